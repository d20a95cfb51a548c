"""netclaim's one error hierarchy. An error's class, not its message, decides what each boundary does.

    NetclaimError
    ├── ConfigError          input that can never work as given (a claim, a DeviceClass, a policy, a file)
    │   └── HostNetworkPodError   a pod on the host network asked for an interface
    ├── GoneError            the object asked about was deleted or replaced (another UID)
    ├── TransientError       a peer is not ready or not reachable; the same call may succeed later
    │   ├── ApiUnavailableError   the Kubernetes API: transport failure, timeout, 429, 5xx
    │   ├── ConflictError         someone else wrote first (409, a failed resourceVersion test)
    │   │   └── AlreadyExistsError    a create found the name taken (an address another claim holds)
    │   ├── PoolExhaustedError    an IP pool had no free address at prepare (one is being released)
    │   ├── AddressQuarantinedError   the address a claim asks for by name was released by another claim
    │   │                         and is not free yet (netclaim.core.ipam.pools.Quarantine)
    │   ├── PodBusyError          an earlier operation on the same pod still holds its lock
    │   ├── StateStoreError       the state database is locked, cannot be written, or its disk did not
    │   │                         take a write within the bound (the write is still made, in its turn)
    │   ├── CniTryAgainError      a CNI plugin answered code 11 ("try again later"), or did not answer in
    │   │                         time (also a CniError)
    │   └── CniNotReadyError      a plugin's STATUS failed (50/51, or its IPAM plugin missing): it
    │                             cannot serve an ADD now (also a CniError)
    ├── ApiRejectedError     the Kubernetes API refused a request (a 4xx but 409 and the 404 of a named
    │   │                    object): a bug, RBAC, or a kind the server does not serve
    │   ├── NotServedError        404 for a kind: the server does not serve it (a CRD not installed, a skew)
    │   └── ApiForbiddenError     401/403: RBAC, or a restarted API server whose RBAC caches are not
    │                             filled yet (it denies every role for a moment)
    ├── CniError             a CNI plugin failed (its code and message) or could not be run: what it
    │                        answered decides the class (CniError.of: code 11 is CniTryAgainError)
    ├── KernelError          the kernel refused a netlink request (a link, an address, a qdisc)
    ├── AttachError          attaching into a pod failed and was rolled back (the cause is chained)
    ├── PrerequisiteError    the machine lacks a program, a permission or a kernel feature
    └── ProtocolError        a peer broke its wire protocol (NRI/ttrpc framing)
    anything else            a bug in netclaim

How each boundary reacts (kubelet: NodePrepareResources, per claim; NRI: RunPodSandbox; loops: the
status writer, each claim and pod on its own; reclaim and the publish/watch loops; the controller's
reconcile). Every loop is kept running by netclaim.runtime.supervisor, which counts each failure of a loop in
netclaim_task_restarts_total{task,error} and each failed one-shot job (an Event, an undo, an NRI call)
in netclaim_task_failures_total{task}; neither stops the process nor makes it unready:

ConfigError, CniError (the claim's config, or the node cannot run its plugins)
    kubelet  the claim's error; Ready=False PrepareFailed on its devices; a Warning Event on its pod
GoneError
    kubelet  the claim's error, nothing written;          loops  the claim is dropped
TransientError (ApiUnavailable, Conflict, PoolExhausted, PodBusy, StateStore, CniTryAgain, CniNotReady)
    kubelet  the claim's error only: kubelet retries, the user is not blamed (no condition, no Event)
AddressQuarantinedError
    kubelet  the claim's error; Ready=False PrepareFailed and a Warning Event on its pod say what it waits
             for (kubelet retries, and takes the address once it is free)
    NRI      the sandbox fails, nothing recorded (kubelet retries);    loops  retried with backoff
AttachError (any cause, after the rollback)
    NRI      the sandbox fails; Ready=False AttachFailed; a Warning Event (queued: no API call inside
             the runtime's budget), unless the cause is a TransientError (a plugin's code 11, a plugin
             out of time): then no Event, the user is not blamed (kubelet retries)
HostNetworkPodError
    NRI      the sandbox fails; a Warning Event
ApiRejectedError
    kubelet  the claim's error, logged;                   loops  logged, retried with backoff
    status writer  final for that claim or pod, logged and counted: written again only once enqueued
             again (likewise a ConfigError there: a claim whose status cannot be read); an
             ApiForbiddenError first retried after 5 s, doubling, 6 times (about 5 min)
PrerequisiteError
    start    the agent refuses to start, saying what to install or do
ProtocolError
    NRI      the connection is dropped and dialled again
anything else (a bug)
    kubelet  "internal error", traceback logged;  NRI  the sandbox fails, traceback logged;
    loops    traceback logged, retried with backoff (the status writer: for that claim or pod only, given
             up after a few tries until it is enqueued again);  one-shot jobs  traceback logged, counted

The controller's passes (IP pools, network Services' EndpointSlices): a write about one object that fails
(freeing an orphan's address, a pool's status, a slice, an Event), whatever the error, is that object's
(per_object): logged, tried again the next pass; the pass goes on. Only ApiUnavailableError ends a pass
(retried with backoff). Passes are counted by result.

Reading: a listed object that cannot be read (nested deeper than netclaim reads, a field of another shape)
is skipped, or a claim read as far as it can be, and reported (a log line, a metric, a Warning Event on
it): it never fails the list. A single object that cannot be read is a ConfigError.

Stop/RemovePodSandbox never raise: what they could not detach, RemovePodSandbox and
NodeUnprepareResources try again. NodeUnprepareResources raises only a TransientError (kubelet calls
again, as for a DEL out of time), for a row at most MAX_RELEASE_TRIES (5) times, then it is final as
below; any other failure of a row (a DEL that can never succeed: CniError,
KernelError, ConfigError; or a bug, its traceback logged) is final for that row: what the ADD left is
cleaned up by hand, the row is forgotten, the next row goes on, the claim's status says
TeardownIncomplete, and the claim and its pod go.
Pool addresses whose end cannot be decided (the claim cannot be read) are kept: the controller frees them
once the claim is gone. Reclaim: one claim's failure, whatever it is, is logged and counted
(netclaim_reclaim_errors_total) and tried again the next round; the round goes on with the others.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Sequence

log = logging.getLogger(__name__)


class NetclaimError(Exception):
    """Base of every error netclaim raises on purpose."""


class ConfigError(NetclaimError):
    """Input that can never work as given; the message names the source and the field."""


class HostNetworkPodError(ConfigError):
    """A pod without its own network namespace cannot receive an interface."""


class GoneError(NetclaimError):
    """The object was deleted, or replaced by another with the same name."""


class TransientError(NetclaimError):
    """A dependency is not ready yet; retrying later may succeed."""


class ApiUnavailableError(TransientError):
    """The Kubernetes API did not answer, or answered that it cannot serve now."""


class ConflictError(TransientError):
    """A write lost a race with another writer: read again, then write."""


class AlreadyExistsError(ConflictError):
    """A create found the name taken: for an IPAllocation, another claim holds the address."""


class PoolExhaustedError(TransientError):
    """An IP pool had no free address when a claim was prepared (a release is still on its way)."""


class AddressQuarantinedError(TransientError):
    """The address a claim asks for by name was released by another claim and is quarantined: free once
    every policy rule and Service that named it has followed."""


class PodBusyError(TransientError):
    """An earlier operation on this pod still runs; nothing was changed."""


class StateStoreError(TransientError):
    """The state database could not be read or written."""


class ApiRejectedError(NetclaimError):
    """The Kubernetes API refused a request netclaim made (not 404/409): a bug or a missing permission."""


class NotServedError(ApiRejectedError):
    """The API server does not serve the kind asked for: a CRD that is not installed, or a version skew."""


class ApiForbiddenError(ApiRejectedError):
    """401/403: a missing permission, or one the API server does not know yet (just restarted)."""


CNI_TRY_AGAIN = 11  # the CNI spec's "try again later"; netclaim answers it for a plugin out of time


class CniError(NetclaimError):
    """A plugin failed (its CNI error code and message) or could not be run at all: the config, or the
    node's plugins, must change. `CniError.of` gives a plugin's answer its class."""

    def __init__(self, plugin: str, command: str, code: int, message: str, details: str = "") -> None:
        self.plugin, self.command, self.code, self.message, self.details = (
            plugin,
            command,
            code,
            message,
            details,
        )
        detail = f" ({details})" if details else ""
        super().__init__(f"CNI {command} {plugin}: code {code}: {message}{detail}")

    @staticmethod
    def of(plugin: str, command: str, code: int, message: str, details: str = "") -> CniError:
        """The error for a plugin's answer: code 11 says "try again later" (CniTryAgainError); any failed
        STATUS says "not ready for ADD" (CniNotReadyError: 50 and 51 by the spec, or whatever a plugin
        answers when the IPAM plugin it asks cannot be found or run)."""
        kind: type[CniError] = CniError
        if code == CNI_TRY_AGAIN:
            kind = CniTryAgainError
        elif command == "STATUS":
            kind = CniNotReadyError
        return kind(plugin, command, code, message, details)


class CniTryAgainError(CniError, TransientError):
    """A plugin answered code 11 ("try again later") or did not answer in time: the same call may work."""


class CniNotReadyError(CniError, TransientError):
    """A plugin's STATUS failed: it cannot serve an ADD now; the attach is retried until it is ready."""


class KernelError(NetclaimError):
    """The kernel refused a netlink request; the message names the interface and the namespace."""


class AttachError(NetclaimError):
    """Attaching failed and was rolled back; the message says which claim and device, and why."""


class PrerequisiteError(NetclaimError):
    """A program, permission or kernel feature is missing; the message says what to install or do."""


class ProtocolError(NetclaimError):
    """The peer sent something its protocol does not allow."""


async def per_object(what: str, write: Awaitable[None]) -> bool:
    """A controller's write about one object: its failure is that object's (logged; the next pass tries
    again), and False. Only an API that cannot serve ends the pass, which is then retried with backoff."""
    try:
        await write
    except ApiUnavailableError:
        raise
    except NetclaimError as err:
        log.warning(f"{what} failed; the next pass tries again", extra={"error": str(err)})
        return False
    except Exception:
        log.exception(f"{what} failed (a bug); the next pass tries again")
        return False
    return True


async def per_object_at_once(writes: Sequence[tuple[str, Awaitable[None]]], at_once: int) -> list[bool]:
    """per_object of each (what, write), `at_once` of them in flight at a time: many objects' writes cost
    about one round trip per `at_once` of them. Each write's success, in their order."""
    limit = asyncio.Semaphore(at_once)

    async def one(what: str, write: Awaitable[None]) -> bool:
        async with limit:
            return await per_object(what, write)

    return list(await asyncio.gather(*(one(what, write) for what, write in writes)))

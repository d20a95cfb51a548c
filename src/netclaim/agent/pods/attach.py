"""Carry out a stored plan in a pod's network namespace (CNI ADD, read back, shape) and undo it (CNI DEL).

Every step is recorded in the store before and after, so a crash at any point leaves a row that says
what may be half done: `attaching` rows are rolled back with DEL before anything else happens to them.
This module is the one home of detaching: the NRI hooks, the restart repairs and NodeUnprepareResources
all come here.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import os
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from netclaim.agent.pods.guard import PortGuard, guarded_nic, interface_sysctls
from netclaim.agent.pods.lifecycle import NetworkGate, PluginReadiness, network_key
from netclaim.agent.store import Attachment, Interface, Key, Outcome, State, Store
from netclaim.core.config.cniconfig import garbage_collected, speaks_lifecycle
from netclaim.core.node import (
    Cni,
    InterfaceState,
    Invocation,
    PodLinks,
    PodSandbox,
    cni_args,
    host_local_dirs,
    pod_of_cni_args,
)
from netclaim.errors import AttachError, CniError, NetclaimError, PodBusyError, TransientError
from netclaim.runtime import faults
from netclaim.runtime.supervisor import Supervisor

log = logging.getLogger(__name__)
# NodeUnprepareResources calls kubelet makes (with its back-off, minutes in all) before a DEL that keeps
# failing for the moment is given up as final: cleaned up by hand, said on the claim
MAX_RELEASE_TRIES = 5


def _described(err: Exception) -> str:
    """An error for the claim's status; a bug's traceback goes to the log."""
    if isinstance(err, NetclaimError):
        return str(err)
    log.error("teardown failed (a bug)", exc_info=err)
    return f"internal error in the netclaim agent ({type(err).__name__}: {err}); see its log"


@dataclass
class _PodLock:
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    users: int = 0  # holding it or waiting for it


class PodLocks:
    """One lock per pod UID: kubelet calls, NRI hooks and repairs of the same pod never interleave. A pod's
    lock is there while someone holds it or waits for it, counted here: it is dropped only when no one
    does (a waiter woken by the last release holds the old lock, and a new one would let the next caller
    run alongside it), and never kept past that, whether or not the pod comes back."""

    def __init__(self) -> None:
        self._locks: dict[str, _PodLock] = {}

    @contextlib.asynccontextmanager
    async def __call__(self, pod_uid: str, deadline: float | None = None) -> AsyncIterator[None]:
        """Hold the pod's lock; with a deadline (time.monotonic), PodBusyError when it is not free by
        then."""
        held = self._locks.setdefault(pod_uid, _PodLock())
        held.users += 1
        try:
            await _acquire(held.lock, deadline)
            try:
                yield
            finally:
                held.lock.release()
        finally:
            held.users -= 1
            if not held.users:
                del self._locks[pod_uid]

    def locked(self, pod_uid: str) -> bool:
        held = self._locks.get(pod_uid)
        return held is not None and held.lock.locked()

    def __len__(self) -> int:
        return len(self._locks)


async def _acquire(lock: asyncio.Lock, deadline: float | None) -> None:
    if deadline is None:
        await lock.acquire()
        return
    try:
        await asyncio.wait_for(lock.acquire(), max(0.0, deadline - time.monotonic()))
    except TimeoutError:
        raise PodBusyError(
            "an earlier operation on this pod is still running; nothing was changed, the runtime will retry"
        ) from None


def _addresses_of(result: dict[str, Any]) -> tuple[str, ...]:
    """The addresses of a CNI result, as plain addresses (what goes into CNI_ARGS: nothing else can)."""
    found = []
    for ip in result.get("ips", []):
        with contextlib.suppress(KeyError, TypeError, ValueError):
            found.append(str(ipaddress.ip_interface(ip["address"]).ip))
    return tuple(found)


def _result_addresses(result: dict[str, Any], name: str, netns: str) -> tuple[str, ...] | None:
    """The addresses a CNI result gives interface `name` in the sandbox `netns` (address/prefix), in its
    order; None when it does not say (the interface not listed, an address not tied to an interface, an
    entry that cannot be read): then the kernel is asked."""
    interfaces = result.get("interfaces")
    if not isinstance(interfaces, list):
        return None
    ours = {
        i
        for i, found in enumerate(interfaces)
        if isinstance(found, dict) and found.get("name") == name and found.get("sandbox") == netns
    }
    if not ours:
        return None
    found_addresses = []
    for ip in result.get("ips") or []:
        try:
            if ip["interface"] in ours:
                found_addresses.append(str(ipaddress.ip_interface(ip["address"])))
        except (KeyError, TypeError, ValueError):
            return None
    return tuple(found_addresses)


def netns_exists(path: str) -> bool:
    return bool(path) and os.path.exists(path)  # noqa: PTH110 - one stat, on the hook's path


class Attacher:
    def __init__(
        self,
        store: Store,
        cni: Cni,
        links: PodLinks,
        locks: PodLocks,
        background: Supervisor,
        readiness: PluginReadiness,
        gate: NetworkGate,
        guard: PortGuard | None = None,
    ) -> None:
        self._release_tries: dict[Key, int] = {}  # transient failures of a row's release, so far
        self.store = store
        self.cni = cni
        self.links = links
        self.locks = locks
        self.background = background  # runs the undo of an ADD whose rollback ran out of time
        self.readiness = readiness
        self.gate = gate
        self.guard = guard  # None: no NIC's children are held to their identity (tests of other parts)

    def _invocation(self, row: Attachment) -> Invocation:
        netns = row.netns if netns_exists(row.netns) else ""
        return Invocation(row.sandbox_id, netns, row.plan.interface_name, row.outcome.cni_args)

    async def _read_back(self, row: Attachment, netns: str, result: dict[str, Any]) -> InterfaceState:
        """The interface the ADD made, set as every pod's interface is (netclaim.agent.pods.guard); its
        addresses as the ADD's result says, read only when the result does not say."""
        name = row.plan.interface_name
        state = await self.links.interface(
            name, netns, interface_sysctls(row), _result_addresses(result, name, netns)
        )
        if state is None:
            raise AttachError(f"CNI ADD succeeded but {name} is not in the pod's namespace")
        return state

    def current(self, row: Attachment) -> Attachment | None:
        return self.store.get(row.key)

    async def is_attached(self, row: Attachment, sandbox: PodSandbox) -> bool:
        if row.state != State.ATTACHED or row.sandbox_id != sandbox.id:
            return False
        # addresses=(): whether it is there, not what it holds (its addresses would be read by a dump)
        return await self.links.interface(row.plan.interface_name, sandbox.netns, addresses=()) is not None

    async def attach_pod(
        self, rows: list[Attachment], sandbox: PodSandbox, deadline: float
    ) -> list[Attachment]:
        """Every row attached into `sandbox`, all or nothing, in the rows' order: those whose chains may
        run beside their siblings' (AttachPlan.runs_beside_siblings) at once, then the others one at a
        time. A failure stops nothing already in flight: once every ADD begun has ended, what attached is
        detached again and the first failure raised."""
        together = [row for row in rows if row.plan.runs_beside_siblings]
        outcomes: dict[Key, Attachment | BaseException] = {}
        if len(together) > 1:  # one alone goes without gather's tasks: each costs a turn of the loop
            ended = await asyncio.gather(
                *(self.attach(row, sandbox, deadline) for row in together), return_exceptions=True
            )
            outcomes.update(zip((row.key for row in together), ended, strict=True))
        for row in rows:
            if row.key in outcomes:
                continue
            if any(isinstance(o, BaseException) for o in outcomes.values()):
                break
            try:
                outcomes[row.key] = await self.attach(row, sandbox, deadline)
            except Exception as err:  # noqa: BLE001 - raised below, once what attached is undone
                outcomes[row.key] = err
        failures = [o for row in rows if isinstance(o := outcomes.get(row.key), BaseException)]
        attached = [o for row in rows if isinstance(o := outcomes.get(row.key), Attachment)]
        if not failures:
            return attached
        for row in attached:  # the retried sandbox starts from a clean slate
            current = self.current(row)
            if current is not None:
                await self.detach(current, deadline)
        raise failures[0]

    async def attach(
        self, row: Attachment, sandbox: PodSandbox, deadline: float, keep: tuple[str, ...] = ()
    ) -> Attachment:
        """ADD the plan into `sandbox`; idempotent for the same sandbox. Raises AttachError after rollback.
        `keep`: the addresses host-local is to hand out again (CNI_ARGS IP=, which it reads)."""
        if await self.is_attached(row, sandbox):
            return row
        plan = row.plan
        try:  # before anything is undone, written or made: a new sandbox of a pod whose plugins are not
            await self.readiness.check(plan.conflist, deadline)  # ready keeps the old one's as it is
        except CniError as err:
            message = f"claim {row.claim_namespace}/{row.claim_name} device {row.device}: {err}"
            await self.store.transition(row.with_state(row.state, error=message), durable=False)
            raise AttachError(message) from err
        if row.state in (State.ATTACHING, State.ATTACHED):
            row = await self.detach(row, deadline)
        network = network_key(plan.conflist)
        async with self.gate.adding(network, deadline):  # never beside the network's GC
            if speaks_lifecycle(plan.conflist):
                await self.store.remember_network(network, plan.conflist)
            return await self._add(row, sandbox, deadline, keep)

    async def _add(
        self, row: Attachment, sandbox: PodSandbox, deadline: float, keep: tuple[str, ...]
    ) -> Attachment:
        plan = row.plan
        if self.guard is not None:  # the child's first frames pass: written since prepare, else now
            try:
                await asyncio.wait_for(self.guard.bind(row), max(0.0, deadline - time.monotonic()))
            except (NetclaimError, TimeoutError) as err:
                raise AttachError(
                    f"claim {row.claim_namespace}/{row.claim_name} device {row.device}: port security on "
                    f"{plan.nic.if_name} not written ({err or 'out of time'}); nothing was attached"
                ) from err
        args = cni_args(sandbox.namespace, sandbox.name, sandbox.id, sandbox.uid)
        if keep and host_local_dirs(plan.conflist):
            args += f";IP={','.join(keep)}"
        row = row.with_state(
            State.ATTACHING,
            sandbox_id=sandbox.id,
            netns=sandbox.netns,
            outcome=Outcome(cni_args=args),
            error="",
        )
        # DEL undoes this ADD, after a kill -9 too; after a power cut, a chain the network's GC does not
        # reach needs the row on disk (netclaim.agent.store says why the others need not wait for that)
        await self.store.transition(row, durable=not garbage_collected(plan.conflist))
        invocation = Invocation(sandbox.id, sandbox.netns, plan.interface_name, args)
        started = time.monotonic()
        try:
            if plan.may_get_ipv6:  # duplicate address detection would hold the ADD 1-2 s: see docs/ipam.md
                async with self.links.without_dad(sandbox.netns):
                    result = await self.cni.add(plan.conflist, invocation, deadline)
            else:
                result = await self.cni.add(plan.conflist, invocation, deadline)
            cni_ms = round((time.monotonic() - started) * 1000, 1)
            faults.point("inside-add")
            state = await self._read_back(row, sandbox.netns, result)
            if plan.bandwidth_bps:
                await self.links.shape(plan.interface_name, plan.bandwidth_bps, sandbox.netns)
            interface = Interface(name=state.name, mac=state.mac, mtu=state.mtu, addresses=state.addresses)
            attached = row.with_state(
                State.ATTACHED, outcome=Outcome(cni_args=args, cni_result=result, interface=interface)
            )
        except Exception as err:
            message = f"claim {row.claim_namespace}/{row.claim_name} device {row.device}: {err}"
            if await self._rollback(row, deadline):
                await self.store.transition(
                    row.with_state(State.PREPARED, sandbox_id="", netns="", outcome=Outcome(), error=message),
                    durable=False,
                )
            else:  # out of the runtime's budget: the row stays `attaching` (undo first) and is undone later
                await self._undo_later(row.with_state(State.ATTACHING, error=message))
            if not isinstance(err, NetclaimError):
                log.exception("attach failed (a bug)", extra={"claim": row.claim_name})
            raise AttachError(message) from err
        row = attached
        await self.store.transition(row, durable=False)
        if self.guard is not None and not self.guard.covers(row):  # the ADD told what prepare could not
            self.background.spawn("port-security", self.guard.follow_soon(plan.nic.if_name, row))
        log.info(
            "attached",
            extra={
                "pod": f"{sandbox.namespace}/{sandbox.name}",
                "claim": row.claim_name,
                "device": row.device,
                "cni_ms": cni_ms,
                "interface": state.name,
                "ips": state.addresses,
                "ms": round((time.monotonic() - started) * 1000, 1),
            },
        )
        return row

    async def _rollback(self, row: Attachment, deadline: float) -> bool:
        """DEL the whole chain after a failed ADD, within the hook's deadline; False if it did not finish."""
        try:
            await self.cni.delete(row.plan.conflist, self._invocation(row), None, deadline)
            await self._restore_host_nic(row)
        except NetclaimError as err:
            log.warning("rollback after a failed ADD did not finish in time", extra={"error": str(err)})
            return False
        return True

    async def _undo_later(self, row: Attachment) -> None:
        await self.store.transition(row, durable=False)

        async def undo() -> None:
            async with self.locks(row.pod_uid):
                current = self.current(row)
                if current is not None and current.state == State.ATTACHING:
                    await self.detach(current, time.monotonic() + self.cni.timeout)

        self.background.spawn("attach-undo", undo())

    async def check(self, row: Attachment, deadline: float) -> None:
        """CNI CHECK of an attached row against its ADD's result; the plugin's error says what is amiss."""
        result = row.outcome.cni_result
        if row.state != State.ATTACHED or result is None or not netns_exists(row.netns):
            return
        await self.cni.check(row.plan.conflist, self._invocation(row), result, deadline)

    async def reattach(self, row: Attachment, deadline: float) -> Attachment:
        """DEL and ADD again into the row's sandbox, with the addresses it had (a CHECK found it broken)."""
        namespace, name = pod_of_cni_args(row.outcome.cni_args)
        sandbox = PodSandbox(row.sandbox_id, row.pod_uid, name, namespace, row.netns)
        keep = _addresses_of(row.outcome.cni_result or {})
        return await self.attach(await self.detach(row, deadline), sandbox, deadline, keep)

    async def detach(self, row: Attachment, deadline: float) -> Attachment:
        """DEL what an `attaching`/`attached` row may have added (the netns may be gone: IPAM is still
        released) and put an exclusive NIC back as it was. Safe to repeat."""
        if row.state not in (State.ATTACHING, State.ATTACHED):
            return row
        invocation = self._invocation(row)
        if invocation.netns:
            await self.links.remove_ifb(invocation.if_name, invocation.netns)
        await self.cni.delete(row.plan.conflist, invocation, row.outcome.cni_result, deadline)
        await self._restore_host_nic(row)
        row = row.with_state(State.DETACHED, netns="", outcome=Outcome(), error="")
        await self.store.transition(row, durable=False)
        log.info("detached", extra={"claim": row.claim_name, "device": row.device})
        return row

    async def release(self, rows: list[Attachment], deadline: float) -> list[str]:
        """Detach each row under its pod's lock and forget it (NodeUnprepareResources); returns what could
        not be released cleanly. A failure of a row is final for that row unless it is transient: a DEL
        that can never succeed (the plugin refuses its own config, is gone, cannot be run) or a bug does not
        keep the claim and its pod for ever: what the ADD left is removed by hand, the row is forgotten and
        the next row goes on. A transient failure (a plugin out of time, or saying try again) is raised so
        that kubelet calls again, MAX_RELEASE_TRIES times at most: a plugin that never answers keeps no
        pod Terminating for ever either."""
        problems: list[str] = []
        try:
            await self._release(rows, deadline, problems)
        finally:
            await self._unbind([nic for nic in map(guarded_nic, rows) if nic is not None])
        return problems

    async def _unbind(self, nics: list[str]) -> None:
        """The released rows' children no longer bound; a failure is logged, never raised (the next change
        of the NIC, or a restart, writes its table again)."""
        if self.guard is None:
            return
        try:
            await self.guard.follow(nics)
        except Exception as err:  # noqa: BLE001 - teardown goes on whatever the guard says
            log.warning("port security not updated after a release", extra={"nics": nics, "error": str(err)})

    async def _release(self, rows: list[Attachment], deadline: float, problems: list[str]) -> None:
        for row in rows:
            async with self.locks(row.pod_uid):
                current = self.current(row)
                if current is None:
                    continue
                try:
                    await self.detach(current, deadline)
                except TransientError as err:
                    tries = self._release_tries[row.key] = self._release_tries.get(row.key, 0) + 1
                    if tries < MAX_RELEASE_TRIES:
                        raise
                    cleaned = await self._clean_up(current)
                    problems.append(f"device {row.device}: {_described(err)} ({tries} tries); {cleaned}")
                except Exception as err:  # noqa: BLE001 - final for this row: cleaned up by hand, reported
                    problems.append(
                        f"device {row.device}: {_described(err)}; {await self._clean_up(current)}"
                    )
                await self.store.delete(current)
                self._release_tries.pop(row.key, None)

    async def _clean_up(self, row: Attachment) -> str:
        """After a DEL that failed for good: remove what the ADD may have left, and say what was found."""
        found: list[str] = []
        try:
            left = row.plan.shared and netns_exists(row.netns)
            if left and await self.links.interface(row.plan.interface_name, row.netns, addresses=()):
                await self.links.delete_link(row.plan.interface_name, row.netns)
                found.append(f"removed {row.plan.interface_name} from the pod")
            if garbage_collected(row.plan.conflist):
                found.append("what the plugins hold for it is left to the network's CNI GC (within 10 min)")
            else:  # a 1.0-level chain has no GC: host-local's files of the sandbox are removed here
                released = self.cni.release_host_local(row.plan.conflist, row.sandbox_id)
                if released:
                    found.append(f"released host-local addresses {released}")
            await self._restore_host_nic(row)
        except Exception as err:  # noqa: BLE001 - what is left is reported on the claim, never raised
            found.append(f"clean-up failed: {_described(err)}")
        return "; ".join(found) or "nothing was left behind"

    async def _restore_host_nic(self, row: Attachment) -> None:
        """After a whole NIC came back from a pod: its MTU and MAC as they were before, and not listening for
        more than its own traffic (a pod's tuning may have turned promisc or allmulti on: the next holder of
        the NIC, or the node, must not inherit it)."""
        if row.plan.shared:
            return
        nic = row.plan.nic
        if_name, mtu, mac = nic.if_name, nic.mtu, nic.mac
        # its MTU, MAC and flags: not its addresses, which a dump of every address of the node would give
        current = await self.links.interface(if_name, addresses=())
        if current is None:
            log.warning("exclusive NIC not back on the node", extra={"interface": if_name})
            return
        listening = current.promisc or current.allmulti
        if current.mtu != mtu or current.mac != mac or listening:
            await self.links.set_link(if_name, mtu=mtu, mac=mac, listening=False if listening else None)

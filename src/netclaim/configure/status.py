"""ResourceClaim.status.devices (KEP-4817) for our devices, and Warning Events on pods.

Off the hot path: hooks only enqueue a claim; one worker writes the claim's entries from the store and
retries with backoff while the apiserver is away. Entries: `Ready` True with networkData read back from
the pod's namespace and the CNI result in `data`; or `Ready` False with the reason and message.

The write is a JSON Patch of `status.devices` guarded by the claim's resourceVersion (field manager = the
driver name): other drivers' entries are copied back verbatim, a concurrent writer makes us re-read and
retry. Not server-side apply: kube-apiserver 1.37 rejects any SSA of the status of a claim whose opaque
config was not sent as canonical JSON (keys unsorted, as lightkube and client-go send them): the typed
round trip re-serialises the config and the immutable `status.allocation` reads as changed.
"""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import logging
from dataclasses import dataclass, field
from typing import Any

from netclaim import faults
from netclaim.adapters.kube import KubeApi
from netclaim.adapters.nri import PodSandbox
from netclaim.backoff import Backoff
from netclaim.configure.store import Attachment, State, Store
from netclaim.errors import ConflictError, GoneError, NetclaimError

log = logging.getLogger(__name__)
MAX_CONFLICT_RETRIES = 3  # immediate re-reads before backing off

_REASONS = {
    State.PREPARED: ("WaitingForPodSandbox", "prepared; attached when the pod's sandbox starts"),
    State.ATTACHING: ("Attaching", "CNI ADD in progress"),
    State.DETACHED: ("Detached", "the pod's sandbox is gone; the interface was removed"),
}


@dataclass(frozen=True)
class ClaimRef:
    namespace: str
    name: str
    uid: str


@dataclass(frozen=True)
class Failure:
    """A claim that could not be prepared: no store rows, but its devices still get a Ready=False entry."""

    devices: tuple[tuple[str, str, str], ...]  # (pool, device, shareID)
    reason: str
    message: str


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def _condition(status: str, reason: str, message: str) -> dict[str, Any]:
    return {
        "type": "Ready",
        "status": status,
        "reason": reason,
        "message": message[:32768],
        "lastTransitionTime": _now(),
    }


def address_entries(driver: str, row: Attachment) -> list[dict[str, Any]]:
    """The entries of the claim's IP pool devices: their addresses, from the moment they are prepared."""
    entries = []
    for granted in row.plan.pool_addresses:
        entry: dict[str, Any] = {"driver": driver, "pool": granted.pool, "device": granted.device}
        if granted.share_id:
            entry["shareID"] = granted.share_id
        entry["conditions"] = [
            _condition("True", "AddressAllocated", f"held for the claim from IPPool {granted.device}")
        ]
        entry["networkData"] = {"interfaceName": row.plan.interface_name, "ips": list(granted.ips)}
        entries.append(entry)
    return entries


def device_entry(driver: str, row: Attachment) -> dict[str, Any]:
    entry: dict[str, Any] = {"driver": driver, "pool": row.pool, "device": row.device}
    if row.share_id:
        entry["shareID"] = row.share_id
    interface = row.outcome.interface
    if row.state == State.ATTACHED and interface is not None:
        entry["conditions"] = [
            _condition("True", "InterfaceAttached", f"{interface.name} is configured in the pod")
        ]
        entry["networkData"] = {
            "interfaceName": interface.name,
            "ips": sorted({str(ipaddress.ip_interface(a)) for a in interface.addresses}),
            "hardwareAddress": interface.mac,
        }
        if row.outcome.cni_result:
            entry["data"] = row.outcome.cni_result
    elif row.error:
        entry["conditions"] = [_condition("False", "AttachFailed", row.error)]
    else:
        reason, message = _REASONS.get(row.state, _REASONS[State.ATTACHING])
        entry["conditions"] = [_condition("False", reason, message)]
    return entry


def _comparable(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    def strip(entry: dict[str, Any]) -> dict[str, Any]:
        conditions = [
            {k: v for k, v in c.items() if k in ("type", "status", "reason", "message")}
            for c in entry.get("conditions", [])
        ]
        return {**{k: v for k, v in entry.items() if v not in (None, {}, [])}, "conditions": conditions}

    return sorted((strip(e) for e in entries), key=lambda e: (e["pool"], e["device"], e.get("shareID", "")))


@dataclass
class StatusWriter:
    api: KubeApi
    driver: str
    store: Store
    _queue: asyncio.Queue[ClaimRef] = field(default_factory=asyncio.Queue)
    _failures: dict[str, Failure] = field(default_factory=dict)
    _pending: set[str] = field(default_factory=set)
    _events: set[asyncio.Task[None]] = field(default_factory=set)

    def enqueue(self, claim: ClaimRef) -> None:
        if claim.uid not in self._pending:
            self._pending.add(claim.uid)
            self._queue.put_nowait(claim)

    def fail(self, claim: ClaimRef, failure: Failure) -> None:
        self._failures[claim.uid] = failure
        self.enqueue(claim)

    def forget(self, claim: ClaimRef) -> None:
        """The claim was unprepared: its entries go (the store rows are already deleted)."""
        self._failures.pop(claim.uid, None)
        self.enqueue(claim)

    def desired(self, claim: ClaimRef) -> list[dict[str, Any]]:
        rows = self.store.for_claim(claim.uid)
        entries = [device_entry(self.driver, row) for row in rows]
        entries += [entry for row in rows for entry in address_entries(self.driver, row)]
        failure = self._failures.get(claim.uid)
        if failure is not None and not rows:
            for pool, device, share_id in failure.devices:
                entry: dict[str, Any] = {
                    "driver": self.driver,
                    "pool": pool,
                    "device": device,
                    "conditions": [_condition("False", failure.reason, failure.message)],
                }
                if share_id:
                    entry["shareID"] = share_id
                entries.append(entry)
        return entries

    async def run(self) -> None:
        """Write each queued claim's entries; retry with backoff while the apiserver is away."""
        while True:
            claim = await self._queue.get()
            self._pending.discard(claim.uid)
            backoff = Backoff()
            conflicts = 0
            while True:
                try:
                    await self.write(claim)
                    break
                except GoneError:
                    self._failures.pop(claim.uid, None)
                    break  # the claim is gone: nothing to report on
                except ConflictError:
                    conflicts += 1
                    if conflicts <= MAX_CONFLICT_RETRIES:
                        continue  # kubelet or the scheduler wrote the claim meanwhile: read it again
                    log.warning("status write kept conflicting; retrying", extra={"claim": claim.name})
                except NetclaimError as err:
                    log.warning(
                        "status write failed; retrying", extra={"claim": claim.name, "error": str(err)}
                    )
                except Exception:
                    log.exception("status write failed (a bug); retrying", extra={"claim": claim.name})
                if claim.uid in self._pending:
                    break  # a newer request for this claim is queued; it will write the latest state
                await backoff.wait()

    async def write(self, claim: ClaimRef) -> None:
        faults.point("before-status")
        entries = self.desired(claim)
        current = await self.api.get_claim(claim.namespace, claim.name)
        if current.uid != claim.uid:
            return
        ours = [d for d in current.devices_status if d.get("driver") == self.driver]
        if _comparable(ours) == _comparable(entries):
            return
        others = [d for d in current.devices_status if d.get("driver") != self.driver]
        await self.api.write_claim_devices(current, others + entries)
        log.info(
            "claim status written",
            extra={
                "claim": f"{claim.namespace}/{claim.name}",
                "ready": [e["conditions"][0]["status"] for e in entries],
            },
        )

    def warn_later(self, pod: PodSandbox, reason: str, message: str) -> None:
        """A Warning Event on the pod, written off the caller's path (never inside the runtime's budget)."""
        task = asyncio.create_task(self.warn(pod.namespace, pod.name, pod.uid, reason, message))
        self._events.add(task)
        task.add_done_callback(self._events.discard)

    async def warn(self, namespace: str, pod: str, pod_uid: str, reason: str, message: str) -> None:
        """A Warning Event on the pod (best effort: failures are logged, never raised)."""
        try:
            await self.api.create_pod_event(namespace, pod, pod_uid, reason, message)
        except NetclaimError as err:
            log.info("could not record a pod event", extra={"error": str(err)})

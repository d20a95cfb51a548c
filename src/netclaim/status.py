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

from lightkube import AsyncClient
from lightkube.core.exceptions import ApiError
from lightkube.models.core_v1 import EventSource, ObjectReference
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Event
from lightkube.resources.resource_v1 import ResourceClaim, ResourceClaimStatus
from lightkube.types import PatchType

from netclaim import faults
from netclaim.kube import is_not_found
from netclaim.store import Attachment, State, Store

log = logging.getLogger(__name__)

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


def device_entry(driver: str, row: Attachment) -> dict[str, Any]:
    entry: dict[str, Any] = {"driver": driver, "pool": row.pool, "device": row.device}
    if row.share_id:
        entry["shareID"] = row.share_id
    if row.state == State.ATTACHED:
        interface = row.result.get("interface", {})
        entry["conditions"] = [
            _condition("True", "InterfaceAttached", f"{interface.get('name')} is configured in the pod")
        ]
        entry["networkData"] = {
            "interfaceName": interface.get("name", ""),
            "ips": sorted({str(ipaddress.ip_interface(a)) for a in interface.get("addresses", [])}),
            "hardwareAddress": interface.get("mac", ""),
        }
        if row.result.get("cni"):
            entry["data"] = row.result["cni"]
    elif row.error:
        entry["conditions"] = [_condition("False", "AttachFailed", row.error)]
    else:
        reason, message = _REASONS[row.state]
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
    client: AsyncClient
    driver: str
    store: Store
    _queue: asyncio.Queue[ClaimRef] = field(default_factory=asyncio.Queue)
    _failures: dict[str, Failure] = field(default_factory=dict)
    _pending: set[str] = field(default_factory=set)

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
        while True:
            claim = await self._queue.get()
            self._pending.discard(claim.uid)
            backoff = 0.5
            while True:
                try:
                    await self.write(claim)
                    break
                except ApiError as err:
                    if is_not_found(err) or (
                        err.status.code == 422 and "no longer" in str(err.status.message)
                    ):
                        break  # the claim is gone: nothing to report on
                    log.warning(
                        "status write failed; retrying", extra={"claim": claim.name, "error": str(err)}
                    )
                except Exception as err:  # noqa: BLE001 - the apiserver may be away; keep the claim queued
                    log.warning(
                        "status write failed; retrying", extra={"claim": claim.name, "error": repr(err)}
                    )
                if claim.uid in self._pending:
                    break  # a newer request for this claim is queued; it will write the latest state
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 10.0)

    async def write(self, claim: ClaimRef) -> None:
        faults.point("before-status")
        entries = self.desired(claim)
        current = await self.client.get(ResourceClaim, claim.name, namespace=claim.namespace)
        if current.metadata is None or current.metadata.uid != claim.uid:
            return
        ours = [
            d.to_dict()
            for d in (current.status.devices if current.status else None) or []
            if d.driver == self.driver
        ]
        if _comparable(ours) == _comparable(entries):
            return
        assert current.status is not None and current.metadata is not None
        others = [d.to_dict() for d in current.status.devices or [] if d.driver != self.driver]
        patch = [
            {"op": "test", "path": "/metadata/resourceVersion", "value": current.metadata.resourceVersion},
            {"op": "add", "path": "/status/devices", "value": others + entries},
        ]
        await self.client.patch(
            ResourceClaimStatus,
            claim.name,
            patch,
            namespace=claim.namespace,
            patch_type=PatchType.JSON,
            field_manager=self.driver,
        )
        log.info(
            "claim status written",
            extra={
                "claim": f"{claim.namespace}/{claim.name}",
                "ready": [e["conditions"][0]["status"] for e in entries],
            },
        )

    async def warn(self, namespace: str, pod: str, pod_uid: str, reason: str, message: str) -> None:
        """A Warning Event on the pod (best effort: failures are logged, never raised)."""
        now = datetime.datetime.now(datetime.UTC).replace(microsecond=0)
        event = Event(
            metadata=ObjectMeta(generateName=f"{pod}.", namespace=namespace),
            involvedObject=ObjectReference(
                kind="Pod", apiVersion="v1", name=pod, namespace=namespace, uid=pod_uid
            ),
            reason=reason,
            message=message[:1024],
            type="Warning",
            source=EventSource(component=self.driver),
            firstTimestamp=now,
            lastTimestamp=now,
            count=1,
        )
        try:
            await self.client.create(event)
        except Exception as err:  # noqa: BLE001 - an event is advice, never a reason to fail
            log.info("could not record a pod event", extra={"error": repr(err)})

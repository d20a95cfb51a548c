"""ResourceClaim.status.devices (KEP-4817) for our devices, the pods' network-status annotation, and
Warning Events on pods.

Off the hot path: hooks only enqueue a claim; one worker writes the claim's entries from the store and
retries with backoff while the apiserver is away. Entries: `Ready` True with networkData read back from
the pod's namespace and the CNI result in `data`; or `Ready` False with the reason and message.

The pod annotation `k8s.v1.cni.cncf.io/network-status` has Multus's schema, so the tools that read it keep
working: one entry per interface we attached, named `<namespace>/<the pod's name for the claim>`; entries
of other writers (Multus itself, for one) are kept. Written after an attach, guarded by the pod's
resourceVersion; admission lets an agent change only that annotation, only on pods of its own node.

The claim write is a JSON Patch of `status.devices` guarded by the claim's resourceVersion (field manager =
the driver name): other drivers' entries are copied back verbatim, a concurrent writer makes us re-read and
retry. Not server-side apply: kube-apiserver 1.37 rejects any SSA of the status of a claim whose opaque
config was not sent as canonical JSON (keys unsorted, as lightkube and client-go send them): the typed
round trip re-serialises the config and the immutable `status.allocation` reads as changed.
"""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import json
import logging
from dataclasses import dataclass, field
from typing import Any

from netclaim import faults
from netclaim.adapters.kube import KubeApi
from netclaim.adapters.nri import PodSandbox
from netclaim.backoff import Backoff
from netclaim.configure.store import Attachment, State, Store
from netclaim.errors import ApiRejectedError, ConfigError, ConflictError, GoneError, NetclaimError
from netclaim.names import DRIVER_DOMAIN

log = logging.getLogger(__name__)
NETWORK_STATUS = "k8s.v1.cni.cncf.io/network-status"
PCI_ATTRIBUTE = f"{DRIVER_DOMAIN}/pciAddress"
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
class PodRef:
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


def pod_claim_names(pod: dict[str, Any]) -> dict[str, str]:
    """ResourceClaim name -> the name the pod's spec.resourceClaims gives it."""
    names = {
        str(ref["resourceClaimName"]): str(ref["name"])
        for ref in (pod.get("spec") or {}).get("resourceClaims") or []
        if ref.get("resourceClaimName")
    }
    for ref in (pod.get("status") or {}).get("resourceClaimStatuses") or []:
        if ref.get("resourceClaimName"):  # made from a template
            names[str(ref["resourceClaimName"])] = str(ref["name"])
    return names


def network_status(pod: dict[str, Any], rows: list[Attachment]) -> list[dict[str, Any]]:
    """The pod's network-status entries: other writers' as they are, then one per interface we attached."""
    namespace = pod["metadata"]["namespace"]
    names = pod_claim_names(pod)
    ours = {f"{namespace}/{name}" for name in names.values()}
    try:
        current = json.loads((pod["metadata"].get("annotations") or {}).get(NETWORK_STATUS, "[]"))
    except ValueError:
        current = []  # not ours to repair, but not ours to keep either: unreadable to every tool
    if not isinstance(current, list):
        current = []
    kept = [e for e in current if isinstance(e, dict) and e.get("name") not in ours]
    entries = []
    for row in sorted(rows, key=lambda r: r.plan.interface_name):
        interface = row.outcome.interface
        if row.state != State.ATTACHED or interface is None:
            continue
        entry: dict[str, Any] = {
            "name": f"{namespace}/{names.get(row.claim_name, row.claim_name)}",
            "interface": interface.name,
            "ips": sorted({str(ipaddress.ip_interface(a).ip) for a in interface.addresses}),
            "mac": interface.mac,
            "mtu": interface.mtu,
            "default": False,  # Multus's meaning: the cluster's default network, never ours
            "dns": {},
        }
        pci = row.plan.device.attributes.get(PCI_ATTRIBUTE)
        if not row.plan.shared and isinstance(pci, str):
            entry["device-info"] = {"type": "pci", "version": "1.1.0", "pci": {"pci-address": pci}}
        entries.append(entry)
    return kept + entries


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
    annotate_pods: bool = True  # the network-status annotation
    _queue: asyncio.Queue[ClaimRef] = field(default_factory=asyncio.Queue)
    # pods have a queue and a worker of their own: a pod write refused for good (another admission
    # webhook, an annotation over the size limit) must never hold up the claims' status
    _pod_queue: asyncio.Queue[PodRef] = field(default_factory=asyncio.Queue)
    _failures: dict[str, Failure] = field(default_factory=dict)
    _pending: set[str] = field(default_factory=set)
    _events: set[asyncio.Task[None]] = field(default_factory=set)

    def enqueue(self, target: ClaimRef | PodRef) -> None:
        if isinstance(target, PodRef) and not self.annotate_pods:
            return
        if target.uid not in self._pending:
            self._pending.add(target.uid)
            if isinstance(target, PodRef):
                self._pod_queue.put_nowait(target)
            else:
                self._queue.put_nowait(target)

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
        """Write each queued claim's entries and each queued pod's annotation, each queue by a worker of
        its own; retry with backoff while the apiserver is away."""
        await asyncio.gather(self._drain(self._queue), self._drain(self._pod_queue))

    async def _drain(self, queue: asyncio.Queue[ClaimRef] | asyncio.Queue[PodRef]) -> None:
        while True:
            target = await queue.get()
            self._pending.discard(target.uid)
            backoff = Backoff()
            conflicts = 0
            while True:
                try:
                    await self.write(target)
                    break
                except GoneError:
                    self._failures.pop(target.uid, None)
                    break  # the claim or pod is gone: nothing to report on
                except ConflictError:
                    conflicts += 1
                    if conflicts <= MAX_CONFLICT_RETRIES:
                        continue  # someone else wrote it meanwhile: read it again
                    log.warning("status write kept conflicting; retrying", extra={"of": target.name})
                except ApiRejectedError as err:
                    if isinstance(target, PodRef):  # refused for good: the annotation is a courtesy
                        log.warning(
                            "network-status refused; not retried",
                            extra={"of": target.name, "error": str(err)},
                        )
                        break
                    log.warning("status write failed; retrying", extra={"of": target.name, "error": str(err)})
                except NetclaimError as err:
                    log.warning("status write failed; retrying", extra={"of": target.name, "error": str(err)})
                except Exception:
                    log.exception("status write failed (a bug); retrying", extra={"of": target.name})
                if target.uid in self._pending:
                    break  # a newer request for it is queued; it will write the latest state
                await backoff.wait()

    async def write(self, target: ClaimRef | PodRef) -> None:
        if isinstance(target, PodRef):
            await self.write_network_status(target)
        else:
            await self.write_claim(target)

    async def write_claim(self, claim: ClaimRef) -> None:
        faults.point("before-status")
        entries = self.desired(claim)
        current = await self.api.get_claim(claim.namespace, claim.name)
        if current.uid != claim.uid:
            return
        if current.unreadable:  # its status.devices were not read: where our entries are is unknown
            raise ConfigError(f"claim {claim.namespace}/{claim.name}: {current.unreadable}")
        ours = [d for d in current.devices_status if d.get("driver") == self.driver]
        if _comparable(ours) == _comparable(entries):
            return
        await self.api.write_claim_devices(current, self.driver, entries)
        log.info(
            "claim status written",
            extra={
                "claim": f"{claim.namespace}/{claim.name}",
                "ready": [e["conditions"][0]["status"] for e in entries],
            },
        )

    async def write_network_status(self, ref: PodRef) -> None:
        rows = self.store.for_pod(ref.uid)
        if not any(row.state == State.ATTACHED for row in rows):
            return  # detached: the pod is going, and its annotation with it
        pod = await self.api.get_pod(ref.namespace, ref.name)
        if pod["metadata"].get("uid") != ref.uid:
            return
        value = json.dumps(network_status(pod, rows))
        if (pod["metadata"].get("annotations") or {}).get(NETWORK_STATUS) == value:
            return
        await self.api.write_pod_annotation(pod, NETWORK_STATUS, value)
        log.info("network-status written", extra={"pod": f"{ref.namespace}/{ref.name}"})

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

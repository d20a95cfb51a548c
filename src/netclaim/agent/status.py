"""ResourceClaim.status.devices (KEP-4817) for our devices, the pods' network-status annotation, and
Warning Events on pods.

Off the hot path: hooks only enqueue a target (a claim, or a pod for its annotation); the writer writes it
from the store. Each target is scheduled on its own: targets that are due go first, a few are written at
once, and a target's own writes never overlap nor reorder (one enqueued while being written is written
once more after). No target holds up another: a write the API refuses (ApiRejectedError, or what can never
be written) is final for its target until it is enqueued again; a gone target is dropped; an unavailable
API or a run of conflicts backs off that target only; a bug is retried with backoff for that target only
and given up after MAX_BUG_ATTEMPTS. Each try is counted in netclaim_status_writes_total{kind,result}.
Entries: `Ready` True with networkData read back from the pod's namespace and, in `data`, the CNI result and
the NIC's network (its `netclaim.dev/network` attribute, when the admin set one: what Services name);
or `Ready` False with the reason and message. An entry is cut to what the API takes, or it would refuse the
whole write: the first MAX_IPS addresses, `data` only up to MAX_DATA_BYTES, names and messages to their
lengths; the condition says what was left out.

The pod annotation `k8s.v1.cni.cncf.io/network-status` has Multus's schema, so the tools that read it keep
working: one entry per interface we attached, named `<namespace>/<the pod's name for the claim>`; entries
of other writers (Multus itself, for one) are kept. Whatever a tenant put there is read without raising:
what is not an entry (not an object, a name that is not a string, nested past what netclaim reads) is
dropped, unreadable to every tool. Written after an attach, guarded by the pod's resourceVersion;
admission lets an agent change only that annotation, only on pods of its own node.

The claim write is a JSON Patch of our entries of `status.devices` guarded by the claim's resourceVersion
(field manager = the driver name): other drivers' entries stay as they are, a concurrent writer makes us
re-read and retry. Not server-side apply: kube-apiserver 1.37 rejects any SSA of the status of a claim
whose opaque config was not sent as canonical JSON (keys unsorted, as lightkube and client-go send them):
the typed round trip re-serialises the config and the immutable `status.allocation` reads as changed.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import ipaddress
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from netclaim.agent.store import Attachment, State, Store
from netclaim.core.config.strict import MAX_DEPTH, too_deep
from netclaim.core.events import EventReason
from netclaim.core.ipam.reservation import with_reservations
from netclaim.core.kubeapi import ClaimsApi, PodAnnotationsApi
from netclaim.core.names import NETWORK
from netclaim.core.objects import Claim, Pod, condition, read_json
from netclaim.errors import (
    ApiForbiddenError,
    ConfigError,
    ConflictError,
    GoneError,
    NetclaimError,
    TransientError,
)
from netclaim.runtime import faults, metrics
from netclaim.runtime.backoff import Backoff
from netclaim.runtime.supervisor import Supervisor

log = logging.getLogger(__name__)
NETWORK_STATUS = "k8s.v1.cni.cncf.io/network-status"
MAX_CONFLICT_RETRIES = 3  # immediate re-reads before backing off
MAX_PARALLEL_WRITES = 4  # targets written at once
MAX_BUG_ATTEMPTS = 5  # tries in a row failing on a bug before a target is given up (until enqueued again)
# A 401/403 is often not the last word: a restarted API server denies for the moment its RBAC
# caches are empty ("clusterrole ... not found"), and an admin fixes RBAC. Retried slowly, then given up.
REFUSED_FIRST_RETRY = 5.0  # seconds; doubled each time: 5, 10, 20, 40, 80, 160 (about 5 min in all)
MAX_REFUSED_RETRIES = 6
# A prepared claim's entries (WaitingForPodSandbox, its pool addresses) are written only if its sandbox has
# not attached by then: the attach's write carries them with Ready, one write instead of two.
INTERIM_AFTER = 5.0  # seconds
# what the API takes in a status.devices entry: ours are cut to fit, or it refuses the whole write
MAX_IPS = 16  # networkData.ips
MAX_INTERFACE_NAME = 256  # networkData.interfaceName
MAX_HARDWARE_ADDRESS = 128  # networkData.hardwareAddress
MAX_DATA_BYTES = 10 * 1024  # data, as JSON

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


Target = ClaimRef | PodRef


@dataclass
class _Queued:
    """A target to write: when it may be tried, and how its tries went since it was last enqueued."""

    due: float
    backoff: Backoff
    bugs: int = 0
    refusals: int = 0
    writing: bool = False
    again: bool = False  # enqueued while being written: written once more after, from the state of then


@dataclass(frozen=True)
class Failure:
    """A claim that could not be prepared: no store rows, but its devices still get a Ready=False entry."""

    devices: tuple[tuple[str, str, str], ...]  # (pool, device, shareID)
    reason: str
    message: str


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def network_data(
    interface: str, addresses: tuple[str, ...], mac: str | None = None
) -> tuple[dict[str, Any], list[str]]:
    """networkData as the API takes it: the addresses in canonical CIDR form, once each, sorted, the first
    MAX_IPS; and what had to be left out."""
    ips = sorted({str(ipaddress.ip_interface(a)) for a in addresses})
    data: dict[str, Any] = {"interfaceName": interface[:MAX_INTERFACE_NAME], "ips": ips[:MAX_IPS]}
    if mac is not None:
        data["hardwareAddress"] = mac[:MAX_HARDWARE_ADDRESS]
    left_out = (
        [f"{len(ips)} addresses: networkData.ips has the first {MAX_IPS}"] if len(ips) > MAX_IPS else []
    )
    return data, left_out


def _cni_data(result: dict[str, Any]) -> tuple[dict[str, Any] | None, list[str]]:
    """The CNI result for `data`, or None and why when the API would not take it."""
    if too_deep(result) is not None:
        return None, [f"the CNI result is left out of data: nested deeper than {MAX_DEPTH} levels"]
    size = len(json.dumps(result, separators=(",", ":")).encode())
    if size > MAX_DATA_BYTES:
        return None, [f"the CNI result ({size} bytes) is left out of data: the API takes {MAX_DATA_BYTES}"]
    return result, []


def _message(message: str, left_out: list[str]) -> str:
    return "; ".join([message, *left_out])


def address_entries(driver: str, row: Attachment) -> list[dict[str, Any]]:
    """The entries of the claim's IP pool devices: their addresses, from the moment they are prepared."""
    entries = []
    for granted in row.plan.pool_addresses:
        entry: dict[str, Any] = {"driver": driver, "pool": granted.pool, "device": granted.device}
        if granted.share_id:
            entry["shareID"] = granted.share_id
        shown, left_out = network_data(row.plan.interface_name, granted.ips)
        message = _message(f"held for the claim from IPPool {granted.device}", left_out)
        entry["conditions"] = [condition("True", "AddressAllocated", message, since=_now())]
        entry["networkData"] = shown
        entries.append(entry)
    return entries


class LinkSight(Protocol):
    """What the node sees of its NICs' links (netclaim.core.devices.catalog.DeviceCatalog)."""

    def link_seen(self, name: str) -> bool: ...

    def link_down_since(self, name: str) -> datetime.datetime | None: ...


def link_condition(row: Attachment, links: LinkSight | None) -> list[dict[str, str]]:
    """`LinkDown` on an attached device whose link the node sees: True from its loss, False otherwise."""
    if links is None or not links.link_seen(row.device):
        return []
    since = links.link_down_since(row.device)
    nic = row.plan.nic.if_name
    if since is None:
        return [condition("False", "CarrierUp", f"{nic} has its link", since=_now(), kind="LinkDown")]
    stamp = since.strftime("%Y-%m-%dT%H:%M:%SZ")
    message = f"{nic} lost its link (no carrier): the pod's {row.plan.interface_name} carries nothing"
    return [condition("True", "NoCarrier", message, since=stamp, kind="LinkDown")]


def device_entry(driver: str, row: Attachment, links: LinkSight | None = None) -> dict[str, Any]:
    entry: dict[str, Any] = {"driver": driver, "pool": row.pool, "device": row.device}
    if row.share_id:
        entry["shareID"] = row.share_id
    interface = row.outcome.interface
    if row.state == State.ATTACHED and interface is not None:
        shown, left_out = network_data(interface.name, interface.addresses, interface.mac)
        data, not_taken = _cni_data(row.outcome.cni_result) if row.outcome.cni_result else (None, [])
        message = _message(f"{interface.name} is configured in the pod", left_out + not_taken)
        entry["conditions"] = [
            condition("True", "InterfaceAttached", message, since=_now()),
            *link_condition(row, links),
        ]
        if row.outcome.check:  # configure.check: what a CNI CHECK found, restored by DEL and ADD
            entry["conditions"].append(
                condition("True", "RepairedByReAdd", row.outcome.check, since=_now(), kind="CheckFailed")
            )
        entry["networkData"] = shown
        network = row.plan.nic.attributes.get(NETWORK)
        if isinstance(network, str):  # what Services and policies name (netclaim.services)
            data = {**(data or {}), NETWORK: network}
        if data is not None:
            entry["data"] = data
    elif row.error:
        entry["conditions"] = [condition("False", "AttachFailed", row.error, since=_now())]
    else:
        reason, message = _REASONS.get(row.state, _REASONS[State.ATTACHING])
        entry["conditions"] = [condition("False", reason, message, since=_now())]
    return entry


def network_status(pod: Pod, rows: list[Attachment]) -> list[dict[str, Any]]:
    """The pod's network-status entries: other writers' as they are, then one per interface we attached."""
    names = {c.claim: c.name for c in pod.claims if c.claim}  # ResourceClaim → the pod's name for it
    kept = _others_entries(pod, {f"{pod.namespace}/{name}" for name in names.values()})
    entries = []
    for row in sorted(rows, key=lambda r: r.plan.interface_name):
        interface = row.outcome.interface
        if row.state != State.ATTACHED or interface is None:
            continue
        entry: dict[str, Any] = {
            "name": f"{pod.namespace}/{names.get(row.claim_name, row.claim_name)}",
            "interface": interface.name,
            "ips": sorted({str(ipaddress.ip_interface(a).ip) for a in interface.addresses}),
            "mac": interface.mac,
            "mtu": interface.mtu,
            "default": False,  # Multus's meaning: the cluster's default network, never ours
            "dns": {},
        }
        pci = row.plan.nic.pci_address
        if not row.plan.shared and pci is not None:
            entry["device-info"] = {"type": "pci", "version": "1.1.0", "pci": {"pci-address": pci}}
        entries.append(entry)
    return kept + entries


def _others_entries(pod: Pod, ours: set[str]) -> list[dict[str, Any]]:
    """The entries of the pod's network-status that other writers own, as they are. What cannot be read
    (not JSON, not a list, an entry that is not an object, a name that is not a string, an entry nested
    deeper than MAX_DEPTH) is not ours to repair, but not ours to keep either: unreadable to every tool."""
    try:
        current = read_json(pod.annotations.get(NETWORK_STATUS, "[]"))
    except ValueError:
        return []
    if not isinstance(current, list):
        return []
    return [
        entry
        for entry in current
        if isinstance(entry, dict)
        and isinstance(entry.get("name"), str)
        and entry["name"] not in ours
        and too_deep(entry) is None
    ]


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
    api: ClaimsApi
    driver: str
    store: Store
    background: Supervisor  # runs each write and each Event, so that a bug in one is never lost
    pods: PodAnnotationsApi | None = None  # the network-status annotation's; None: not written
    links: LinkSight | None = None  # the NICs' links, for the LinkDown condition; None: not written
    retry: Callable[[], Backoff] = Backoff  # each target's backoff
    _queued: dict[Target, _Queued] = field(default_factory=dict)
    _wake: asyncio.Event = field(default_factory=asyncio.Event)
    _failures: dict[str, Failure] = field(default_factory=dict)
    # by claim UID, the claims this node writes, as last read or written: a write guarded by a
    # resourceVersion still current needs no read first (a stale one fails the guard: read again then)
    _known: dict[str, Claim] = field(default_factory=dict)

    def enqueue(self, target: Target, delay: float = 0.0) -> None:
        """Write the target from the state as it is then, in `delay` seconds at the latest, whatever its
        earlier tries."""
        if isinstance(target, PodRef) and self.pods is None:
            return
        due = time.monotonic() + delay
        queued = self._queued.get(target)
        if queued is None:
            self._queued[target] = _Queued(due, self.retry())
        elif queued.writing:
            queued.again = True
        else:
            queued.due, queued.bugs = min(queued.due, due), 0
            queued.backoff.reset()
        self._wake.set()

    def prepared(self, claim: Claim) -> None:
        """The claim was prepared: its entries are written when its sandbox attaches, or INTERIM_AFTER from
        now if that is sooner; the claim as prepare read it saves reading it again for that write."""
        self._known[claim.uid] = claim
        self.enqueue(ClaimRef(claim.namespace, claim.name, claim.uid), delay=INTERIM_AFTER)

    async def prepare_failed(self, claim: ClaimRef, message: str) -> None:
        """A claim whose config cannot work: Ready=False PrepareFailed on its devices of this driver (all on
        this node, or the IP pools'), and a Warning Event on its pod."""
        current = await self.api.get_claim(claim.namespace, claim.name)
        if current.uid != claim.uid:
            return
        devices = tuple((r.pool, r.device, r.share_id) for r in current.results if r.driver == self.driver)
        self.fail(claim, Failure(devices, "PrepareFailed", message))
        for pod in current.reserved_for:
            await self.warn(claim.namespace, pod.name, pod.uid, EventReason.PREPARE_FAILED, message)

    def fail(self, claim: ClaimRef, failure: Failure) -> None:
        self._failures[claim.uid] = failure
        self.enqueue(claim)

    def forget(self, claim: ClaimRef) -> None:
        """The claim was unprepared: its entries go (the store rows are already deleted)."""
        self._failures.pop(claim.uid, None)
        self.enqueue(claim)

    def desired(self, claim: ClaimRef) -> list[dict[str, Any]]:
        rows = self.store.for_claim(claim.uid)
        entries = [device_entry(self.driver, row, self.links) for row in rows]
        entries += [entry for row in rows for entry in address_entries(self.driver, row)]
        failure = self._failures.get(claim.uid)
        if failure is not None and not rows:
            for pool, device, share_id in failure.devices:
                entry: dict[str, Any] = {
                    "driver": self.driver,
                    "pool": pool,
                    "device": device,
                    "conditions": [condition("False", failure.reason, failure.message, since=_now())],
                }
                if share_id:
                    entry["shareID"] = share_id
                entries.append(entry)
        return entries

    async def run(self) -> None:
        """Write the queued targets: those that are due, earliest first, MAX_PARALLEL_WRITES at once; a
        target waiting out its backoff holds up no other."""
        writing: set[asyncio.Task[None]] = set()

        def done(task: asyncio.Task[None]) -> None:
            writing.discard(task)
            self._wake.set()

        try:
            while True:
                self._wake.clear()
                now = time.monotonic()
                waiting = [(q.due, t) for t, q in self._queued.items() if not q.writing]
                due = sorted((w for w in waiting if w[0] <= now), key=lambda w: w[0])
                for _, target in due[: MAX_PARALLEL_WRITES - len(writing)]:
                    self._queued[target].writing = True
                    task = self.background.spawn("status-write", self._write_queued(target))
                    writing.add(task)
                    task.add_done_callback(done)
                later = [when for when, _ in waiting if when > now]
                timeout = min(later) - now if later and len(writing) < MAX_PARALLEL_WRITES else None
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), timeout)
        finally:
            for task in writing:
                task.cancel()
            await asyncio.gather(*writing, return_exceptions=True)

    async def _write_queued(self, target: Target) -> None:
        queued = self._queued[target]
        try:
            result = await self._try(target, queued)
        finally:
            queued.writing = False
        metrics.STATUS_WRITES.labels("pod" if isinstance(target, PodRef) else "claim", result).inc()
        if queued.again:  # enqueued while written: once more, from the state of now
            queued.again, queued.due, queued.bugs, queued.refusals = False, time.monotonic(), 0, 0
            queued.backoff.reset()
        elif result == "refused" and queued.refusals < MAX_REFUSED_RETRIES:
            queued.due = time.monotonic() + REFUSED_FIRST_RETRY * 2**queued.refusals
            queued.refusals += 1
        elif result in ("ok", "gone", "refused", "rejected", "given_up"):
            del self._queued[target]
        else:
            queued.due = time.monotonic() + queued.backoff.next()

    async def _try(self, target: Target, queued: _Queued) -> str:
        """One try at writing the target (a few immediate re-reads on conflicts); its result."""
        where = {"of": f"{target.namespace}/{target.name}"}
        for _ in range(MAX_CONFLICT_RETRIES + 1):
            try:
                await self.write(target)
            except ConflictError:
                continue  # someone else wrote it meanwhile: read it again
            except GoneError:
                self._failures.pop(target.uid, None)
                return "gone"  # the claim or pod is gone: nothing to report on
            except TransientError as err:
                log.info("status write postponed; retrying", extra={**where, "error": str(err)})
                return "unavailable"
            except ApiForbiddenError as err:  # RBAC: retried slowly a few times
                final = queued.refusals >= MAX_REFUSED_RETRIES
                log.warning(
                    "status write refused; not retried until queued again"
                    if final
                    else "status write refused; retrying later",
                    extra={**where, "error": str(err)},
                )
                return "refused"
            except NetclaimError as err:  # what can never be written
                log.warning(
                    "status write rejected; not retried until queued again",
                    extra={**where, "error": str(err)},
                )
                return "rejected"
            except Exception:
                queued.bugs += 1
                if queued.bugs >= MAX_BUG_ATTEMPTS:
                    log.exception("status write failed (a bug); given up until queued again", extra=where)
                    return "given_up"
                log.exception("status write failed (a bug); retrying", extra=where)
                return "error"
            return "ok"
        log.warning("status write kept conflicting; retrying", extra=where)
        return "conflict"

    async def write(self, target: Target) -> None:
        if isinstance(target, PodRef):
            await self.write_network_status(target)
        else:
            await self.write_claim(target)

    async def write_claim(self, claim: ClaimRef) -> None:
        faults.point("before-status")
        entries = self.desired(claim)
        current = self._known.get(claim.uid)
        if current is None:
            current = await self.api.get_claim(claim.namespace, claim.name)
            if current.uid != claim.uid:
                return
            if current.unreadable:  # its status.devices were not read: where our entries are is unknown
                raise ConfigError(f"claim {claim.namespace}/{claim.name}: {current.unreadable}")
        entries = with_reservations(current, entries, _now())
        ours = [d for d in current.devices_status if d.get("driver") == self.driver]
        if _comparable(ours) == _comparable(entries):
            self._keep(current)
            return
        try:
            version = await self.api.write_claim_devices(current, self.driver, entries)
        except (ConflictError, GoneError):
            self._known.pop(claim.uid, None)  # changed or gone since: read again, if at all
            raise
        others = [d for d in current.devices_status if d.get("driver") != self.driver]
        if version is None:
            self._known.pop(claim.uid, None)
        else:
            self._keep(replace(current, resource_version=version, devices_status=(*others, *entries)))
        log.info(
            "claim status written",
            extra={
                "claim": f"{claim.namespace}/{claim.name}",
                "ready": [e["conditions"][0]["status"] for e in entries],
            },
        )

    def _keep(self, claim: Claim) -> None:
        """Remember the claim while this node still has something of it to write, forget it after."""
        if self.store.for_claim(claim.uid) or claim.uid in self._failures:
            self._known[claim.uid] = claim
        else:
            self._known.pop(claim.uid, None)

    async def write_network_status(self, ref: PodRef) -> None:
        rows = self.store.for_pod(ref.uid)
        if not any(row.state == State.ATTACHED for row in rows):
            return  # detached: the pod is going, and its annotation with it
        if self.pods is None:
            return
        pod = await self.pods.get_pod(ref.namespace, ref.name)
        if pod.uid != ref.uid:
            return
        value = json.dumps(network_status(pod, rows))
        if pod.annotations.get(NETWORK_STATUS) == value:
            return
        await self.pods.write_pod_annotation(pod, NETWORK_STATUS, value)
        log.info("network-status written", extra={"pod": f"{ref.namespace}/{ref.name}"})

    def tell_pod_later(
        self, claim: ClaimRef, pod_uid: str, reason: EventReason, message: str, warning: bool
    ) -> None:
        """An Event on the claim's pod `pod_uid`, named as the claim's reservedFor names it, written off
        the caller's path."""

        async def tell() -> None:
            try:
                known = self._known.get(claim.uid) or await self.api.get_claim(claim.namespace, claim.name)
            except NetclaimError as err:
                log.info("could not record a pod event", extra={"error": str(err)})
                return
            for pod in known.reserved_for:
                if pod.uid == pod_uid:
                    await self.warn(claim.namespace, pod.name, pod_uid, reason, message, warning)

        self.background.spawn("pod-event", tell())

    def warn_later(self, pod: PodRef, reason: EventReason, message: str) -> None:
        """A Warning Event on the pod, written off the caller's path (never inside the runtime's budget)."""
        self.background.spawn("pod-event", self.warn(pod.namespace, pod.name, pod.uid, reason, message))

    async def warn(
        self, namespace: str, pod: str, pod_uid: str, reason: EventReason, message: str, warning: bool = True
    ) -> None:
        """A Warning (or Normal) Event on the pod (best effort: failures are logged, never raised)."""
        try:
            await self.api.create_pod_event(namespace, pod, pod_uid, reason, message, warning)
        except NetclaimError as err:
            log.info("could not record a pod event", extra={"error": str(err)})


class LinkEvents(LinkSight, Protocol):
    """The NICs' links as kubelet's health stream sees them (netclaim.core.devices.catalog.DeviceCatalog)."""

    def device_problems(self) -> dict[str, str | None]: ...

    async def health_changed(self) -> None: ...


async def follow_links(links: LinkEvents, store: Store, status: StatusWriter) -> None:
    """At each change of a NIC's link: the LinkDown condition of every claim attached to it written again,
    and an Event on each of their pods."""
    seen = links.device_problems()
    while True:
        await links.health_changed()
        now = links.device_problems()
        changed = {name for name in seen.keys() | now.keys() if seen.get(name) != now.get(name)}
        seen = now
        for row in store.all():
            if row.device not in changed or row.state != State.ATTACHED:
                continue
            claim = ClaimRef(row.claim_namespace, row.claim_name, row.claim_uid)
            status.enqueue(claim)
            problem = now.get(row.device)
            if problem is not None:
                status.tell_pod_later(claim, row.pod_uid, EventReason.LINK_DOWN, problem, warning=True)
            else:
                message = (
                    f"{row.plan.nic.if_name} has its link again: {row.plan.interface_name} carries traffic"
                )
                status.tell_pod_later(claim, row.pod_uid, EventReason.LINK_UP, message, warning=False)

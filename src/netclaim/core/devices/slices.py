"""The one ResourceSlice writer: the slices of one pool of one driver, written only when they must change.

Both of netclaim's pools go through it: a node's NICs (netclaim.agent.publish.publisher: the pool named after
the node, owned by its Node) and the IP pools (netclaim.core.ipam.pools: the pool of all nodes, owned by the
IPPool CRD). Its rules:
- own slices only: named `<prefix>-<index>` and owned by the owner's UID. Another writer's slice in the
  same pool never decides what is written nor its generation, and is never deleted;
- devices of one capacity (values and request policies) share slices, others never: Kubernetes 1.34's
  scheduler checks a request's capacity against the slice's device at the request's own index (0 for one
  device) instead of the device it picked (kubernetes/kubernetes#133705, fixed in 1.35), so a 25G NIC
  listed after a 1G one took no share above 1G. Within a slice every device has the same capacity, and
  the wrong device's check is the right one's; a node of like NICs is still one slice;
- devices sorted by name within their capacity, at most MAX_DEVICES_PER_SLICE a slice, slices in the
  order of their first device's name; no device is still one slice ("none");
- no write while the own slices hold what they should (devices compared as the API spells them back),
  all of one generation, with the right count;
- any change is a new generation of every slice, as consumers use only the highest generation and need
  all of its slices; bounded: at MAX_GENERATION the own slices are deleted and counting starts again;
- the slices of a generation are written at once (one HTTP/2 connection carries them: 8 slices one after
  another took 1-3 s on a busy API server), then the stale ones deleted.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from netclaim.core.kubeapi import SliceStoreApi
from netclaim.core.objects import Slice
from netclaim.core.quantity import parse_quantity
from netclaim.errors import NetclaimError
from netclaim.runtime import metrics

log = logging.getLogger(__name__)
# The API allows 128 devices a slice, but 64 once any of them has a taint, as a NIC gets when its link
# goes down: 64 always, so that a link going down never reshapes the node's slices.
MAX_DEVICES_PER_SLICE = 64
MAX_GENERATION = 2**62  # started again before it could ever pass int64

ApiDevice = dict[str, Any]  # a device as ResourceSlice.spec.devices has it


def _normalized_capacity(capacity: dict[str, Any]) -> dict[str, Any]:
    """Quantities as numbers, so `1024Mi` written and `1Gi` read back compare equal."""

    def number(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: number(v) for k, v in value.items() if v is not None}
        return parse_quantity(value) if isinstance(value, str | int) else value

    return {name: number(entry) for name, entry in capacity.items()}


# Fields of a device the API server drops without a word when a feature gate is off, and that gate.
GATED_FIELDS = {
    "allowMultipleAllocations": "DRAConsumableCapacity",
    "capacity.requestPolicy": "DRAConsumableCapacity",
    "taints": "DRADeviceTaints",
    # the pools' devices (netclaim.core.ipam.reservation); the failure conditions go with them
    "bindingConditions": "DRADeviceBindingConditions",
}
# How long a pool compares its slices without the fields the API server dropped before it writes them in
# full once more: a gate turned on meanwhile is then used, one still off costs one write per this period.
DROPPED_RECHECK_SECONDS = 600.0


def normalized_device(device: ApiDevice, dropped: frozenset[str] = frozenset()) -> dict[str, Any]:
    """The fields netclaim writes, in a form that compares equal across a round trip to the apiserver;
    without the `dropped` ones (GATED_FIELDS the API server does not keep)."""
    attributes = {
        name: {k: v for k, v in value.items() if v is not None}
        for name, value in (device.get("attributes") or {}).items()
    }
    capacity = _normalized_capacity(device.get("capacity") or {})
    if "capacity.requestPolicy" in dropped:
        capacity = {
            name: {k: v for k, v in entry.items() if k != "requestPolicy"} for name, entry in capacity.items()
        }
    normalized: dict[str, Any] = {"name": device["name"], "attributes": attributes, "capacity": capacity}
    if "allowMultipleAllocations" not in dropped:
        normalized["allowMultipleAllocations"] = bool(device.get("allowMultipleAllocations"))
    if "taints" not in dropped:
        # timeAdded left out: the API server stamps a taint written without it, and a restarted agent
        # would otherwise rewrite a down NIC's slice only to move the time of the loss
        normalized["taints"] = [
            {k: v for k, v in taint.items() if k != "timeAdded" and v is not None}
            for taint in device.get("taints") or []
        ]
    if "bindingConditions" not in dropped:
        for field in ("bindingConditions", "bindingFailureConditions"):
            normalized[field] = list(device.get(field) or [])
    return normalized


def dropped_fields(sent: Sequence[ApiDevice], stored: Sequence[ApiDevice]) -> frozenset[str]:
    """The GATED_FIELDS that `sent` devices had and the API server's `stored` ones lack."""
    kept = {d.get("name"): d for d in stored}
    found = set()
    for device in sent:
        answer = kept.get(device["name"], {})
        for field in ("allowMultipleAllocations", "taints", "bindingConditions"):
            if device.get(field) and not answer.get(field):
                found.add(field)
        stored_capacity = answer.get("capacity") or {}
        for name, entry in (device.get("capacity") or {}).items():
            if entry.get("requestPolicy") and not (stored_capacity.get(name) or {}).get("requestPolicy"):
                found.add("capacity.requestPolicy")
    return frozenset(found)


@dataclass(frozen=True)
class DroppedFields:
    """What the API server kept of a write: the GATED_FIELDS it dropped (none: all kept), in words, and
    whether any of them is dropped for the first time (an Event then)."""

    fields: frozenset[str]
    message: str
    new: bool


_DROPPED_EFFECTS = {
    "allowMultipleAllocations": "shared NICs and IP pools cannot be allocated as shared",
    "capacity.requestPolicy": "shared NICs and IP pools cannot be allocated as shared",
    "taints": "link-down taints are not kept",
    "bindingConditions": "pool addresses are taken at prepare, not reserved before the pod binds",
}


def dropped_message(dropped: frozenset[str]) -> str:
    if not dropped:
        return "the API server keeps every field of netclaim's ResourceSlices"
    gates = sorted({GATED_FIELDS[f] for f in dropped})
    effects = sorted({_DROPPED_EFFECTS[f] for f in dropped})
    return (
        f"the API server drops {', '.join(sorted(dropped))} from netclaim's ResourceSlices: feature gate "
        f"{' and '.join(gates)} is off in kube-apiserver. Published without them ({'; '.join(effects)}); "
        "enable the gate on kube-apiserver, kube-scheduler, kube-controller-manager and kubelet"
    )


def chunk(devices: Sequence[ApiDevice], size: int = MAX_DEVICES_PER_SLICE) -> list[list[ApiDevice]]:
    by_capacity: dict[str, list[ApiDevice]] = {}
    for device in sorted(devices, key=lambda d: str(d["name"])):
        by_capacity.setdefault(json.dumps(device.get("capacity"), sort_keys=True), []).append(device)
    return [group[i : i + size] for group in by_capacity.values() for i in range(0, len(group), size)] or [[]]


@dataclass(frozen=True)
class SliceOwner:
    """The object a pool's slices belong to: the garbage collector removes them with it."""

    api_version: str
    kind: str
    name: str
    uid: Callable[[], Awaitable[str]]  # asks the API for its UID now
    controller: bool = False
    # Asked on every pass, or only on the first and before each write. A Node registered again has a new
    # UID and its slices are collected, which the agent's slice watch sees: asking before writes is
    # enough, and a pass that changes nothing reads one list. The controller watches no slices: a CRD
    # created again is seen only by asking.
    asked_every_pass: bool = False

    def reference(self, uid: str) -> dict[str, Any]:
        reference: dict[str, Any] = {
            "apiVersion": self.api_version,
            "kind": self.kind,
            "name": self.name,
            "uid": uid,
        }
        if self.controller:
            reference["controller"] = True
        return reference


class SliceWriter:
    """The slices of `driver`'s pool `pool`, named `<prefix>-<index>`, on node `node` (None: all nodes)."""

    def __init__(
        self,
        api: SliceStoreApi,
        driver: str,
        pool: str,
        prefix: str,
        owner: SliceOwner,
        node: str | None = None,
        on_dropped: Callable[[DroppedFields], Awaitable[None]] | None = None,
    ) -> None:
        self.api = api
        self.driver = driver
        self.pool = pool
        self.prefix = prefix
        self.owner = owner
        self.node = node
        self.on_dropped = on_dropped  # told what the API server keeps of our writes, each time that changes
        self._owner_uid: str | None = None  # the UID last asked
        self._dropped: frozenset[str] = frozenset()  # GATED_FIELDS the API server did not keep
        self._dropped_since = 0.0
        self._told: frozenset[str] = frozenset()  # the fields warned about (once each)
        self._reported: frozenset[str] | None = None  # what on_dropped was last told

    @property
    def dropped(self) -> frozenset[str]:
        """The fields the slices are compared without: those the API server dropped, until it is time to
        write them in full once more (DROPPED_RECHECK_SECONDS)."""
        if self._dropped and time.monotonic() - self._dropped_since > DROPPED_RECHECK_SECONDS:
            self._dropped = frozenset()
        return self._dropped

    def slice_name(self, index: int) -> str:
        return f"{self.prefix}-{index}"

    async def _list(self) -> list[Slice]:
        return await self.api.list_slices(self.driver, self.pool, self.node)  # a node's: its share only

    def _own(self, listed: list[Slice], owner_uid: str) -> list[Slice]:
        return [s for s in listed if s.name.startswith(f"{self.prefix}-") and s.owner_uids == (owner_uid,)]

    def up_to_date(self, own: list[Slice], desired: list[list[ApiDevice]]) -> bool:
        by_name = {s.name: s for s in own}
        if set(by_name) != {self.slice_name(i) for i in range(len(desired))}:
            return False
        if len({s.generation for s in own}) != 1:
            return False
        for index, devices in enumerate(desired):
            stored = by_name[self.slice_name(index)]
            if stored.pool != self.pool or stored.slice_count != len(desired):
                return False
            dropped = self.dropped
            wanted = [normalized_device(d, dropped) for d in devices]
            if [normalized_device(d, dropped) for d in stored.devices] != wanted:
                return False
        return True

    def bodies(self, devices: Sequence[ApiDevice], generation: int, owner_uid: str) -> list[dict[str, Any]]:
        desired = chunk(devices)
        where: dict[str, Any] = {"nodeName": self.node} if self.node is not None else {"allNodes": True}
        return [
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceSlice",
                "metadata": {
                    "name": self.slice_name(index),
                    "ownerReferences": [self.owner.reference(owner_uid)],
                },
                "spec": {
                    "driver": self.driver,
                    **where,
                    "pool": {"name": self.pool, "generation": generation, "resourceSliceCount": len(desired)},
                    "devices": part,
                },
            }
            for index, part in enumerate(desired)
        ]

    async def write(self, devices: Sequence[ApiDevice]) -> int:
        """Make the pool hold exactly `devices`; returns how many API writes that took (0 when current)."""
        desired = chunk(devices)
        asked = self.owner.asked_every_pass or self._owner_uid is None
        if asked:
            listed, self._owner_uid = await asyncio.gather(self._list(), self.owner.uid())
        else:
            listed = await self._list()
        assert self._owner_uid is not None
        if self.up_to_date(self._own(listed, self._owner_uid), desired):
            return 0
        if not asked:
            self._owner_uid = await self.owner.uid()
        own = self._own(listed, self._owner_uid)
        generation = max((s.generation for s in own), default=0)
        writes = 0
        if generation >= MAX_GENERATION:
            writes += await self._delete([s.name for s in own])
            log.warning("ResourceSlices started again at generation 1", extra={"pool": self.pool})
            own, generation = [], 0
        bodies = self.bodies(devices, generation + 1, self._owner_uid)
        results = await asyncio.gather(*(self.api.apply_slice(b) for b in bodies), return_exceptions=True)
        applied = sum(1 for r in results if not isinstance(r, BaseException))
        metrics.SLICE_WRITES.labels("apply").inc(applied)
        failed = [r for r in results if isinstance(r, BaseException)]
        if failed:
            raise failed[0]
        stored = [device for result in results if not isinstance(result, BaseException) for device in result]
        await self._notice_dropped(dropped_fields(devices, stored))
        wanted = {b["metadata"]["name"] for b in bodies}
        writes += applied + await self._delete([s.name for s in own if s.name not in wanted])
        log.info(
            "ResourceSlices written",
            extra={
                "pool": self.pool,
                "devices": len(devices),
                "slices": len(bodies),
                "generation": generation + 1,
                "writes": writes,
            },
        )
        return writes

    async def _notice_dropped(self, dropped: frozenset[str]) -> None:
        """Compare without what the API server dropped (no write loop on a gate that is off); warn once per
        field, set the metric, and tell `on_dropped` (the Node's condition and Event) on each change, the
        first write included: an agent started after the gate was turned on clears what an earlier said."""
        self._dropped, self._dropped_since = dropped, time.monotonic()
        for field in GATED_FIELDS:
            metrics.DROPPED_FIELDS.labels(self.pool if self.node is None else "node", field).set(
                1 if field in dropped else 0
            )
        news = dropped - self._told
        self._told |= dropped
        report = DroppedFields(dropped, dropped_message(dropped), bool(news))
        if news:
            log.warning(report.message, extra={"pool": self.pool, "problem": sorted(dropped)})
        if self.on_dropped is None or dropped == self._reported:
            return
        try:
            await self.on_dropped(report)
            self._reported = dropped
        except NetclaimError as err:
            log.info("could not record the dropped fields on the Node", extra={"error": str(err)})

    async def _delete(self, names: list[str]) -> int:
        await asyncio.gather(*(self.api.delete_slice(name) for name in names))
        metrics.SLICE_WRITES.labels("delete").inc(len(names))
        return len(names)

    async def remove_all(self) -> None:
        """Delete every slice of this writer's names (whoever owns them now: the owner may be gone)."""
        listed = await self._list()
        await self._delete([s.name for s in listed if s.name.startswith(f"{self.prefix}-")])

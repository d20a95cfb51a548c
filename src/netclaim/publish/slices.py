"""The one ResourceSlice writer: the slices of one pool of one driver, written only when they must change.

Both of netclaim's pools go through it: a node's NICs (netclaim.publish.publisher: the pool named after
the node, owned by its Node) and the IP pools (netclaim.ipam.pools: the pool of all nodes, owned by the
IPPool CRD). Its rules:
- own slices only: named `<prefix>-<index>` and owned by the owner's UID. Another writer's slice in the
  same pool never decides what is written nor its generation, and is never deleted;
- devices sorted by name, at most MAX_DEVICES_PER_SLICE a slice; no device is still one slice ("none");
- no write while the own slices hold what they should (devices compared as the API spells them back),
  all of one generation, with the right count;
- any change is a new generation of every slice, as consumers use only the highest generation and need
  all of its slices; bounded: at MAX_GENERATION the own slices are deleted and counting starts again;
- the slices of a generation are written at once (one HTTP/2 connection carries them: 8 slices one after
  another took 1-3 s on a busy API server), then the stale ones deleted.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from netclaim import metrics
from netclaim.kubeapi import SliceStoreApi
from netclaim.objects import Slice
from netclaim.quantity import parse_quantity

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


def normalized_device(device: ApiDevice) -> dict[str, Any]:
    """The fields netclaim writes, in a form that compares equal across a round trip to the apiserver."""
    attributes = {
        name: {k: v for k, v in value.items() if v is not None}
        for name, value in (device.get("attributes") or {}).items()
    }
    return {
        "name": device["name"],
        "attributes": attributes,
        "capacity": _normalized_capacity(device.get("capacity") or {}),
        "allowMultipleAllocations": bool(device.get("allowMultipleAllocations")),
        # timeAdded left out: the API server stamps a taint written without it, and a restarted agent
        # would otherwise rewrite a down NIC's slice only to move the time of the loss
        "taints": [
            {k: v for k, v in taint.items() if k != "timeAdded" and v is not None}
            for taint in device.get("taints") or []
        ],
    }


def chunk(devices: Sequence[ApiDevice], size: int = MAX_DEVICES_PER_SLICE) -> list[list[ApiDevice]]:
    ordered = sorted(devices, key=lambda d: str(d["name"]))
    return [ordered[i : i + size] for i in range(0, len(ordered), size)] or [[]]


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
    ) -> None:
        self.api = api
        self.driver = driver
        self.pool = pool
        self.prefix = prefix
        self.owner = owner
        self.node = node
        self._owner_uid: str | None = None  # the UID last asked

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
            if [normalized_device(d) for d in stored.devices] != [normalized_device(d) for d in devices]:
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

    async def _delete(self, names: list[str]) -> int:
        await asyncio.gather(*(self.api.delete_slice(name) for name in names))
        metrics.SLICE_WRITES.labels("delete").inc(len(names))
        return len(names)

    async def remove_all(self) -> None:
        """Delete every slice of this writer's names (whoever owns them now: the owner may be gone)."""
        listed = await self._list()
        await self._delete([s.name for s in listed if s.name.startswith(f"{self.prefix}-")])

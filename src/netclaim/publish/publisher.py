"""ResourceSlices of one node's pool: written only when their content must change.

Pool name = node name. Devices are sorted by name and cut into slices of at most 128; any change bumps
the pool's generation in every slice and sets `resourceSliceCount`, as consumers use only the highest
generation and need all of its slices. An unchanged desired state makes no API write at all.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from netclaim import metrics
from netclaim.kubeapi import SlicesApi
from netclaim.objects import Slice
from netclaim.publish.devices import Device
from netclaim.quantity import parse_quantity

log = logging.getLogger(__name__)

MAX_DEVICES_PER_SLICE = 128


def _normalized_capacity(capacity: dict[str, Any]) -> dict[str, Any]:
    """Quantities as numbers, so `1024Mi` written and `1Gi` read back compare equal."""

    def number(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: number(v) for k, v in value.items() if v is not None}
        return parse_quantity(value) if isinstance(value, str | int) else value

    return {name: number(entry) for name, entry in capacity.items()}


def normalized_device(device: dict[str, Any]) -> dict[str, Any]:
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
    }


def chunk(devices: list[Device], size: int = MAX_DEVICES_PER_SLICE) -> list[list[Device]]:
    ordered = sorted(devices, key=lambda d: d.name)
    return [ordered[i : i + size] for i in range(0, len(ordered), size)] or [[]]


class SlicePublisher:
    def __init__(self, api: SlicesApi, node: str, driver: str) -> None:
        self.api = api
        self.node = node
        self.driver = driver

    def slice_name(self, index: int) -> str:
        return f"{self.node}-{self.driver}-{index}"

    def up_to_date(self, current: list[Slice], desired: list[list[Device]]) -> bool:
        by_name = {s.name: s for s in current}
        if set(by_name) != {self.slice_name(i) for i in range(len(desired))}:
            return False
        if len({s.generation for s in current}) != 1:
            return False
        for index, devices in enumerate(desired):
            stored = by_name[self.slice_name(index)]
            if stored.pool != self.node or stored.slice_count != len(desired):
                return False
            if [normalized_device(d) for d in stored.devices] != [
                normalized_device(d.to_api()) for d in devices
            ]:
                return False
        return True

    def slice_body(
        self, index: int, devices: list[Device], generation: int, count: int, node_uid: str
    ) -> dict[str, Any]:
        owner = {"apiVersion": "v1", "kind": "Node", "name": self.node, "uid": node_uid, "controller": True}
        return {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": self.slice_name(index), "ownerReferences": [owner]},
            "spec": {
                "driver": self.driver,
                "nodeName": self.node,
                "pool": {"name": self.node, "generation": generation, "resourceSliceCount": count},
                "devices": [d.to_api() for d in devices],
            },
        }

    async def publish(self, devices: list[Device]) -> int:
        """Make the pool hold exactly `devices`; returns how many API writes that took (0 when current)."""
        started = time.monotonic()
        desired = chunk(devices)
        current = await self.api.list_slices(self.node, self.driver)
        metrics.PUBLISHED_DEVICES.set(len(devices))
        if self.up_to_date(current, desired):
            metrics.LAST_PUBLISH.set_to_current_time()
            return 0
        generation = max((s.generation for s in current), default=0) + 1
        # asked on every write (they are rare): a Node deleted and registered again has a new UID, and
        # slices owned by the old one would be collected as soon as they are written
        node_uid = await self.api.node_uid(self.node)
        bodies = [
            self.slice_body(index, slice_devices, generation, len(desired), node_uid)
            for index, slice_devices in enumerate(desired)
        ]
        # all at once (one HTTP/2 connection carries them): the scheduler waits for every slice of a new
        # generation anyway, and 8 slices one after another took 1-3 s on a busy API server
        results = await asyncio.gather(*(self.api.apply_slice(b) for b in bodies), return_exceptions=True)
        writes = sum(1 for r in results if not isinstance(r, BaseException))
        metrics.SLICE_WRITES.labels("apply").inc(writes)
        failed = [r for r in results if isinstance(r, BaseException)]
        if failed:
            raise failed[0]
        wanted = {self.slice_name(i) for i in range(len(desired))}
        for stale in current:
            if stale.name not in wanted:
                await self.api.delete_slice(stale.name)
                metrics.SLICE_WRITES.labels("delete").inc()
                writes += 1
        elapsed = time.monotonic() - started
        metrics.PUBLISH_SECONDS.observe(elapsed)
        metrics.LAST_PUBLISH.set_to_current_time()
        log.info(
            "published",
            extra={
                "devices": len(devices),
                "slices": len(desired),
                "generation": generation,
                "writes": writes,
                "seconds": round(elapsed, 3),
            },
        )
        return writes

    async def remove_all(self) -> None:
        for current in await self.api.list_slices(self.node, self.driver):
            await self.api.delete_slice(current.name)
            metrics.SLICE_WRITES.labels("delete").inc()

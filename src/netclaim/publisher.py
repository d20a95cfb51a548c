"""ResourceSlices of one node's pool: written only when their content must change.

Pool name = node name. Devices are sorted by name and cut into slices of at most 128; any change bumps
the pool's generation in every slice and sets `resourceSliceCount`, as consumers use only the highest
generation and need all of its slices. An unchanged desired state makes no API write at all.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from lightkube import AsyncClient
from lightkube.core.client import FieldSelector
from lightkube.core.exceptions import ApiError
from lightkube.models.meta_v1 import ObjectMeta, OwnerReference
from lightkube.resources.core_v1 import Node
from lightkube.resources.resource_v1 import ResourceSlice

from netclaim import metrics
from netclaim.devices import Device
from netclaim.kube import is_not_found
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
    def __init__(self, client: AsyncClient, node: str, driver: str) -> None:
        self.client = client
        self.node = node
        self.driver = driver
        self._owner: OwnerReference | None = None

    def slice_name(self, index: int) -> str:
        return f"{self.node}-{self.driver}-{index}"

    async def current(self) -> list[ResourceSlice]:
        selector: FieldSelector = {"spec.nodeName": self.node, "spec.driver": self.driver}
        return [s async for s in self.client.list(ResourceSlice, fields=selector)]

    async def _owner_reference(self) -> OwnerReference:
        if self._owner is None:
            node = await self.client.get(Node, self.node)
            assert node.metadata is not None and node.metadata.uid is not None
            self._owner = OwnerReference(
                apiVersion="v1", kind="Node", name=self.node, uid=node.metadata.uid, controller=True
            )
        return self._owner

    def _up_to_date(self, current: list[ResourceSlice], desired: list[list[Device]]) -> bool:
        by_name = {s.metadata.name: s for s in current if s.metadata is not None}
        if set(by_name) != {self.slice_name(i) for i in range(len(desired))}:
            return False
        generations = {s.spec.pool.generation for s in current}
        if len(generations) != 1:
            return False
        for index, devices in enumerate(desired):
            spec = by_name[self.slice_name(index)].spec
            if spec.pool.name != self.node or spec.pool.resourceSliceCount != len(desired):
                return False
            stored = [normalized_device(d.to_dict()) for d in spec.devices or []]
            if stored != [normalized_device(d.to_api()) for d in devices]:
                return False
        return True

    async def publish(self, devices: list[Device]) -> int:
        """Make the pool hold exactly `devices`; returns how many API writes that took (0 when current)."""
        started = time.monotonic()
        desired = chunk(devices)
        current = await self.current()
        metrics.PUBLISHED_DEVICES.set(len(devices))
        if self._up_to_date(current, desired):
            metrics.LAST_PUBLISH.set_to_current_time()
            return 0
        generation = max((s.spec.pool.generation for s in current), default=0) + 1
        owner = await self._owner_reference()
        writes = 0
        for index, slice_devices in enumerate(desired):
            body = ResourceSlice.from_dict(
                {
                    "apiVersion": "resource.k8s.io/v1",
                    "kind": "ResourceSlice",
                    "metadata": {"name": self.slice_name(index)},
                    "spec": {
                        "driver": self.driver,
                        "nodeName": self.node,
                        "pool": {
                            "name": self.node,
                            "generation": generation,
                            "resourceSliceCount": len(desired),
                        },
                        "devices": [d.to_api() for d in slice_devices],
                    },
                }
            )
            assert isinstance(body, ResourceSlice) and body.metadata is not None
            body.metadata = ObjectMeta(name=self.slice_name(index), ownerReferences=[owner])
            await self.client.apply(body, field_manager=self.driver, force=True)
            metrics.SLICE_WRITES.labels("apply").inc()
            writes += 1
        wanted = {self.slice_name(i) for i in range(len(desired))}
        for stale in current:
            if stale.metadata is not None and stale.metadata.name not in wanted:
                await self._delete(str(stale.metadata.name))
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

    async def _delete(self, name: str) -> None:
        try:
            await self.client.delete(ResourceSlice, name)
            metrics.SLICE_WRITES.labels("delete").inc()
        except ApiError as err:
            if not is_not_found(err):
                raise

    async def remove_all(self) -> None:
        for current in await self.current():
            if current.metadata is not None:
                await self._delete(str(current.metadata.name))

"""The ResourceSlices netclaim publishes, their owners, and DeviceClasses: the agent's NodeSlicesApi and the
controller's PoolSlicesApi."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

from lightkube.models.core_v1 import ObjectReference
from lightkube.resources.apiextensions_v1 import CustomResourceDefinition
from lightkube.resources.core_v1 import Node
from lightkube.resources.resource_v1 import DeviceClass, ResourceSlice
from lightkube.types import PatchType

from netclaim.adapters.kube.connection import SLICES, KubeConnection, as_data, selector, translated
from netclaim.core.events import EventReason
from netclaim.core.kubeapi import NodeSlicesApi, PoolSlicesApi
from netclaim.core.objects import Slice
from netclaim.errors import GoneError


class KubeSlices(NodeSlicesApi, PoolSlicesApi):
    """Through lightkube: slices, nodes, CRDs and DeviceClasses carry nothing a tenant nests."""

    def __init__(self, kube: KubeConnection) -> None:
        self.kube = kube

    async def list_slices(self, driver: str, pool: str, node: str | None = None) -> list[Slice]:
        """Selected by driver (and node) on the server, by pool here: the API selects no slice by pool."""
        fields: dict[str, Any] = {"spec.driver": driver}
        if node is not None:
            fields["spec.nodeName"] = node
        with translated(f"ResourceSlices of driver {driver}" + (f" on node {node}" if node else "")):
            found = [as_data(s) async for s in self.kube.client.list(ResourceSlice, fields=fields)]
        return [Slice.from_api(s) for s in found if s["spec"]["pool"]["name"] == pool]

    async def apply_slice(self, body: dict[str, Any]) -> list[dict[str, Any]]:
        resource = ResourceSlice.from_dict(body)
        assert isinstance(resource, ResourceSlice)
        with translated(f"ResourceSlice {body['metadata']['name']}"):
            stored = await self.kube.client.apply(resource, field_manager=self.kube.field_manager, force=True)
        devices: list[dict[str, Any]] = as_data(stored)["spec"].get("devices") or []
        return devices

    async def delete_slice(self, name: str) -> None:
        with contextlib.suppress(GoneError), translated(f"ResourceSlice {name}"):
            await self.kube.client.delete(ResourceSlice, name)

    async def slice_changes(self, node: str, driver: str) -> AsyncIterator[str]:
        fields = selector({"spec.nodeName": node, "spec.driver": driver})
        async for kind, _ in self.kube.watch(f"watch of node {node}'s ResourceSlices", SLICES.path(), fields):
            yield kind

    async def node_uid(self, node: str) -> str:
        with translated(f"node {node}"):
            found = await self.kube.client.get(Node, node)
        assert found.metadata is not None
        return str(found.metadata.uid)

    async def create_node_event(self, node: str, node_uid: str, reason: EventReason, message: str) -> None:
        involved = ObjectReference(kind="Node", apiVersion="v1", name=node, uid=node_uid)
        await self.kube.create_event(involved, reason, message)

    async def set_node_condition(self, node: str, condition: dict[str, str]) -> None:
        now = datetime.now(UTC).replace(microsecond=0)
        with translated(f"node {node}'s status"):
            found = await self.kube.client.get(Node, node)
            listed = (found.status.conditions if found.status else None) or []
            before = next((c for c in listed if c.type == condition["type"]), None)
            since = now  # the status moves, or the condition is new
            if before is not None and before.status == condition["status"] and before.lastTransitionTime:
                since = before.lastTransitionTime
            entry = {**condition, "lastHeartbeatTime": _stamp(now), "lastTransitionTime": _stamp(since)}
            await self.kube.client.patch(
                Node.Status,
                node,
                {"status": {"conditions": [entry]}},
                patch_type=PatchType.STRATEGIC,
                field_manager=self.kube.field_manager,
            )

    async def crd_uid(self, name: str) -> str:
        with translated(f"CustomResourceDefinition {name}"):
            found = await self.kube.client.get(CustomResourceDefinition, name)
        assert found.metadata is not None and found.metadata.uid is not None
        return found.metadata.uid

    async def device_class_exists(self, name: str) -> bool:
        try:
            with translated(f"DeviceClass {name}"):
                await self.kube.client.get(DeviceClass, name)
        except GoneError:
            return False
        return True


def _stamp(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")

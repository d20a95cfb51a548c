"""Services over a netclaim network, the pods they select and their EndpointSlices: the controller's
NetworkServicesApi. Read as JSON (read_json: no recursion), like claims; slices written by server-side apply
with the connection's field manager."""

from __future__ import annotations

import contextlib
import json
from typing import Any

from lightkube.models.core_v1 import ObjectReference

from netclaim.adapters.kube.connection import (
    ENDPOINT_SLICES,
    KubeConnection,
    raise_for_status,
    translated,
)
from netclaim.core.events import EventReason
from netclaim.core.kubeapi import NetworkServicesApi
from netclaim.errors import GoneError

APPLY = "application/apply-patch+yaml"  # JSON is YAML: the API server takes either


class KubeServices(NetworkServicesApi):
    def __init__(self, kube: KubeConnection) -> None:
        self.kube = kube

    async def apply_endpoint_slice(self, body: dict[str, Any]) -> None:
        meta = body["metadata"]
        path = ENDPOINT_SLICES.path(meta["namespace"], meta["name"])
        with translated(f"EndpointSlice {meta['namespace']}/{meta['name']}"):
            response = await self.kube.http.patch(
                path,
                content=json.dumps(body).encode(),
                headers={"Content-Type": APPLY},
                params={"fieldManager": self.kube.field_manager, "force": "true"},
            )
            raise_for_status(response)

    async def delete_endpoint_slice(self, namespace: str, name: str) -> None:
        with contextlib.suppress(GoneError), translated(f"EndpointSlice {namespace}/{name}"):
            response = await self.kube.http.delete(ENDPOINT_SLICES.path(namespace, name))
            raise_for_status(response)

    async def create_service_event(
        self, namespace: str, service: str, service_uid: str, reason: EventReason, message: str
    ) -> None:
        involved = ObjectReference(
            kind="Service", apiVersion="v1", name=service, namespace=namespace, uid=service_uid
        )
        await self.kube.create_event(involved, reason, message)

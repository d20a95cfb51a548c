"""What the operator tools read (`netclaim explain`, `status`, `nics`), with read access only."""

from __future__ import annotations

import contextlib
from typing import Any

from lightkube.resources.core_v1 import Node, Pod
from lightkube.resources.discovery_v1 import EndpointSlice
from lightkube.resources.resource_v1 import DeviceClass, ResourceClaim, ResourceClaimTemplate, ResourceSlice

from netclaim.adapters.kube.connection import CLAIMS, POLICIES, KubeConnection, as_data, translated
from netclaim.core.names import DRIVER_DOMAIN, SLICE_MANAGED_BY
from netclaim.core.objects import ListItems
from netclaim.errors import ApiRejectedError, GoneError, NotServedError


class KubeClusterReader:
    def __init__(self, kube: KubeConnection) -> None:
        self.kube = kube

    async def read_cluster(self, namespace: str | None) -> tuple[dict[str, list[dict[str, Any]]], list[str]]:
        """The namespace's pods and claim templates (every namespace's when None), and the cluster's claims,
        DeviceClasses, ResourceSlices, nodes and netclaim agent pods, and the namespace's EndpointSlices of
        network Services (netclaim's) and MultiNetworkPolicies, each as the API has it. A list the
        reader may not make is left empty and named in the second value (a tenant with a namespace's rights
        still gets what they may see). Claims are read without lightkube's decoder: a claim nested
        thousands deep fails no one's read."""
        scope = namespace or "*"
        reads: dict[str, Any] = {
            "pods": (Pod, scope, None),
            "claims": (ResourceClaim, "*", None),
            "templates": (ResourceClaimTemplate, scope, None),
            "device_classes": (DeviceClass, None, None),
            "slices": (ResourceSlice, None, None),
            "nodes": (Node, None, None),
            "agent_pods": (Pod, "*", {"app.kubernetes.io/name": "netclaim-agent"}),
            "endpoint_slices": (EndpointSlice, scope, {SLICE_MANAGED_BY: DRIVER_DOMAIN}),
        }
        found: dict[str, list[dict[str, Any]]] = {}
        refused = []
        try:
            found["network_policies"] = await self.kube.read_items(
                f"list MultiNetworkPolicies ({scope})", POLICIES.path(namespace), _objects_of
            )
        except (NotServedError, GoneError):  # no CRD: no policies, nothing the reader missed
            found["network_policies"] = []
        except ApiRejectedError:
            found["network_policies"] = []
            refused.append(f"MultiNetworkPolicy ({scope})")
        for key, (kind, where, labels) in reads.items():
            what = f"{kind.__name__} ({'netclaim agent pods' if key == 'agent_pods' else where or 'cluster'})"
            try:
                found[key] = await self._read_all(f"list {what}", kind, where, labels)
            except ApiRejectedError:
                found[key] = []
                if key == "claims" and namespace:  # a tenant: the namespace's own claims at least
                    with contextlib.suppress(ApiRejectedError):
                        found[key] = await self._read_all(f"list {what}", ResourceClaim, namespace, None)
                refused.append(what)
        return found, refused

    async def _read_all(
        self, what: str, kind: Any, where: str | None, labels: dict[str, Any] | None
    ) -> list[dict[str, Any]]:
        if kind is ResourceClaim:
            path = CLAIMS.path(None if where == "*" else where)
            return await self.kube.read_items(what, path, _objects_of)
        with translated(what):
            listing = (
                self.kube.client.list(kind, namespace=where, labels=labels)
                if where is not None
                else self.kube.client.list(kind, labels=labels)
            )
            return [as_data(item) async for item in listing]


def _objects_of(listed: ListItems) -> list[dict[str, Any]]:
    return [item for item in listed.items if isinstance(item, dict)]

"""Objects by the thousand for the kubelet-less nodes of `make bench-scale`: pause pods and their claims,
created many at once."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, cast

from lightkube import AsyncClient, KubeConfig
from lightkube.resources.core_v1 import Pod
from lightkube.resources.resource_v1 import DeviceClass, ResourceClaim, ResourceSlice

from netclaim.adapters.kube.addresses import IPPoolResource

CREATORS = 32  # concurrent creates (one HTTP/2 connection)


def pod_body(name: str, namespace: str, claim: str | None, node: str | None = None) -> dict[str, Any]:
    """A pause pod for the kubelet-less nodes, with its claim by name, on `node` when given."""
    container: dict[str, Any] = {"name": "app", "image": "registry.k8s.io/pause:3.10"}
    spec: dict[str, Any] = {
        "containers": [container],
        "terminationGracePeriodSeconds": 0,
        # the nodes have no kubelet: the pods are only scheduled, never started
        "tolerations": [{"key": "netclaim.dev/kubelet-less", "operator": "Exists", "effect": "NoSchedule"}],
    }
    if node is not None:
        spec["nodeSelector"] = {"kubernetes.io/hostname": node}
    if claim is not None:
        spec["resourceClaims"] = [{"name": "nic", "resourceClaimName": claim}]
        container["resources"] = {"claims": [{"name": "nic"}]}
    metadata = {"name": name, "namespace": namespace}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


KINDS: dict[str, Any] = {
    "ResourceClaim": ResourceClaim,
    "Pod": Pod,
    "ResourceSlice": ResourceSlice,
    "DeviceClass": DeviceClass,
    "IPPool": IPPoolResource,
}


async def create_all(kubeconfig: Path, bodies: list[dict[str, Any]]) -> None:
    """Every object, CREATORS at a time over one HTTP/2 connection."""
    client = AsyncClient(KubeConfig.from_file(kubeconfig), field_manager="netclaim-bench", http2=True)
    limit = asyncio.Semaphore(CREATORS)

    async def one(body: dict[str, Any]) -> None:
        kind = KINDS[body["kind"]]
        async with limit:
            await client.create(cast(Any, kind.from_dict(body)))

    try:
        await asyncio.gather(*(one(b) for b in bodies))
    finally:
        await client.close()

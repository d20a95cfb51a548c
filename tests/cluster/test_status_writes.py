"""The agent's claim status write as the real API server answers it. The write is a JSON Patch guarded by a
test of the claim's resourceVersion; when someone changed the claim since it was read, kube-apiserver answers
a bare 422 ("the server rejected our request…", no details) that says nothing of the test. That must be a
conflict (read again, write again), never a refusal that leaves the claim's status as it was."""

from __future__ import annotations

import asyncio

import pytest
from lightkube import Client
from lightkube.resources.resource_v1 import ResourceClaim

from netclaim.adapters.kube.claims import KubeClaims
from netclaim.adapters.kube.connection import KubeConnection
from netclaim.errors import ConflictError
from netclaim_lab.cluster import ClusterHandle
from tests.kube import typed

DRIVER = "netclaim.dev"


def test_a_status_write_from_a_claim_read_before_a_change_is_a_conflict(
    cluster: ClusterHandle, kube: Client, ns: str
) -> None:
    request = {"name": "nic", "exactly": {"deviceClassName": "netclaim-shared"}}
    claim = {"metadata": {"name": "stale"}, "spec": {"devices": {"requests": [request]}}}
    kube.create(typed(ResourceClaim, claim), namespace=ns)

    async def write_twice() -> str | None:
        connection = KubeConnection.connect(cluster.kubeconfig, f"{DRIVER}-tests")
        claims = KubeClaims(connection)
        try:
            read = await claims.get_claim(ns, "stale")
            kube.patch(ResourceClaim, "stale", {"metadata": {"labels": {"changed": "since"}}}, namespace=ns)
            with pytest.raises(ConflictError, match="changed since it was read"):
                await claims.write_claim_devices(read, DRIVER, [])
            return await claims.write_claim_devices(await claims.get_claim(ns, "stale"), DRIVER, [])
        finally:
            await connection.close()

    written = asyncio.run(write_twice())
    meta = kube.get(ResourceClaim, "stale", namespace=ns).metadata
    assert meta is not None and written == meta.resourceVersion

"""The one read the tools make: a snapshot of the cluster, through the Kubernetes API adapter."""

from __future__ import annotations

from pathlib import Path

from netclaim.adapters.kube.connection import KubeConnection
from netclaim.adapters.kube.reader import KubeClusterReader
from netclaim.cli.explain import Snapshot
from netclaim.core.objects import Pod

FIELD_MANAGER = "netclaim-cli"  # never used to write: the tools only read


async def read_snapshot(kubeconfig: Path | None, namespace: str | None) -> Snapshot:
    kube = KubeConnection.connect(kubeconfig, FIELD_MANAGER)
    try:
        found, refused = await KubeClusterReader(kube).read_cluster(namespace)
        return Snapshot(
            pods=[Pod.from_api(p) for p in found["pods"]],
            claims=found["claims"],
            templates=found["templates"],
            device_classes=found["device_classes"],
            slices=found["slices"],
            nodes=found["nodes"],
            agent_pods=[Pod.from_api(p) for p in found["agent_pods"]],
            unreadable=refused,
            endpoint_slices=found["endpoint_slices"],
            network_policies=found["network_policies"],
        )
    finally:
        await kube.close()

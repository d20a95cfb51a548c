"""The one read the tools make: a snapshot of the cluster, through the Kubernetes API adapter."""

from __future__ import annotations

from pathlib import Path

from netclaim.adapters.kube import KubeApi
from netclaim.tools.explain import Snapshot

FIELD_MANAGER = "netclaim-cli"  # never used to write: the tools only read


async def read_snapshot(kubeconfig: Path | None, namespace: str | None) -> Snapshot:
    api = KubeApi.connect(kubeconfig, FIELD_MANAGER)
    try:
        found, refused = await api.read_cluster(namespace)
        return Snapshot(**found, unreadable=refused)
    finally:
        await api.close()

"""An edited policy ConfigMap is published without restarting the agent and without disturbing attached
pods: kubelet updates the agent pod's ConfigMap volume (swapping its `..data` symlink), the agent notices."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from lightkube import Client

from netclaim_lab import agents
from netclaim_lab.cluster import ClusterHandle
from tests.cluster.helpers import apply, interface_in_pod, published, running
from tests.cluster.ipam import IPAM_NODES, ip_pool, pod_on, pool_template
from tests.kube import wait_for

POLICY = Path(__file__).with_name("policy.yaml")
NODE = "node-1"


@pytest.fixture
def edited_policy(cluster: ClusterHandle, kube: Client, tmp_path: Path) -> Iterator[Path]:
    """A copy of the test policy that the test edits; the ConfigMap gets the original back afterwards, and
    the next tests start once every agent has published it again (kubelet updates each node's volume on
    its own schedule)."""
    edited = tmp_path / "policy.yaml"
    edited.write_text(
        POLICY.read_text().replace(
            "attributes: {netclaim.dev/network: lan3}",
            "attributes: {netclaim.dev/network: lan3, netclaim.dev/tier: gold}",
        )
    )
    assert edited.read_text() != POLICY.read_text()
    yield edited
    agents.set_policy(cluster, POLICY)
    cluster.kubectl("delete", "ippool", "reload", "--ignore-not-found")

    def restored() -> bool:
        return all(
            "netclaim.dev/tier" not in published(kube, node)["ipn0"]["attributes"] for node in IPAM_NODES
        )

    wait_for(restored, 120, "every agent publishing the original policy again")


def _container(cluster: ClusterHandle) -> tuple[str, str, int]:
    """(pod UID, container ID, restarts) of the agent on NODE: any restart changes one of them."""
    pod = agents.agent_pod(cluster, NODE)
    assert pod is not None
    status = pod["status"]["containerStatuses"][0]
    return pod["metadata"]["uid"], status["containerID"], status["restartCount"]


def test_an_edited_policy_configmap_is_published_within_30_s_without_a_restart(
    cluster: ClusterHandle, kube: Client, ns: str, edited_policy: Path, figures: Callable[[str], None]
) -> None:
    apply(cluster, "default", ip_pool("reload", {"subnet": "10.69.0.0/24"}))
    apply(cluster, ns, pool_template("t", "reload"), pod_on("attached", "t", NODE))
    wait_for(lambda: len(running(kube, ns)) == 1, 120, "the pod running with its interface")
    before = interface_in_pod(cluster, ns, "attached", "net1")
    container = _container(cluster)
    assert "netclaim.dev/tier" not in published(kube, NODE)["ipn0"]["attributes"]

    agents.set_policy(cluster, edited_policy)

    def tier() -> object:
        return published(kube, NODE)["ipn0"]["attributes"].get("netclaim.dev/tier", {}).get("string")

    started = time.monotonic()
    wait_for(lambda: tier() == "gold", 30, "the new attribute published")
    figures(f"\npolicy ConfigMap edited: published after {time.monotonic() - started:.1f} s, no restart")
    assert _container(cluster) == container, "the agent restarted"
    assert interface_in_pod(cluster, ns, "attached", "net1") == before
    assert len(running(kube, ns)) == 1

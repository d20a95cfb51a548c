"""An edited policy is published without restarting the agent and without disturbing attached pods.

The agents of the local cluster still run as node processes reading the policy from a file (the
DaemonSet mounts the ConfigMap there); the test edits that file as a ConfigMap update does, by swapping
the mounted `..data` symlink."""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from lightkube import Client

from netclaim.cluster import agents, processes
from netclaim.cluster.cluster import ClusterHandle
from tests.cluster.helpers import apply, interface_in_pod, published, running
from tests.cluster.ipam import ip_pool, pod_on, pool_template
from tests.kube import wait_for

POLICY = Path(__file__).with_name("policy.yaml")
NODE = "node-1"


def _mount(directory: Path, version: str, text: str) -> Path:
    (directory / version).mkdir()
    (directory / version / "policy.yaml").write_text(text)
    (directory / "..data_tmp").symlink_to(version)
    (directory / "..data_tmp").replace(directory / "..data")
    path = directory / "policy.yaml"
    if not path.is_symlink():
        path.symlink_to("..data/policy.yaml")
    return path


@pytest.fixture
def mounted_policy(cluster: ClusterHandle) -> Iterator[Path]:
    directory = cluster.node(NODE).layout.root / "policy-volume"
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir()
    path = _mount(directory, "v1", POLICY.read_text())
    agents.stop_agent(cluster, NODE)
    agents.start_agent(cluster, NODE, path)
    agents.wait_ready(cluster, [NODE])
    yield directory
    agents.stop_agent(cluster, NODE)
    agents.start_agent(cluster, NODE, POLICY)
    agents.wait_ready(cluster, [NODE])
    cluster.kubectl("delete", "ippool", "reload", "--ignore-not-found")


def test_an_edited_policy_is_published_within_30_s_without_a_restart(
    cluster: ClusterHandle, kube: Client, ns: str, mounted_policy: Path, figures: Callable[[str], None]
) -> None:
    apply(cluster, "default", ip_pool("reload", {"subnet": "10.69.0.0/24"}))
    apply(cluster, ns, pool_template("t", "reload"), pod_on("attached", "t", NODE))
    wait_for(lambda: len(running(kube, ns)) == 1, 120, "the pod running with its interface")
    before = interface_in_pod(cluster, ns, "attached", "net1")
    pid = processes.recorded(cluster.node(NODE).pid_dir, agents.AGENT)
    assert "netclaim.dev/tier" not in published(kube, NODE)["ipn0"]["attributes"]

    edited = POLICY.read_text().replace(
        "attributes: {netclaim.dev/network: lan3}",
        "attributes: {netclaim.dev/network: lan3, netclaim.dev/tier: gold}",
    )
    assert edited != POLICY.read_text()
    _mount(mounted_policy, "v2", edited)

    def tier() -> object:
        return published(kube, NODE)["ipn0"]["attributes"].get("netclaim.dev/tier", {}).get("string")

    started = time.monotonic()
    wait_for(lambda: tier() == "gold", 30, "the new attribute published")
    figures(f"\npolicy edited: published after {time.monotonic() - started:.1f} s, no restart")
    assert processes.recorded(cluster.node(NODE).pid_dir, agents.AGENT) == pid, "the agent restarted"
    assert interface_in_pod(cluster, ns, "attached", "net1") == before
    assert len(running(kube, ns)) == 1

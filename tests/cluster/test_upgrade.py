"""Upgrades without disruption: while a Deployment with claims scales 0 → 20 → 0 three times, the agents'
DaemonSet rolls to a new image tag and back during the first waves, and one agent pod is deleted by hand as
the last wave starts.

Every container checks for itself: it prints NET1-PRESENT or NET1-MISSING as it starts, then watches its
interface every 200 ms and prints NET1-LOST if it goes. The test reads every container's log before each
scale-down, then counts what is left behind: links on the nodes, addresses (IPAllocations and host-local
files), the agents' state rows and the claims' status entries."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from lightkube import Client
from lightkube.resources.core_v1 import Pod

from netclaim_lab import agents, processes
from netclaim_lab.cluster import ClusterHandle
from tests.cluster.helpers import WATCH, apply, deployment, kubectl_json, read_watches, running, store_rows
from tests.cluster.ipam import IPAM_NODES, allocations, ip_pool, pool_template
from tests.kube import wait_for

REPLICAS = 20
CYCLES = 3
NEXT_TAG = "-next"


@pytest.fixture
def churn_pool(cluster: ClusterHandle) -> Iterator[str]:
    apply(cluster, "default", ip_pool("upgrade", {"subnet": "10.70.0.0/24"}))
    yield "upgrade"
    cluster.kubectl("delete", "ippool", "upgrade", "--ignore-not-found")


def _image(cluster: ClusterHandle) -> str:
    return str(
        cluster.kubectl(
            *("get", "ds", "netclaim-agent", "-n", agents.NAMESPACE),
            *("-o", "jsonpath={.spec.template.spec.containers[0].image}"),
        )
    )


@pytest.fixture
def two_tags(cluster: ClusterHandle) -> Iterator[tuple[str, str]]:
    """The running image and the same image under a new tag on every node: an upgrade as kubelet sees one
    (a new pod template, a new reference to pull); the DaemonSet is back on the first tag afterwards."""
    current = _image(cluster)
    upgraded = current + NEXT_TAG
    for node in agents.kubelet_nodes(cluster):
        ctr = [str(cluster.bin_dir / "ctr"), "-n", "k8s.io", "images", "tag", "--force", current, upgraded]
        processes.run([*cluster.node(node).enter(), *ctr])
    yield current, upgraded
    if _image(cluster) != current:
        _roll(cluster, current)
    agents.wait_ready(cluster, agents.kubelet_nodes(cluster))


def _roll(cluster: ClusterHandle, image: str) -> None:
    cluster.kubectl("set", "image", "-n", agents.NAMESPACE, "daemonset/netclaim-agent", f"agent={image}")
    cluster.kubectl(
        *("rollout", "status", "-n", agents.NAMESPACE, "daemonset/netclaim-agent", "--timeout=300s"),
        timeout=310,
    )


def _churn_deployment(template: str) -> dict[str, Any]:
    manifest = deployment("churn", 0, template)
    spec = manifest["spec"]["template"]["spec"]
    spec["containers"][0]["command"] = ["sh", "-c", WATCH]
    spec["affinity"] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [
                            {"key": "kubernetes.io/hostname", "operator": "In", "values": list(IPAM_NODES)}
                        ]
                    }
                ]
            }
        }
    }
    return manifest


def _links(cluster: ClusterHandle) -> dict[str, int]:
    """Links in each node's namespace, but the primary pod network's (its bridge, made by the first pod,
    and its pods' veths): netclaim's interfaces live in pods; one left in a node is a leak."""
    found = {}
    for node in agents.kubelet_nodes(cluster):
        listing = processes.run([*cluster.node(node).enter(), "ip", "-o", "link", "show"]).splitlines()
        names = [line.split(":")[1].strip().split("@")[0] for line in listing]
        found[node] = sum(1 for name in names if name != "cni0" and not name.startswith("veth"))
    return found


def _scale(cluster: ClusterHandle, replicas: int, ns: str) -> None:
    cluster.kubectl("scale", "-n", ns, "deployment/churn", f"--replicas={replicas}")


def test_rolling_updates_under_churn_leave_no_pod_without_its_interface_and_nothing_behind(
    cluster: ClusterHandle,
    kube: Client,
    ns: str,
    churn_pool: str,
    two_tags: tuple[str, str],
    figures: Callable[[str], None],
) -> None:
    current, upgraded = two_tags
    links_before = _links(cluster)
    apply(cluster, ns, pool_template("t", churn_pool), _churn_deployment("t"))
    rollouts: list[str] = []
    failures: list[BaseException] = []

    def upgrade() -> None:
        try:
            for image in (upgraded, current):
                started = time.monotonic()
                _roll(cluster, image)
                rollouts.append(f"{image.rsplit(':', 1)[1]} in {time.monotonic() - started:.0f} s")
        except BaseException as err:
            failures.append(err)

    starts: list[str] = []
    lost: list[str] = []
    deleted_agent = ""
    roller = threading.Thread(target=upgrade, daemon=True)
    roller.start()
    for cycle in range(CYCLES):
        if cycle == CYCLES - 1:  # the rollouts span the first waves; the last one sees a deleted agent pod
            roller.join(timeout=600)
            agent = agents.agent_pod(cluster, "node-2")
            assert agent is not None, "no agent pod on node-2 after the rollouts"
            deleted_agent = agent["metadata"]["name"]
        _scale(cluster, REPLICAS, ns)
        if deleted_agent:  # `kubectl delete pod` of one agent while the last wave starts
            cluster.kubectl("delete", "pod", "-n", agents.NAMESPACE, deleted_agent, "--wait=false")
        wait_for(
            lambda: len(running(kube, ns)) == REPLICAS, 300, f"wave {cycle + 1}: {REPLICAS} pods running"
        )
        time.sleep(2)  # each container's watch loop runs a few rounds
        words, lost_now = read_watches(cluster, kube, ns)
        starts += words
        lost += lost_now
        _scale(cluster, 0, ns)
        wait_for(lambda: not list(kube.list(Pod, namespace=ns)), 300, f"wave {cycle + 1}: pods gone")
    roller.join(timeout=600)
    assert not failures, failures
    assert len(rollouts) == 2, rollouts
    agents.wait_ready(cluster, agents.kubelet_nodes(cluster))

    wait_for(lambda: not allocations(cluster, churn_pool), 120, "every address of the pool released")
    wait_for(lambda: _links(cluster) == links_before, 60, "the nodes' links back to what they were")

    def rows_of_ns() -> list[dict[str, Any]]:
        return [
            r
            for node in agents.kubelet_nodes(cluster)
            for r in store_rows(cluster, node)
            if r["claim_namespace"] == ns
        ]

    # kubelet retries an unprepare that failed while a node's agent was being replaced; rows whose claim is
    # gone without one are the agents' reclaim's (two 60 s rounds); a row still there after that is a leak
    drained = time.monotonic()
    try:
        wait_for(lambda: not rows_of_ns(), 180, "the agents' state rows of the gone claims dropped")
    except BaseException:
        print(f"\nstate rows left: {[(r['pool'], r['state'], r['claim_name']) for r in rows_of_ns()]}")
        raise
    finally:
        print(f"\nstate rows drained {time.monotonic() - drained:.1f} s after the last pod was gone")
    rows = rows_of_ns()
    reclaimed = sum(
        1
        for node in agents.kubelet_nodes(cluster)
        for line in agents.agent_log(cluster, node).splitlines()
        if "without NodeUnprepareResources" in line and f'"{ns}/' in line
    )
    claims = kubectl_json(cluster, "get", "resourceclaims", "-n", ns)["items"]
    entries = [e for c in claims for e in (c.get("status", {}).get("devices") or [])]
    counts = {s: starts.count(s) for s in ("NET1-PRESENT", "NET1-MISSING", "NET1-LOST")}
    figures(
        f"\nrolling update under churn: {CYCLES} waves of {REPLICAS} pods, rollouts {rollouts}, agent pod "
        f"{deleted_agent or '(none)'} deleted by hand; container starts with net1 {counts['NET1-PRESENT']}, "
        f"without {counts['NET1-MISSING']}, interfaces lost while running {counts['NET1-LOST']}; "
        f"leaked: links {sum(_links(cluster).values()) - sum(links_before.values())}, "
        f"addresses {len(allocations(cluster, churn_pool))}, state rows {len(rows)}, "
        f"claims {len(claims)}, status entries {len(entries)}; claims the agents reclaimed because "
        f"kubelet never unprepared them: {reclaimed}"
    )
    assert counts == {"NET1-PRESENT": CYCLES * REPLICAS, "NET1-MISSING": 0, "NET1-LOST": 0}, (counts, lost)
    assert deleted_agent
    assert (rows, claims, entries) == ([], [], [])

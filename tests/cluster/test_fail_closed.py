"""Fail closed: no container of a pod with a netclaim claim starts without the claim's interface, whether
the agent is down or too slow for the runtime's NRI budget; pods without claims never wait for us.

Each container checks for itself as it starts (`ip link show net1`) and prints NET1-PRESENT or
NET1-MISSING; the test reads every container's log (restarts too) and samples the pods every 200 ms."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from lightkube import Client

from netclaim_lab import agents
from netclaim_lab.cluster import ClusterHandle
from tests.cluster.helpers import apply, kubectl_netclaim, running
from tests.cluster.ipam import ip_pool, pod_on, pool_template
from tests.kube import wait_for

NODE = "node-2"
PODS = 10
CHECK = "ip link show net1 >/dev/null 2>&1 && echo NET1-PRESENT || echo NET1-MISSING; exec sleep 3600"


@pytest.fixture
def gated_pool(cluster: ClusterHandle) -> Iterator[str]:
    apply(cluster, "default", ip_pool("gate", {"subnet": "10.68.0.0/24"}))
    yield "gate"
    cluster.kubectl("delete", "ippool", "gate", "--ignore-not-found")


def _checking_pod(name: str, template: str | None) -> dict[str, Any]:
    manifest = pod_on(name, template or "none", NODE)
    container = manifest["spec"]["containers"][0]
    container["command"] = ["sh", "-c", CHECK]
    if template is None:  # a pod that asked for no network of ours
        del manifest["spec"]["resourceClaims"]
        del container["resources"]
    return manifest


def _running_names(kube: Client, ns: str) -> set[str]:
    return {str(p.metadata.name) for p in running(kube, ns) if p.metadata}


def _starts(cluster: ClusterHandle, ns: str, pod: str) -> list[str]:
    """What each start of the pod's container printed (the current one and, if any, the previous)."""
    seen = [cluster.kubectl("logs", "-n", ns, pod, check=False).strip()]
    previous = cluster.kubectl("logs", "-n", ns, pod, "--previous", check=False).strip()
    return seen + ([previous] if previous.startswith("NET1") else [])


def test_pods_created_while_the_agent_is_down_start_only_with_their_interface(
    cluster: ClusterHandle, kube: Client, ns: str, gated_pool: str, figures: Callable[[str], None]
) -> None:
    agents.stop_agent(cluster, NODE)
    try:
        apply(
            cluster,
            ns,
            pool_template("t", gated_pool),
            *(_checking_pod(f"p{i}", "t") for i in range(PODS)),
            _checking_pod("plain", None),
        )
        samples, seen = 0, set()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:  # 20 s of the agent down, sampled every 200 ms
            seen |= _running_names(kube, ns)
            samples += 1
            time.sleep(0.2)
        assert seen == {"plain"}, f"expected only the pod without claims running, saw {sorted(seen)}"
        told = kubectl_netclaim(cluster, "explain", "pod/p0", "-n", ns)
        # stop_agent takes it off as an admin would: the node label
        label = "netclaim.dev/agent"
        assert (
            f"no netclaim agent is Ready on {NODE} (the node is labelled {label}=disabled): "
            "the pod waits for it (fail closed)"
        ) in told, told
        assert f"fix: start the agent on {NODE}: kubectl label node {NODE} {label}-" in told, told
    finally:
        agents.start_agent(cluster, NODE)
    back = time.monotonic()
    wait_for(lambda: len(running(kube, ns)) == PODS + 1, 30, "all 10 running within 30 s of the agent")
    outputs = [o for i in range(PODS) for o in _starts(cluster, ns, f"p{i}")]
    figures(
        f"\nagent down: {samples} samples at 200 ms, 0 of {PODS} pods with claims running while it was down; "
        f"all running {time.monotonic() - back:.1f} s after it came back; container starts: "
        f"{outputs.count('NET1-PRESENT')} with net1, {outputs.count('NET1-MISSING')} without"
    )
    assert outputs.count("NET1-MISSING") == 0 and outputs.count("NET1-PRESENT") == PODS


def test_a_hook_slower_than_the_runtimes_budget_never_lets_a_container_start_without_its_interface(
    cluster: ClusterHandle, kube: Client, ns: str, gated_pool: str, figures: Callable[[str], None]
) -> None:
    """The RunPodSandbox hook sleeps past containerd's 2 s: the runtime starts each sandbox without us. The
    claims' CDI hook keeps every container from starting until the agent has attached the interface."""
    agents.restart_agent(cluster, NODE, faults="stall-run-pod-sandbox")
    try:
        apply(
            cluster, ns, pool_template("t", gated_pool), *(_checking_pod(f"p{i}", "t") for i in range(PODS))
        )
        created, samples = time.monotonic(), 0
        while time.monotonic() < created + 240 and len(_running_names(kube, ns)) < PODS:
            samples += 1
            time.sleep(0.2)
        elapsed = time.monotonic() - created
        assert len(_running_names(kube, ns)) == PODS, "the stalled hook's pods never ran"
    finally:
        agents.restart_agent(cluster, NODE)
    events = cluster.kubectl("get", "events", "-n", ns, "--field-selector", "reason=Failed", "-o", "name")
    outputs = [o for i in range(PODS) for o in _starts(cluster, ns, f"p{i}")]
    figures(
        f"\nhook slower than the runtime's budget: {samples} samples at 200 ms, all {PODS} pods running "
        f"after {elapsed:.1f} s; containers refused by the CDI hook meanwhile: {len(events.split())} events; "
        f"container starts: {outputs.count('NET1-PRESENT')} with net1, "
        f"{outputs.count('NET1-MISSING')} without"
    )
    assert outputs.count("NET1-MISSING") == 0 and outputs.count("NET1-PRESENT") == PODS

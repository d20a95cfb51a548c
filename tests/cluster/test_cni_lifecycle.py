"""CNI 1.1 on the real cluster, with the reference plugins the lab installs (containernetworking/plugins as
pinned in tools/k8s/cni-plugins) and a claim config at cniVersion 1.1.0:
- CHECK: an address removed by hand inside the pod is found by the agent's CHECK round and put back by DEL
  and ADD into the same sandbox, with the same address; the claim says so (CheckFailed) and so does an
  Event on the pod;
- GC: a reservation planted in the network's host-local directory, for a sandbox that never had its DEL,
  is removed by the GC an agent runs at its start, and the live pod's reservation stays;
- STATUS: with `static` gone from the nodes' plugin directory (macvlan's STATUS asks its IPAM plugin; the
  primary network's host-local stays), the pod's replacement sandbox fails with the plugin's words and the
  agent is not ready, naming the plugin; with `static` back, the pod runs again with net1.
The agents run with --check-seconds=2 for this module (their DaemonSet patched, then put back)."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import pytest
from lightkube import Client
from lightkube.resources.core_v1 import Event, Pod

from netclaim_lab import agents, processes
from netclaim_lab.cluster import ClusterHandle
from tests.cluster.helpers import (
    agent_metrics,
    apply,
    claim_devices,
    claim_template,
    configured_and_running,
    host_local_dir,
    in_pod_netns,
    macvlan,
    node_name,
    pod_claim_name,
    pod_manifest,
    sandbox_netns,
)
from tests.kube import wait_for

NETWORK = "lifecycle-net"
ARGS = "/spec/template/spec/containers/0/args"


def _set_args(cluster: ClusterHandle, args: list[str]) -> None:
    """The agents' arguments, rolled out."""
    patch = json.dumps([{"op": "replace", "path": ARGS, "value": args}])
    cluster.kubectl("patch", "ds", "-n", agents.NAMESPACE, "netclaim-agent", "--type=json", "-p", patch)
    rollout = ("rollout", "status", "-n", agents.NAMESPACE, "daemonset/netclaim-agent", "--timeout=300s")
    cluster.kubectl(*rollout, timeout=310)


@pytest.fixture(scope="module")
def checking(cluster: ClusterHandle) -> Iterator[None]:
    """The agents CHECK every 2 s while this module runs; their DaemonSet's arguments as before after."""
    found = json.loads(cluster.kubectl("get", "ds", "-n", agents.NAMESPACE, "netclaim-agent", "-o", "json"))
    args = list(found["spec"]["template"]["spec"]["containers"][0]["args"])
    _set_args(cluster, [*args, "--check-seconds=2"])
    yield
    _set_args(cluster, args)


STATIC = {"type": "static", "addresses": [{"address": "10.33.9.77/24"}]}


def _documents(ipam: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """The claim template (host-local in a tenant range, or `ipam`) and the pod using it."""
    plugin = macvlan("10.33.9.0/24")
    if ipam is not None:
        plugin["ipam"] = ipam
    config = {
        "apiVersion": "netclaim.dev/v1alpha1",
        "kind": "CNIConfig",
        "interfaceName": "net1",
        "config": {"cniVersion": "1.1.0", "name": NETWORK, "plugins": [plugin]},
    }
    template = claim_template("lifecycle", "netclaim-shared", "true", config)
    return [template, pod_manifest("checked", "lifecycle")]


def _addresses(cluster: ClusterHandle, node: str, netns: str) -> list[str]:
    shown = in_pod_netns(cluster, node, netns, "ip", "-4", "-o", "addr", "show", "dev", "net1")
    return re.findall(r"inet (\S+)", shown)


def _check_failed(kube: Client, ns: str) -> str | None:
    for entry in claim_devices(kube, ns, pod_claim_name(kube, ns, "checked")):
        for condition in entry.get("conditions") or []:
            if condition["type"] == "CheckFailed":
                return str(condition["message"])
    return None


def _started(
    cluster: ClusterHandle, kube: Client, ns: str, ipam: dict[str, Any] | None = None
) -> tuple[str, str, str]:
    """The pod running with net1: its node, its sandbox's netns and net1's address."""
    apply(cluster, ns, *_documents(ipam))
    wait_for(partial(configured_and_running, kube, ns, "checked"), 120, "the pod running with net1")
    pod = kube.get(Pod, "checked", namespace=ns)
    node = node_name(pod)
    assert pod.metadata is not None and pod.metadata.uid is not None
    netns = sandbox_netns(cluster, node, pod.metadata.uid)
    [address] = _addresses(cluster, node, netns)
    return node, netns, address


def test_check_finds_an_address_removed_by_hand_and_the_repair_puts_the_same_one_back(
    cluster: ClusterHandle, kube: Client, ns: str, checking: None
) -> None:
    node, netns, address = _started(cluster, kube, ns)
    before = agent_metrics(cluster, node)
    in_pod_netns(cluster, node, netns, "ip", "addr", "del", address, "dev", "net1")
    assert _addresses(cluster, node, netns) == []
    wait_for(lambda: _check_failed(kube, ns) is not None, 60, "CheckFailed on the claim")
    message = _check_failed(kube, ns)
    assert message is not None and "CNI CHECK failed" in message and "DEL and ADD restored it" in message
    assert _addresses(cluster, node, netns) == [address]  # the same sandbox, the same address
    events = kube.list(Event, namespace=ns, fields={"involvedObject.name": "checked"})
    assert "NetclaimCheckFailed" in {e.reason for e in events}
    failed, passed = (f'netclaim_cni_checks_total{{result="{r}"}}' for r in ("failed", "ok"))
    assert agent_metrics(cluster, node).get(failed, 0) - before.get(failed, 0) >= 1
    wait_for(  # the next rounds find the repaired attachment as its ADD left it
        lambda: agent_metrics(cluster, node).get(passed, 0) > before.get(passed, 0), 30, "a CHECK passing"
    )


def test_gc_at_the_agents_start_removes_a_stale_reservation_and_keeps_the_live_one(
    cluster: ClusterHandle, kube: Client, ns: str, checking: None
) -> None:
    node, _, address = _started(cluster, kube, ns)
    directory = host_local_dir(cluster, node, NETWORK, ns)
    live = address.split("/")[0]
    assert (directory / live).is_file()
    stale = directory / "10.33.9.250"
    stale.write_text("sandbox-whose-del-never-came\r\nnet1")
    agents.restart_agent(cluster, node)
    wait_for(lambda: not stale.exists(), 60, "the planted reservation collected")
    assert (directory / live).is_file()
    assert agent_metrics(cluster, node).get("netclaim_cni_gc_removed_total", 0) >= 1
    wait_for(partial(configured_and_running, kube, ns, "checked"), 60, "the pod still running with net1")


def _sandbox_events(kube: Client, ns: str) -> list[str]:
    found = kube.list(Event, namespace=ns, fields={"involvedObject.name": "checked"})
    return [str(e.message) for e in found if e.reason == "FailedCreatePodSandBox"]


def _agent_ready(cluster: ClusterHandle, node: str) -> bool:
    pod = agents.agent_pod(cluster, node) or {}
    conditions = pod.get("status", {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def test_a_plugin_made_not_ready_fails_the_new_sandbox_with_its_words_then_the_pod_runs(
    cluster: ClusterHandle, kube: Client, ns: str, checking: None, figures: Callable[[str], None]
) -> None:
    node, _, _ = _started(cluster, kube, ns, STATIC)
    pod = kube.get(Pod, "checked", namespace=ns)
    assert pod.metadata is not None
    crictl = cluster.node(node).crictl()
    label = f"io.kubernetes.pod.uid={pod.metadata.uid}"
    [sandbox] = processes.run([*crictl, "pods", "--state", "ready", "--label", label, "-q"]).split()
    static = cluster.layout.cni_bin / "static"
    hidden = static.with_name(".static.hidden")
    static.rename(hidden)
    try:
        processes.run([*crictl, "stopp", sandbox])  # kubelet makes the pod a new sandbox
        wait_for(
            lambda: any("CNI STATUS macvlan" in m for m in _sandbox_events(kube, ns)),
            120,
            "the new sandbox failing with macvlan's STATUS",
        )
        [said] = {m for m in _sandbox_events(kube, ns) if "CNI STATUS macvlan" in m}
        assert 'failed to find plugin "static"' in said, said
        figures(f"the new sandbox's Event: {said}")
        wait_for(lambda: not _agent_ready(cluster, node), 60, "the agent not ready")
        metrics = agent_metrics(cluster, node)
        assert metrics.get('netclaim_cni_not_ready_total{plugin="macvlan"}', 0) >= 1
    finally:
        hidden.rename(static)
    back = time.monotonic()
    wait_for(partial(configured_and_running, kube, ns, "checked"), 180, "the pod running with net1 again")
    figures(f"running with net1 {time.monotonic() - back:.1f} s after static was back (kubelet's back-off)")
    wait_for(lambda: _agent_ready(cluster, node), 60, "the agent ready again")

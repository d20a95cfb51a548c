"""A cluster that is not ready for netclaim: kube-apiserver (and the rest) with DRAConsumableCapacity off,
and node-2's containerd with NRI off. `netclaim preflight`, the agent pod's init container, keeps each
agent in Init and names what is missing (on node-2, NRI). With preflight turned off, the agent on node-1
runs anyway: the API server drops the fields of shared capacity from its slice, and the agent says so once
(log, the Node's Event, a metric) and does not rewrite its slice in a loop. The passing case, every check
ok, is the install test's (tests/cluster/test_install.py prints every node's preflight)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest

from netclaim_lab import agent_image, agents, processes
from netclaim_lab.cluster import ClusterHandle
from netclaim_lab.demo import POLICY
from tests.cluster.helpers import agent_metrics, own_cluster
from tests.kube import wait_for

SPEC = """
apiVersion: netclaim.dev/v1alpha1
kind: LocalCluster
name: ncpre
managementCIDR: 10.209.0.0/24
podCIDR: 10.251.0.0/16
ports: {apiserver: 15443, etcdClient: 15379, etcdPeer: 15380}
featureGates: {DRAConsumableCapacity: false}
segments: [{name: lan0}]
nodes:
- name: node-1
  nics: [{name: enp0s10, segment: lan0, properties: {speed: 10Gi}}]
- name: node-2
  nri: false
  nics: [{name: enp0s10, segment: lan0, properties: {speed: 10Gi}}]
"""
WRITES = "netclaim_resourceslice_writes_total"


@pytest.fixture(scope="module")
def unready(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterHandle]:
    path = tmp_path_factory.mktemp("ncpre") / "ncpre.yaml"
    path.write_text(SPEC)
    with own_cluster(path) as handle:
        yield handle


def _failed_preflight_log(handle: ClusterHandle, node: str) -> str:
    """The log of the init container's last finished attempt, or "" before one has failed: the kubelet
    restarts a failed init container, and the new attempt's log is empty until it has run its checks."""
    pod = agents.agent_pod(handle, node)
    if pod is None:
        return ""
    for attempt in ((), ("--previous",)):
        log = handle.kubectl(
            "logs", "-n", agents.NAMESPACE, pod["metadata"]["name"], "-c", "preflight", *attempt, check=False
        )
        if "checks failed" in log:
            return log
    return ""


def _daemonset(handle: ClusterHandle, archive: agent_image.ImageArchive, preflight: bool) -> None:
    texts = agents.manifests(handle, {"agent.preflight": "true" if preflight else "false"})
    daemonset = agents.lab_manifest(agents.DAEMONSET, archive, text=texts[agents.DAEMONSET])
    handle.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input_text=json.dumps(daemonset))


def _slice_writes(handle: ClusterHandle) -> float:
    return sum(v for k, v in agent_metrics(handle, "node-1").items() if k.startswith(WRITES))


def test_preflight_names_what_is_missing_and_a_gate_that_is_off_costs_no_write_loop(
    unready: ClusterHandle,
) -> None:
    archive = agent_image.ensure()
    agents.import_image(unready, archive)
    agents.apply_manifests(unready)
    agents.set_policy(unready, POLICY)
    _daemonset(unready, archive, preflight=True)

    logs: dict[str, str] = {}

    def failed(node: str) -> bool:
        logs[node] = logs.get(node) or _failed_preflight_log(unready, node)
        return bool(logs[node])

    wait_for(lambda: failed("node-1") and failed("node-2"), 240, "both nodes' preflight to fail")
    first, second = logs["node-1"], logs["node-2"]
    print(f"\nnode-1's preflight (gate off):\n{first}\nnode-2's (gate off, NRI off):\n{second}")
    gate = "FAIL  DRAConsumableCapacity: the API server dropped allowMultipleAllocations and requestPolicy"
    for line in (
        "ok    NRI: /var/run/nri/nri.sock answers",
        "ok    CNI plugins: macvlan, host-device, static in /opt/cni/bin",
        "ok    bandwidth caps: ifb, tbf, ingress, u32 and mirred work (a veth shaped)",
        "ok    port security: nftables' netdev egress hook and tc are there",
        "ok    node-bound token: system:serviceaccount:netclaim-system:netclaim-agent, bound to node node-1",
        gate,
        "preflight: 1 of 9 checks failed",
    ):
        assert line in first, first
    for line in (
        "FAIL  NRI: no socket at /var/run/nri/nri.sock: the runtime's NRI is off or elsewhere",
        '[plugins."io.containerd.nri.v1.nri"] disable = false',
        gate,
        "preflight: 2 of 9 checks failed",
    ):
        assert line in second, second
    for node in ("node-1", "node-2"):
        assert agents.readiness(unready, node) is None, node  # no agent started anywhere
    # the probes leave nothing: no link on the node, no slice
    assert "probe" not in processes.run([*unready.node("node-1").enter(), "ip", "-o", "link", "show"])
    assert "netclaim.dev" not in unready.kubectl("get", "resourceslices", "-o", "name")

    # the admin turns preflight off: node-1's agent publishes; the server drops the gated fields
    _daemonset(unready, archive, preflight=False)
    agents.wait_ready(unready, ["node-1"], timeout=180)
    wait_for(lambda: "the API server drops" in agents.agent_log(unready, "node-1"), 60, "the agent's warning")
    before, started = _slice_writes(unready), time.monotonic()
    time.sleep(60)
    writes = _slice_writes(unready) - before
    log = agents.agent_log(unready, "node-1")
    warnings = [line for line in log.splitlines() if "the API server drops" in line]
    node_events = ("--field-selector=involvedObject.kind=Node,reason=NetclaimFieldsDropped", "-o", "json")
    events = json.loads(unready.kubectl("get", "events", "-n", "default", *node_events))["items"]
    metric = agent_metrics(unready, "node-1")
    print(
        f"gate off: {writes:.0f} slice writes in {time.monotonic() - started:.0f} s after the first; "
        f"{len(warnings)} warning; Node events: {[e['message'][:80] for e in events]}"
    )
    assert writes <= 1, writes
    assert len(warnings) == 1, warnings
    assert "feature gate DRAConsumableCapacity is off" in warnings[0]
    # one Event per agent on its Node: node-2's runs too without preflight (it publishes; NRI it lacks)
    assert sorted(e["involvedObject"]["name"] for e in events) == ["node-1", "node-2"]
    assert metric['netclaim_dropped_slice_fields{field="allowMultipleAllocations",pool="node"}'] == 1
    for node in ("node-1", "node-2"):  # the Node's condition, as `kubectl describe node` shows it
        conditions = json.loads(unready.kubectl("get", "node", node, "-o", "json"))["status"]["conditions"]
        [said] = [c for c in conditions if c["type"] == "NetclaimSliceFieldsDropped"]
        assert (said["status"], said["reason"]) == ("True", "GateOff"), said
        assert "feature gate DRAConsumableCapacity is off" in said["message"]
    # still published, without what the server cannot keep
    slices = json.loads(unready.kubectl("get", "resourceslices", "-o", "json"))["items"]
    [mine] = [
        s for s in slices if s["spec"]["driver"] == "netclaim.dev" and s["spec"].get("nodeName") == "node-1"
    ]
    [device] = mine["spec"]["devices"]
    assert device["attributes"]["netclaim.dev/ifName"] == {"string": "enp0s10"}
    assert "allowMultipleAllocations" not in device

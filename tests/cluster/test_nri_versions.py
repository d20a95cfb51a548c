"""The pod events reach the agent by the NRI call the node's runtime sends: the dedicated RunPodSandbox of
NRI ≥ 0.12 (containerd 2.4, the suite's), or StateChange on NRI v0.8 and v0.11 (containerd 2.0 and 2.2,
CRI-O 1.36; `make test-matrix` runs this module there). Either way the pod runs with its interface."""

from __future__ import annotations

from lightkube import Client

from netclaim_lab.cluster import ClusterHandle
from tests.cluster.helpers import (
    agent_metrics,
    apply,
    claim_template,
    cni_config,
    configured_and_running,
    macvlan,
    pod_manifest,
)
from tests.kube import wait_for

NODE, NIC = "node-2", "enp94s0"
# the runtime's call that starts a pod sandbox, by the runtime the cluster runs (its NRI version): containerd
# by its version, CRI-O 1.36 (NRI v0.11)
START_CALL = {
    "2.4": "RunPodSandbox",
    "2.2": "StateChange",
    "2.0": "StateChange",
    "1.7": "StateChange",  # NRI v0.8, as 2.0
    "crio": "StateChange",
}


def _runtime(cluster: ClusterHandle) -> str:
    return "crio" if cluster.spec.runtime == "crio" else cluster.spec.containerd


def _calls(cluster: ClusterHandle, method: str) -> float:
    return agent_metrics(cluster, NODE).get(f'netclaim_nri_calls_total{{method="{method}",result="ok"}}', 0.0)


def test_a_pod_start_reaches_the_agent_by_the_call_of_the_nodes_nri_version(
    cluster: ClusterHandle, kube: Client, ns: str
) -> None:
    runtime = _runtime(cluster)
    expected = START_CALL[runtime]
    other = next(call for call in START_CALL.values() if call != expected)
    before, other_before = _calls(cluster, expected), _calls(cluster, other)
    template = claim_template(
        "on-nic",
        "netclaim-shared",
        f'device.attributes["netclaim.dev"].ifName == "{NIC}"',
        cni_config([macvlan("10.33.8.0/24")]),
    )
    pod = pod_manifest("nri-path", "on-nic")
    apply(cluster, ns, template, pod)
    wait_for(lambda: configured_and_running(kube, ns, "nri-path"), 120, "the pod running with its interface")
    counted = _calls(cluster, expected) - before
    name = "CRI-O 1.36" if runtime == "crio" else f"containerd {runtime}"
    print(f"\n{name}: {expected} calls +{counted:.0f}")
    assert _calls(cluster, expected) > before, f"no {expected} call counted for the pod's start"
    assert _calls(cluster, other) == other_before, f"{other} counted on {name}"

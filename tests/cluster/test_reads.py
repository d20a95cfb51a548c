"""Issue 15: an agent's cost does not grow with the cluster. Every request the deployed agents made in this
test session (the API server's audit log: prepares, attaches, IPAM, restarts, repairs of the tests before
this one) reads by name, or lists and watches only what its own node's token may need: its node's slices,
one claim's (or one pool's) IPAllocations. docs/scale.md lists them per event."""

from __future__ import annotations

from lightkube import Client
from lightkube.resources.core_v1 import Pod
from lightkube.resources.resource_v1 import ResourceClaim

from netclaim_lab.benchmarks import measure
from netclaim_lab.cluster import ClusterHandle
from tests.cluster.helpers import (
    apply,
    claim_devices,
    claim_template,
    cni_config,
    configured_and_running,
    exists,
    macvlan,
    node_name,
    pod_claim_name,
    pod_manifest,
)
from tests.kube import delete, wait_for


def test_agents_read_only_what_concerns_their_own_node(cluster: ClusterHandle, kube: Client, ns: str) -> None:
    offset = cluster.layout.audit_log.stat().st_size
    on_enp0s10 = 'device.attributes["netclaim.dev"].ifName == "enp0s10"'
    network = cni_config([macvlan("10.51.0.0/24")], name="reads-net")
    apply(
        cluster,
        ns,
        claim_template("reads", "netclaim-shared", on_enp0s10, network),
        pod_manifest("reader", "reads"),
    )
    wait_for(lambda: configured_and_running(kube, ns, "reader"), 120, "the pod running with its interface")
    node = node_name(kube.get(Pod, "reader", namespace=ns))
    claim = pod_claim_name(kube, ns, "reader")
    delete(kube, Pod, "reader", ns)
    # the template's claim goes with its pod once unprepared; until then our status entry must go
    wait_for(
        lambda: not exists(kube, ResourceClaim, claim, ns) or not claim_devices(kube, ns, claim),
        60,
        "the claim unprepared",
    )

    mine = [r for r in measure.agent_requests(cluster.layout.audit_log, offset) if r.node == node]
    # sampled: kubelet's prepare made the agent read this claim by name, and the attach wrote its status
    assert any(r.verb == "get" and r.resource == "resourceclaims" and r.name == claim for r in mine), mine
    assert any(r.verb == "patch" and r.resource == "resourceclaims/status" and r.name == claim for r in mine)

    # test_admission and test_attacks use agents' tokens to show what the API server refuses them
    session = [r for r in measure.agent_requests(cluster.layout.audit_log) if r.code != 403]
    # every token is bound to its node (kubelet-less ones too: test_publish_resilience runs an agent for one)
    assert {r.node for r in session} <= {node.name for node in cluster.spec.nodes}
    assert [r.wide() for r in session if r.wide()] == []
    # nothing cluster-wide was even tried: no list or watch of claims, pods or nodes
    assert not [
        r
        for r in session
        if r.verb in ("list", "watch") and r.resource in ("resourceclaims", "pods", "nodes")
    ]

"""Several networks per pod: examples/multinet as shipped, on the test cluster's lan3 and lan1 networks.
Its two claims, one of them with two NIC requests, give a pod three interfaces on two networks, each
shaped and addressed (from its network's pool) as its own request asks; a name two claims of a pod both
ask is refused at prepare, before the pod's sandbox."""

from __future__ import annotations

import functools
import ipaddress
import re
import time
from collections.abc import Iterator
from typing import Any

import pytest
from lightkube import Client
from lightkube.core.client import FieldSelector
from lightkube.resources.core_v1 import Event, Pod
from lightkube.resources.resource_v1 import ResourceClaim

from netclaim.core.ipam.ippool import POOLS_POOL
from netclaim.core.quantity import parse_quantity
from netclaim_lab.cluster import ClusterHandle
from tests.cluster.helpers import (
    apply,
    claim_devices,
    example_documents,
    interface_in_pod,
    metadata_devices,
    network_status,
    ping,
    runnable_here,
    running,
)
from tests.cluster.ipam import allocations
from tests.kube import wait_for

# the example's networks → the test cluster's (tests/cluster/policy.yaml: ipn0 is lan3, ens1f0 and enp94s0
# lan1; node-1 and node-2 have both)
NETWORKS = {"front": "lan3", "back": "lan1"}
# interface → the pod's claim, its request, the pool of its address, the bandwidth asked (the example's)
INTERFACES = {
    "net1": ("front-and-back", "nic-front", "front", "200Mi"),
    "net2": ("front-and-back", "nic-back", "back", "300Mi"),
    "net3": ("front", "nic-front", "front", "100Mi"),
}
SIDES = {"left": "node-1", "right": "node-2"}


def _documents(name: str) -> list[dict[str, Any]]:
    said = {"ippools.yaml": "network: {}", "claim-templates.yaml": 'network == "{}"'}.get(name)
    replacements = {said.format(ours): said.format(lab) for ours, lab in NETWORKS.items()} if said else {}
    return example_documents("multinet", name, replacements)


@pytest.fixture
def pools(cluster: ClusterHandle) -> Iterator[dict[str, str]]:
    """The example's pools, created: name → subnet."""
    documents = _documents("ippools.yaml")
    apply(cluster, "default", *documents)
    yield {d["metadata"]["name"]: d["spec"]["ranges"][0]["subnet"] for d in documents}
    for document in documents:
        cluster.kubectl("delete", "ippool", document["metadata"]["name"], "--ignore-not-found")


def _pod(name: str, node: str, claims: list[str] | None = None) -> dict[str, Any]:
    """The example's pod, on `node`; `claims`: its claims made from these templates instead."""
    [pod] = _documents("pod.yaml")
    pod["metadata"]["name"] = name
    pod["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
    if claims is not None:
        pod["spec"]["resourceClaims"] = [
            {"name": f"claim-{i}", "resourceClaimTemplateName": t} for i, t in enumerate(claims)
        ]
        pod["spec"]["containers"][0]["resources"]["claims"] = [
            {"name": f"claim-{i}"} for i in range(len(claims))
        ]
    return runnable_here(pod)


def _pod_claims(kube: Client, namespace: str, pod: str) -> dict[str, str]:
    """The pod's name for each of its claims → the claim made for it (none while not made yet)."""
    found = kube.get(Pod, pod, namespace=namespace)
    statuses = (found.status.resourceClaimStatuses if found.status else None) or []
    return {s.name: s.resourceClaimName for s in statuses if s.resourceClaimName}


def _nic_entries(kube: Client, namespace: str, claims: list[str]) -> list[dict[str, Any]]:
    return [e for c in claims for e in claim_devices(kube, namespace, c) if e["pool"] != POOLS_POOL]


def _all_ready(kube: Client, namespace: str, pod: str) -> bool:
    claims = _pod_claims(kube, namespace, pod)
    entries = _nic_entries(kube, namespace, list(claims.values()))
    return (
        len(claims) == 2
        and len(entries) == len(INTERFACES)
        and all(
            any(c["type"] == "Ready" and c["status"] == "True" for c in e.get("conditions", []))
            for e in entries
        )
    )


def _addresses_in_pod(cluster: ClusterHandle, namespace: str, pod: str) -> dict[str, set[str]]:
    """Interface → its IPv4 CIDRs, as `ip a` inside the pod prints them (eth0 and lo left out)."""
    shown = cluster.kubectl("exec", "-n", namespace, pod, "--", "ip", "-o", "-4", "addr", "show")
    found: dict[str, set[str]] = {}
    for interface, cidr in re.findall(r"^\d+: (\S+?)(?:@\S+)?\s+inet (\S+)", shown, re.MULTILINE):
        if interface not in ("lo", "eth0"):
            found.setdefault(interface, set()).add(cidr)
    return found


def test_three_interfaces_from_two_claims_on_two_networks_each_as_asked_and_reaching_the_other_node(
    cluster: ClusterHandle, kube: Client, ns: str, pools: dict[str, str]
) -> None:
    apply(cluster, ns, *_documents("claim-templates.yaml"))
    apply(cluster, ns, *(_pod(side, node) for side, node in SIDES.items()))
    for side in SIDES:
        wait_for(functools.partial(_all_ready, kube, ns, side), 120, f"{side}: three interfaces Ready")
    wait_for(lambda: len(running(kube, ns)) == 2, 60, "both pods running")

    shown: dict[str, dict[str, set[str]]] = {}
    for side, node in SIDES.items():
        shown[side] = _addresses_in_pod(cluster, ns, side)
        assert set(shown[side]) == set(INTERFACES), shown[side]
        claims = _pod_claims(kube, ns, side)
        # one NIC status entry per interface, with the addresses `ip a` shows
        entries = _nic_entries(kube, ns, list(claims.values()))
        assert len(entries) == len(INTERFACES), entries
        assert {e["networkData"]["interfaceName"]: set(e["networkData"]["ips"]) for e in entries} == shown[
            side
        ]
        # each interface's one address is its network's pool's, and the pool's entry of its claim says so
        pool_entries = [
            (e["device"], e["networkData"]["interfaceName"], set(e["networkData"]["ips"]))
            for c in claims.values()
            for e in claim_devices(kube, ns, c)
            if e["pool"] == POOLS_POOL
        ]
        assert sorted(pool_entries) == sorted(
            (pool, interface, shown[side][interface]) for interface, (_, _, pool, _) in INTERFACES.items()
        )
        for interface, (_, _, pool, _) in INTERFACES.items():
            [cidr] = shown[side][interface]
            assert ipaddress.ip_interface(cidr).network == ipaddress.ip_network(pools[pool]), (
                interface,
                cidr,
            )
        # each NIC result consumed the bandwidth its request asked
        for pod_claim, claim_name in claims.items():
            claim = kube.get(ResourceClaim, claim_name, namespace=ns)
            assert claim.status is not None and claim.status.allocation is not None
            assert claim.status.allocation.devices is not None
            results = [r for r in claim.status.allocation.devices.results or [] if r.pool != POOLS_POOL]
            asked = {request: bw for c, request, _, bw in INTERFACES.values() if c == pod_claim}
            assert sorted(r.request for r in results) == sorted(asked), (pod_claim, results)
            for result in results:
                consumed = (result.consumedCapacity or {}).get("netclaim.dev/bandwidth")
                assert consumed is not None, result
                assert parse_quantity(consumed) == parse_quantity(asked[result.request]), result
                assert result.pool == node
    # the pools hold exactly the addresses the pods show: one each, none twice across the nodes
    for pool in pools:
        held = sorted(a.address for a in allocations(cluster, pool))
        assert held == sorted(
            cidr
            for side in SIDES
            for interface, (_, _, of, _) in INTERFACES.items()
            if of == pool
            for cidr in shown[side][interface]
        )
    # each container reads its interfaces where Kubernetes says (KEP-5304), as `ip a` shows them
    for interface, (pod_claim, request, pool, _) in INTERFACES.items():
        [device] = metadata_devices(cluster, ns, "left", f"resourceclaimtemplates/{pod_claim}/{request}")
        mac, ips, _ = interface_in_pod(cluster, ns, "left", interface)
        assert device["networkData"] == {"interfaceName": interface, "ips": ips, "hardwareAddress": mac}
        assert device["attributes"]["netclaim.dev/network"] == {"string": NETWORKS[pool]}
    # the Multus network-status annotation (on in the test cluster) lists all three, as Multus would
    annotated = {e["interface"]: e for e in network_status(kube, ns, "left")}
    assert set(annotated) == set(INTERFACES), annotated
    assert {i: {f"{ip}/24" for ip in e["ips"]} for i, e in annotated.items()} == shown["left"]
    # traffic on each network crosses to the pod on the other node
    for interface in INTERFACES:
        [cidr] = shown["right"][interface]
        ping(cluster, ns, "left", cidr.split("/")[0], interface=interface)


def test_two_claims_of_a_pod_naming_one_interface_are_refused_before_its_sandbox(
    cluster: ClusterHandle, kube: Client, ns: str, pools: dict[str, str]
) -> None:
    """The same template twice: both claims name net1 and net2."""
    apply(cluster, ns, *_documents("claim-templates.yaml"))
    apply(cluster, ns, _pod("clash", "node-1", ["front-and-back", "front-and-back"]))

    def refusal() -> str:
        selector: FieldSelector = {"involvedObject.name": "clash", "reason": "NetclaimPrepareFailed"}
        events = list(kube.list(Event, namespace=ns, fields=selector))
        return str(events[0].message) if events else ""

    wait_for(lambda: bool(refusal()), 120, "the pod's second claim refused at prepare")
    found = re.search(
        rf"claim {ns}/(\S+): request nic-(front|back) names interface net[12], as claim {ns}/(\S+) of the "
        "same pod does; give one of them another interfaceName",
        refusal(),
    )
    assert found and found.group(1) != found.group(3), refusal()
    refused, prepared = found.group(1), found.group(3)
    assert set(_pod_claims(kube, ns, "clash").values()) == {refused, prepared}

    def failed(claim: str) -> bool:
        return any(
            c["status"] == "False" and c["reason"] == "PrepareFailed"
            for e in claim_devices(kube, ns, claim)
            for c in e.get("conditions", [])
        )

    wait_for(lambda: failed(refused), 60, f"claim {refused} Ready=False PrepareFailed")
    assert not failed(prepared)
    time.sleep(5)  # kubelet keeps retrying prepare meanwhile: the pod must stay without a container
    pod = kube.get(Pod, "clash", namespace=ns)
    assert pod.status is not None and pod.status.phase == "Pending", pod.status
    assert not any(s.state and s.state.running for s in pod.status.containerStatuses or [])

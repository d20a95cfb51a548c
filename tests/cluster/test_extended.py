"""Extended resources backed by netclaim (KEP-5004): examples/extended-resources as shipped, on the test
cluster's lan3 network. A pod that asks `limits: {netclaim.dev/fabric: 1, netclaim.dev/fabric-ip: 1}` and
no claim runs with the class's interface and an address of the pool; deleting it releases everything: the
claim, the address, and on the node the agent's rows, the metadata files and the interface.

Why two limits and not one: docs/composing.md, "Why a pool address takes a second resource"."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterator
from typing import Any

import pytest
from lightkube import Client
from lightkube.resources.core_v1 import Pod
from lightkube.resources.resource_v1 import DeviceClass, ResourceClaim

from netclaim_lab.cluster import ClusterHandle
from tests.cluster.helpers import (
    apply,
    claim_devices,
    example_documents,
    exists,
    in_node,
    interface_in_pod,
    kubectl_json,
    metadata_on_node,
    node_name,
    runnable_here,
    running,
    store_rows,
)
from tests.cluster.ipam import NETWORK
from tests.kube import delete, wait_for

SUBNET = "10.78.0.0/24"  # the example's 10.40.0.0/24 is a tenant's host-local range in test_configure
# the example, on this cluster's network (its NICs say netclaim.dev/network: lan3)
REPLACEMENTS = {
    "classes.yaml": {'network == "fabric"': f'network == "{NETWORK}"'},
    "ippool.yaml": {
        "network: fabric": f"network: {NETWORK}",
        "10.40.0.0/24": SUBNET,
        "10.40.0.1": "10.78.0.1",
    },
    "pod.yaml": {},
}


def _documents(name: str) -> list[dict[str, Any]]:
    return example_documents("extended-resources", name, REPLACEMENTS[name])


@pytest.fixture
def classes(cluster: ClusterHandle, kube: Client) -> Iterator[None]:
    documents = _documents("classes.yaml") + _documents("ippool.yaml")
    apply(cluster, "default", *documents)
    yield
    cluster.kubectl("delete", "ippool", "fabric", "--ignore-not-found")
    for document in documents:
        if document["kind"] == "DeviceClass":
            delete(kube, DeviceClass, document["metadata"]["name"])


def _allocations(cluster: ClusterHandle) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = kubectl_json(
        cluster, "get", "ipallocations", "-l", "netclaim.dev/pool=fabric", "-o", "json"
    )["items"]
    return found


def test_a_pod_asking_the_extended_resource_gets_the_interface_and_a_pool_address(
    cluster: ClusterHandle, kube: Client, ns: str, classes: None
) -> None:
    [pod] = _documents("pod.yaml")
    assert "resourceClaims" not in pod["spec"]  # the workload as a device-plugin cluster wrote it
    apply(cluster, ns, runnable_here(pod))
    wait_for(
        lambda: any(p.metadata and p.metadata.name == "fabric-user" for p in running(kube, ns)),
        120,
        "running",
    )

    _, ips, _ = interface_in_pod(cluster, ns, "fabric-user", "fabric0")
    [address] = ips
    assert ipaddress.ip_interface(address).ip in ipaddress.ip_network(SUBNET), address
    [held] = _allocations(cluster)
    assert held["spec"]["address"] == address

    # the claim the scheduler made for the pod is named in its status and carries our entries
    status = kubectl_json(cluster, "get", "pod", "-n", ns, "fabric-user", "-o", "json")["status"]
    claim_name = status["extendedResourceClaimStatus"]["resourceClaimName"]
    entries = claim_devices(kube, ns, claim_name)
    assert {e["networkData"]["interfaceName"] for e in entries} == {"fabric0"}
    assert address in {ip for e in entries for ip in e["networkData"]["ips"]}

    # what the node keeps for the claim while its pod runs, so that its absence after says something
    node = node_name(kube.get(Pod, "fabric-user", namespace=ns))
    claim = kube.get(ResourceClaim, claim_name, namespace=ns)
    assert claim.metadata is not None
    uid = str(claim.metadata.uid)
    assert [r for r in store_rows(cluster, node) if r["claim_uid"] == uid]
    assert metadata_on_node(cluster, node, ns, claim_name, uid) == ["files", "cdi"]

    delete(kube, Pod, "fabric-user", ns)
    wait_for(lambda: not exists(kube, ResourceClaim, claim_name, ns), 60, "the pod's claim deleted with it")
    wait_for(lambda: _allocations(cluster) == [], 60, "the pool's address released")
    wait_for(
        lambda: (
            not [r for r in store_rows(cluster, node) if r["claim_uid"] == uid]
            and metadata_on_node(cluster, node, ns, claim_name, uid) == []
        ),
        60,
        "the claim's store rows, metadata files and CDI device removed from the node",
    )
    # the macvlan went with the pod's namespace; one left in the node's would be a half-done ADD's
    assert "macvlan" not in in_node(cluster, node, "ip", "-d", "-o", "link", "show")

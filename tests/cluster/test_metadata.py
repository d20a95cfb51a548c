"""Network metadata inside the pod (KEP-5304): each container using the claim reads its interface from
the file Kubernetes defines (name, addresses and MAC as `ip a` shows them; gateways, routes and network as
the CNI config made them), and nothing of it stays on the node once the pod is gone."""

from __future__ import annotations

import copy

from lightkube import Client
from lightkube.resources.core_v1 import Pod
from lightkube.resources.resource_v1 import ResourceClaim

from netclaim_lab.cluster import ClusterHandle
from tests.cluster.helpers import (
    apply,
    claim_template,
    cni_config,
    configured_and_running,
    in_node,
    interface_in_pod,
    macvlan,
    metadata_devices,
    metadata_on_node,
    node_name,
    pod_claim_name,
    pod_manifest,
)
from tests.kube import delete, wait_for

ON_ENP0S10 = 'device.attributes["netclaim.dev"].ifName == "enp0s10"'


def test_a_container_reads_its_interface_and_device_from_the_metadata_file(
    cluster: ClusterHandle, kube: Client, ns: str
) -> None:
    plugin = macvlan("10.77.0.0/24")
    plugin["ipam"]["ranges"][0][0]["gateway"] = "10.77.0.1"
    plugin["ipam"]["routes"] = [{"dst": "10.99.0.0/16", "gw": "10.77.0.1"}]
    pod = pod_manifest("reader", "t")
    [main] = pod["spec"]["containers"]
    pod["spec"]["containers"].append({**copy.deepcopy(main), "name": "second"})  # uses the same claim
    config = cni_config([plugin], name="md-net")
    apply(cluster, ns, claim_template("t", "netclaim-shared", ON_ENP0S10, config), pod)
    wait_for(lambda: configured_and_running(kube, ns, "reader"), 120, "the pod configured and running")
    # a claim from the pod's template: found under the pod's name for it (net) and the request (nic)
    [device] = metadata_devices(cluster, ns, "reader", "resourceclaimtemplates/net/nic")
    assert metadata_devices(cluster, ns, "reader", "resourceclaimtemplates/net/nic", container="second") == [
        device
    ]
    mac, ips, _ = interface_in_pod(cluster, ns, "reader", "net1")
    assert device["networkData"] == {"interfaceName": "net1", "ips": ips, "hardwareAddress": mac}
    # what networkData has no field for, under our names: from the CNI result, as the pod has it
    routes = cluster.kubectl("exec", "-n", ns, "reader", "--", "ip", "route", "show", "dev", "net1")
    assert "10.99.0.0/16 via 10.77.0.1" in routes, routes
    assert device["attributes"]["netclaim.dev/routes"] == {"strings": ["10.99.0.0/16 via 10.77.0.1"]}
    assert device["attributes"]["netclaim.dev/gateways"] == {"strings": ["10.77.0.1"]}
    assert device["attributes"]["netclaim.dev/cniNetwork"] == {"string": "md-net"}
    node = node_name(kube.get(Pod, "reader", namespace=ns))
    assert (device["driver"], device["pool"]) == ("netclaim.dev", node)
    # the NIC's attributes as published, the standard ones included (tests/cluster/cluster.yaml)
    assert device["attributes"]["netclaim.dev/ifName"] == {"string": "enp0s10"}
    assert device["attributes"]["resource.kubernetes.io/pcieRoot"] == {"string": "pci0000:5d"}
    assert device["attributes"]["resource.kubernetes.io/numaNode"] == {"int": 0}

    claim = kube.get(ResourceClaim, pod_claim_name(kube, ns, "reader"), namespace=ns)
    assert claim.metadata is not None
    uid, name = str(claim.metadata.uid), str(claim.metadata.name)
    assert metadata_on_node(cluster, node, ns, name, uid) == ["files", "cdi"]
    # one spec for the node's metadata devices (containerd rereads every spec file at each change)
    assert f'"{uid}_nic"' in in_node(cluster, node, "cat", "/run/cdi/netclaim.dev_metadata.json")
    delete(kube, Pod, "reader", ns)
    wait_for(
        lambda: metadata_on_node(cluster, node, ns, name, uid) == [],
        60,
        "the claim's metadata file and its CDI device removed",
    )

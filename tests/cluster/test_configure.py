"""Issue 4 acceptance on the real cluster: kubelet plugin, NRI hooks, CNI plugins, claim status, teardown."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from lightkube import Client
from lightkube.core.client import FieldSelector
from lightkube.resources.core_v1 import Event, Pod
from lightkube.resources.resource_v1 import DeviceClass, ResourceClaim

from netclaim_lab.cluster import ClusterHandle
from netclaim_lab.layout import REPO_ROOT
from tests.cluster.helpers import (
    admin_device_class,
    apply,
    claim_devices,
    claim_template,
    cni_config,
    configured_and_running,
    deployment,
    exists,
    in_node,
    interface_in_pod,
    ipam_reservations,
    macvlan,
    metadata_devices,
    name_of,
    node_name,
    ping,
    pod_claim_conditions,
    pod_manifest,
    published,
    ready_entry,
    running,
    store_rows,
)
from tests.kube import delete, typed, wait_for

DEMO = REPO_ROOT / "examples" / "demo"
# `network` is an admin attribute only some devices carry: CEL errors on a missing key fail scheduling.
ON_LAN1 = (
    '"network" in device.attributes["netclaim.dev"] && device.attributes["netclaim.dev"].network == "lan1"'
)


def test_a_pinned_ipam_holds_and_the_interface_name_stays_free(
    cluster: ClusterHandle, kube: Client, ns: str
) -> None:
    class_name = f"lan1-pinned-{ns}"
    admin = {**cni_config([macvlan("10.31.0.0/24")], name="pinned-net"), "pinned": ["ipam", "master"]}
    kube.create(admin_device_class(class_name, ON_LAN1, admin))
    try:
        own_ipam = cni_config([macvlan("10.10.1.0/24")], name="pinned-net")  # the demo LAN's range
        renamed = {"apiVersion": "netclaim.dev/v1alpha1", "kind": "CNIConfig", "interfaceName": "data1"}
        apply(
            cluster,
            ns,
            claim_template("steal", class_name, "true", own_ipam),
            pod_manifest("thief", "steal"),
            claim_template("rename", class_name, "true", renamed),
            pod_manifest("renamer", "rename"),
        )

        def refused() -> bool:
            return any(
                c["reason"] == "PrepareFailed" and ".ipam: pinned by the DeviceClass" in c["message"]
                for c in pod_claim_conditions(kube, ns, "thief")
            )

        wait_for(refused, 120, "the claim overriding the pinned IPAM refused, naming the field")
        wait_for(lambda: configured_and_running(kube, ns, "renamer"), 120, "the renamed interface configured")
        _, addresses, _ = interface_in_pod(cluster, ns, "renamer", "data1")
        assert ipaddress.ip_interface(addresses[0]).ip in ipaddress.ip_network("10.31.0.0/24")
    finally:
        for pod in ("thief", "renamer"):
            delete(kube, Pod, pod, ns)
        wait_for(lambda: not list(kube.list(Pod, namespace=ns)), 120, "the pods gone")
        delete(kube, DeviceClass, class_name)


def test_one_template_on_nics_with_different_names(cluster: ClusterHandle, kube: Client, ns: str) -> None:
    """node-1 reaches lan1 through ens1f0, node-2 through enp94s0; `master` comes from the placeholder."""
    on_lan1 = ON_LAN1
    apply(
        cluster,
        ns,
        claim_template("lan1", "netclaim-shared", on_lan1, cni_config([macvlan("10.20.0.0/24")]), "20G"),
        deployment("hetero", 2, "lan1"),
    )  # 20G of a 25G NIC each: one replica per node
    wait_for(lambda: len(running(kube, ns, "hetero")) == 2, 120, "both replicas running")
    pods = running(kube, ns, "hetero")
    assert sorted(node_name(p) for p in pods) == ["node-1", "node-2"]
    ips = []
    for replica in pods:
        mac, addresses, _ = interface_in_pod(cluster, ns, name_of(replica), "net1")
        entry = ready_entry(kube, ns, name_of(replica))
        assert entry is not None and entry["networkData"]["hardwareAddress"] == mac
        ips.append(addresses[0].split("/")[0])
    ping(cluster, ns, name_of(pods[0]), ips[1])


def test_admin_config_in_the_device_class(cluster: ClusterHandle, kube: Client, ns: str) -> None:
    class_name = f"lan1-admin-{ns}"
    admin = cni_config([macvlan("10.30.0.0/24")], interface="data0", name="admin-net")
    kube.create(admin_device_class(class_name, ON_LAN1, admin))
    try:
        apply(cluster, ns, claim_template("plain", class_name, "true", None), pod_manifest("tenant", "plain"))
        wait_for(lambda: configured_and_running(kube, ns, "tenant"), 120, "the tenant pod configured")
        mac, addresses, _ = interface_in_pod(cluster, ns, "tenant", "data0")
        assert ipaddress.ip_interface(addresses[0]).ip in ipaddress.ip_network("10.30.0.0/24")
        entry = ready_entry(kube, ns, "tenant")
        assert entry is not None and entry["networkData"] == {
            "interfaceName": "data0",
            "ips": addresses,
            "hardwareAddress": mac,
        }
    finally:
        delete(kube, Pod, "tenant", ns)
        wait_for(lambda: not list(kube.list(Pod, namespace=ns)), 120, "tenant gone")
        delete(kube, DeviceClass, class_name)


def test_exclusive_nic_moves_into_the_pod_and_comes_back_restored(
    cluster: ClusterHandle, kube: Client, ns: str
) -> None:
    host_device = {
        "type": "host-device",
        "device": "{{ device.ifName }}",
        "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.40.0.0/24"}]]},
    }
    on_enp7s0 = 'device.attributes["netclaim.dev"].ifName == "enp7s0"'
    before = published(kube, "node-2")["enp7s0"]
    apply(
        cluster,
        ns,
        claim_template("whole", "netclaim-exclusive", on_enp7s0, cni_config([host_device], "wan0")),
        pod_manifest("owner", "whole"),
    )
    wait_for(lambda: configured_and_running(kube, ns, "owner"), 120, "the owner pod configured")
    mac, _, mtu = interface_in_pod(cluster, ns, "owner", "wan0")
    assert (mac, mtu) == ("02:42:00:00:07:01", 9000)
    assert "enp7s0" not in in_node(cluster, "node-2", "ip", "-o", "link", "show")
    assert published(kube, "node-2")["enp7s0"]["name"] == before["name"]  # still this node's device

    apply(cluster, ns, pod_manifest("waiter", "whole"))  # nobody else gets it meanwhile

    def unschedulable() -> bool:
        status = kube.get(Pod, "waiter", namespace=ns).status
        return any(c.reason == "Unschedulable" for c in (status.conditions if status else None) or [])

    wait_for(unschedulable, 60, "waiter unschedulable")

    delete(kube, Pod, "owner", ns)
    # host-device takes the NIC from the node's namespace: the waiter gets it only once it came back, and
    # gets it as it was published (the node may hold it for a moment only: the waiter is already waiting)
    wait_for(
        lambda: configured_and_running(kube, ns, "waiter"), 120, "the waiter gets the NIC once it is back"
    )
    mac, _, mtu = interface_in_pod(cluster, ns, "waiter", "wan0")
    assert (mac, mtu) == ("02:42:00:00:07:01", 9000)


def test_teardown_leaves_no_links_reservations_rows_or_status(
    cluster: ClusterHandle, kube: Client, ns: str
) -> None:
    """A standalone claim outlives its pod: after the pod, our status entry must be gone too."""
    on_enp0s10 = 'device.attributes["netclaim.dev"].ifName == "enp0s10"'
    spec = claim_template(
        "unused", "netclaim-shared", on_enp0s10, cni_config([macvlan("10.50.0.0/24")], name="td-net")
    )
    kube.create(
        typed(
            ResourceClaim,
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaim",
                "metadata": {"name": "standalone", "namespace": ns},
                "spec": spec["spec"]["spec"],
            },
        )
    )
    manifest = pod_manifest("user", "unused")
    manifest["spec"]["resourceClaims"] = [{"name": "net", "resourceClaimName": "standalone"}]
    apply(cluster, ns, manifest)
    wait_for(
        lambda: any(e["conditions"][0]["status"] == "True" for e in claim_devices(kube, ns, "standalone")),
        120,
        "the standalone claim Ready",
    )
    node = node_name(kube.get(Pod, "user", namespace=ns))
    claim = kube.get(ResourceClaim, "standalone", namespace=ns)
    assert claim.metadata is not None
    assert ipam_reservations(cluster, "td-net") and [
        r for r in store_rows(cluster, node) if r["claim_uid"] == claim.metadata.uid
    ]

    delete(kube, Pod, "user", ns)
    uid = claim.metadata.uid

    def nothing_left() -> bool:
        return (
            not claim_devices(kube, ns, "standalone")
            and ipam_reservations(cluster, "td-net") == set()
            and not [r for r in store_rows(cluster, node) if r["claim_uid"] == uid]
        )

    wait_for(nothing_left, 60, "no status entry, IPAM reservation or store row left")
    assert exists(kube, ResourceClaim, "standalone", ns)  # the claim itself stays: only our traces go
    assert "macvlan" not in in_node(cluster, node, "ip", "-d", "-o", "link", "show")


def test_an_admins_host_local_ipv6_range_reaches_the_pod_and_its_status(
    cluster: ClusterHandle, kube: Client, ns: str
) -> None:
    """host-local IPv6 from an admin's DeviceClass: the same address in `ip a`, in networkData and in the
    metadata file."""
    class_name = f"lan1-v6-{ns}"
    plugin = {
        "type": "macvlan",
        "master": "{{ device.ifName }}",
        "mode": "bridge",
        "ipam": {"type": "host-local", "ranges": [[{"subnet": "fd00:79::/64", "rangeStart": "fd00:79::10"}]]},
    }
    kube.create(admin_device_class(class_name, ON_LAN1, cni_config([plugin], name="v6-net")))
    try:
        apply(cluster, ns, claim_template("v6", class_name, "true", None), pod_manifest("six", "v6"))
        wait_for(lambda: configured_and_running(kube, ns, "six"), 120, "the IPv6 pod configured and running")
        shown = cluster.kubectl("exec", "-n", ns, "six", "--", "ip", "-o", "-6", "addr", "show", "net1")
        [address] = [a for a in re.findall(r"inet6 (\S+)", shown) if not a.startswith("fe80:")]
        assert ipaddress.ip_interface(address).ip in ipaddress.ip_network("fd00:79::/64"), shown
        entry = ready_entry(kube, ns, "six")
        assert entry is not None and entry["networkData"]["ips"] == [address]
        [device] = metadata_devices(cluster, ns, "six", "resourceclaimtemplates/net/nic")
        assert device["networkData"]["ips"] == [address]
        dad = cluster.kubectl(  # off for our interface only: the ADD does not wait for it (docs/ipam.md)
            "exec",
            "-n",
            ns,
            "six",
            "--",
            "cat",
            "/proc/sys/net/ipv6/conf/net1/accept_dad",
            "/proc/sys/net/ipv6/conf/default/accept_dad",
        )
        assert dad.split() == ["0", "1"], dad  # the namespace's default put back for what comes later
    finally:
        delete(kube, Pod, "six", ns)
        delete(kube, DeviceClass, class_name)


def test_a_claim_named_by_a_second_pod_is_refused_before_that_pod_starts(
    cluster: ClusterHandle, kube: Client, ns: str
) -> None:
    """One claim, one pod (docs/composing.md, "One claim, one pod"; the admission policy in
    docs/security.md): the scheduler's reservation of the claim for a second pod is refused by admission,
    so that pod stays Pending, saying why; the first keeps its interface."""
    spec = claim_template(
        "unused", "netclaim-shared", "true", cni_config([macvlan("10.51.0.0/24")], name="sh")
    )
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "shared", "namespace": ns},
        "spec": spec["spec"]["spec"],
    }
    kube.create(typed(ResourceClaim, claim))
    pods = {name: pod_manifest(name, "unused") for name in ("first", "second")}
    for manifest in pods.values():
        manifest["spec"]["resourceClaims"] = [{"name": "net", "resourceClaimName": "shared"}]
    apply(cluster, ns, pods["first"])

    def first_configured() -> bool:  # a claim named by the pod: not in the pod's resourceClaimStatuses
        ready = any(e["conditions"][0]["status"] == "True" for e in claim_devices(kube, ns, "shared"))
        return ready and any(name_of(p) == "first" for p in running(kube, ns))

    wait_for(first_configured, 120, "the first pod configured and running")
    apply(cluster, ns, pods["second"])
    seen: list[str] = []

    def refused() -> bool:
        pod = kube.get(Pod, "second", namespace=ns)
        conditions = (pod.status.conditions if pod.status else None) or []
        seen[:] = [f"{c.type}={c.status}: {c.message}" for c in conditions]
        return any(
            c.type == "PodScheduled"
            and c.status == "False"
            and "already reserved for pod first" in str(c.message)
            for c in conditions
        )

    wait_for(refused, 60, "the second pod Pending, told the claim is the first pod's")
    second = kube.get(Pod, "second", namespace=ns)
    assert second.spec is not None and not second.spec.nodeName, seen
    assert "give each pod its own claim" in " ".join(seen)
    reserved = kube.get(ResourceClaim, "shared", namespace=ns)
    assert reserved.status is not None and [r.name for r in reserved.status.reservedFor or []] == ["first"]
    assert first_configured()
    assert len(claim_devices(kube, ns, "shared")) == 1  # the first pod's interface, the only status entry


BAD_CONFIGS: dict[str, tuple[dict[str, Any], str]] = {
    "unknown field": ({"colour": "red"}, "colour: unknown field"),
    "unknown kind": ({"kind": "Macvlan"}, "kind: 'Macvlan' is not one of"),
    "plugin missing": (
        {"config": {"cniVersion": "1.0.0", "name": "x", "plugins": [{"type": "nosuchplugin"}]}},
        "plugins[0].type: 'nosuchplugin' is admin-only",
    ),
    "plugin with a slash": (
        {"config": {"cniVersion": "1.0.0", "name": "x", "plugins": [{"type": "../macvlan"}]}},
        "plugins[0].type: '../macvlan' must be a plugin name",
    ),
    "missing attribute": (
        {
            "config": {
                "cniVersion": "1.0.0",
                "name": "x",
                "plugins": [{"type": "macvlan", "master": "{{ device.vlanId }}"}],
            }
        },
        "config.plugins[0].master: the allocated device has no attribute 'vlanId'",
    ),
    "invalid CIDR": (
        {"config": {"cniVersion": "1.0.0", "name": "bad-cidr", "plugins": [macvlan("10.60.0.0/33")]}},
        "ipam.ranges[0][0].subnet: '10.60.0.0/33' is not a CIDR",
    ),
}


@pytest.fixture
def without_admission_policy(cluster: ClusterHandle) -> Iterator[None]:
    """As in a cluster where deploy/admission.yaml is not installed: prepare is the last line of defence."""
    cluster.kubectl("delete", "validatingadmissionpolicybinding", "netclaim-config", "--ignore-not-found")
    probe = claim_template("probe", "netclaim-shared", "true", cni_config([macvlan("10.60.0.0/24")], "a/b"))
    document = yaml.safe_dump(probe)
    wait_for(
        lambda: bool(
            cluster.kubectl(
                "create", "--dry-run=server", "-n", "default", "-f", "-", input_text=document, check=False
            )
        ),
        30,
        "the policy's binding gone",
    )
    yield
    cluster.kubectl("apply", "-f", str(DEMO.parents[1] / "deploy" / "admission.yaml"))


@pytest.mark.parametrize("case", sorted(BAD_CONFIGS))
def test_bad_config_keeps_the_pod_out_and_names_the_field(
    cluster: ClusterHandle, kube: Client, ns: str, case: str, without_admission_policy: None
) -> None:
    change, expected = BAD_CONFIGS[case]
    config = {**cni_config([macvlan("10.60.0.0/24")], name="bad-net"), **change}
    on_enp0s10 = 'device.attributes["netclaim.dev"].ifName == "enp0s10"'
    apply(
        cluster,
        ns,
        claim_template("bad", "netclaim-shared", on_enp0s10, config),
        pod_manifest("victim", "bad"),
    )

    def reported() -> bool:
        return any(
            expected in c.get("message", "") and c["status"] == "False"
            for c in pod_claim_conditions(kube, ns, "victim")
        )

    wait_for(reported, 60, f"the claim's Ready=False condition naming {expected!r}")
    selector: FieldSelector = {"involvedObject.name": "victim", "type": "Warning"}
    wait_for(
        lambda: any(expected in (e.message or "") for e in kube.list(Event, namespace=ns, fields=selector)),
        30,
        "a Warning Event on the pod naming the field",
    )
    victim = kube.get(Pod, "victim", namespace=ns)
    assert victim.status is not None and victim.status.phase == "Pending"
    node = node_name(victim)
    assert ipam_reservations(cluster, "bad-net") == set() and ipam_reservations(cluster, "bad-cidr") == set()
    assert not [r for r in store_rows(cluster, node) if r["claim_namespace"] == ns]

"""Several networks per pod: two claims, one of them with two NIC requests, give a pod three interfaces on
two networks, each shaped and addressed as its own request asks; a name two claims of a pod both ask is
refused at prepare, before the pod's sandbox."""

from __future__ import annotations

import functools
import re
from typing import Any

from lightkube import Client
from lightkube.core.client import FieldSelector
from lightkube.resources.core_v1 import Event, Pod
from lightkube.resources.resource_v1 import ResourceClaim

from netclaim.quantity import parse_quantity
from netclaim_lab.cluster import ClusterHandle
from netclaim_lab.images import BUSYBOX_IMAGE
from tests.cluster.helpers import (
    apply,
    claim_devices,
    cni_config,
    interface_in_pod,
    metadata_devices,
    network_status,
    ping,
    running,
)
from tests.kube import wait_for

ON_LAN0 = 'device.attributes["netclaim.dev"].ifName == "enp0s10"'
ON_LAN1 = (
    '"network" in device.attributes["netclaim.dev"] && device.attributes["netclaim.dev"].network == "lan1"'
)
SIDES = {"left": ("node-1", 10), "right": ("node-2", 20)}  # node, first host number of its ranges
# interface → (network's NIC selector, subnet, bandwidth asked)
INTERFACES = {
    "net1": (ON_LAN0, "10.74.0.0/24", "200Mi"),
    "net2": (ON_LAN1, "10.75.0.0/24", "300Mi"),
    "net3": (ON_LAN0, "10.76.0.0/24", "100Mi"),
}


def _macvlan(subnet: str, first: int) -> dict[str, Any]:
    """host-local is per node: each side takes its own ten addresses of the subnet."""
    prefix = subnet.rsplit(".", 1)[0]
    ranges = [[{"subnet": subnet, "rangeStart": f"{prefix}.{first}", "rangeEnd": f"{prefix}.{first + 9}"}]]
    return {
        "type": "macvlan",
        "master": "{{ device.ifName }}",
        "mode": "bridge",
        "ipam": {"type": "host-local", "ranges": ranges},
    }


def _claim(name: str, interfaces: list[str], first: int) -> dict[str, Any]:
    requests, configs = [], []
    for interface in interfaces:
        cel, subnet, bandwidth = INTERFACES[interface]
        request = f"nic-{interface}"
        requests.append(
            {
                "name": request,
                "exactly": {
                    "deviceClassName": "netclaim-shared",
                    "selectors": [{"cel": {"expression": cel}}],
                    "capacity": {"requests": {"netclaim.dev/bandwidth": bandwidth}},
                },
            }
        )
        config = cni_config([_macvlan(subnet, first)], interface=interface, name=f"mn-{interface}")
        configs.append({"requests": [request], "opaque": {"driver": "netclaim.dev", "parameters": config}})
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {"devices": {"requests": requests, "config": configs}},
    }


def _pod(name: str, node: str, claims: list[str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "terminationGracePeriodSeconds": 0,
            "nodeSelector": {"kubernetes.io/hostname": node},
            "resourceClaims": [{"name": c, "resourceClaimName": c} for c in claims],
            "containers": [
                {
                    "name": "main",
                    "image": BUSYBOX_IMAGE,
                    "imagePullPolicy": "Never",
                    "command": ["sleep", "3600"],
                    "resources": {"claims": [{"name": c} for c in claims]},
                }
            ],
        },
    }


def _addresses_in_pod(cluster: ClusterHandle, namespace: str, pod: str) -> dict[str, set[str]]:
    """Interface → its IPv4 CIDRs, as `ip a` inside the pod prints them (eth0 and lo left out)."""
    shown = cluster.kubectl("exec", "-n", namespace, pod, "--", "ip", "-o", "-4", "addr", "show")
    found: dict[str, set[str]] = {}
    for interface, cidr in re.findall(r"^\d+: (\S+?)(?:@\S+)?\s+inet (\S+)", shown, re.MULTILINE):
        if interface not in ("lo", "eth0"):
            found.setdefault(interface, set()).add(cidr)
    return found


def _entries(kube: Client, namespace: str, claims: list[str]) -> list[dict[str, Any]]:
    return [e for c in claims for e in claim_devices(kube, namespace, c)]


def _all_ready(kube: Client, namespace: str, claims: list[str], count: int) -> bool:
    entries = _entries(kube, namespace, claims)
    return len(entries) == count and all(
        any(c["type"] == "Ready" and c["status"] == "True" for c in e.get("conditions", [])) for e in entries
    )


def test_three_interfaces_from_two_claims_on_two_networks_each_as_asked_and_reaching_the_other_node(
    cluster: ClusterHandle, kube: Client, ns: str
) -> None:
    claims = {side: [f"{side}-a", f"{side}-b"] for side in SIDES}
    for side, (node, first) in SIDES.items():
        a, b = claims[side]
        apply(
            cluster,
            ns,
            _claim(a, ["net1", "net2"], first),
            _claim(b, ["net3"], first),
            _pod(side, node, claims[side]),
        )
    for side_claims in claims.values():
        wait_for(
            functools.partial(_all_ready, kube, ns, side_claims, 3),
            120,
            f"{side_claims}: three interfaces Ready",
        )
    wait_for(lambda: len(running(kube, ns)) == 2, 60, "both pods running")

    shown: dict[str, dict[str, set[str]]] = {}
    for side, (node, first) in SIDES.items():
        shown[side] = _addresses_in_pod(cluster, ns, side)
        assert set(shown[side]) == set(INTERFACES), shown[side]
        entries = _entries(kube, ns, claims[side])
        # one status entry per interface, with the addresses `ip a` shows
        assert {e["networkData"]["interfaceName"]: set(e["networkData"]["ips"]) for e in entries} == shown[
            side
        ]
        for interface, (_, subnet, _) in INTERFACES.items():
            [cidr] = shown[side][interface]
            host = int(cidr.split("/")[0].rsplit(".", 1)[1])
            assert cidr.startswith(subnet.rsplit(".", 1)[0]) and first <= host < first + 10, (interface, cidr)
        # each NIC result consumed the bandwidth its request asked
        for name in claims[side]:
            claim = kube.get(ResourceClaim, name, namespace=ns)
            assert claim.status is not None and claim.status.allocation is not None
            assert claim.status.allocation.devices is not None
            for result in claim.status.allocation.devices.results or []:
                asked = INTERFACES[result.request.removeprefix("nic-")][2]
                consumed = (result.consumedCapacity or {}).get("netclaim.dev/bandwidth")
                assert consumed is not None and parse_quantity(consumed) == parse_quantity(asked), (
                    name,
                    result,
                )
                assert result.pool == node
    # each container reads its interfaces where Kubernetes says (KEP-5304), as `ip a` shows them
    for interface in INTERFACES:
        holder = claims["left"][0] if interface in ("net1", "net2") else claims["left"][1]
        [device] = metadata_devices(cluster, ns, "left", f"resourceclaims/{holder}/nic-{interface}")
        mac, ips, _ = interface_in_pod(cluster, ns, "left", interface)
        assert device["networkData"] == {"interfaceName": interface, "ips": ips, "hardwareAddress": mac}
    # the Multus network-status annotation (on in the test cluster) lists all three, as Multus would
    annotated = {e["interface"]: e for e in network_status(kube, ns, "left")}
    assert set(annotated) == set(INTERFACES), annotated
    assert {i: {f"{ip}/24" for ip in e["ips"]} for i, e in annotated.items()} == shown["left"]
    # traffic on each network crosses to the pod on the other node
    for interface in INTERFACES:
        [cidr] = shown["right"][interface]
        ping(cluster, ns, "left", cidr.split("/")[0], interface=interface)


def test_two_claims_of_a_pod_naming_one_interface_are_refused_before_its_sandbox(
    cluster: ClusterHandle, kube: Client, ns: str
) -> None:
    first = _claim("first", ["net1"], 30)
    second = _claim("second", ["net3"], 30)
    second["spec"]["devices"]["config"][0]["opaque"]["parameters"]["interfaceName"] = "net1"
    apply(cluster, ns, first, second, _pod("clash", "node-1", ["first", "second"]))

    def refusal() -> str:
        selector: FieldSelector = {"involvedObject.name": "clash", "reason": "NetclaimPrepareFailed"}
        events = list(kube.list(Event, namespace=ns, fields=selector))
        return str(events[0].message) if events else ""

    wait_for(lambda: bool(refusal()), 120, "the pod's second claim refused at prepare")
    assert re.search(
        rf"claim {ns}/(first|second): request nic-net\d names interface net1, as claim "
        rf"{ns}/(first|second) of the same pod does; give one of them another interfaceName",
        refusal(),
    ), refusal()
    pod = kube.get(Pod, "clash", namespace=ns)
    statuses = (pod.status.containerStatuses if pod.status else None) or []
    assert not any(s.state and s.state.running for s in statuses)  # never started

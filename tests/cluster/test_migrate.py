"""`netclaim migrate` on the Multus example (examples/multus): the migrated objects are accepted by the
real API server, the workloads that can run here come up with the interfaces and addresses their
NetworkAttachmentDefinitions described (ipvlan, SR-IOV VFs and whereabouts cannot run in this lab: the
kernel has no ipvlan, the veth NICs have no VFs, whereabouts is not installed on the test nodes), and the
migrated MultiNetworkPolicy is enforced on the migrated interface."""

from __future__ import annotations

import ipaddress
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from lightkube import Client
from lightkube.resources.core_v1 import Pod

from netclaim_lab.cluster import ClusterHandle
from netclaim_lab.layout import REPO_ROOT
from tests.cluster.helpers import (
    apply,
    in_pod_netns,
    interface_in_pod,
    name_of,
    network_status,
    running,
    sandbox_netns,
)
from tests.kube import wait_for

EXAMPLES = REPO_ROOT / "examples" / "multus"
RUNNABLE = ("db", "ledger", "worker", "sniffer", "web")


@pytest.fixture
def migrated(cluster: ClusterHandle, ns: str, tmp_path: Path) -> Iterator[list[dict[str, Any]]]:
    """The example, moved to the test's namespace, through `netclaim migrate` as a user runs it."""
    for source in EXAMPLES.glob("*.yaml"):
        (tmp_path / source.name).write_text(source.read_text().replace("shop", ns))
    out = tmp_path / "migrated.yaml"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "netclaim",
            "migrate",
            *sorted(str(p) for p in tmp_path.glob("*.yaml")),
            "--output-file",
            str(out),
            # the NAD's NIC (ens1f0) is published on network lan1 here (tests/cluster/policy.yaml)
            "--network",
            f"{ns}/fixed=lan1",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr  # 1 when the output does not pass validate
    assert f"# not migrated: NetworkAttachmentDefinition/{ns}/overlay" in done.stderr
    objects = [o for o in yaml.safe_load_all(out.read_text()) if o]
    classes = [o["metadata"]["name"] for o in objects if o["kind"] == "DeviceClass"]
    yield objects
    cluster.kubectl("delete", "deviceclass", *classes, "--ignore-not-found")


def _ips(cluster: ClusterHandle, ns: str, pod: str, interface: str) -> list[ipaddress.IPv4Interface]:
    return [ipaddress.IPv4Interface(a) for a in interface_in_pod(cluster, ns, pod, interface)[1]]


def test_migrated_workloads_come_up_with_the_interfaces_their_nads_described(
    cluster: ClusterHandle, kube: Client, ns: str, migrated: list[dict[str, Any]]
) -> None:
    wanted = [
        o
        for o in migrated
        if o["kind"] in ("DeviceClass", "ResourceClaimTemplate", "MultiNetworkPolicy")
        or o["metadata"]["name"] in RUNNABLE
    ]
    cluster_scoped = [o for o in wanted if o["kind"] == "DeviceClass"]
    apply(cluster, "default", *cluster_scoped)
    apply(cluster, ns, *(o for o in wanted if o["kind"] != "DeviceClass"))
    wait_for(lambda: len(running(kube, ns)) == len(RUNNABLE), 180, "the migrated workloads running")
    pods = {
        str(p.metadata.labels["app"]): name_of(p)
        for p in running(kube, ns)
        if p.metadata and p.metadata.labels
    }

    def inside(app: str, interface: str, subnet: str) -> ipaddress.IPv4Interface:
        [address] = _ips(cluster, ns, pods[app], interface)
        assert address.ip in ipaddress.ip_network(subnet), (app, interface, address)
        return address

    storage = inside("db", "net1", "10.120.1.0/24")
    assert ipaddress.IPv4Address("10.120.1.20") <= storage.ip <= ipaddress.IPv4Address("10.120.1.50")
    assert _ips(cluster, ns, pods["ledger"], "fixed0") == [ipaddress.IPv4Interface("10.120.2.10/24")]
    inside("worker", "net1", "10.120.1.0/24")
    inside("worker", "back0", "10.120.3.0/24")
    inside("sniffer", "cap0", "10.120.4.0/24")
    inside("web", "net1", "10.120.8.0/24")
    mac, _, _ = interface_in_pod(cluster, ns, pods["web"], "net1")
    assert mac == "02:00:00:00:12:34"
    routes = cluster.kubectl("exec", "-n", ns, pods["web"], "--", "ip", "route")
    assert (
        "0.0.0.0/1 via 10.120.8.1 dev net1" in routes and "128.0.0.0/1 via 10.120.8.1 dev net1" in routes
    ), routes
    # the shop's policy, now also for netclaim.dev/lan1, isolates ledger on fixed0 (db, its one allowed
    # peer, has no address on lan1: nothing is allowed in)
    ledger = kube.get(Pod, pods["ledger"], namespace=ns)
    assert ledger.spec is not None and ledger.metadata is not None
    node, uid = str(ledger.spec.nodeName), str(ledger.metadata.uid)

    def table() -> str:
        return in_pod_netns(cluster, node, sandbox_netns(cluster, node, uid), "nft", "list", "ruleset")

    wait_for(lambda: '"fixed0"' in table(), 60, "the migrated policy in ledger's table, on fixed0")
    assert "table inet netclaim" in table(), table()
    # tools reading Multus's annotation see the network by its NAD's name
    wait_for(lambda: bool(network_status(kube, ns, pods["worker"])), 60, "worker's network-status")
    assert [(e["name"], e["interface"]) for e in network_status(kube, ns, pods["worker"])] == [
        (f"{ns}/backplane", "back0"),
        (f"{ns}/storage", "net1"),
    ]

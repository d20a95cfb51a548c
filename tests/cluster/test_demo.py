"""Issue 5: the talks' demo as `make demo` runs it, on the test cluster; and the deploy/ manifests."""

from __future__ import annotations

import copy
import io
import ipaddress
from collections.abc import Iterator

import pytest
from lightkube import Client
from lightkube.resources.core_v1 import Namespace, Pod

from netclaim_lab import demo
from netclaim_lab.cluster import ClusterHandle
from netclaim_lab.layout import REPO_ROOT
from tests.cluster.helpers import (
    interface_in_pod,
    kubectl_netclaim,
    name_of,
    network_status,
    ping,
    pod_claim_entries,
    running,
)
from tests.kube import delete, wait_for

DEPLOY = REPO_ROOT / "deploy"


@pytest.fixture
def demo_namespace(cluster: ClusterHandle, kube: Client) -> Iterator[None]:
    yield
    delete(kube, Namespace, demo.NAMESPACE)
    wait_for(lambda: not list(kube.list(Pod, namespace=demo.NAMESPACE)), 180, "demo pods gone")
    # the demo's pool is cluster-wide: left, its device would meet every later test's DeviceClass selectors
    cluster.kubectl("delete", "ippool", demo.POOL, "--ignore-not-found", "--wait=true", timeout=120)


def test_the_demo_report_shows_every_expectation_met(
    cluster: ClusterHandle, kube: Client, demo_namespace: None
) -> None:
    """The talks' demo, run once for the whole suite: the report, what it checks, and what it does not."""
    report = io.StringIO()
    try:
        outcome = demo.run(cluster, out=report)
    finally:
        print(report.getvalue())  # pytest shows it when the demo fails
    text = report.getvalue()
    assert outcome.problems == []
    for section in (
        "== NICs and bandwidth",
        "== Pods",
        "== Pending",
        "== Pod-A: `ip a show net1`",
        "== Ping",
    ):
        assert section in text
    assert "cannot allocate all claims" in text and " 0% packet loss" in text
    assert "== IP pool demo-net" in text and "capacity 253 claims" in text
    used = {
        node: (total, used)
        for node, _, if_name, total, used in demo.nic_table(outcome)
        if if_name == "enp0s10"
    }
    assert sorted(used.values()) == [(10 * 2**30, 10 * 2**30), (10 * 2**30, 10 * 2**30)]

    # Pod-A's claim status: networkData as `ip` shows it inside the pod, the CNI result in `data`
    entries = [e for e in pod_claim_entries(kube, demo.NAMESPACE, "pod-a") if e["pool"] != demo.POOLS_POOL]
    assert len(entries) == 1
    entry = entries[0]
    mac, addresses, _ = interface_in_pod(cluster, demo.NAMESPACE, "pod-a", "net1")
    assert entry["networkData"] == {"interfaceName": "net1", "ips": addresses, "hardwareAddress": mac}
    assert ipaddress.ip_interface(addresses[0]).ip in ipaddress.ip_network("10.10.1.0/24")
    assert entry["data"]["interfaces"][0]["name"] == "net1"
    # Multus's network-status annotation on every running demo pod, for the tools that read it: the
    # interface, addresses and MAC of its claim's status
    for running_pod in running(kube, demo.NAMESPACE):
        name = name_of(running_pod)
        [nic] = [e for e in pod_claim_entries(kube, demo.NAMESPACE, name) if e["pool"] != demo.POOLS_POOL]
        wait_for(lambda: bool(network_status(kube, demo.NAMESPACE, name)), 60, f"{name}'s network-status")  # noqa: B023
        [annotated] = network_status(kube, demo.NAMESPACE, name)
        data = nic["networkData"]
        assert annotated == {
            "name": f"{demo.NAMESPACE}/net",
            "interface": data["interfaceName"],
            "ips": [ip.split("/")[0] for ip in data["ips"]],
            "mac": data["hardwareAddress"],
            "mtu": 1500,
            "default": False,
            "dns": {},
        }
    # the two B replicas share one NIC: macvlan bridge mode lets them reach each other
    b_pods = running(kube, demo.NAMESPACE, "deployment-b")
    b_ips = [
        interface_in_pod(cluster, demo.NAMESPACE, name_of(p), "net1")[1][0].split("/")[0] for p in b_pods
    ]
    ping(cluster, demo.NAMESPACE, name_of(b_pods[0]), b_ips[1])

    # kubectl netclaim: why the third replica waits, and the demo's tables for its namespace
    pending = next(p for p in outcome.pods if not p["spec"].get("nodeName"))
    told = kubectl_netclaim(cluster, "explain", f"pod/{pending['metadata']['name']}", "-n", demo.NAMESPACE)
    for node in ("node-1", "node-2"):
        assert f"enp0s10 on {node}: does not fit: bandwidth: 0 free of 10Gi, asks 5Gi" in told, told
        assert (
            f"enp0s10 on {node}: 0" in told.split("fix: no device has the bandwidth asked for free (")[1]
        ), told
    status = kubectl_netclaim(cluster, "status", "-n", demo.NAMESPACE)
    for claim_entry in (
        entry,
        *(e for p in b_pods for e in pod_claim_entries(kube, demo.NAMESPACE, name_of(p))),
    ):
        if claim_entry["pool"] != demo.POOLS_POOL:
            assert claim_entry["networkData"]["ips"][0] in status, status
    assert "== Pods and their interfaces (netclaim-demo)" in status and "== NICs and capacity" in status
    assert "bandwidth 10Gi/10Gi used, 0 free" in status, status

    # a broken expectation is reported: the same observation with B spread over both NICs and none Pending
    spread = copy.deepcopy(outcome)
    for pod in spread.pods:
        if pod["metadata"]["name"] == pending["metadata"]["name"]:
            pod["spec"]["nodeName"] = next(
                p["spec"]["nodeName"] for p in outcome.pods if p["metadata"]["name"] == "pod-a"
            )
            pod["status"]["conditions"] = []
    problems = demo.check(cluster, spread, io.StringIO())
    assert any("expected two B replicas sharing the other NIC" in p for p in problems), problems
    assert any("expected exactly one Pending B replica" in p for p in problems), problems


def test_deploy_manifests_pass_a_server_side_dry_run(cluster: ClusterHandle) -> None:
    output = cluster.kubectl("apply", "--dry-run=server", "-f", str(DEPLOY))
    for kind in (
        "daemonset.apps/netclaim-agent",
        "deployment.apps/netclaim-controller",
        "customresourcedefinition.apiextensions.k8s.io/ippools.netclaim.dev",
        "deviceclass.resource.k8s.io/netclaim-address",
        "clusterrole.rbac.authorization.k8s.io/netclaim-agent",
        "deviceclass.resource.k8s.io/netclaim-shared",
    ):
        assert kind in output, output

"""Issue 14: `kubectl netclaim explain` names the real reason a pod waits, and the fix, in situations
prepared on the real cluster (the demo's Pending replica is in test_demo, an agent away in
test_fail_closed, a config refused at prepare in test_admission)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from lightkube import Client
from lightkube.resources.core_v1 import Pod

from netclaim_lab.cluster import ClusterHandle
from netclaim_lab.controlplane import write_kubeconfig
from tests.cluster.helpers import (
    apply,
    claim_template,
    cni_config,
    kubectl_netclaim,
    macvlan,
    pod_manifest,
    run_kubectl_netclaim,
)
from tests.cluster.ipam import ip_pool, pool_template
from tests.kube import wait_for

ENS3F0 = 'device.attributes["netclaim.dev"].ifName == "ens3f0"'  # node-4 only, 32 attachments


def _scheduled(kube: Client, ns: str, *pods: str) -> bool:
    return all(kube.get(Pod, pod, namespace=ns).spec.nodeName for pod in pods)  # type: ignore[union-attr]


def _unschedulable(kube: Client, ns: str, pod: str) -> bool:
    found = kube.get(Pod, pod, namespace=ns)
    conditions = (found.status.conditions if found.status else None) or []
    return any(c.type == "PodScheduled" and c.status == "False" and c.message for c in conditions)


@pytest.fixture
def tiny_pool(cluster: ClusterHandle) -> Iterator[str]:
    apply(cluster, "default", ip_pool("explain-tiny", {"subnet": "10.69.0.0/30"}))
    cluster.kubectl("wait", "--for=condition=Ready", "ippool/explain-tiny", "--timeout=60s", timeout=70)
    yield "explain-tiny"
    cluster.kubectl("delete", "ippool", "explain-tiny", "--ignore-not-found")


def _pending(cluster: ClusterHandle, kube: Client, ns: str, *documents: dict[str, Any]) -> None:
    apply(cluster, ns, *documents)
    for document in documents:
        if document["kind"] == "Pod":
            name = document["metadata"]["name"]
            wait_for(lambda: _unschedulable(kube, ns, name), 60, f"{name} unschedulable")  # noqa: B023


def test_explain_names_the_clause_the_class_the_node_and_the_capacity(
    cluster: ClusterHandle, kube: Client, ns: str
) -> None:
    nowhere = claim_template(
        "nowhere", "netclaim-shared", 'device.attributes["netclaim.dev"].ifName == "enp99s0"', None
    )
    no_class = claim_template("no-class", "netclaim-fast", ENS3F0, None)
    on_ens1f0 = claim_template(
        "on-ens1f0", "netclaim-shared", 'device.attributes["netclaim.dev"].ifName == "ens1f0"', None
    )
    pinned = pod_manifest("pinned", "on-ens1f0")
    pinned["spec"]["nodeSelector"] = {"kubernetes.io/hostname": "node-2"}
    _pending(
        cluster, kube, ns, nowhere, no_class, on_ens1f0,
        pod_manifest("nowhere", "nowhere"), pod_manifest("no-class", "no-class"), pinned,
    )  # fmt: skip

    told = kubectl_netclaim(cluster, "explain", "pod/nowhere", "-n", ns)
    clause = '`device.attributes["netclaim.dev"].ifName == "enp99s0"` is false'
    assert f"enp0s10 on node-1: does not fit: the request's selector: {clause}" in told, told
    assert "fix: no device passes " + clause + "; published ifName values: " in told, told
    assert "enp0s10" in told.split("published ifName values: ")[1]

    told = kubectl_netclaim(cluster, "explain", "pod/no-class", "-n", ns)
    assert "DeviceClass 'netclaim-fast' does not exist (there are: " in told, told
    assert "netclaim-shared" in told and "fix: create DeviceClass 'netclaim-fast'" in told, told

    told = kubectl_netclaim(cluster, "explain", "pod/pinned", "-n", ns)
    assert "node node-1: the pod's nodeSelector kubernetes.io/hostname=node-2 excludes it" in told, told
    assert "ens1f0 on node-1: fits" in told, told
    assert "fix: the devices request nic selects are on node-1, which the pod may not use" in told, told

    # the namespace's table: one row per pod, each with its reason
    table = kubectl_netclaim(cluster, "explain", "-n", ns)
    for pod in ("nowhere", "no-class", "pinned"):
        assert f"{ns}/{pod}" in table, table


def test_explain_names_exhausted_attachments_and_addresses(
    cluster: ClusterHandle, kube: Client, ns: str, tiny_pool: str
) -> None:
    # one claim takes all 32 attachments of node-4's ens3f0; the next asks for one
    greedy = claim_template(
        "greedy", "netclaim-shared", ENS3F0, cni_config([macvlan("10.95.0.0/24")], name="greedy")
    )
    greedy["spec"]["spec"]["devices"]["requests"][0]["exactly"]["capacity"] = {
        "requests": {"netclaim.dev/attachments": "32"}
    }
    apply(cluster, ns, greedy, pod_manifest("greedy", "greedy"))
    wait_for(lambda: _scheduled(kube, ns, "greedy"), 60, "greedy scheduled")
    one_more = claim_template("one-more", "netclaim-shared", ENS3F0, None)
    # two claims take the pool's two addresses; a third waits
    _pending(cluster, kube, ns, one_more, pod_manifest("one-more", "one-more"))
    apply(cluster, ns, pool_template("pt", tiny_pool), pod_manifest("a1", "pt"), pod_manifest("a2", "pt"))
    wait_for(lambda: _scheduled(kube, ns, "a1", "a2"), 60, "a1, a2 scheduled")
    _pending(cluster, kube, ns, pod_manifest("a3", "pt"))

    told = kubectl_netclaim(cluster, "explain", "pod/one-more", "-n", ns)
    assert "ens3f0 on node-4: does not fit: attachments: 0 free of 32, asks 1" in told, told
    assert "fix: no device has the attachments asked for free (ens3f0 on node-4: 0)" in told, told

    told = kubectl_netclaim(cluster, "explain", "pod/a3", "-n", ns)
    assert f"IPPool {tiny_pool}: does not fit: addresses: 0 free of 2, asks 1" in told, told
    assert f"fix: no device has the addresses asked for free (IPPool {tiny_pool}: 0)" in told, told


def test_explain_status_and_nics_need_only_the_viewer_role(
    cluster: ClusterHandle, ns: str, tmp_path: Path
) -> None:
    """A user bound to deploy/rbac.yaml's netclaim-viewer (get and list, nothing else) runs every reading
    command; the same user without the binding is refused."""
    cluster.kubectl("create", "serviceaccount", "reader", "-n", ns)
    token = cluster.kubectl("create", "token", "reader", "-n", ns, "--duration=10m").strip()
    kubeconfig = tmp_path / "reader.kubeconfig"
    server = f"https://{cluster.spec.management_gateway().ip}:{cluster.spec.ports.apiserver}"
    write_kubeconfig(kubeconfig, server, cluster.layout.pki / "ca.crt", "reader", {"token": token})
    refused = run_kubectl_netclaim(cluster, "nics", "--kubeconfig", str(kubeconfig), "-o", "json")
    assert "could not read ResourceSlice (cluster) (RBAC)" in refused.stderr, refused.stderr
    assert json.loads(refused.stdout) == []  # nothing it may see, nothing shown
    binding = f"netclaim-viewer-{ns}"
    cluster.kubectl(
        "create",
        "clusterrolebinding",
        binding,
        "--clusterrole=netclaim-viewer",
        f"--serviceaccount={ns}:reader",
    )
    try:
        apply(
            cluster,
            ns,
            claim_template(
                "nowhere", "netclaim-shared", 'device.attributes["netclaim.dev"].ifName == "enp99s0"', None
            ),
            pod_manifest("nowhere", "nowhere"),
        )

        def told() -> subprocess.CompletedProcess[str]:
            return run_kubectl_netclaim(
                cluster, "explain", "pod/nowhere", "-n", ns, "--kubeconfig", str(kubeconfig)
            )

        # the binding takes effect within a second or two
        wait_for(lambda: "published ifName values" in told().stdout, 30, "explain as the viewer")
        assert "could not read" not in told().stderr  # all explain reads, the role grants
        nics = kubectl_netclaim(cluster, "nics", "--kubeconfig", str(kubeconfig), "-o", "json")
        assert ("node-1", "enp0s10") in {(row["node"], row["ifName"]) for row in json.loads(nics)}
        kubectl_netclaim(cluster, "status", "-n", ns, "--kubeconfig", str(kubeconfig))
        reader = f"--as=system:serviceaccount:{ns}:reader"
        for verb, kind, allowed in (
            ("list", "ippools.netclaim.dev", "yes"),  # what docs/troubleshooting.md has users read
            ("get", "ipallocations.netclaim.dev", "yes"),
            ("delete", "ipallocations.netclaim.dev", "no"),
        ):
            told_can = cluster.kubectl("auth", "can-i", verb, kind, reader, check=False).strip()
            assert told_can == allowed, (verb, kind, told_can)
    finally:
        cluster.kubectl("delete", "clusterrolebinding", binding, "--ignore-not-found")

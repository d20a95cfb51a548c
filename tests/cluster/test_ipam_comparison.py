"""netclaim's cluster-wide IPAM next to whereabouts v0.9.2, the incumbent, on a side cluster of their own
(`make test-tools`: a comparison, ~3 min; what netclaim must achieve is asserted in test_ipam.py too).

The same run for both, one after the other: 60 pods at once, spread over three nodes, one claim each
(netclaim: an IPPool device, pool_template of tests/cluster/ipam.py; whereabouts: a DeviceClass whose admin
config is macvlan with whereabouts IPAM, the tenant naming no plugin). Half of each run is then deleted (a
NIC takes 32 attachments) and one node is lost for good with 10 pods of each. Printed, as figures:
per-claim allocation time p50/p99, duplicate addresses, addresses leaked after the node loss (whereabouts
before and after one pass of its reconciler). Asserted: only what netclaim must achieve, and that every
figure was sampled.

Where the times come from: netclaim's agents log each claim's allocation (`"addresses allocated"`, ms);
whereabouts' `whereabouts` entry in the agents' plugin directory is a shim that times the real binary's
ADD and logs pod, µs and exit code, passing stdin, stdout and the exit code through.
"""

from __future__ import annotations

import base64
import collections
import ipaddress
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from lightkube import Client, KubeConfig
from lightkube.resources.core_v1 import Pod

from netclaim.errors import PrerequisiteError
from netclaim_lab import agents, binaries
from netclaim_lab import cluster as local_cluster
from netclaim_lab.cluster import ClusterHandle
from netclaim_lab.processes import CommandFailed
from tests.cluster.helpers import apply, kubectl_json, name_of, running
from tests.cluster.ipam import (
    IPAM_NODES,
    ON_IPN0,
    POLICY,
    allocation_ms,
    allocations,
    claim_uids,
    ip_pool,
    lose_node,
    percentiles,
    pod_addresses,
    pool_template,
    spread,
)
from tests.conftest import require_root_prerequisites
from tests.kube import wait_for

pytestmark = pytest.mark.tools

# Nodes named as the session cluster's IPAM nodes, so the helpers of tests/cluster/ipam.py read them as
# they are (spread, allocation_ms); NIC ipn0 on lan3 is that module's network too.
_NODES = "".join(
    f"- name: {name}\n  nics: [{{name: ipn0, segment: lan3, properties: {{speed: 10G}}}}]\n"
    for name in IPAM_NODES
)
SPEC = f"""
apiVersion: netclaim.dev/v1alpha1
kind: LocalCluster
name: ncwb
managementCIDR: 10.204.0.0/24
podCIDR: 10.247.0.0/16
ports: {{apiserver: 17443, etcdClient: 17379, etcdPeer: 17380}}
# whereabouts takes a Kubernetes lease and writes its IPPool in every ADD: a slow chain, given the budget
# README tells admins to give one (containerd's NRI request timeout), for both sides alike
nriRequestTimeout: 10s
segments: [{{name: lan3}}]
nodes:
{_NODES}"""
PODS = 60
KEPT = PODS // 2  # pods p-0 … p-29 of each run: 10 per node
LOST = "node-4"
NETCLAIM_NS, WHEREABOUTS_NS = "cmp-netclaim", "cmp-whereabouts"
POOL, POOL_SUBNET = "cmp", "10.70.0.0/24"
# whereabouts keeps its IPPool CRs in its kubeconfig context's namespace
WB_SYSTEM, WB_RANGE, WB_CLASS = "whereabouts", "10.71.0.0/24", "netclaim-whereabouts"
WB_MODULE = "github.com/k8snetworkplumbingwg/whereabouts"
NETWORK_STATUS = "k8s.v1.cni.cncf.io/network-status"  # Multus' annotation, read by whereabouts' reconciler

WB_RBAC = f"""
apiVersion: v1
kind: Namespace
metadata: {{name: {WB_SYSTEM}}}
---
apiVersion: v1
kind: ServiceAccount
metadata: {{name: whereabouts, namespace: {WB_SYSTEM}}}
---
# what the CNI plugin and the reconciler use (upstream's doc/crds/daemonset-install.yaml, without
# NetworkAttachmentDefinitions: there is no Multus here, and neither program reads them)
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {{name: whereabouts-cni}}
rules:
- apiGroups: [whereabouts.cni.cncf.io]
  resources: [ippools, overlappingrangeipreservations, nodeslicepools]
  verbs: [get, list, watch, create, update, patch, delete]
- apiGroups: [coordination.k8s.io]
  resources: [leases]
  verbs: [get, list, watch, create, update, patch, delete]
- apiGroups: [""]
  resources: [pods, nodes]
  verbs: [get, list, watch]
- apiGroups: ["", events.k8s.io]
  resources: [events]
  verbs: [create, patch, update, get]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {{name: whereabouts-cni}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: whereabouts-cni}}
subjects: [{{kind: ServiceAccount, name: whereabouts, namespace: {WB_SYSTEM}}}]
"""

# Times the real plugin's ADD with bash's clock (no fork) and logs "pod start" before it and "pod µs
# exit-code" after it, each in one append (atomic for a line this short): an ADD killed at the agent's
# deadline leaves its start alone. stdin, stdout, stderr and the exit code are the real plugin's.
# Where the agents' pods see whereabouts' files: the node's /opt/cni/bin and /var/lib/cni (hostPaths)
IN_NODE = {"bin": "/opt/cni/bin", "dir": "/var/lib/cni/whereabouts"}
SHIM = """#!/bin/bash
real={real}
log={log}
[ "$CNI_COMMAND" = ADD ] || exec "$real"
[[ $CNI_ARGS =~ K8S_POD_NAMESPACE=([^\\;]*) ]] && ns=${{BASH_REMATCH[1]}}
[[ $CNI_ARGS =~ K8S_POD_NAME=([^\\;]*) ]] && pod=${{BASH_REMATCH[1]}}
echo "$ns/$pod start" >> "$log"
start=${{EPOCHREALTIME/./}}
"$real"
code=$?
end=${{EPOCHREALTIME/./}}
echo "$ns/$pod $((end - start)) $code" >> "$log"
exit $code
"""


@pytest.fixture(scope="module")
def side(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterHandle]:
    """The side cluster ncwb with netclaim deployed; torn down after the module, whatever happened
    (unless NETCLAIM_KEEP_CLUSTER is set, as for the session cluster)."""
    require_root_prerequisites()
    spec_file = tmp_path_factory.mktemp("ncwb") / "ncwb.yaml"
    spec_file.write_text(SPEC)
    started = time.monotonic()
    handle = local_cluster.up(spec_file, log=sys.stderr)
    try:
        agents.deploy(handle, POLICY)
        print(f"\nside cluster ncwb up and netclaim deployed in {time.monotonic() - started:.0f} s")
        yield handle
    finally:
        if not os.environ.get("NETCLAIM_KEEP_CLUSTER"):  # as the session cluster: kept to look around
            local_cluster.down(handle.spec.name)


@pytest.fixture(scope="module")
def side_kube(side: ClusterHandle) -> Iterator[Client]:
    with Client(KubeConfig.from_file(side.kubeconfig), field_manager="netclaim-tests") as client:
        yield client


def _namespace(cluster: ClusterHandle, name: str) -> None:
    cluster.kubectl("create", "namespace", name)
    wait_for(
        lambda: bool(cluster.kubectl("get", "serviceaccount", "default", "-n", name, check=False)),
        60,
        f"the default ServiceAccount of {name}",
    )


def _whereabouts_crds() -> list[Path]:
    """Upstream's CRDs, from the module cache (downloaded through the module proxy if missing)."""
    try:
        crds = binaries.module_source("whereabouts", WB_MODULE) / "doc" / "crds"
    except PrerequisiteError as err:
        pytest.fail(str(err))
    names = (
        "whereabouts.cni.cncf.io_ippools.yaml",
        "whereabouts.cni.cncf.io_overlappingrangeipreservations.yaml",
    )
    return [crds / name for name in names]


def _install_whereabouts(cluster: ClusterHandle) -> tuple[Path, list[Path]]:
    """CRDs, RBAC, a ServiceAccount kubeconfig, the flat file, the timing shim and the admin's DeviceClass;
    returns (the kubeconfig, the shim's log on every node)."""
    for path in _whereabouts_crds():
        cluster.kubectl("apply", "--server-side", "-f", str(path))
    for crd in ("ippools", "overlappingrangeipreservations"):
        cluster.kubectl(
            "wait", "--for=condition=Established", "--timeout=60s", f"crd/{crd}.whereabouts.cni.cncf.io"
        )
    cluster.kubectl("apply", "-f", "-", input_text=WB_RBAC)
    # Its files where the agents' DaemonSet pods see them: each node's /var/lib/cni (a hostPath they mount)
    token = cluster.kubectl("create", "token", "whereabouts", "-n", WB_SYSTEM, "--duration=2h").strip()
    server = f"https://{cluster.spec.management_gateway().ip}:{cluster.spec.ports.apiserver}"
    ca = base64.b64encode((cluster.layout.pki / "ca.crt").read_bytes()).decode()
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "local", "cluster": {"server": server, "certificate-authority-data": ca}}],
        "users": [{"name": "whereabouts", "user": {"token": token}}],
        "contexts": [
            {"name": "local", "context": {"cluster": "local", "user": "whereabouts", "namespace": WB_SYSTEM}}
        ],
        "current-context": "local",
    }
    times = []
    for node in agents.kubelet_nodes(cluster):
        on_node = cluster.node(node).layout.cni_dir / "whereabouts"
        on_node.mkdir(exist_ok=True)
        (on_node / "whereabouts.kubeconfig").write_text(yaml.safe_dump(config, sort_keys=False))
        (on_node / "whereabouts.kubeconfig").chmod(0o600)
        (on_node / "whereabouts.conf").write_text("{}\n")  # whereabouts requires one; all is inline
        (on_node / "add.log").touch()
        times.append(on_node / "add.log")
    kubeconfig = (
        cluster.node(agents.kubelet_nodes(cluster)[0]).layout.cni_dir
        / "whereabouts"
        / "whereabouts.kubeconfig"
    )

    plugins = cluster.layout.cni_bin
    if not (plugins / "whereabouts.real").exists():
        os.link(plugins / "whereabouts", plugins / "whereabouts.real")
    partial = plugins / ".whereabouts.shim"
    shim = SHIM.format(real=f"{IN_NODE['bin']}/whereabouts.real", log=f"{IN_NODE['dir']}/add.log")
    partial.write_text(shim)
    partial.chmod(0o755)
    partial.rename(plugins / "whereabouts")  # in place of the hard link to the real binary

    ipam = {
        "type": "whereabouts",
        "range": WB_RANGE,
        "kubernetes": {"kubeconfig": f"{IN_NODE['dir']}/whereabouts.kubeconfig"},
        "configuration_path": f"{IN_NODE['dir']}/whereabouts.conf",
        "log_file": f"{IN_NODE['dir']}/whereabouts.log",
        "log_level": "error",
    }
    parameters = {
        "apiVersion": "netclaim.dev/v1alpha1",
        "kind": "CNIConfig",
        "bandwidth": "none",
        "config": {
            "cniVersion": "1.0.0",
            "name": "wb-net",
            "plugins": [{"type": "macvlan", "master": "{{ device.ifName }}", "mode": "bridge", "ipam": ipam}],
        },
    }
    selector = (
        '"ifName" in device.attributes["netclaim.dev"] && device.attributes["netclaim.dev"].shared == true'
    )
    device_class = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": WB_CLASS},
        "spec": {
            "selectors": [{"cel": {"expression": f'device.driver == "netclaim.dev" && {selector}'}}],
            "config": [{"opaque": {"driver": "netclaim.dev", "parameters": parameters}}],
        },
    }
    apply(cluster, "default", device_class)
    return kubeconfig, times


def _tenant_naming_whereabouts_refused(cluster: ClusterHandle) -> None:
    """whereabouts is the admin's, like every plugin reaching the API: a claim naming it is refused."""
    template = _whereabouts_template("tenant-whereabouts")
    plugin = {
        "type": "macvlan",
        "master": "{{ device.ifName }}",
        "ipam": {"type": "whereabouts", "range": WB_RANGE},
    }
    parameters = {
        "apiVersion": "netclaim.dev/v1alpha1",
        "kind": "CNIConfig",
        "config": {"cniVersion": "1.0.0", "name": "tenant-net", "plugins": [plugin]},
    }
    template["spec"]["spec"]["devices"]["config"] = [
        {"requests": ["nic"], "opaque": {"driver": "netclaim.dev", "parameters": parameters}}
    ]
    with pytest.raises(CommandFailed) as refused:
        apply(cluster, WHEREABOUTS_NS, template)
    assert "macvlan/whereabouts is not a plugin name (no paths) or not one of" in str(refused.value.stderr)


def _whereabouts_template(name: str) -> dict[str, Any]:
    """A share of an ipn0 NIC from the whereabouts class: the tenant names no plugin at all."""
    nic = {
        "name": "nic",
        "exactly": {
            "deviceClassName": WB_CLASS,
            "selectors": [{"cel": {"expression": ON_IPN0}}],
            "capacity": {"requests": {"netclaim.dev/bandwidth": "100M"}},
        },
    }
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name},
        "spec": {"spec": {"devices": {"requests": [nic]}}},
    }


def _duplicates(addresses: dict[str, list[str]]) -> int:
    counts = collections.Counter(str(ipaddress.ip_interface(a).ip) for ips in addresses.values() for a in ips)
    return sum(n - 1 for n in counts.values() if n > 1)


@dataclass(frozen=True)
class AddTimes:
    ms: dict[str, float]  # pod → its last successful ADD
    attempts: int
    failed: int  # returned an error
    killed: int  # never returned: killed at the agent's deadline (the runtime's hook budget)


def _add_times(logs: list[Path], namespace: str) -> AddTimes:
    """What the shim logged on every node for the pods of `namespace`."""
    ms: dict[str, float] = {}
    starts = ends = failed = 0
    for line in (line for log in logs if log.exists() for line in log.read_text().splitlines()):
        pod, *rest = line.split()
        if not pod.startswith(f"{namespace}/"):
            continue
        if rest == ["start"]:
            starts += 1
            continue
        ends += 1
        micros, code = rest
        if code == "0":
            ms[pod] = int(micros) / 1000
        else:
            failed += 1
    return AddTimes(ms, starts, failed, starts - ends)


def _wb_allocations(cluster: ClusterHandle) -> list[tuple[str, str]]:
    """(address, pod ref) of every allocation in whereabouts' IPPool CRs."""
    found = []
    for pool in kubectl_json(cluster, "get", "ippools.whereabouts.cni.cncf.io", "-n", WB_SYSTEM)["items"]:
        first = ipaddress.ip_network(pool["spec"]["range"], strict=False).network_address
        for offset, allocation in (pool["spec"].get("allocations") or {}).items():
            found.append((str(first + int(offset)), str(allocation["podref"])))
    return found


def _live_pods(cluster: ClusterHandle) -> set[str]:
    return {
        f"{p['metadata']['namespace']}/{p['metadata']['name']}"
        for p in kubectl_json(cluster, "get", "pods", "-A")["items"]
    }


def _pods_on(kube: Client, namespace: str, node: str) -> set[str]:
    return {name_of(p) for p in kube.list(Pod, namespace=namespace) if p.spec and p.spec.nodeName == node}


def _run_pods(cluster: ClusterHandle, kube: Client, namespace: str, *documents: dict[str, Any]) -> float:
    """Apply, wait for PODS pods running; returns the seconds it took."""
    started = time.monotonic()
    apply(cluster, namespace, *documents)
    try:
        wait_for(lambda: len(running(kube, namespace)) == PODS, 420, f"{PODS} pods of {namespace} running")
    except BaseException:
        up = {name_of(p) for p in running(kube, namespace)}
        events = kubectl_json(cluster, "get", "events", "-n", namespace, "--sort-by=.lastTimestamp")["items"]
        last = {e["involvedObject"]["name"]: f"{e['reason']}: {e['message'][:200]}" for e in events}
        stuck = sorted({name_of(p) for p in kube.list(Pod, namespace=namespace)} - up)
        print(
            f"\n{namespace}: {len(up)} running; not running, with their last event: "
            f"{[(name, last.get(name, '-')) for name in stuck]}"
        )
        raise
    return time.monotonic() - started


def _delete_half(cluster: ClusterHandle, kube: Client, namespace: str) -> None:
    """Delete pods p-KEPT … p-(PODS-1), a third of them on each node, and wait until they are gone."""
    names = [f"p-{i}" for i in range(KEPT, PODS)]
    cluster.kubectl("delete", "pods", "-n", namespace, "--wait=false", *names)
    wait_for(
        lambda: len(list(kube.list(Pod, namespace=namespace))) == KEPT, 180, f"{namespace}: pods deleted"
    )


def test_netclaim_ipam_next_to_whereabouts(
    side: ClusterHandle, side_kube: Client, figures: Callable[[str], None]
) -> None:
    cluster, kube = side, side_kube
    wb_kubeconfig, wb_times_log = _install_whereabouts(cluster)
    apply(cluster, "default", ip_pool(POOL, {"subnet": POOL_SUBNET}))
    _namespace(cluster, NETCLAIM_NS)
    _namespace(cluster, WHEREABOUTS_NS)
    _tenant_naming_whereabouts_refused(cluster)

    # One run each, one after the other, so neither's allocations compete with the other's. A NIC takes 32
    # attachments (the policy's default), so half of each run is deleted before the next: 10 pods of each
    # per node are there when the node is lost (and both show they release on a normal delete).
    nc_seconds = _run_pods(cluster, kube, NETCLAIM_NS, pool_template("t", POOL), *spread("p", "t", PODS))
    wait_for(lambda: len(pod_addresses(cluster, NETCLAIM_NS)) == PODS, 60, "60 claims showing their address")
    nc_addresses = pod_addresses(cluster, NETCLAIM_NS)
    nc_times = allocation_ms(cluster, NETCLAIM_NS)
    assert len(nc_times) == PODS, f"{len(nc_times)} allocations logged for {PODS} claims"
    nc_duplicates = _duplicates(nc_addresses)
    assert nc_duplicates == 0, f"duplicates among {sorted(nc_addresses.items())}"
    _delete_half(cluster, kube, NETCLAIM_NS)
    wait_for(
        lambda: len(allocations(cluster, POOL)) == KEPT, 120, "the deleted pods' netclaim addresses freed"
    )

    wb_seconds = _run_pods(cluster, kube, WHEREABOUTS_NS, _whereabouts_template("t"), *spread("p", "t", PODS))
    # a sandbox retried after a killed ADD writes its claim's status once attached, with the write's backoff
    try:
        wait_for(
            lambda: len(pod_addresses(cluster, WHEREABOUTS_NS, nic=True)) == PODS,
            180,
            "60 claims showing their address",
        )
    except BaseException:
        shown = pod_addresses(cluster, WHEREABOUTS_NS, nic=True)
        claims = kubectl_json(cluster, "get", "resourceclaims", "-n", WHEREABOUTS_NS)["items"]
        for claim in claims:
            owner = claim["metadata"].get("annotations", {}).get("resource.kubernetes.io/pod-claim-name", "")
            if not any(claim["metadata"]["name"].startswith(f"{pod}-") for pod in shown):
                print(f"no address shown: {claim['metadata']['name']} {owner}: {claim.get('status')}")
        raise
    wb_addresses = pod_addresses(cluster, WHEREABOUTS_NS, nic=True)
    wb_add = _add_times(wb_times_log, WHEREABOUTS_NS)
    assert len(wb_add.ms) == PODS, f"{len(wb_add.ms)} whereabouts ADDs timed for {PODS} pods"
    assert len(wb_addresses) == PODS and all(wb_addresses.values())
    wb_duplicates = _duplicates(wb_addresses)
    held = {address for address, _ in _wb_allocations(cluster)}
    wb_unbacked = sum(
        1 for ips in wb_addresses.values() for a in ips if str(ipaddress.ip_interface(a).ip) not in held
    )
    _delete_half(cluster, kube, WHEREABOUTS_NS)
    wait_for(
        lambda: len(_wb_allocations(cluster)) == KEPT, 120, "the deleted pods' whereabouts addresses freed"
    )

    # node-4 is lost for good; the pod GC deletes its pods (their claims go with them)
    lost = {ns: _pods_on(kube, ns, LOST) for ns in (NETCLAIM_NS, WHEREABOUTS_NS)}
    assert all(len(pods) == KEPT // len(IPAM_NODES) for pods in lost.values()), lost
    lose_node(cluster, kube, LOST)
    started = time.monotonic()
    wait_for(
        lambda: not any(_pods_on(kube, ns, LOST) for ns in lost),
        240,
        "the lost node's pods deleted by the pod GC",
    )
    gc_seconds = time.monotonic() - started
    survivors = KEPT - len(lost[NETCLAIM_NS])

    def nc_leaked() -> int:
        live = claim_uids(cluster)
        return sum(1 for a in allocations(cluster, POOL) if a.claim_uid not in live)

    def claims_left(namespace: str) -> int:
        return len(kubectl_json(cluster, "get", "resourceclaims", "-n", namespace)["items"])

    wait_for(lambda: claims_left(NETCLAIM_NS) == survivors, 120, "the lost pods' claims deleted")
    freed_from = time.monotonic()
    wait_for(
        lambda: nc_leaked() == 0 and len(allocations(cluster, POOL)) == survivors, 120, "netclaim frees them"
    )
    nc_free_seconds = time.monotonic() - freed_from
    assert nc_leaked() == 0

    def wb_leaked() -> int:
        live = _live_pods(cluster)
        return sum(1 for _, pod in _wb_allocations(cluster) if pod not in live)

    def wb_reservations_leaked() -> int:
        live = _live_pods(cluster)
        items = kubectl_json(cluster, "get", "overlappingrangeipreservations", "-n", WB_SYSTEM)["items"]
        return sum(1 for r in items if r["spec"]["podref"] not in live)

    wb_leaked_before, wb_reservations_before = wb_leaked(), wb_reservations_leaked()

    # One reconciler pass, as ip-control-loop's daily one would do it. It keeps a live pod's address only
    # if Multus' network-status annotation lists it, so the live pods get it, as Multus would write it;
    # one is left without, to see what the reconciler does to a live pod whose annotation is missing.
    live_wb = {
        name: ips
        for name, ips in pod_addresses(cluster, WHEREABOUTS_NS, nic=True).items()
        if name not in lost[WHEREABOUTS_NS]
    }
    assert len(live_wb) == survivors, live_wb
    control, *annotated = sorted(live_wb)
    for name in annotated:
        status = [
            {
                "name": f"{WHEREABOUTS_NS}/wb-net",
                "interface": "net1",
                "ips": [str(ipaddress.ip_interface(a).ip) for a in live_wb[name]],
                "default": False,
            }
        ]
        patch = {"metadata": {"annotations": {NETWORK_STATUS: json.dumps(status)}}}
        kube.patch(Pod, name, patch, namespace=WHEREABOUTS_NS)
    reconcile = subprocess.run(
        [str(cluster.bin_dir / "whereabouts-reconcile"), f"-kubeconfig={wb_kubeconfig}"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert reconcile.returncode == 0, reconcile.stderr
    match = re.fullmatch(r"freed (\d+)(?: \S+)*\n", reconcile.stdout)
    assert match, reconcile.stdout
    wb_leaked_after = wb_leaked()
    still = {pod for _, pod in _wb_allocations(cluster)}
    control_lost = f"{WHEREABOUTS_NS}/{control}" not in still
    annotated_lost = sum(1 for name in annotated if f"{WHEREABOUTS_NS}/{name}" not in still)

    nc_p50, nc_p99 = percentiles(nc_times)
    wb_p50, wb_p99 = percentiles(list(wb_add.ms.values()))
    rows = [
        ("IPAM", "p50 ms", "p99 ms", "duplicates", "leaked after node loss: before reconcile", "after"),
        ("netclaim", f"{nc_p50:.1f}", f"{nc_p99:.1f}", str(nc_duplicates), f"{nc_leaked()} [1]", "n/a [1]"),
        (
            "whereabouts",
            f"{wb_p50:.1f}",
            f"{wb_p99:.1f}",
            str(wb_duplicates),
            f"{wb_leaked_before} [2]",
            f"{wb_leaked_after} [3]",
        ),
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    table = "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows
    )
    figures(
        f"\n\nnetclaim IPAM vs whereabouts v0.9.2, {PODS} pods at once each ({PODS // len(IPAM_NODES)} per "
        f"node, one claim each): all running after {nc_seconds:.0f} s (netclaim) / {wb_seconds:.0f} s "
        f"(whereabouts); then {KEPT} of each kept, {LOST} lost for good with {len(lost[NETCLAIM_NS])} + "
        f"{len(lost[WHEREABOUTS_NS])} of them (the pod GC deleted them after {gc_seconds:.0f} s)\n"
        f"{table}\n"
        f"p50/p99: netclaim = each claim's allocation at prepare (IPAllocation created; agents' logs), "
        f"{len(nc_times)} claims; whereabouts = its CNI ADD, run in the runtime's sandbox hook, the last "
        f"successful one of each of {len(wb_add.ms)} pods: of {wb_add.attempts} ADDs, {wb_add.killed} were "
        f"killed at the hook's deadline (not in the figures; kubelet retried the sandbox) and "
        f"{wb_add.failed} failed. Duplicates: among the {PODS} addresses the claims' status shows "
        f"(whereabouts: {wb_unbacked} of them without an IPPool allocation behind).\n"
        f"[1] no reconciler to wait for: the controller freed the lost claims' addresses "
        f"{nc_free_seconds:.1f} s after the claims were gone.\n"
        f"[2] IPPool allocations whose pod is gone ({wb_reservations_before} OverlappingRangeIPReservations "
        f"too), until ip-control-loop's cron pass (daily, 04:30, by default).\n"
        f"[3] after one whereabouts-reconcile pass ({match.group(1)} freed), the live pods annotated with "
        f"Multus' {NETWORK_STATUS} first, as Multus would. Without it the reconciler frees a LIVE pod's "
        f"address too: the one live pod left unannotated here {'lost' if control_lost else 'kept'} its "
        f"allocation (annotated live pods that lost theirs: {annotated_lost} of {len(annotated)}).\n"
    )

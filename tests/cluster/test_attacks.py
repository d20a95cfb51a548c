"""The attack corpus on the real cluster: no tenant claim reaches the node, another tenant or more than its
share; every pod goes again; another tenant's pods and the cluster's IPAM controller never notice."""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from lightkube import Client
from lightkube.resources.core_v1 import Node, Pod

from netclaim_lab import agents
from netclaim_lab.cluster import ClusterHandle
from tests.attacks import (
    CORPUS_OPEN_POOL,
    CORPUS_POOL,
    Attack,
    ClaimAttack,
    attacks,
    claim_attacks,
    claim_template_json,
    deep_json,
    pool_device_class,
)
from tests.cluster.helpers import (
    apply,
    claim_template,
    cni_config,
    configured_and_running,
    controller_metrics,
    exists,
    in_node,
    interface_in_pod,
    ipam_reservations,
    macvlan,
    pod_claim_conditions,
    pod_manifest,
    ready_entry,
    running,
    store_rows,
)
from tests.cluster.ipam import allocations, ip_pool, pool_template
from tests.cluster.netpolicy import ALLOW_CLIENTS, Net, network_service, server, slice_addresses
from tests.kube import wait_for
from tests.tenant_objects import tenant_objects

ON_ENP0S10 = 'device.attributes["netclaim.dev"].ifName == "enp0s10"'
NODES = ("node-1", "node-2")
BATCH = 24  # pods at once: two enp0s10 NICs carry 32 attachments each
CONTROL_READY_S = 10.0  # a new pod of another tenant gets Ready within this while the corpus runs
TERMINATING_S = 30.0  # no pod of the corpus stays Terminating longer
RECONCILED = 'netclaim_reconcile_total{result="ok"}'
RECONCILE_FAILED = 'netclaim_reconcile_total{result="error"}'
APISERVER_PROBE = (
    "import socket,sys; socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5).close()"
)


def node_state(cluster: ClusterHandle, node: str) -> dict[str, str]:
    """What a tenant reaching the node would change: links, addresses, routes, firewall rules."""
    return {
        "links": in_node(cluster, node, "ip", "-o", "link", "show"),
        "addresses": in_node(cluster, node, "ip", "-o", "addr", "show"),
        "routes": in_node(cluster, node, "ip", "route", "show", "table", "all"),
        "iptables": "\n".join(
            line for line in in_node(cluster, node, "iptables-save").splitlines() if not line.startswith("#")
        ),
    }


def _normalized(state: dict[str, str]) -> dict[str, list[str]]:
    """Without what other pods' churn on the primary network changes by itself: the host ends of their
    veths, the bridge's carrier and link-local addresses, `linkdown` and `tentative` marks."""
    churn = re.compile(r"<[^>]*>|\b(linkdown|tentative|state \S+)\b")
    return {
        kind: sorted(
            churn.sub("", line).split("valid_lft")[0].strip()
            for line in text.splitlines()
            if "veth" not in line and "fe80:" not in line and "ff00::" not in line
        )
        for kind, text in state.items()
    }


def _refused_at_prepare(kube: Client, namespace: str, pod: str) -> str | None:
    for condition in pod_claim_conditions(kube, namespace, pod):
        if condition["status"] == "False" and condition["reason"] == "PrepareFailed":
            return str(condition["message"])
    return None


def _unschedulable(kube: Client, namespace: str, pod: str) -> bool:
    found = kube.get(Pod, pod, namespace=namespace)
    conditions = found.status.conditions if found.status else None
    return any(c.type == "PodScheduled" and c.reason == "Unschedulable" for c in conditions or [])


def _allocated(cluster: ClusterHandle, namespace: str) -> list[str]:
    claims = json.loads(cluster.kubectl("get", "resourceclaims", "-n", namespace, "-o", "json"))["items"]
    return [c["metadata"]["name"] for c in claims if (c.get("status") or {}).get("allocation")]


@pytest.fixture
def corpus_pools(cluster: ClusterHandle) -> Iterator[None]:
    """The corpus' pools: one restricted to a namespace that is not the attacker's (with the DeviceClass
    its admin makes for it), one open to all."""
    documents = [CORPUS_POOL, CORPUS_OPEN_POOL, pool_device_class(CORPUS_POOL["metadata"]["name"])]
    cluster.kubectl(
        "apply", "-f", "-", input_text=json.dumps({"apiVersion": "v1", "kind": "List", "items": documents})
    )
    yield
    cluster.kubectl(
        "delete",
        "--ignore-not-found",
        "-f",
        "-",
        input_text=json.dumps({"apiVersion": "v1", "kind": "List", "items": documents}),
    )


class ControlTenant:
    """Another namespace's pods on the attacked NICs: one from before the corpus, one new per batch."""

    def __init__(self, cluster: ClusterHandle, kube: Client, namespace: str) -> None:
        self.cluster, self.kube, self.namespace = cluster, kube, namespace
        config = cni_config([macvlan("10.70.1.0/24")], name="control-net")
        apply(cluster, namespace, claim_template("ctl", "netclaim-shared", ON_ENP0S10, config))
        self.ready_s: list[float] = []

    def start(self, pod: str) -> float:
        """Seconds from creating the pod to its claim's status saying Ready."""
        started = time.monotonic()
        apply(self.cluster, self.namespace, pod_manifest(pod, "ctl"))
        wait_for(lambda: ready_entry(self.kube, self.namespace, pod) is not None, 120, f"{pod} Ready")
        return time.monotonic() - started

    def seen(self, pod: str) -> tuple[Any, ...]:
        """What the pod has: its status entry's addresses and MAC, and net1 as `ip` inside shows it."""
        entry = ready_entry(self.kube, self.namespace, pod)
        assert entry is not None, f"{pod}'s claim is no longer Ready"
        data = entry["networkData"]
        return (
            data["ips"],
            data["hardwareAddress"],
            interface_in_pod(self.cluster, self.namespace, pod, "net1"),
        )

    def batch(self, index: int) -> None:
        pod = f"ctl-{index + 1}"
        self.ready_s.append(self.start(pod))
        self.kube.delete(Pod, pod, namespace=self.namespace)
        wait_for(lambda: not exists(self.kube, Pod, pod, self.namespace), 60, f"{pod} deleted")


def test_no_tenant_claim_of_the_attack_corpus_reaches_the_node_or_another_tenant(
    cluster: ClusterHandle, kube: Client, ns: str, other_tenant: str, corpus_pools: None, figures: Any
) -> None:
    control = ControlTenant(cluster, kube, other_tenant)
    control.ready_s.append(control.start("ctl-0"))
    wait_for(lambda: configured_and_running(kube, other_tenant, "ctl-0"), 60, "ctl-0 running")
    control_before = control.seen("ctl-0")
    reconciles_before = controller_metrics(cluster)
    before = {node: _normalized(node_state(cluster, node)) for node in NODES}

    corpus: list[Attack | ClaimAttack] = [*attacks(), *claim_attacks()]
    at_admission, accepted, pending = 0, [], []
    for index, attack in enumerate(corpus):
        expected_at = attack.refused_at if isinstance(attack, ClaimAttack) else None
        try:
            cluster.kubectl(
                "create", "-n", ns, "-f", "-", input_text=claim_template_json(f"a{index}", attack)
            )
        except subprocess.CalledProcessError as err:  # the admission policy refused it when written
            assert "ValidatingAdmissionPolicy" in str(err.stderr), err.stderr
            assert expected_at in (None, "admission"), f"{attack.name}: {err.stderr}"
            if isinstance(attack, ClaimAttack):
                assert attack.field in str(err.stderr), (attack.name, err.stderr)
            at_admission += 1
            continue
        if expected_at == "admission":
            accepted.append(f"{attack.name}: admitted")
        pending.append((f"p{index}", attack))

    at_prepare = at_scheduling = 0
    slowest_delete = 0.0
    for batch_index, start in enumerate(range(0, len(pending), BATCH)):
        batch = pending[start : start + BATCH]
        apply(cluster, ns, *(pod_manifest(pod, f"a{pod[1:]}") for pod, _ in batch))

        def all_refused(batch: list[tuple[str, Any]] = batch) -> bool:
            return all(
                _unschedulable(kube, ns, pod)
                if isinstance(attack, ClaimAttack) and attack.refused_at == "scheduling"
                else _refused_at_prepare(kube, ns, pod)
                for pod, attack in batch
            )

        wait_for(all_refused, 180, f"pods {batch[0][0]}..{batch[-1][0]} refused")
        for pod, attack in batch:
            if isinstance(attack, ClaimAttack) and attack.refused_at == "scheduling":
                at_scheduling += 1
                continue
            message = _refused_at_prepare(kube, ns, pod)
            if message is None or attack.field not in message:
                accepted.append(f"{attack.name}: {message}")
            at_prepare += 1
        assert not running(kube, ns), "a pod of the attack corpus runs"
        unallocated = {
            f"{pod}" for pod, a in batch if isinstance(a, ClaimAttack) and a.refused_at == "scheduling"
        }
        assert not [c for c in _allocated(cluster, ns) if any(c.startswith(f"{p}-") for p in unallocated)]
        control.batch(batch_index)
        started = time.monotonic()
        for pod, _ in batch:
            kube.delete(Pod, pod, namespace=ns)  # no force: every teardown path must let it go
        wait_for(lambda: not list(kube.list(Pod, namespace=ns)), 120, "the corpus' pods deleted")
        slowest_delete = max(slowest_delete, time.monotonic() - started)

    after = {node: _normalized(node_state(cluster, node)) for node in NODES}
    changed = {
        node: [
            f"{kind}: {sorted(set(before[node][kind]) ^ set(after[node][kind]))}"
            for kind in before[node]
            if before[node][kind] != after[node][kind]
        ]
        for node in NODES
    }
    reconciles_after = controller_metrics(cluster)
    refused = at_admission + at_prepare - len(accepted)
    node = "unchanged" if not any(changed.values()) else changed
    figures(
        f"attack corpus: {len(corpus)} cases, {refused + at_scheduling} refused ({at_admission} at "
        f"admission, {at_prepare - len(accepted)} at prepare, {at_scheduling} never allocated), "
        f"{len(accepted)} accepted, node {node}; slowest batch deletion {slowest_delete:.1f} s; the "
        f"other tenant's new pods Ready in {', '.join(f'{s:.1f}' for s in control.ready_s)} s"
    )
    assert accepted == []
    assert changed == {node: [] for node in NODES}
    assert slowest_delete <= TERMINATING_S, f"a pod of the corpus was Terminating for {slowest_delete:.1f} s"
    assert max(control.ready_s) <= CONTROL_READY_S, control.ready_s
    assert control.seen("ctl-0") == control_before
    # the controller reconciled all along, and never failed
    assert reconciles_after[RECONCILED] > reconciles_before[RECONCILED]
    assert reconciles_after.get(RECONCILE_FAILED, 0.0) == reconciles_before.get(RECONCILE_FAILED, 0.0)
    # nothing left behind
    assert not [r for node in NODES for r in store_rows(cluster, node) if r["claim_namespace"] == ns]
    assert not [a for a in allocations(cluster) if a.claim.startswith(f"{ns}/")]
    assert ipam_reservations(cluster, "attack") == set()
    # the nodes keep their control plane
    server = str(cluster.spec.management_gateway().ip)
    for node in NODES:
        status = kube.get(Node, node).status
        assert status is not None
        assert [c.status for c in status.conditions or [] if c.type == "Ready"] == ["True"], node
        in_node(cluster, node, "python3", "-c", APISERVER_PROBE, server, str(cluster.spec.ports.apiserver))


def test_the_corpus_as_admin_device_class_configs_is_admitted_where_admins_may(
    cluster: ClusterHandle,
) -> None:
    """The boundary is who writes it: what a tenant may not do, a DeviceClass may (docs/security.md)."""
    admitted, refused = 0, []
    for index, attack in enumerate(attacks()):
        device_class = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": f"admin-{index}"},
            "spec": {"config": [{"opaque": {"driver": "netclaim.dev", "parameters": attack.cni_config()}}]},
        }
        try:
            cluster.kubectl("create", "--dry-run=server", "-f", "-", input_text=deep_json(device_class))
            admitted += 1
        except subprocess.CalledProcessError as err:
            if attack.admin_may:
                refused.append(f"{attack.name}: {err.stderr}")
    print(f"attack corpus as DeviceClass configs: {admitted} admitted, {len(refused)} wrongly refused")
    assert refused == []
    assert admitted >= sum(1 for a in attacks() if a.admin_may)


TENANT_ROLE = {
    "apiVersion": "rbac.authorization.k8s.io/v1",
    "kind": "Role",
    "metadata": {"name": "tenant"},
    "rules": [
        {"apiGroups": ["k8s.cni.cncf.io"], "resources": ["multi-networkpolicies"], "verbs": ["*"]},
        {"apiGroups": [""], "resources": ["services", "pods"], "verbs": ["*"]},
        {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["*"]},
    ],
}


def _tenant_kubeconfig(cluster: ClusterHandle, namespace: str, path: Path) -> Path:
    """A ServiceAccount of the namespace with the tenant's Role (its policies, Services, slices, pods)."""
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": "tenant"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "tenant"},
        "subjects": [{"kind": "ServiceAccount", "name": "default", "namespace": namespace}],
    }
    apply(cluster, namespace, TENANT_ROLE, binding)
    agents.token_kubeconfig(cluster, namespace, "default", path)
    return path


def test_no_tenant_policy_service_or_slice_reaches_another_tenant_the_node_or_the_controller(
    cluster: ClusterHandle, kube: Client, ns: str, other_tenant: str, tmp_path: Path, figures: Any
) -> None:
    """The tenant-objects corpus (tests/tenant_objects.py), written in its own namespace with a tenant's
    token: each is refused when written, or else changes nothing of another tenant's (its pods' traffic,
    by real connections; its tables; its Service's slices), of the nodes (no agent restarts) or of the
    controller (no restart, its passes go on and still follow the other tenant's changes)."""
    victim = other_tenant
    apply(cluster, "default", ip_pool("tobj", {"subnet": "10.64.14.0/24", "gateway": "10.64.14.1"}))
    try:
        _the_corpus_changes_nothing_of_the_victims(cluster, kube, ns, victim, tmp_path, figures)
    finally:
        cluster.kubectl("delete", "ippool", "tobj", "--ignore-not-found")


def _the_corpus_changes_nothing_of_the_victims(
    cluster: ClusterHandle, kube: Client, ns: str, victim: str, tmp_path: Path, figures: Any
) -> None:
    service = network_service("db", "app=db")
    apply(
        cluster,
        victim,
        pool_template("t", "tobj"),
        server("db", "node-1", {"app": "db"}),
        server("client", "node-2", {"role": "client"}),
        server("outsider", "node-4", {"role": "outsider"}),
        service,
        ALLOW_CLIENTS,
    )
    apply(cluster, ns, pool_template("t", "tobj"), server("a0", "node-1", {"app": "db", "role": "client"}))
    wait_for(lambda: len(running(kube, victim)) == 3 and len(running(kube, ns)) == 1, 180, "pods running")
    net = Net(cluster, victim)
    db = net.net1["db"]

    def the_victim_as_it_should_be() -> bool:
        return (
            net.tcp("client", db) == "db"
            and net.tcp("outsider", db) == ""
            and slice_addresses(cluster, victim, "db") == {db}
        )

    wait_for(the_victim_as_it_should_be, 60, "the victim's policy and Service in force")
    attacker = Net(cluster, ns)
    assert attacker.tcp("a0", db) == ""  # the client's label, another namespace: not the victim's client
    table_before = net.table("db")
    controller_before = controller_metrics(cluster)
    restarts_before = {node: agents.restarts(cluster, node) for node in ("node-1", "node-2", "node-4")}
    controller_pod_before = _controller_restarts(cluster)

    tenant = _tenant_kubeconfig(cluster, ns, tmp_path / "tenant.kubeconfig")
    corpus = tenant_objects(victim, db)
    refused, accepted = [], []
    for case in corpus:
        try:
            cluster.kubectl(
                f"--kubeconfig={tenant}", "create", "-n", ns, "-f", "-", input_text=deep_json(case.body)
            )
            accepted.append(case.name)
        except subprocess.CalledProcessError as err:
            refused.append(case.name)
            assert "Unable to connect" not in str(err.stderr), err.stderr
    into_the_victims = tenant_objects(victim, db)[-1].body  # a slice, written into the victim's namespace
    with pytest.raises(subprocess.CalledProcessError, match="forbidden"):
        cluster.kubectl(
            f"--kubeconfig={tenant}",
            "create",
            "-n",
            victim,
            "-f",
            "-",
            input_text=json.dumps(into_the_victims),
        )

    # the controller keeps passing, and keeps following the victim: a revocation and an allow, in time
    wait_for(
        lambda: (
            controller_metrics(cluster).get(POLICY_PASSES_OK, 0.0)
            > controller_before.get(POLICY_PASSES_OK, 0.0) + 1
        ),
        60,
        "two more policy passes of the controller",
    )
    cluster.kubectl("label", "pod", "-n", victim, "client", "role=retired", "--overwrite")
    started = time.monotonic()
    wait_for(lambda: net.tcp("client", db) == "", 30, "the victim's revoked client cut off")
    revoked_s = time.monotonic() - started
    cluster.kubectl("label", "pod", "-n", victim, "client", "role=client", "--overwrite")
    started = time.monotonic()
    wait_for(lambda: net.tcp("client", db) == "db", 30, "the victim's client allowed again")
    allowed_s = time.monotonic() - started
    wait_for(the_victim_as_it_should_be, 30, "the victim as before")
    assert attacker.tcp("a0", db) == ""
    wait_for(
        lambda: "db-netclaim-ipv4-9" not in _slice_names(cluster, ns), 30, "the forged slice of ours undone"
    )
    assert net.table("db").count("table ") == table_before.count("table ") == 1  # our table, only ours
    assert {node: agents.restarts(cluster, node) for node in restarts_before} == restarts_before
    assert _controller_restarts(cluster) == controller_pod_before
    after = controller_metrics(cluster)
    assert after.get(POLICY_PASSES_ERROR, 0.0) == controller_before.get(POLICY_PASSES_ERROR, 0.0)
    told = cluster.kubectl("get", "events", "-n", ns, "-o", "jsonpath={.items[*].reason}").split()
    assert {"NetworkPolicyInvalid", "NetworkPolicyUnknownNetwork", "NetworkServiceInvalid"} <= set(told), told
    kinds = {kind: sum(c.kind == kind for c in corpus) for kind in ("policy", "service", "slice")}
    figures(
        f"tenant objects: {len(corpus)} cases ({kinds['policy']} policies, {kinds['service']} Services, "
        f"{kinds['slice']} slices): {len(refused)} refused when written, {len(accepted)} accepted without "
        f"effect on the other tenant (its revocation in {revoked_s:.1f} s, its allow in {allowed_s:.1f} s); "
        "nodes and controller not restarted"
    )


POLICY_PASSES_OK = 'netclaim_policy_passes_total{result="ok"}'
POLICY_PASSES_ERROR = 'netclaim_policy_passes_total{result="error"}'


def _slice_names(cluster: ClusterHandle, namespace: str) -> set[str]:
    found = json.loads(cluster.kubectl("get", "endpointslices", "-n", namespace, "-o", "json"))
    return {s["metadata"]["name"] for s in found["items"]}


def _controller_restarts(cluster: ClusterHandle) -> tuple[str, int]:
    """The controller's pod and its container's restarts."""
    found = agents.controller_pod(cluster)
    return found["metadata"]["name"], int(found["status"]["containerStatuses"][0]["restartCount"])

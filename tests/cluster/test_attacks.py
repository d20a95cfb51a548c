"""The attack corpus on the real cluster: no tenant config reaches the node, and every pod goes again."""

from __future__ import annotations

import json
import re
import subprocess
import time
from typing import Any

from lightkube import Client
from lightkube.resources.core_v1 import Node, Pod

from netclaim.cluster.cluster import ClusterHandle
from tests.attacks import attacks
from tests.cluster.helpers import (
    apply,
    claim_template,
    in_node,
    ipam_reservations,
    pod_claim_conditions,
    pod_manifest,
    running,
    store_rows,
)
from tests.kube import wait_for

ON_ENP0S10 = 'device.attributes["netclaim.dev"].ifName == "enp0s10"'
NODES = ("node-1", "node-2")
BATCH = 24  # pods at once: two enp0s10 NICs carry 32 attachments each
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


def test_no_tenant_config_of_the_attack_corpus_reaches_the_node(
    cluster: ClusterHandle, kube: Client, ns: str
) -> None:
    corpus = attacks()
    before = {node: _normalized(node_state(cluster, node)) for node in NODES}
    at_admission, at_prepare, accepted, slowest_delete = 0, 0, [], 0.0
    pending: list[tuple[str, Any]] = []
    for index, attack in enumerate(corpus):
        config = {"apiVersion": "netclaim.dev/v1alpha1", "kind": "CNIConfig", "config": attack.config}
        try:
            apply(cluster, ns, claim_template(f"a{index}", "netclaim-shared", ON_ENP0S10, config))
        except subprocess.CalledProcessError as err:  # the admission policy refused it when written
            assert "netclaim-config" in str(err.stderr) and ".opaque.parameters" in str(err.stderr), (
                err.stderr
            )
            at_admission += 1
            continue
        pending.append((f"p{index}", attack))
    for start in range(0, len(pending), BATCH):
        batch = pending[start : start + BATCH]
        apply(cluster, ns, *(pod_manifest(pod, f"a{pod[1:]}") for pod, _ in batch))
        names = [pod for pod, _ in batch]

        def all_refused(names: list[str] = names) -> bool:
            return all(_refused_at_prepare(kube, ns, pod) for pod in names)

        wait_for(all_refused, 180, f"pods {names[0]}..{names[-1]} refused at prepare")
        for pod, attack in batch:
            message = _refused_at_prepare(kube, ns, pod)
            if message is None or attack.field not in message:
                accepted.append(f"{attack.name}: {message}")
        assert not running(kube, ns), "a pod of the attack corpus runs"
        started = time.monotonic()
        for pod, _ in batch:
            kube.delete(Pod, pod, namespace=ns)  # no force: every teardown path must let it go
        wait_for(lambda: not list(kube.list(Pod, namespace=ns)), 60, "the corpus' pods deleted")
        slowest_delete = max(slowest_delete, time.monotonic() - started)
        at_prepare += len(batch)
    after = {node: _normalized(node_state(cluster, node)) for node in NODES}
    changed = {
        node: [
            f"{kind}: {sorted(set(before[node][kind]) ^ set(after[node][kind]))}"
            for kind in before[node]
            if before[node][kind] != after[node][kind]
        ]
        for node in NODES
    }
    print(
        f"attack corpus: {len(corpus)} cases, {at_admission + at_prepare - len(accepted)} refused "
        f"({at_admission} at admission, {at_prepare - len(accepted)} at prepare), {len(accepted)} accepted, "
        f"node {'unchanged' if not any(changed.values()) else changed}; slowest batch deletion "
        f"{slowest_delete:.1f} s"
    )
    assert accepted == []
    assert changed == {node: [] for node in NODES}
    assert not [r for node in NODES for r in store_rows(cluster, node) if r["claim_namespace"] == ns]
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
        config = {"apiVersion": "netclaim.dev/v1alpha1", "kind": "CNIConfig", "config": attack.config}
        device_class = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": f"admin-{index}"},
            "spec": {"config": [{"opaque": {"driver": "netclaim.dev", "parameters": config}}]},
        }
        try:
            cluster.kubectl("create", "--dry-run=server", "-f", "-", input_text=json.dumps(device_class))
            admitted += 1
        except subprocess.CalledProcessError as err:
            if attack.admin_may:
                refused.append(f"{attack.name}: {err.stderr}")
    print(f"attack corpus as DeviceClass configs: {admitted} admitted, {len(refused)} wrongly refused")
    assert refused == []
    assert admitted >= sum(1 for a in attacks() if a.admin_may)

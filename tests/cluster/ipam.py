"""Helpers of the cluster-wide IPAM tests: pools, claims asking for addresses, the allocations as the API
has them, what the agents logged, and losing a node for good (and getting it back for the next tests)."""

from __future__ import annotations

import collections
import ipaddress
import json
import statistics
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lightkube import Client
from lightkube.core.exceptions import ApiError
from lightkube.resources.core_v1 import Node

from netclaim.core.objects import IPAllocation
from netclaim_lab import agents, processes
from netclaim_lab.cluster import ClusterHandle
from tests.cluster.helpers import apply, kubectl_json, pod_spec
from tests.kube import wait_for

NETWORK = "lan3"  # tests/cluster/cluster.yaml: NIC ipn0 of node-1, node-2 and node-4
IPAM_NODES = ("node-1", "node-2", "node-4")
POLICY = Path(__file__).with_name("policy.yaml")
ON_IPN0 = 'device.attributes["netclaim.dev"].ifName == "ipn0"'


def ip_pool(name: str, *ranges: dict[str, str], **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "netclaim.dev/v1alpha1",
        "kind": "IPPool",
        "metadata": {"name": name},
        "spec": {"network": NETWORK, "ranges": list(ranges), **spec},
    }


def installed_pool(cluster: ClusterHandle, name: str, subnet: str, gateway: str) -> Iterator[str]:
    """An IPPool on NETWORK for a test, deleted at its end."""
    apply(cluster, "default", ip_pool(name, {"subnet": subnet, "gateway": gateway}))
    yield name
    cluster.kubectl("delete", "ippool", name, "--ignore-not-found")


def ip_allocation(
    name: str, address: str, node: str, pool: str = "probe", claim: tuple[str, str, str] | None = None
) -> dict[str, Any]:
    """An IPAllocation as an agent writes it (its labels say its spec's pool and claim), for `claim`'s
    (namespace, name, uid) or a claim that never was."""
    namespace, claim_name, uid = claim or ("default", "c", "00000000-0000-0000-0000-000000000000")
    return IPAllocation(name, "", pool, address, namespace, claim_name, uid, node).to_api()


def pool_template(name: str, pool: str, static: list[str] | None = None) -> dict[str, Any]:
    """A claim template: a share of an ipn0 NIC (macvlan, no IPAM of its own) and an address from `pool`,
    on the same network."""
    nic = {
        "name": "nic",
        "exactly": {
            "deviceClassName": "netclaim-shared",
            "selectors": [{"cel": {"expression": ON_IPN0}}],
            "capacity": {"requests": {"netclaim.dev/bandwidth": "100M"}},
        },
    }
    address = {
        "name": "ip",
        "exactly": {
            "deviceClassName": "netclaim-address",
            "selectors": [{"cel": {"expression": f'device.attributes["netclaim.dev"].pool == "{pool}"'}}],
        },
    }
    config: list[dict[str, Any]] = [
        {
            "requests": ["nic"],
            "opaque": {
                "driver": "netclaim.dev",
                "parameters": {
                    "apiVersion": "netclaim.dev/v1alpha1",
                    "kind": "CNIConfig",
                    "config": {
                        "cniVersion": "1.0.0",
                        "name": pool,
                        "plugins": [{"type": "macvlan", "master": "{{ device.ifName }}", "mode": "bridge"}],
                    },
                },
            },
        }
    ]
    if static:
        parameters = {"apiVersion": "netclaim.dev/v1alpha1", "kind": "AddressConfig", "addresses": static}
        config.append({"requests": ["ip"], "opaque": {"driver": "netclaim.dev", "parameters": parameters}})
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name},
        "spec": {
            "spec": {
                "devices": {
                    "requests": [nic, address],
                    "constraints": [{"requests": ["nic", "ip"], "matchAttribute": "netclaim.dev/network"}],
                    "config": config,
                }
            }
        },
    }


def pod_on(name: str, template: str, node: str | None) -> dict[str, Any]:
    spec = pod_spec(template)
    if node is not None:
        spec["nodeSelector"] = {"kubernetes.io/hostname": node}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": template}},
        "spec": spec,
    }


def spread(
    prefix: str, template: str, count: int, nodes: tuple[str, ...] = IPAM_NODES
) -> list[dict[str, Any]]:
    """`count` pods, placed round-robin on `nodes`."""
    return [pod_on(f"{prefix}-{i}", template, nodes[i % len(nodes)]) for i in range(count)]


@dataclass(frozen=True)
class Allocation:
    name: str
    pool: str
    address: str
    claim: str  # namespace/name
    claim_uid: str
    node: str


def allocations(cluster: ClusterHandle, pool: str | None = None) -> list[Allocation]:
    items = kubectl_json(cluster, "get", "ipallocations")["items"]
    found = [
        Allocation(
            name=i["metadata"]["name"],
            pool=i["spec"]["pool"],
            address=i["spec"]["address"],
            claim=f"{i['spec']['claim']['namespace']}/{i['spec']['claim']['name']}",
            claim_uid=i["spec"]["claim"]["uid"],
            node=i["spec"]["node"],
        )
        for i in items
    ]
    return [a for a in found if pool is None or a.pool == pool]


def claim_uids(cluster: ClusterHandle) -> set[str]:
    return {c["metadata"]["uid"] for c in kubectl_json(cluster, "get", "resourceclaims", "-A")["items"]}


def pod_addresses(cluster: ClusterHandle, namespace: str, *, nic: bool = False) -> dict[str, list[str]]:
    """pod → the addresses its claim's status shows for the pool device (the AddressAllocated entry), or
    with `nic` for its NIC (what the CNI result configured: also other IPAMs' addresses)."""
    claims = {
        c["metadata"]["name"]: c
        for c in kubectl_json(cluster, "get", "resourceclaims", "-n", namespace)["items"]
    }
    found = {}
    for pod in kubectl_json(cluster, "get", "pods", "-n", namespace)["items"]:
        for entry in (pod.get("status") or {}).get("resourceClaimStatuses") or []:
            claim = claims.get(entry.get("resourceClaimName"))
            for device in ((claim or {}).get("status") or {}).get("devices") or []:
                ips = device.get("networkData", {}).get("ips")
                if ips and (device["pool"] != "netclaim.dev/ip-pools") == nic:
                    found[pod["metadata"]["name"]] = list(ips)
    return found


def allocation_ms(cluster: ClusterHandle, namespace: str) -> list[float]:
    """Per claim of `namespace`: how long its agent took to take its addresses (the agents' logs)."""
    found = []
    for node in IPAM_NODES:
        for line in agents.agent_log(cluster, node).splitlines():
            if '"addresses allocated"' in line:
                entry = json.loads(line)
                if entry["claim"].startswith(f"{namespace}/"):
                    found.append(float(entry["ms"]))
    return found


def percentiles(values: list[float]) -> tuple[float, float]:
    """(p50, p99) of at least two values."""
    cuts = statistics.quantiles(values, n=100, method="inclusive")
    return statistics.median(values), cuts[98]


@dataclass(frozen=True)
class LeakReport:
    leaked: int  # held for claims that are gone
    duplicates: int  # addresses held twice among live claims' status
    lost: int  # live claims with an address in their status that no IPAllocation backs

    def line(self) -> str:
        return (
            f"addresses leaked: {self.leaked}, duplicates: {self.duplicates}, live claims lost: {self.lost}"
        )


def leak_report(cluster: ClusterHandle, namespace: str, pool: str) -> LeakReport:
    held = allocations(cluster, pool)
    live = claim_uids(cluster)
    shown = [a for ips in pod_addresses(cluster, namespace).values() for a in ips]
    counts = collections.Counter(str(ipaddress.ip_interface(a).ip) for a in shown)
    backed = {str(ipaddress.ip_interface(a.address).ip) for a in held}
    return LeakReport(
        leaked=sum(1 for a in held if a.claim_uid not in live),
        duplicates=sum(n - 1 for n in counts.values() if n > 1),
        lost=sum(1 for address in counts if address not in backed),
    )


def lose_node(cluster: ClusterHandle, kube: Client, node: str) -> None:
    """The node is gone for good: its kubelet and agent stop (SIGKILL; kubelet first, so that nothing
    restarts the agent), its Node object is deleted. The pod garbage collector then deletes its pods, and
    the claims of those pods go with them."""
    processes.stop(cluster.node(node).pid_dir, "kubelet", grace=0)
    agents.kill_agent(cluster, node)
    kube.delete(Node, node)


def restore_node(cluster: ClusterHandle, kube: Client, node: str) -> None:
    """Register the node again (kubelet); the DaemonSet starts its agent: the next tests find the cluster
    whole."""
    processes.start_recorded(cluster.node(node).pid_dir, "kubelet")

    def ready() -> bool:
        try:
            found = kube.get(Node, node)
        except ApiError:  # not registered yet
            return False
        conditions = found.status.conditions if found.status else None
        return any(c.type == "Ready" and c.status == "True" for c in conditions or [])

    wait_for(ready, 120, f"{node} registered and Ready again")
    agents.wait_ready(cluster, [node], timeout=120)

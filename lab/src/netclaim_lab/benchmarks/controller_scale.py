"""`make bench-policy`: netclaim's controller at 10,000 pods, 1,000 MultiNetworkPolicies and 50,000 claims
(issue 44), measured from outside it.

Its own local cluster (controller-cluster.yaml): a control plane and NODES Node objects kept Ready without
a kubelet, as bench-scale's. The controller is the real `netclaim controller` process beside the cluster,
with the admin's kubeconfig. What the scheduler and the agents would have written, the benchmark writes:
each node's slice (one NIC, ipn0, on network lan3); each pod bound to its node, and its claim allocated
that NIC, reserved for the pod, with a Ready status entry giving the pod's address on lan3 (an admin
range's: no IPPool is involved, so no IPAllocation either).

The layout, per namespace (NAMESPACES of them, PODS_PER_NAMESPACE pods each, spread over the nodes): pod k
is labelled app=a<k mod 10>, role=r<k div 10 mod 10>, and svc=on when k is even; policy j (10 a namespace)
selects app=a<j> and lets in role=r<j> on TCP 8080 and one /24 on TCP 9090, so every pod is selected and
its 8080 allow names 10 peers; the namespace's Service `web` over lan3 selects svc=on (50 endpoints).

Measured, from the objects the controller writes (watched, each change timed as it arrives):
- apply: the policies created at once → every pod's rules in its node's objects; compile_cpu_s is the
  controller's CPU seconds (/proc) in that time;
- policy_change: one policy's port edited → the rules of every pod it selects, on each of their nodes;
- relabel: a pod moved from one role to another → every pod whose peers it left or joined shows it;
- endpoint_change: a pod's svc label toggled → its Service's slices show it (or not);
- largest_object_kib: the largest rules ConfigMap or EndpointSlice the controller wrote, as JSON;
- controller_rss_mib_50k_claims: after more claims of the same shape (allocated, status written, reserved
  for no pod) take the cluster to CLAIMS, and the controller's claims informer holds them all.

Writes bench/controller.json; the last line is the POLICY line. NETCLAIM_KEEP_CLUSTER=1 keeps the cluster.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import ipaddress
import json
import os
import queue
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, cast

import httpx2
from lightkube import AsyncClient, Client, KubeConfig
from lightkube.generic_resource import create_namespaced_resource
from lightkube.operators import exists
from lightkube.resources.core_v1 import ConfigMap, Namespace, Pod, Service, ServiceAccount
from lightkube.resources.discovery_v1 import EndpointSlice
from lightkube.resources.resource_v1 import ResourceClaim, ResourceSlice
from lightkube.types import PatchType, on_error_retry
from prometheus_client.parser import text_string_to_metric_families

from netclaim.core.names import (
    DRIVER_DOMAIN,
    NETWORK,
    POLICY_RULES_KEY,
    POLICY_RULES_LABEL,
    SLICE_MANAGED_BY,
    SLICE_SERVICE_NAME,
)
from netclaim.core.policy.distribution import node_label, read_rules
from netclaim_lab import agents, cluster, processes
from netclaim_lab.benchmarks import ipam_load, measure
from netclaim_lab.benchmarks.scale import Nodes
from netclaim_lab.benchmarks.suite import log
from netclaim_lab.cluster import ClusterHandle
from netclaim_lab.layout import REPO_ROOT

HERE = Path(__file__).parent
NETWORK_NAME = "lan3"
NIC = "ipn0"
ROLES = 10
POLICIES_PER_NAMESPACE = 10
PORT = 8080
CREATORS = 32  # writes at once, over one HTTP/2 connection
SPARE_NAMESPACE = "spare-claims"
MultiNetworkPolicy = create_namespaced_resource(
    "k8s.cni.cncf.io", "v1beta1", "MultiNetworkPolicy", "multi-networkpolicies"
)


@dataclass(frozen=True)
class Sizes:
    nodes: int = 50
    namespaces: int = 100
    pods_per_namespace: int = 100
    claims: int = 50_000
    changes: int = 20  # of each kind: policy edits, relabels, Service membership toggles


QUICK = Sizes(nodes=5, namespaces=2, claims=400, changes=3)  # make test-tools' run


@dataclass(frozen=True)
class SimPod:
    namespace: str
    index: int  # k, in its namespace
    number: int  # across the cluster: its address
    node: str

    @property
    def name(self) -> str:
        return f"p-{self.index:03d}"

    @property
    def address(self) -> str:
        return str(ipaddress.ip_address("10.70.1.0") + self.number)

    def labels(self, role: int | None = None) -> dict[str, str]:
        chosen = (self.index // 10) % ROLES if role is None else role
        labels = {"app": f"a{self.index % POLICIES_PER_NAMESPACE}", "role": f"r{chosen}"}
        if self.index % 2 == 0:
            labels["svc"] = "on"
        return labels


def node_name(index: int) -> str:
    return f"ctl-{index:03d}"


def layout(sizes: Sizes) -> list[SimPod]:
    pods = []
    for n in range(sizes.namespaces):
        for k in range(sizes.pods_per_namespace):
            number = n * sizes.pods_per_namespace + k
            pods.append(SimPod(f"t-{n:03d}", k, number, node_name(number % sizes.nodes)))
    return pods


# --- what the scheduler and the agents would have written ---------------------------------------------
def slice_body(node: str) -> dict[str, Any]:
    attributes = {NETWORK: {"string": NETWORK_NAME}, f"{DRIVER_DOMAIN}/ifName": {"string": NIC}}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-{DRIVER_DOMAIN}"},
        "spec": {
            "driver": DRIVER_DOMAIN,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": NIC, "attributes": attributes}],
        },
    }


def pod_body(pod: SimPod) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": pod.name, "namespace": pod.namespace, "labels": pod.labels()},
        "spec": {
            "nodeName": pod.node,  # bound as the scheduler would: the nodes have no kubelet to start it
            "containers": [
                {
                    "name": "app",
                    "image": "registry.k8s.io/pause:3.10",
                    "resources": {"claims": [{"name": "net"}]},
                }
            ],
            "resourceClaims": [{"name": "net", "resourceClaimName": f"{pod.name}-net"}],
            "tolerations": [{"operator": "Exists"}],
            "terminationGracePeriodSeconds": 0,
        },
    }


def claim_body(name: str, namespace: str) -> dict[str, Any]:
    request = {"name": "net", "exactly": {"deviceClassName": "netclaim-shared"}}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"devices": {"requests": [request]}},
    }


def claim_status(node: str, address: str, pod: tuple[str, str] | None) -> dict[str, Any]:
    """Allocated the node's NIC (the scheduler's write), Ready with `address` on the network (the agent's),
    reserved for `pod` (name, UID) when given."""
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    device = {"driver": DRIVER_DOMAIN, "pool": node, "device": NIC}
    status: dict[str, Any] = {
        "allocation": {
            "devices": {"results": [{"request": "net", **device}]},
            "nodeSelector": {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
                ]
            },
        },
        "devices": [
            {
                **device,
                "conditions": [
                    {
                        "type": "Ready",
                        "status": "True",
                        "reason": "Attached",
                        "message": "",
                        "lastTransitionTime": now,
                    }
                ],
                "data": {NETWORK: NETWORK_NAME},
                "networkData": {"interfaceName": "net1", "ips": [f"{address}/16"]},
            }
        ],
    }
    if pod is not None:
        status["reservedFor"] = [{"resource": "pods", "name": pod[0], "uid": pod[1]}]
    return {"status": status}


def policy_body(namespace: str, index: int, port: int = PORT) -> dict[str, Any]:
    return {
        "apiVersion": "k8s.cni.cncf.io/v1beta1",
        "kind": "MultiNetworkPolicy",
        "metadata": {
            "name": f"allow-{index}",
            "namespace": namespace,
            "annotations": {"k8s.v1.cni.cncf.io/policy-for": f"{DRIVER_DOMAIN}/{NETWORK_NAME}"},
        },
        "spec": {
            "podSelector": {"matchLabels": {"app": f"a{index}"}},
            "ingress": [
                {
                    "from": [{"podSelector": {"matchLabels": {"role": f"r{index % ROLES}"}}}],
                    "ports": [{"protocol": "TCP", "port": port}],
                },
                {
                    "from": [{"ipBlock": {"cidr": f"10.99.{int(namespace[2:]) % 256}.0/24"}}],
                    "ports": [{"protocol": "TCP", "port": 9090}],
                },
            ],
        },
    }


def service_body(namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": "web",
            "namespace": namespace,
            "labels": {NETWORK: NETWORK_NAME},
            "annotations": {f"{DRIVER_DOMAIN}/selector": "svc=on"},
        },
        "spec": {"clusterIP": "None", "ports": [{"name": "http", "port": PORT, "protocol": "TCP"}]},
    }


KINDS: dict[str, Any] = {
    "Namespace": Namespace,
    "Pod": Pod,
    "ResourceClaim": ResourceClaim,
    "ResourceSlice": ResourceSlice,
    "Service": Service,
    "MultiNetworkPolicy": MultiNetworkPolicy,
}


async def _write_all(kubeconfig: Path, writes: Iterable[Callable[[AsyncClient], Any]]) -> list[Any]:
    """Every write, CREATORS at a time over one HTTP/2 connection: their answers, in order."""
    client = AsyncClient(KubeConfig.from_file(kubeconfig), field_manager="netclaim-bench", http2=True)
    limit = asyncio.Semaphore(CREATORS)

    async def one(write: Callable[[AsyncClient], Any]) -> Any:
        async with limit:
            return await write(client)

    try:
        return await asyncio.gather(*(one(w) for w in writes))
    finally:
        await client.close()


def create_all(kubeconfig: Path, bodies: list[dict[str, Any]]) -> list[Any]:
    def creating(body: dict[str, Any]) -> Callable[[AsyncClient], Any]:
        return lambda client: client.create(cast(Any, KINDS[body["kind"]].from_dict(body)))

    return asyncio.run(_write_all(kubeconfig, [creating(b) for b in bodies]))


def write_statuses(kubeconfig: Path, statuses: list[tuple[str, str, dict[str, Any]]]) -> None:
    """(namespace, claim, status patch) each, through the claims' status subresource."""

    def writing(namespace: str, name: str, patch: dict[str, Any]) -> Callable[[AsyncClient], Any]:
        return lambda client: client.patch(
            ResourceClaim.Status, name, patch, namespace=namespace, patch_type=PatchType.MERGE
        )

    asyncio.run(_write_all(kubeconfig, [writing(*s) for s in statuses]))


# --- what the controller writes, watched ---------------------------------------------------------------
@dataclass
class Watched:
    """One kind's objects as the watch last told them, and each change with the time it arrived."""

    objects: dict[str, dict[str, Any]] = field(default_factory=dict)  # namespace/name → the object
    changes: queue.Queue[tuple[float, str, dict[str, Any] | None]] = field(default_factory=queue.Queue)
    largest_bytes: int = 0

    def follow(self, config: KubeConfig, resource: Any, namespace: str, labels: dict[str, Any]) -> None:
        """In a thread of its own, for as long as the benchmark runs (the cluster's end ends it)."""
        with (
            contextlib.suppress(httpx2.TransportError),
            Client(config, field_manager="netclaim-bench") as kube,
        ):
            for kind, obj in kube.watch(
                resource, namespace=namespace, labels=labels, on_error=on_error_retry
            ):
                body = cast(dict[str, Any], obj.to_dict())
                meta = body["metadata"]
                key = f"{meta.get('namespace', '')}/{meta['name']}"
                if kind == "DELETED":
                    self.changes.put((time.monotonic(), key, None))
                else:
                    self.largest_bytes = max(self.largest_bytes, len(json.dumps(body)))
                    self.changes.put((time.monotonic(), key, body))

    def until(self, condition: Callable[[], bool], what: str, timeout: float = 300) -> float:
        """Apply each change as it arrived until `condition` holds: the arrival time of the change that made
        it hold (now, if it already did)."""
        if condition():
            return time.monotonic()
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            try:
                arrived, key, body = self.changes.get(timeout=max(0.0, remaining))
            except queue.Empty:
                raise SystemExit(f"bench-policy: {what}: not after {timeout:.0f} s") from None
            self._apply(key, body)
            if self.changes.empty() and condition():
                return arrived

    def settle(self) -> None:
        """Take every change that has arrived."""
        while True:
            try:
                _, key, body = self.changes.get_nowait()
            except queue.Empty:
                return
            self._apply(key, body)

    def _apply(self, key: str, body: dict[str, Any] | None) -> None:
        if body is None:
            self.objects.pop(key, None)
        else:
            self.objects[key] = body


def watch(config: KubeConfig, resource: Any, namespace: str, labels: dict[str, Any]) -> Watched:
    watched = Watched()
    threading.Thread(
        target=watched.follow, args=(config, resource, namespace, labels), daemon=True, name="watch"
    ).start()
    return watched


@dataclass
class Rules:
    """The rules ConfigMaps, read as an agent reads its node's (netclaim.core.policy.distribution)."""

    maps: Watched

    parsed: dict[str, tuple[tuple[str, ...], dict[str, dict[str, Any]]]] = field(default_factory=dict)

    def of_node(self, node: str) -> dict[str, dict[str, Any]]:
        """Pod UID → network → its rules, from every part of the node's objects (parsed once a version)."""
        label = node_label(node)
        parts = sorted(
            (body["metadata"]["resourceVersion"], body["data"][POLICY_RULES_KEY])
            for body in self.maps.objects.values()
            if body["metadata"].get("labels", {}).get(POLICY_RULES_LABEL) == label
            and POLICY_RULES_KEY in (body.get("data") or {})
        )
        versions = tuple(version for version, _ in parts)
        kept = self.parsed.get(label)
        if kept is None or kept[0] != versions:
            kept = (versions, cast(dict[str, dict[str, Any]], read_rules(text for _, text in parts)))
            self.parsed[label] = kept
        return kept[1]

    def allows(self, pods: Iterable[tuple[SimPod, str]], port: int) -> dict[str, set[str] | None]:
        """Pod UID → the addresses its ingress on the network allows on `port` (None: no allow on that
        port, or no rules at all), for each of `pods` (pod, UID)."""
        by_node: dict[str, list[str]] = {}
        for pod, uid in pods:
            by_node.setdefault(pod.node, []).append(uid)
        found: dict[str, set[str] | None] = {}
        for node, uids in by_node.items():
            rules = self.of_node(node)
            for uid in uids:
                ingress = getattr(rules.get(uid, {}).get(NETWORK_NAME), "ingress", None)
                on_port = [
                    a for a in (ingress.allows if ingress else ()) if any(p.first == port for p in a.ports)
                ]
                found[uid] = {c.split("/")[0] for a in on_port for c in a.cidrs} if on_port else None
        return found


def endpoints(slices: Watched, namespace: str) -> set[str]:
    return {
        address
        for body in slices.objects.values()
        if body["metadata"]["namespace"] == namespace
        and body["metadata"].get("labels", {}).get(SLICE_SERVICE_NAME) == "web"
        for endpoint in body.get("endpoints") or []
        for address in endpoint.get("addresses") or []
    }


# --- the measurements ----------------------------------------------------------------------------------
def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered) + 0.5) - 1))]


def _summary(seconds: list[float]) -> dict[str, float]:
    ms = [s * 1000 for s in seconds]
    return {"n": len(ms), "p50_ms": statistics.median(ms), "p99_ms": _quantile(ms, 0.99), "max_ms": max(ms)}


def controller_gauge(name: str, **labels: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{ipam_load.METRICS_PORT}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items())
    )


@dataclass
class Bench:
    handle: ClusterHandle
    kube: Client
    sizes: Sizes
    pods: list[SimPod]
    uids: dict[tuple[str, str], str]  # (namespace, pod) → UID
    rules: Rules
    slices: Watched
    controller: int  # its pid

    def uid(self, pod: SimPod) -> str:
        return self.uids[(pod.namespace, pod.name)]

    def of_namespace(self, namespace: str) -> list[SimPod]:
        return [p for p in self.pods if p.namespace == namespace]


def apply_policies(bench: Bench) -> dict[str, float]:
    namespaces = sorted({p.namespace for p in bench.pods})
    bodies = [policy_body(ns, j) for ns in namespaces for j in range(POLICIES_PER_NAMESPACE)]
    everyone = [(p, bench.uid(p)) for p in bench.pods]
    cpu, started = measure.cpu_seconds(bench.controller), time.monotonic()
    create_all(bench.handle.kubeconfig, bodies)
    created = time.monotonic() - started

    def all_ruled() -> bool:
        return all(found is not None for found in bench.rules.allows(everyone, PORT).values())

    done = bench.rules.maps.until(all_ruled, f"every pod's rules after {len(bodies)} policies", timeout=900)
    return {
        "policies": len(bodies),
        "create_s": created,
        "apply_s": done - started,
        "compile_cpu_s": measure.cpu_seconds(bench.controller) - cpu,
    }


def policy_changes(bench: Bench) -> dict[str, float]:
    seconds = []
    for change in range(bench.sizes.changes):
        namespace = f"t-{(change * 37) % bench.sizes.namespaces:03d}"
        index = change % POLICIES_PER_NAMESPACE
        port = 10_000 + change
        selected = [
            (p, bench.uid(p)) for p in bench.of_namespace(namespace) if p.labels()["app"] == f"a{index}"
        ]
        started = time.monotonic()
        bench.kube.patch(
            MultiNetworkPolicy,
            f"allow-{index}",
            {"spec": policy_body(namespace, index, port)["spec"]},
            namespace=namespace,
            patch_type=PatchType.MERGE,
        )

        def edited(selected: list[tuple[SimPod, str]] = selected, port: int = port) -> bool:
            return all(found is not None for found in bench.rules.allows(selected, port).values())

        seconds.append(bench.rules.maps.until(edited, f"policy edit {change}") - started)
        bench.kube.patch(  # back, and settled, so the next measurement starts from the layout
            MultiNetworkPolicy,
            f"allow-{index}",
            {"spec": policy_body(namespace, index)["spec"]},
            namespace=namespace,
            patch_type=PatchType.MERGE,
        )
        bench.rules.maps.until(partial(edited, selected, PORT), f"policy edit {change} undone")
    return _summary(seconds)


def _label(bench: Bench, pod: SimPod, label: str, value: str | None) -> None:
    """Set (None: remove) one label of the pod."""
    bench.kube.patch(Pod, pod.name, {"metadata": {"labels": {label: value}}}, namespace=pod.namespace)


def relabels(bench: Bench) -> dict[str, float]:
    seconds = []
    for change in range(bench.sizes.changes):
        namespace = f"t-{(change * 53 + 7) % bench.sizes.namespaces:03d}"
        members = bench.of_namespace(namespace)
        moved = members[(change * 13) % len(members)]
        left = int(moved.labels()["role"][1:])
        joined = (left + 1 + change % (ROLES - 1)) % ROLES
        losing = [(p, bench.uid(p)) for p in members if p.labels()["app"] == f"a{left}"]
        gaining = [(p, bench.uid(p)) for p in members if p.labels()["app"] == f"a{joined}"]
        started = time.monotonic()
        _label(bench, moved, "role", f"r{joined}")

        def followed(moved: SimPod = moved, losing: Any = losing, gaining: Any = gaining) -> bool:
            lost = bench.rules.allows(losing, PORT)
            got = bench.rules.allows(gaining, PORT)
            return all(moved.address not in (a or ()) for a in lost.values()) and all(
                moved.address in (a or ()) for a in got.values()
            )

        seconds.append(bench.rules.maps.until(followed, f"relabel {change}") - started)
        _label(bench, moved, "role", f"r{left}")  # back, and settled: the next change starts from the layout

        def undone(moved: SimPod = moved, losing: Any = losing) -> bool:
            return all(moved.address in (a or ()) for a in bench.rules.allows(losing, PORT).values())

        bench.rules.maps.until(undone, f"relabel {change} undone")
    return _summary(seconds)


def endpoint_changes(bench: Bench) -> dict[str, float]:
    seconds = []
    for change in range(bench.sizes.changes):
        namespace = f"t-{(change * 29 + 3) % bench.sizes.namespaces:03d}"
        members = bench.of_namespace(namespace)
        pod = members[(change * 7) % len(members)]
        member = "svc" in pod.labels()
        started = time.monotonic()
        _label(bench, pod, "svc", None if member else "on")

        def followed(pod: SimPod = pod, member: bool = member, namespace: str = namespace) -> bool:
            return (pod.address in endpoints(bench.slices, namespace)) != member

        seconds.append(bench.slices.until(followed, f"Service change {change}") - started)
        _label(bench, pod, "svc", "on" if member else None)

        def back(pod: SimPod = pod, member: bool = member, namespace: str = namespace) -> bool:
            return (pod.address in endpoints(bench.slices, namespace)) == member

        bench.slices.until(back, f"Service change {change} undone")
    return _summary(seconds)


def claims_memory(bench: Bench) -> dict[str, float]:
    """More claims, to CLAIMS in all; the controller's RSS (and its peak) before, and once its informer
    holds every one."""
    spare = bench.sizes.claims - len(bench.pods)
    kubeconfig = bench.handle.kubeconfig
    before = {"rss_mib": measure.rss_mib(bench.controller), "peak_rss_mib": _peak_rss_mib(bench.controller)}
    create_all(kubeconfig, [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": SPARE_NAMESPACE}}])
    started = time.monotonic()
    for first in range(0, spare, 5_000):
        names = [f"c-{i:05d}" for i in range(first, min(spare, first + 5_000))]
        create_all(kubeconfig, [claim_body(name, SPARE_NAMESPACE) for name in names])
        write_statuses(
            kubeconfig,
            [
                (
                    SPARE_NAMESPACE,
                    name,
                    claim_status(
                        node_name(i % bench.sizes.nodes), str(ipaddress.ip_address("10.80.0.0") + i), None
                    ),
                )
                for i, name in zip(range(first, first + len(names)), names, strict=True)
            ],
        )
        log(f"  {first + len(names)} more claims written")
    written = time.monotonic() - started
    total = len(bench.pods) + spare

    def all_held() -> bool:
        return controller_gauge("netclaim_informer_objects", kind="claims") >= total

    processes.wait_until(all_held, 600, f"the controller's claims informer holding {total} claims")
    time.sleep(30)  # a few passes over all of them
    return {
        "claims": total,
        "write_s": written,
        "rss_mib": measure.rss_mib(bench.controller),
        "peak_rss_mib": _peak_rss_mib(bench.controller),
        # with the layout's pods and claims only, after the changes: what the 40,000 more add
        "rss_mib_before": before["rss_mib"],
        "peak_rss_mib_before": before["peak_rss_mib"],
    }


def _peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise ValueError(f"/proc/{pid}/status has no VmHWM")


# --- the run --------------------------------------------------------------------------------------------
def populate(
    handle: ClusterHandle, sizes: Sizes, nodes: Nodes
) -> tuple[list[SimPod], dict[tuple[str, str], str]]:
    pods = layout(sizes)
    names = [node_name(i) for i in range(sizes.nodes)]
    nodes.add(names)
    namespaces = sorted({p.namespace for p in pods})
    started = time.monotonic()
    create_all(
        handle.kubeconfig,
        [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}} for ns in namespaces]
        + [slice_body(node) for node in names],
    )
    with Client(KubeConfig.from_file(handle.kubeconfig)) as kube:  # a pod needs its namespace's account

        def accounts() -> bool:
            listed = kube.list(ServiceAccount, namespace="*")
            return {a.metadata.namespace for a in listed if a.metadata} >= set(namespaces)

        processes.wait_until(accounts, 120, "every namespace's default ServiceAccount")
    created = create_all(handle.kubeconfig, [pod_body(p) for p in pods])
    uids = {(o.metadata.namespace, o.metadata.name): str(o.metadata.uid) for o in created}
    create_all(handle.kubeconfig, [claim_body(f"{p.name}-net", p.namespace) for p in pods])
    write_statuses(
        handle.kubeconfig,
        [
            (
                p.namespace,
                f"{p.name}-net",
                claim_status(p.node, p.address, (p.name, uids[(p.namespace, p.name)])),
            )
            for p in pods
        ],
    )
    create_all(handle.kubeconfig, [service_body(ns) for ns in namespaces])
    log(f"  {len(pods)} pods and their claims on {len(names)} nodes in {time.monotonic() - started:.0f} s")
    return pods, uids


def run(handle: ClusterHandle, sizes: Sizes, work: Path) -> dict[str, Any]:
    agents.apply_manifests(handle)
    config = KubeConfig.from_file(handle.kubeconfig)
    result: dict[str, Any] = {"when": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")}
    result["sizes"] = sizes.__dict__.copy()
    with Client(config, field_manager="netclaim-bench") as kube:
        nodes = Nodes(kube)
        try:
            pods, uids = populate(handle, sizes, nodes)
            controller = ipam_load.start_controller(handle, work)
            rules = Rules(watch(config, ConfigMap, agents.NAMESPACE, {POLICY_RULES_LABEL: exists()}))
            slices = watch(config, EndpointSlice, "*", {SLICE_MANAGED_BY: exists()})
            bench = Bench(handle, kube, sizes, pods, uids, rules, slices, controller)
            everyone = {p.address for p in pods if "svc" in p.labels()}
            namespaces = sorted({p.namespace for p in pods})
            slices.until(
                lambda: set().union(*(endpoints(slices, ns) for ns in namespaces)) >= everyone,
                "every Service's endpoints",
                timeout=900,
            )
            log("applying the policies")
            result["apply"] = apply_policies(bench)
            log(f"  {result['apply']}")
            result["policy_change"] = policy_changes(bench)
            log(f"  policy changes: {result['policy_change']}")
            result["relabel"] = relabels(bench)
            log(f"  relabels: {result['relabel']}")
            result["endpoint_change"] = endpoint_changes(bench)
            log(f"  Service changes: {result['endpoint_change']}")
            rules.maps.settle()
            slices.settle()
            result["largest_object_kib"] = max(rules.maps.largest_bytes, slices.largest_bytes) / 1024
            result["rules_objects"] = len(rules.maps.objects)
            result["memory"] = claims_memory(bench)
            log(f"  memory: {result['memory']}")
        finally:
            nodes.stop()
            processes.stop(work, ipam_load.CONTROLLER)
    return result


def policy_line(result: dict[str, Any]) -> str:
    fields = {
        "policy_change_p99_ms": f"{result['policy_change']['p99_ms']:.0f}",
        "relabel_p99_ms": f"{result['relabel']['p99_ms']:.0f}",
        "endpoint_change_p99_ms": f"{result['endpoint_change']['p99_ms']:.0f}",
        "largest_object_kib": f"{result['largest_object_kib']:.0f}",
        "controller_rss_mib_50k_claims": f"{result['memory']['rss_mib']:.0f}",
        "compile_cpu_s": f"{result['apply']['compile_cpu_s']:.1f}",
    }
    return "POLICY " + " ".join(f"{k}={v}" for k, v in fields.items())


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="make bench-policy", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--namespaces", type=int, default=Sizes.namespaces, help="of 100 pods and 10 policies"
    )
    parser.add_argument("--claims", type=int, default=Sizes.claims, help="claims in all, for the RSS figure")
    parser.add_argument(
        "--changes",
        type=int,
        default=Sizes.changes,
        help="of each kind measured (p99 of fewer than 100: the max)",
    )
    parser.add_argument("--quick", action="store_true", help="small sizes: make test-tools' run")
    parser.add_argument("--out", type=Path, default=REPO_ROOT, help="where bench/ is")
    args = parser.parse_args(argv)
    sizes = (
        QUICK if args.quick else Sizes(namespaces=args.namespaces, claims=args.claims, changes=args.changes)
    )
    processes.exit_on_sigterm()
    started = time.monotonic()
    handle = cluster.up(HERE / "controller-cluster.yaml")
    keep = os.environ.get("NETCLAIM_KEEP_CLUSTER") == "1"
    with tempfile.TemporaryDirectory() as scratch:
        try:
            result = run(handle, sizes, Path(scratch))
        finally:
            if not keep:
                cluster.down(handle.spec.name)
    result["seconds"] = time.monotonic() - started
    result["policy_line"] = policy_line(result)
    out = args.out / "bench" / "controller.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    log(f"wrote {out} in {result['seconds'] / 60:.1f} min")
    print(result["policy_line"])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""`make bench-scale`: what netclaim costs the control plane as the cluster grows (500 nodes, 5,000 claims).

Its own local cluster (benchmarks/scale-cluster.yaml): a control plane, no kubelet. Every node is a Node
object kept Ready as kubelets keep theirs (a Lease renewed every 10 s). Three of them ("measured") run a
netclaim agent process each, with its kubelet plugin serving (no kubelet calls it), connected to a second
kube-apiserver of their own on the same etcd: that server's `apiserver_watch_events_total` counts exactly
what the agents are sent, and its audit log holds exactly their requests. Every other node's slices are
published by netclaim's own publish code (inventory -> policy -> devices -> SlicePublisher), from the same
synthetic inventories and policy the measured agents use, many nodes from this one process.

Stages, each measured the same way:
  small   3 nodes; 30 pods with claims created, scheduled and deleted over and over (the churn window)
  mid     100 nodes; the same churn
  large   500 nodes; 5,000 pods without claims, then 5,000 with a bandwidth claim each, scheduled by the
          real kube-scheduler from a standing start (it is stopped while they are created); the claims'
          run is this stage's churn window

In every churn window: watch events the agents' API server sent (resourceslices, the only kind agents
watch), the agents' requests (its audit log), a probe that watches every ResourceClaim (what each agent did
before it read claims by name) on the same server, and the agents' RSS (/proc). Writes bench/scale.json and
README's scale table; the last line is the SCALE line. `--quick` runs it small (make test).
NETCLAIM_KEEP_CLUSTER=1 keeps the cluster.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import datetime
import http.client
import json
import os
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any, cast

import httpx2
from lightkube import AsyncClient, Client, KubeConfig
from lightkube.core.exceptions import ApiError
from lightkube.resources.core_v1 import Namespace, Node, Pod
from lightkube.resources.resource_v1 import ResourceClaim, ResourceSlice
from prometheus_client.parser import text_string_to_metric_families

from benchmarks import measure, report
from benchmarks.suite import log, wait_for
from netclaim.adapters.kube import KubeApi
from netclaim.cluster import agents, binaries, cluster, keeper, processes
from netclaim.cluster.cluster import ClusterHandle
from netclaim.cluster.controlplane import ControlPlane
from netclaim.names import DRIVER_DOMAIN
from netclaim.publish.devices import Device, decide
from netclaim.publish.inventory import FileInventory
from netclaim.publish.policy import PolicyFile
from netclaim.publish.publisher import SlicePublisher, normalized_device
from netclaim.quantity import parse_quantity

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
NAMESPACE = "scale"
MEASURED = ("scale-0001", "scale-0002", "scale-0003")  # benchmarks/scale-cluster.yaml
BANDWIDTH = f"{DRIVER_DOMAIN}/bandwidth"
ASKS = ("1G", "2G", "5G", "10G")  # of 25G NICs, in turn
CREATORS = 32  # concurrent creates (one HTTP/2 connection)


@dataclasses.dataclass(frozen=True)
class Sizes:
    mid_nodes: int = 100
    nodes: int = 500
    pods: int = 5000
    churn_pods: int = 30
    churn_seconds: float = 60
    schedule_timeout: float = 600
    profile_seconds: int = 20  # of the scheduler's CPU, from its start


FULL = Sizes()
QUICK = Sizes(
    mid_nodes=20, nodes=50, pods=500, churn_pods=30, churn_seconds=15, schedule_timeout=300, profile_seconds=3
)


def node_name(index: int) -> str:
    return f"scale-{index:04d}"


def nic_count(node: str) -> int:
    """2 to 8 NICs, by the node's number."""
    return 2 + (int(node.rsplit("-", 1)[1]) - 1) % 7


# --- what the agents publish, for many nodes from one process ------------------------------------------
async def node_devices(inventory: Path, policy: PolicyFile) -> list[Device]:
    """The devices an agent with this inventory and policy publishes (the agent's own publish step)."""
    scanned = decide(await FileInventory(inventory).scan(), policy.policy, DRIVER_DOMAIN)
    return [d.device for d in scanned if d.device is not None]


def write_inventory(work: Path, node: str) -> Path:
    path = work / "inventories" / f"{node}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    agents.synthetic_inventory(path, nic_count(node))
    return path


def virtual_policy(work: Path) -> PolicyFile:
    path = work / "policy.yaml"
    path.write_text(agents.VIRTUAL_POLICY)
    return PolicyFile(path)


async def _publish_nodes(kubeconfig: Path, work: Path, nodes: list[str]) -> float:
    policy = virtual_policy(work)
    api = KubeApi.connect(kubeconfig, DRIVER_DOMAIN)
    limit = asyncio.Semaphore(CREATORS)

    async def one(node: str) -> None:
        async with limit:
            devices = await node_devices(write_inventory(work, node), policy)
            await SlicePublisher(api, node, DRIVER_DOMAIN).publish(devices)

    started = time.monotonic()
    try:
        await asyncio.gather(*(one(n) for n in nodes))
    finally:
        await api.close()
    return time.monotonic() - started


def slices_match_agents(kube: Client, work: Path) -> dict[str, bool]:
    """Whether what this benchmark would publish for a measured node equals what its agent published."""
    policy = virtual_policy(work)
    found = {}
    for node in MEASURED:
        ours = asyncio.run(node_devices(write_inventory(work, node), policy))
        published = [
            normalized_device(d.to_dict())
            for s in kube.list(ResourceSlice)
            if s.spec.nodeName == node and s.spec.driver == DRIVER_DOMAIN
            for d in s.spec.devices or []
        ]
        found[node] = sorted(published, key=lambda d: d["name"]) == sorted(
            (normalized_device(d.to_api()) for d in ours), key=lambda d: d["name"]
        )
    return found


# --- the API servers' and the scheduler's metrics -------------------------------------------------------
def _admin_context(handle: ClusterHandle) -> ssl.SSLContext:
    pki = handle.layout.pki
    context = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    context.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))
    return context


def agents_port(handle: ClusterHandle) -> int:
    port = handle.spec.ports.agentApiserver
    if port is None:
        raise SystemExit("bench-scale: the cluster file sets no ports.agentApiserver")
    return port


def agents_server(handle: ClusterHandle) -> str:
    return f"https://{handle.spec.management_gateway().ip}:{agents_port(handle)}"


def _samples(url: str, context: ssl.SSLContext) -> Iterator[tuple[str, dict[str, str], float]]:
    with urllib.request.urlopen(url, timeout=30, context=context) as response:  # noqa: S310 - our own URL
        text = response.read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            yield sample.name, sample.labels, sample.value


def watch_events(handle: ClusterHandle) -> dict[str, float]:
    """apiserver_watch_events_total of the agents' API server, by resource."""
    found: dict[str, float] = {}
    for name, labels, value in _samples(f"{agents_server(handle)}/metrics", _admin_context(handle)):
        if name == "apiserver_watch_events_total":
            found[labels["resource"]] = found.get(labels["resource"], 0.0) + value
    return found


def histogram_quantile(buckets: list[tuple[float, float]], q: float) -> float:
    """Prometheus' histogram_quantile over cumulative (upper bound, count) buckets: linear within the
    bucket the rank falls in."""
    ordered = sorted(buckets)
    if not ordered or ordered[-1][1] == 0:
        raise ValueError("no samples: the histogram is empty")
    rank = q * ordered[-1][1]
    lower, below = 0.0, 0.0
    for bound, count in ordered:
        if count >= rank:
            if bound == float("inf"):
                return lower
            return lower + (bound - lower) * (rank - below) / max(count - below, 1e-9)
        lower, below = bound, count
    return lower


# kube-scheduler's histograms read: each pod's attempt (its scheduling cycle and its binding), the
# algorithm alone (filters and scores), and the SLI (queue entry to bound, waiting behind the others included)
SCHEDULER_HISTOGRAMS = {
    "attempt": "scheduler_scheduling_attempt_duration_seconds",
    "algorithm": "scheduler_scheduling_algorithm_duration_seconds",
    "sli": "scheduler_pod_scheduling_sli_duration_seconds",
}


def scheduler_figures(handle: ClusterHandle) -> dict[str, Any]:
    """From kube-scheduler's /metrics (fresh: it was started for the run): attempts by result, and p50/p99
    of each of SCHEDULER_HISTOGRAMS (attempts that scheduled the pod)."""
    port = handle.spec.ports.schedulerMetrics
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE  # the scheduler's self-signed serving certificate, on 127.0.0.1
    attempts: dict[str, float] = {}
    buckets: dict[str, dict[float, float]] = {key: {} for key in SCHEDULER_HISTOGRAMS}
    names = {f"{metric}_bucket": key for key, metric in SCHEDULER_HISTOGRAMS.items()}
    for name, labels, value in _samples(f"https://127.0.0.1:{port}/metrics", context):
        if name == "scheduler_schedule_attempts_total":
            attempts[labels["result"]] = attempts.get(labels["result"], 0.0) + value
        if name in names and labels.get("result", "scheduled") == "scheduled":
            histogram, bound = buckets[names[name]], float(labels["le"])
            histogram[bound] = histogram.get(bound, 0.0) + value
    figures: dict[str, Any] = {"attempts": attempts}
    for key, histogram in buckets.items():
        figures[f"{key}_p50_s"] = histogram_quantile(list(histogram.items()), 0.5)
        figures[f"{key}_p99_s"] = histogram_quantile(list(histogram.items()), 0.99)
    return figures


# where kube-scheduler's CPU goes, by the code's own packages (cumulative shares of its profile)
PROFILE_PARTS = {
    "DRA plugin (dynamicresources)": "scheduler/framework/plugins/dynamicresources.",
    "DRA allocator (structured)": "dynamic-resource-allocation/structured",
    "CEL selectors": "dynamic-resource-allocation/cel.",
    "pod binding": "(*Scheduler).bindingCycle",
    "scheduling cycle": "(*Scheduler).schedulingCycle",
    "garbage collection": "runtime.gcBgMarkWorker",
}


class SchedulerProfile:
    """kube-scheduler's CPU profile over its serving port while it schedules (a thread), read by pprof."""

    def __init__(self, handle: ClusterHandle, path: Path, seconds: int) -> None:
        port = handle.spec.ports.schedulerMetrics
        self.url = f"https://127.0.0.1:{port}/debug/pprof/profile?seconds={seconds}"
        self.seconds = seconds
        self.path = path
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE  # the scheduler's self-signed serving certificate, on 127.0.0.1
        deadline = time.monotonic() + 30
        while True:  # the scheduler was just started: its port opens once it has read its configuration
            try:
                with urllib.request.urlopen(self.url, timeout=self.seconds + 30, context=context) as response:  # noqa: S310
                    self.path.write_bytes(response.read())
            except (ConnectionError, urllib.error.URLError):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
            else:
                return

    def start(self) -> None:
        self._thread.start()

    def shares(self) -> dict[str, Any]:
        """Cumulative share of the profile's samples in each of PROFILE_PARTS, and the top functions."""
        self._thread.join()
        go = shutil.which("go") or "/usr/local/go/bin/go"
        top = subprocess.run(
            [go, "tool", "pprof", "-top", "-cum", "-nodecount=400", str(self.path)],
            capture_output=True,
            text=True,
            check=True,
            timeout=120,
        ).stdout
        rows = []
        for line in top.splitlines():
            fields = line.split(maxsplit=5)
            if len(fields) == 6 and fields[4].endswith("%") and fields[1].endswith("%"):
                rows.append((float(fields[4].rstrip("%")), fields[5]))
        if not rows:
            raise SystemExit(f"bench-scale: the scheduler's profile has no samples:\n{top[-2000:]}")
        parts = {
            part: max((share for share, function in rows if needle in function), default=0.0)
            for part, needle in PROFILE_PARTS.items()
        }
        scheduler = [(share, f) for share, f in rows if "k8s.io/" in f][:40]
        return {"parts_percent": parts, "top_cumulative": [[share, f] for share, f in scheduler]}


class WatchProbe:
    """One watch on every object of a kind through the agents' API server, from the resourceVersion of a
    list made at start (so no ADDED events for what exists): what any watcher of the whole kind is sent,
    the API server's own one per kind included. Counts the events it receives, with their times."""

    def __init__(self, handle: ClusterHandle, path: str) -> None:
        self.path = path
        self._connection = http.client.HTTPSConnection(
            str(handle.spec.management_gateway().ip),
            agents_port(handle),
            context=_admin_context(handle),
            timeout=60,
        )
        self.stamps: list[float] = []
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._connection.request("GET", f"{self.path}?limit=1")
        listed = json.loads(self._connection.getresponse().read())
        version = listed["metadata"]["resourceVersion"]
        self._connection.request("GET", f"{self.path}?watch=1&resourceVersion={version}&timeoutSeconds=3600")
        self._response = self._connection.getresponse()
        if self._response.status != 200:
            raise SystemExit(f"bench-scale: the watch of {self.path} was refused: {self._response.status}")
        self._thread.start()

    def _run(self) -> None:
        with contextlib.suppress(OSError, ValueError, http.client.HTTPException):  # stop() cut it
            for line in self._response:
                if line.strip():
                    self.stamps.append(time.monotonic())

    def stop(self) -> None:
        """Once the kind is quiet: then what the server sent is what was read."""
        if self._connection.sock is not None:
            self._connection.sock.shutdown(socket.SHUT_RDWR)
        self._thread.join()
        self._connection.close()

    def rate(self, start: float, end: float) -> float:
        return sum(1 for s in self.stamps if start <= s <= end) / (end - start)


def open_watches(handle: ClusterHandle) -> dict[str, float]:
    """Watches open at the agents' API server, by resource (apiserver_longrunning_requests)."""
    found: dict[str, float] = {}
    for name, labels, value in _samples(f"{agents_server(handle)}/metrics", _admin_context(handle)):
        if name == "apiserver_longrunning_requests" and labels.get("verb") == "WATCH":
            found[labels["resource"]] = found.get(labels["resource"], 0.0) + value
    return found


# --- the cluster's nodes ----------------------------------------------------------------------------------
class Nodes:
    """Node objects added by the benchmark, kept Ready by netclaim's node keeper (a thread here)."""

    def __init__(self, kube: Client) -> None:
        self.kube = kube
        self.names: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=keeper.keep, args=(kube, self.names, self._stop), daemon=True)
        self._thread.start()

    def add(self, names: list[str]) -> None:
        for name in names:
            keeper.ensure_node(self.kube, name, {})
            keeper.heartbeat(self.kube, name)
        self.names.extend(names)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def _ready_nodes(kube: Client) -> int:
    count = 0
    for node in kube.list(Node):
        conditions = (node.status.conditions if node.status else None) or []
        taints = (node.spec.taints if node.spec else None) or []
        if any(c.type == "Ready" and c.status == "True" for c in conditions) and not any(
            t.key.startswith("node.kubernetes.io/") for t in taints
        ):
            count += 1
    return count


def _published_nodes(kube: Client) -> set[str]:
    return {
        str(s.spec.nodeName)
        for s in kube.list(ResourceSlice)
        if s.spec.driver == DRIVER_DOMAIN and s.spec.devices and s.spec.nodeName
    }


# --- pods and claims -------------------------------------------------------------------------------------
def claim_body(name: str, ask: str) -> dict[str, Any]:
    request = {"deviceClassName": "netclaim-shared", "capacity": {"requests": {BANDWIDTH: ask}}}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"devices": {"requests": [{"name": "nic", "exactly": request}]}},
    }


def pod_body(name: str, claim: str | None) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "app", "image": "registry.k8s.io/pause:3.10"}
    spec: dict[str, Any] = {
        "containers": [container],
        "terminationGracePeriodSeconds": 0,
        # the nodes have no kubelet: the pods are only scheduled, never started
        "tolerations": [{"key": "netclaim.dev/kubelet-less", "operator": "Exists", "effect": "NoSchedule"}],
    }
    if claim is not None:
        spec["resourceClaims"] = [{"name": "nic", "resourceClaimName": claim}]
        container["resources"] = {"claims": [{"name": "nic"}]}
    metadata = {"name": name, "namespace": NAMESPACE}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


async def _create_all(kubeconfig: Path, bodies: list[dict[str, Any]]) -> None:
    client = AsyncClient(KubeConfig.from_file(kubeconfig), field_manager="netclaim-bench", http2=True)
    limit = asyncio.Semaphore(CREATORS)

    async def one(body: dict[str, Any]) -> None:
        kind = ResourceClaim if body["kind"] == "ResourceClaim" else Pod
        async with limit:
            await client.create(cast(Any, kind.from_dict(body)))

    try:
        await asyncio.gather(*(one(b) for b in bodies))
    finally:
        await client.close()


def create_pods(handle: ClusterHandle, prefix: str, count: int, with_claims: bool) -> list[str]:
    """`count` pods (and their claims first), names `<prefix>-00001`...; returns the pod names."""
    names = [f"{prefix}-{i:05d}" for i in range(1, count + 1)]
    if with_claims:
        claims = [claim_body(n, ASKS[i % len(ASKS)]) for i, n in enumerate(names)]
        asyncio.run(_create_all(handle.kubeconfig, claims))
    asyncio.run(_create_all(handle.kubeconfig, [pod_body(n, n if with_claims else None) for n in names]))
    return names


def _unbound_left(kube: Client) -> bool:
    return any(True for _ in kube.list(Pod, namespace=NAMESPACE, fields={"spec.nodeName": ""}, chunk_size=1))


def _empty(kube: Client) -> bool:
    return not any(True for _ in kube.list(Pod, namespace=NAMESPACE, chunk_size=1)) and not any(
        True for _ in kube.list(ResourceClaim, namespace=NAMESPACE, chunk_size=1)
    )


def delete_all(kube: Client) -> None:
    """The namespace's pods at once (no kubelet to wait for), then its claims."""
    kube.deletecollection(Pod, namespace=NAMESPACE, grace_period=0)
    kube.deletecollection(ResourceClaim, namespace=NAMESPACE)
    wait_for(lambda: _empty(kube), 300, "pods and claims deleted")


# --- what each stage measures ---------------------------------------------------------------------------
def agent_rss(work: Path) -> list[float]:
    found = []
    for node in MEASURED:
        entry = processes.recorded(work, f"{node}-agent")
        if entry is None or not processes.alive(*entry):
            raise SystemExit(f"bench-scale: the agent of {node} is not running (see its log)")
        found.append(measure.rss_mib(entry[0]))
    return found


CLAIMS = "/apis/resource.k8s.io/v1/resourceclaims"
SLICES = "/apis/resource.k8s.io/v1/resourceslices"


@dataclasses.dataclass(frozen=True)
class Bench:
    """What every stage works with. `internal`: the watches the agents' API server keeps itself, by kind,
    counted before any agent or probe connected."""

    handle: ClusterHandle
    kube: Client
    work: Path
    sizes: Sizes
    internal: dict[str, float]


@dataclasses.dataclass
class Window:
    """A measurement window at the agents' API server: probes on every claim and every slice, its counters
    and audit log at the start."""

    claims: WatchProbe
    slices: WatchProbe
    events: dict[str, float]
    watches: dict[str, float]
    audit_offset: int
    started: float


def _agents_audit_log(handle: ClusterHandle) -> Path:
    return handle.layout.apiserver_audit_log(cluster.AGENT_APISERVER)


def _window(bench: Bench) -> Window:
    """Open a window while claims and slices are quiet (the probes and the counters then agree)."""
    handle = bench.handle
    claims, slices = WatchProbe(handle, CLAIMS), WatchProbe(handle, SLICES)
    claims.start()
    slices.start()
    offset = _agents_audit_log(handle).stat().st_size
    return Window(claims, slices, watch_events(handle), open_watches(handle), offset, time.monotonic())


def _close(bench: Bench, window: Window, quiet: Callable[[], bool]) -> dict[str, Any]:
    """Close the window; the probes stop once `quiet()` (no claim changes in flight).

    The agents' API server sends each event of a kind to each watcher of it: its own watchers of that kind
    (each is sent what the probe of that kind is sent), the probe, and the agents. Hence what the agents
    were sent: the counter's growth less (its own watchers + 1) times the probe's count. It keeps no watch
    of its own on slices (no Node authorizer), the one kind agents watch: their figure is exact. For
    claims, which no agent watches, what remains are its own watcher's bookmarks, which the probe did not
    ask for: about one a minute (the watch cache's bookmark period). `own_bookmarks_at_most` allows one
    more than the minutes the probe was open: a reference run's 150 s window saw 4."""
    handle = bench.handle
    ended = time.monotonic()
    seconds = ended - window.started
    requests = measure.agent_requests(_agents_audit_log(handle), window.audit_offset)
    rss = agent_rss(bench.work)
    wait_for(quiet, 300, "the claims settled")
    time.sleep(2)
    window.claims.stop()
    window.slices.stop()
    after = watch_events(handle)
    probed_seconds = time.monotonic() - window.started

    def sent_to_agents(resource: str, probe: WatchProbe) -> float:
        own = bench.internal.get(resource, 0.0)
        return after.get(resource, 0.0) - window.events.get(resource, 0.0) - (own + 1) * len(probe.stamps)

    agent_watches = {
        kind: window.watches.get(kind, 0.0) - bench.internal.get(kind, 0.0) - 1
        for kind in ("resourceclaims", "resourceslices")
    }
    slice_events = sent_to_agents("resourceslices", window.slices)
    return {
        "seconds": seconds,
        "own_watches": {k: bench.internal.get(k, 0.0) for k in agent_watches},
        "agent_watches": agent_watches,
        "agent_slice_events": slice_events,
        "agent_claim_events": sent_to_agents("resourceclaims", window.claims),
        "own_bookmarks_at_most": int(bench.internal.get("resourceclaims", 0.0))
        * (int(probed_seconds // 60) + 2),
        "agent_events_per_s": slice_events / len(MEASURED) / seconds,
        "agent_rss_mib": rss,
        "agent_requests": len(requests),
        "agent_requests_per_s": len(requests) / len(MEASURED) / seconds,
        "agent_wide_reads": [w for w in (r.wide() for r in requests) if w],
        "probe_events": len(window.claims.stamps),
        "probe_events_per_s": window.claims.rate(window.started, ended),
        "slice_probe_events": len(window.slices.stamps),
    }


def churn(bench: Bench, stage: str) -> dict[str, Any]:
    """`churn_pods` pods with claims created, scheduled and deleted, over and over for churn_seconds."""
    handle, kube, sizes = bench.handle, bench.kube, bench.sizes
    log(f"{stage}: churn of {sizes.churn_pods} pods with claims for {sizes.churn_seconds:.0f} s")
    window = _window(bench)
    cycles = 0
    while time.monotonic() - window.started < sizes.churn_seconds:
        cycles += 1
        create_pods(handle, f"{stage}{cycles}", sizes.churn_pods, with_claims=True)
        wait_for(lambda: not _unbound_left(kube), 120, f"{stage} churn pods scheduled")
        kube.deletecollection(Pod, namespace=NAMESPACE, grace_period=0)
        kube.deletecollection(ResourceClaim, namespace=NAMESPACE)
    result = _close(bench, window, lambda: _empty(kube))
    result["cycles"] = cycles
    log(
        f"  {cycles} cycles; agents sent {result['agent_events_per_s']:.3f} events/s each, made "
        f"{result['agent_requests_per_s']:.3f} requests/s each; the claim probe "
        f"{result['probe_events_per_s']:.1f} events/s; agent RSS {result['agent_rss_mib']} MiB"
    )
    return result


def _bind_seconds(kube: Client) -> list[float]:
    stamps = []
    for pod in kube.list(Pod, namespace=NAMESPACE):
        conditions = (pod.status.conditions if pod.status else None) or []
        for condition in conditions:
            if condition.type == "PodScheduled" and condition.status == "True":
                assert condition.lastTransitionTime is not None
                stamps.append(condition.lastTransitionTime.timestamp())
    return stamps


def schedule(bench: Bench, with_claims: bool) -> dict[str, Any]:
    """`pods` pods created while the scheduler is stopped, then scheduled from a standing start."""
    handle, kube, work, sizes = bench.handle, bench.kube, bench.work, bench.sizes
    kind = "with a claim each" if with_claims else "without claims"
    log(f"large: {sizes.pods} pods {kind}: created with the scheduler stopped")
    plane = ControlPlane(handle.spec, handle.layout, binaries.bin_dir())
    processes.stop(handle.layout.pids, "kube-scheduler")
    create_pods(handle, "claim" if with_claims else "plain", sizes.pods, with_claims)
    measure.wait_quiet()
    window = _window(bench) if with_claims else None
    log("  scheduler started")
    plane.start_scheduler()
    name = f"scheduler-{'claims' if with_claims else 'plain'}.pprof"
    profile = SchedulerProfile(handle, work / name, sizes.profile_seconds)
    profile.start()
    wait_for(lambda: not _unbound_left(kube), sizes.schedule_timeout, "every pod scheduled")
    closed = _close(bench, window, lambda: True) if window is not None else None
    binds = _bind_seconds(kube)
    if len(binds) != sizes.pods:
        raise SystemExit(f"bench-scale: {len(binds)} of {sizes.pods} pods scheduled")
    # PodScheduled's time has whole seconds: the run spans from the first bind's second to the last's end
    span = max(binds) - min(binds) + 1
    binds.sort()
    fifth = len(binds) // 5
    result: dict[str, Any] = {
        "pods": sizes.pods,
        "span_s": span,
        "pods_per_s": sizes.pods / span,
        # does the pace fall as allocated claims pile up? the first and the last fifth of the pods
        "first_fifth_pods_per_s": fifth / (binds[fifth] - binds[0] + 1),
        "last_fifth_pods_per_s": fifth / (binds[-1] - binds[-fifth - 1] + 1),
        "scheduler": scheduler_figures(handle),
        "window": closed,
        "profile": profile.shares(),
    }
    if with_claims:
        result["oversubscribed"] = oversubscribed(kube)
        result["allocated"] = sum(
            1 for c in kube.list(ResourceClaim, namespace=NAMESPACE) if c.status and c.status.allocation
        )
    figures = result["scheduler"]
    log(
        f"  {result['pods_per_s']:.1f} pods/s over {span:.0f} s; p99: attempt "
        f"{figures['attempt_p99_s'] * 1000:.0f} ms, algorithm {figures['algorithm_p99_s'] * 1000:.1f} ms; "
        f"attempts {figures['attempts']}"
    )
    return result


def oversubscribed(kube: Client) -> list[str]:
    """Devices whose allocated bandwidth exceeds what their slice publishes (the scheduler's promise)."""
    capacity: dict[tuple[str, str], Decimal] = {}
    for resource_slice in kube.list(ResourceSlice):
        spec = resource_slice.to_dict()["spec"]
        if spec["driver"] != DRIVER_DOMAIN:
            continue
        for device in spec.get("devices") or []:
            value = (device.get("capacity") or {}).get(BANDWIDTH)
            if value is not None:
                capacity[(spec["pool"]["name"], device["name"])] = parse_quantity(value["value"])
    used: dict[tuple[str, str], Decimal] = {}
    for claim in kube.list(ResourceClaim, namespace=NAMESPACE):
        allocation = claim.status.allocation if claim.status else None
        for result in (allocation.devices.results or []) if allocation and allocation.devices else []:
            key = (result.pool, result.device)
            consumed = (result.consumedCapacity or {}).get(BANDWIDTH)
            used[key] = used.get(key, Decimal(0)) + parse_quantity(consumed or "0")
    return sorted(
        f"{p}/{d}: {used[(p, d)]:.0f} of {capacity.get((p, d), 0):.0f}"
        for p, d in used
        if used[(p, d)] > capacity.get((p, d), Decimal(0))
    )


# --- the run -------------------------------------------------------------------------------------------
def grow(bench: Bench, nodes: Nodes, total: int) -> dict[str, Any]:
    handle, kube, work = bench.handle, bench.kube, bench.work
    present = len(MEASURED) + len(nodes.names)
    added = [node_name(i) for i in range(present + 1, total + 1)]
    log(f"grow: {len(added)} nodes ({present} -> {total}), their slices by netclaim's publish code")
    nodes.add(added)
    seconds = asyncio.run(_publish_nodes(handle.kubeconfig, work, added))
    wait_for(lambda: _ready_nodes(kube) == total, 180, f"{total} nodes Ready")
    published = _published_nodes(kube)
    if len(published) != total:
        raise SystemExit(f"bench-scale: {len(published)} of {total} nodes have slices")
    devices = sum(nic_count(n) for n in [*MEASURED, *nodes.names])
    log(f"  published {len(added)} nodes in {seconds:.2f} s; {devices} NICs in the cluster")
    return {"nodes": total, "added": len(added), "publish_s": seconds, "devices": devices}


def start_agents(handle: ClusterHandle, work: Path) -> None:
    for node in MEASURED:
        agents.start_virtual_agent(
            handle, node, work, nic_count(node), server=agents_server(handle), kubelet_plugin=True
        )
    with Client(KubeConfig.from_file(handle.kubeconfig)) as kube:
        wait_for(lambda: set(MEASURED) <= _published_nodes(kube), 120, "the measured agents' slices")


def scale_line(result: dict[str, Any]) -> str:
    claims = result["large"]["with_claims"]
    fields = {
        "nodes": str(result["sizes"]["nodes"]),
        "claims": str(claims["allocated"]),
        "publish_s": f"{result['publish_s']:.2f}",
        "sched_pods_per_s": f"{claims['pods_per_s']:.1f}",
        "sched_p99_s": f"{claims['scheduler']['attempt_p99_s']:.3f}",
        "agent_events_per_s": f"{claims['window']['agent_events_per_s']:.3f}",
        "agent_rss_mib": f"{sum(claims['window']['agent_rss_mib']) / len(MEASURED):.1f}",
    }
    return "SCALE " + " ".join(f"{k}={v}" for k, v in fields.items())


def run(handle: ClusterHandle, sizes: Sizes, work: Path) -> dict[str, Any]:
    agents.apply_manifests(handle)
    internal = open_watches(handle)  # before any agent or probe: the API server's own
    start_agents(handle, work)
    result: dict[str, Any] = {"when": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")}
    result["sizes"] = dataclasses.asdict(sizes)
    config = KubeConfig.from_file(handle.kubeconfig)
    # deleting 5,000 pods is one request the API server answers when it is done
    with Client(config, field_manager="netclaim-bench", timeout=httpx2.Timeout(300.0)) as kube:
        try:
            kube.create(Namespace(metadata={"name": NAMESPACE}))  # type: ignore[arg-type]
        except ApiError as err:
            if err.status.code != 409:
                raise
        bench = Bench(handle, kube, work, sizes, internal)
        nodes = Nodes(kube)
        try:
            result["slices_match_agents"] = slices_match_agents(kube, work)
            result["small"] = {"nodes": len(MEASURED), "churn": churn(bench, "small")}
            result["mid"] = grow(bench, nodes, sizes.mid_nodes)
            result["mid"]["churn"] = churn(bench, "mid")
            result["large"] = grow(bench, nodes, sizes.nodes)
            result["large"]["without_claims"] = schedule(bench, with_claims=False)
            delete_all(kube)
            result["large"]["with_claims"] = schedule(bench, with_claims=True)
        finally:
            nodes.stop()
    result["publish_s"] = result["mid"]["publish_s"] + result["large"]["publish_s"]
    large = result["large"]
    large["claims_to_plain_ratio"] = (
        large["with_claims"]["pods_per_s"] / large["without_claims"]["pods_per_s"]
    )
    return result


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="make bench-scale", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes: make test's run")
    parser.add_argument("--out", type=Path, default=ROOT, help="where bench/ and README.md are")
    args = parser.parse_args(argv)
    sizes = QUICK if args.quick else FULL
    started = time.monotonic()
    handle = cluster.up(HERE / "scale-cluster.yaml")
    keep = os.environ.get("NETCLAIM_KEEP_CLUSTER") == "1"
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        try:
            result = run(handle, sizes, work)
        finally:
            for node in MEASURED:
                processes.stop(work, f"{node}-agent")
            if not keep:
                cluster.down(handle.spec.name)
    result["machine"] = report.machine()
    result["seconds"] = time.monotonic() - started
    result["scale_line"] = scale_line(result)
    out = args.out / "bench" / "scale.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    report.render_scale(result, args.out)
    log(f"wrote {out} and README's scale table in {result['seconds'] / 60:.1f} min")
    print(result["scale_line"])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""`make bench-scale`: what netclaim costs the control plane as the cluster grows (500 nodes, 5,000 claims).

Its own local cluster (scale-cluster.yaml): a control plane, no kubelet. Every node is a Node
object kept Ready as kubelets keep theirs (a Lease renewed every 10 s). Three of them ("measured") run a
netclaim agent process each, with its kubelet plugin serving (no kubelet calls it), connected to a second
kube-apiserver of their own on the same etcd: that server's `apiserver_watch_events_total` counts what
the agents are sent, and its audit log holds exactly their requests. Every other node's slices are
published by netclaim's own publish code (inventory -> policy -> devices -> SlicePublisher), from the same
synthetic inventories and policy the measured agents use, many nodes from this one process.

Stages:
  small   3 nodes: a churn window
  mid     100 nodes: a churn window
  large   500 nodes: the scheduling arms (benchmarks.arms), each 5,000 pods scheduled by the real
          kube-scheduler from a standing start (it is stopped while they are created), `repeats` times in
          turn: without claims, with a no-op DRA driver's claim, with a bandwidth share of the no-op
          driver's NIC-like devices, with a NIC share and a pool address
          (netclaim's controller running: the addresses taken as agents take them, benchmarks.ipam_load),
          with a NIC share; then, with the last arm's 5,000 claims allocated, a churn window

A churn window (the same at every stage): 30 pods with claims created, scheduled and deleted over and
over for 60 s; every measured node's slice changes twice (an MTU in its agent's inventory, and back), and
so does a tenth of the other nodes' (republished). Measured in it: the watch events the agents' API server
sent the agents (exactly 2 each: their own node's changes, nobody else's), two probes watching every
slice and every claim (what a watch on the whole kind is sent: each agent had one on every claim before
it read claims by name), the agents' requests (that server's audit log) and their RSS (/proc).

Writes bench/scale.json and docs/scale.md's table; the last line is the SCALE line. `--quick` runs it small
(make test). NETCLAIM_KEEP_CLUSTER=1 keeps the cluster.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import datetime
import http.client
import json
import os
import re
import shutil
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx2
from lightkube import Client, KubeConfig
from lightkube.core.exceptions import ApiError
from lightkube.resources.core_v1 import Namespace, Node, Pod
from lightkube.resources.resource_v1 import DeviceClass, ResourceClaim, ResourceSlice
from prometheus_client.parser import text_string_to_metric_families

from netclaim.adapters.kube.connection import KubeConnection
from netclaim.adapters.kube.slices import KubeSlices
from netclaim.agent.publish.inventory import FileInventory
from netclaim.agent.publish.loop import PolicyFile
from netclaim.agent.publish.publisher import SlicePublisher
from netclaim.core.devices.catalog import Device, decide
from netclaim.core.devices.slices import normalized_device
from netclaim.core.names import DRIVER_DOMAIN
from netclaim.core.quantity import parse_quantity
from netclaim_lab import agents, binaries, cluster, keeper, processes
from netclaim_lab.benchmarks import arms, bulk, dense, ipam_load, measure, report
from netclaim_lab.benchmarks.arms import Arm
from netclaim_lab.benchmarks.suite import log, wait_for
from netclaim_lab.cluster import ClusterHandle
from netclaim_lab.controlplane import ControlPlane
from netclaim_lab.layout import REPO_ROOT

HERE = Path(__file__).resolve().parent
NAMESPACE = "scale"  # the 5,000-pod runs
CHURN_NAMESPACE = "scale-churn"
MEASURED = ("scale-0001", "scale-0002", "scale-0003")  # scale-cluster.yaml
BANDWIDTH = f"{DRIVER_DOMAIN}/bandwidth"
ATTACHMENTS = f"{DRIVER_DOMAIN}/attachments"
# of 25G NICs, in turn: 5,000 claims ask for 64 % of the 500 nodes' bandwidth, and a 2-NIC node fills up
ASKS = ("2G", "5G", "10G", "15G")
CHURN_ASKS = ("1G",)  # the churn windows' 30 claims fit on the 3 measured nodes' 9 NICs
MTU, CHANGED_MTU = 1500, 9000  # a window's slice changes: every NIC's MTU, and back


@dataclasses.dataclass(frozen=True)
class Sizes:
    mid_nodes: int = 100
    nodes: int = 500
    pods: int = 5000
    churn_pods: int = 30
    churn_seconds: float = 60
    schedule_timeout: float = 1800
    profile_seconds: int = 20  # of the scheduler's CPU, from its start
    late_profile_after: float = 0.8  # the second profile: once this share of the pods is placed
    repeats: int = 3  # of the large stage's arms, in turn
    dense_claims: int = 1000  # prepared by one agent (dense.py)
    only: tuple[str, ...] = ()  # these arms alone (their runs only: no SCALE line, no README table)


FULL = Sizes()
QUICK = Sizes(
    mid_nodes=20,
    nodes=50,
    pods=500,
    churn_pods=30,
    churn_seconds=15,
    schedule_timeout=300,
    profile_seconds=3,
    late_profile_after=0.5,  # an arm of 500 pods takes 3-30 s: at 4/5, its last pods may be in backoff
    repeats=1,
    dense_claims=100,
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


def write_inventory(work: Path, node: str, mtu: int = MTU) -> Path:
    path = work / "inventories" / f"{node}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    agents.synthetic_inventory(path, nic_count(node), mtu)
    return path


def virtual_policy(work: Path) -> PolicyFile:
    path = work / "policy.yaml"
    path.write_text(agents.VIRTUAL_POLICY)
    return PolicyFile(path)


async def _publish_nodes(kubeconfig: Path, work: Path, nodes: list[str], mtu: int = MTU) -> float:
    policy = virtual_policy(work)
    kube = KubeConnection.connect(kubeconfig, DRIVER_DOMAIN)
    slices = KubeSlices(kube)
    limit = asyncio.Semaphore(bulk.CREATORS)

    async def one(node: str) -> None:
        async with limit:
            devices = await node_devices(write_inventory(work, node, mtu), policy)
            await SlicePublisher(slices, node, DRIVER_DOMAIN).publish(devices)

    started = time.monotonic()
    try:
        await asyncio.gather(*(one(n) for n in nodes))
    finally:
        await kube.close()
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


def _by_resource(handle: ClusterHandle, metric: str, **wanted: str) -> dict[str, float]:
    """A metric of the agents' API server summed by resource, over the samples with the `wanted` labels."""
    found: dict[str, float] = {}
    for name, labels, value in _samples(f"{agents_server(handle)}/metrics", _admin_context(handle)):
        if name == metric and all(labels.get(k) == v for k, v in wanted.items()):
            found[labels["resource"]] = found.get(labels["resource"], 0.0) + value
    return found


def watch_events(handle: ClusterHandle) -> dict[str, float]:
    """Watch events the agents' API server sent, by resource."""
    return _by_resource(handle, "apiserver_watch_events_total")


def open_watches(handle: ClusterHandle) -> dict[str, float]:
    """Watches open at the agents' API server, by resource."""
    return _by_resource(handle, "apiserver_longrunning_requests", verb="WATCH")


def _scheduler_context() -> ssl.SSLContext:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE  # the scheduler's self-signed serving certificate, on 127.0.0.1
    return context


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
    context = _scheduler_context()
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
    "DRA Filter": "dynamicresources.(*DynamicResources).Filter",
    "DRA PreFilter": "dynamicresources.(*DynamicResources).PreFilter",
    "DRA allocator": "incubating.(*Allocator).Allocate",
    "CEL DeviceMatches": "cel.CompilationResult.DeviceMatches",
    "slices converted (GatherPools)": "incubating.GatherPools",
    "capacity checks": "incubating.(*allocator).CmpRequestOverCapacity",
    "pod binding": "(*Scheduler).bindingCycle",
    "garbage collection": "runtime.gcBgMarkWorker",
}


def _scheduled(handle: ClusterHandle) -> float:
    """Pods the scheduler has placed since it started (0 while its port is not open yet)."""
    port = handle.spec.ports.schedulerMetrics
    try:
        samples = list(_samples(f"https://127.0.0.1:{port}/metrics", _scheduler_context()))
    except (ConnectionError, urllib.error.URLError):
        return 0.0
    return sum(
        value
        for name, labels, value in samples
        if name == "scheduler_schedule_attempts_total" and labels.get("result") == "scheduled"
    )


class SchedulerProfile:
    """kube-scheduler's CPU profile over its serving port while it schedules (a thread), read by pprof;
    from the start, or (`after_scheduled`) once the scheduler has placed that many pods."""

    def __init__(self, handle: ClusterHandle, path: Path, seconds: int, after_scheduled: int = 0) -> None:
        port = handle.spec.ports.schedulerMetrics
        self.url = f"https://127.0.0.1:{port}/debug/pprof/profile?seconds={seconds}"
        self.seconds = seconds
        self.path = path
        self.handle = handle
        self.after_scheduled = after_scheduled
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while self.after_scheduled and _scheduled(self.handle) < self.after_scheduled:
            time.sleep(1)  # one scrape of /metrics a second: nothing beside the scheduler's own work
        context = _scheduler_context()
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
        rows: list[tuple[float, str]] = []
        for line in top.splitlines():
            fields = line.split(maxsplit=5)
            if len(fields) == 6 and fields[4].endswith("%") and fields[1].endswith("%"):
                rows.append((float(fields[4].rstrip("%")), fields[5]))
        total = re.search(r"Total samples = (\S+)", top)
        samples = total.group(1) if total else "?"
        if not rows:  # a window in which the scheduler waited on backoffs: said so, and the test decides
            parts = dict.fromkeys(PROFILE_PARTS, 0.0)
            return {"samples": samples, "parts_percent": parts, "top_cumulative": []}
        parts = {
            part: max((share for share, function in rows if needle in function), default=0.0)
            for part, needle in PROFILE_PARTS.items()
        }
        scheduler = [(share, f) for share, f in rows if "k8s.io/" in f][:40]
        top_cumulative = [[share, f] for share, f in scheduler]
        return {"samples": samples, "parts_percent": parts, "top_cumulative": top_cumulative}


class WatchProbe:
    """One watch on every object of a kind through the agents' API server, from the resourceVersion of a
    list made at start (so no ADDED events for what exists): what any watcher of the whole kind is sent,
    the API server's own ones included. Counts the events it receives, with their times."""

    def __init__(self, handle: ClusterHandle, path: str) -> None:
        self.path = path
        self._connection = http.client.HTTPSConnection(
            str(handle.spec.management_gateway().ip),
            agents_port(handle),
            context=_admin_context(handle),
            timeout=60,
        )
        self.stamps: list[float] = []
        self._stopping = False
        self._error: str | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._connection.request("GET", f"{self.path}?limit=1")
        listed = json.loads(self._connection.getresponse().read())
        version = listed["metadata"]["resourceVersion"]
        self._connection.request("GET", f"{self.path}?watch=1&resourceVersion={version}&timeoutSeconds=3600")
        self._response = self._connection.getresponse()
        if self._response.status != 200:
            raise SystemExit(f"bench-scale: the watch of {self.path} was refused: {self._response.status}")
        assert self._connection.sock is not None
        self._connection.sock.settimeout(None)  # a quiet minute is no reason to stop counting
        self._thread.start()

    def _run(self) -> None:
        try:
            for line in self._response:
                if line.strip():
                    self.stamps.append(time.monotonic())
        except (OSError, ValueError, http.client.HTTPException) as err:
            if not self._stopping:
                self._error = repr(err)
        if not self._stopping:
            self._error = self._error or "the API server ended the watch"

    def stop(self) -> None:
        """Once the kind is quiet: then what the server sent is what was read."""
        self._stopping = True
        if self._connection.sock is not None:
            self._connection.sock.shutdown(socket.SHUT_RDWR)
        self._thread.join()
        self._connection.close()
        if self._error is not None:
            raise SystemExit(f"bench-scale: the probe's watch of {self.path} broke: {self._error}")

    def rate(self, start: float, end: float) -> float:
        return sum(1 for s in self.stamps if start <= s <= end) / (end - start)


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


def create_pods(
    handle: ClusterHandle, namespace: str, prefix: str, count: int, arm: Arm, asks: tuple[str, ...]
) -> None:
    """`count` pods of `arm` in `namespace`, named `<prefix>-00001`..., each with its claim made first
    (NIC shares asking `asks`, in turn)."""
    names = [f"{prefix}-{i:05d}" for i in range(1, count + 1)]
    make = arm.claim
    if make is not None:
        claims = [make(n, namespace, asks[i % len(asks)]) for i, n in enumerate(names)]
        asyncio.run(bulk.create_all(handle.kubeconfig, claims))
    pods = [bulk.pod_body(n, namespace, n if make is not None else None) for n in names]
    asyncio.run(bulk.create_all(handle.kubeconfig, pods))


def _unbound_left(kube: Client, namespace: str) -> bool:
    unbound = kube.list(Pod, namespace=namespace, fields={"spec.nodeName": ""}, chunk_size=1)
    return any(True for _ in unbound)


def _empty(kube: Client, namespace: str) -> bool:
    return not any(True for _ in kube.list(Pod, namespace=namespace, chunk_size=1)) and not any(
        True for _ in kube.list(ResourceClaim, namespace=namespace, chunk_size=1)
    )


def _deleted(delete: Callable[[], object], attempts: int = 5) -> None:
    """A deletecollection, sent again when the API server closed the kept-alive connection just as it went
    out (seen after two quiet minutes of scheduling) or gave up on it at its request timeout (504, seen
    with 5,000 pods: what it deleted by then stays deleted). Deleting what is gone already is no harm."""
    for attempt in range(attempts):
        try:
            delete()
        except httpx2.RemoteProtocolError:
            pass
        except httpx2.HTTPStatusError as err:
            if err.response.status_code != 504:
                raise
        else:
            return
        log(f"  deleting again ({attempt + 1} of {attempts})")
    delete()


def delete_all(kube: Client, namespace: str, *, wait: bool = True) -> None:
    """The namespace's pods at once (no kubelet to wait for), then its claims."""
    _deleted(lambda: kube.deletecollection(Pod, namespace=namespace, grace_period=0))
    _deleted(lambda: kube.deletecollection(ResourceClaim, namespace=namespace))
    if wait:
        wait_for(lambda: _empty(kube, namespace), 300, f"pods and claims of {namespace} deleted")


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
    counted before any agent or probe connected. `others`: the nodes this benchmark publishes. `partial`:
    where each arm's run is written as soon as it ends, so that a run stopped early keeps what it measured."""

    handle: ClusterHandle
    kube: Client
    work: Path
    sizes: Sizes
    internal: dict[str, float]
    others: list[str]
    partial: Path


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


def _mtus(kube: Client, nodes: list[str]) -> dict[str, set[int]]:
    """The MTUs the nodes' published NICs have."""
    found: dict[str, set[int]] = {node: set() for node in nodes}
    for resource_slice in kube.list(ResourceSlice):
        spec = resource_slice.to_dict()["spec"]
        if spec["driver"] == DRIVER_DOMAIN and spec.get("nodeName") in found:
            for device in spec.get("devices") or []:
                found[spec["nodeName"]].add(device["attributes"][f"{DRIVER_DOMAIN}/mtu"]["int"])
    return found


def change_slices(bench: Bench, toggled: list[str], mtu: int) -> None:
    """Every measured node's NICs and the `toggled` nodes' get `mtu`: one slice write per node, by the
    measured agents (their inventory file changed) and by this process; returns once all are published."""
    for node in MEASURED:
        inventory = agents.virtual_agent_files(bench.work, node) / "inventory.yaml"
        agents.synthetic_inventory(inventory, nic_count(node), mtu)
    asyncio.run(_publish_nodes(bench.handle.kubeconfig, bench.work, toggled, mtu))
    nodes = [*MEASURED, *toggled]
    wait_for(lambda: all(m == {mtu} for m in _mtus(bench.kube, nodes).values()), 60, f"MTU {mtu} published")


def _close(bench: Bench, window: Window, quiet: Callable[[], bool]) -> dict[str, Any]:
    """Close the window; the probes stop once `quiet()` (no claim changes in flight).

    The agents' API server sends each event of a kind to each watcher of it: its own watchers of that kind
    (each is sent what the probe of that kind is sent), the probe, and the agents. Hence what the agents
    were sent: the counter's growth less (its own watchers + 1) times the probe's count. It keeps no watch
    of its own on slices (no Node authorizer), the one kind agents watch: their figure is exact. For
    claims, which no agent watches, what remains are its own watcher's bookmarks, which the probe did not
    ask for: about one a minute (the watch cache's bookmark period). `own_bookmarks_allowed` allows one
    more than the minutes the probe was open: a 150 s window once saw 4."""
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
    own_claim_watches = int(bench.internal.get("resourceclaims", 0.0))
    return {
        "seconds": seconds,
        "own_watches": {k: bench.internal.get(k, 0.0) for k in agent_watches},
        "agent_watches": agent_watches,
        "agent_slice_events": slice_events,
        "agent_events_per_agent": slice_events / len(MEASURED),
        "agent_events_per_s": slice_events / len(MEASURED) / seconds,
        "agent_claim_events": sent_to_agents("resourceclaims", window.claims),
        "own_bookmarks_allowed": own_claim_watches * (int(probed_seconds // 60) + 2),
        "agent_rss_mib": rss,
        "agent_rss_mean_mib": sum(rss) / len(rss),
        "agent_requests": len(requests),
        "agent_requests_by_kind": dict(Counter(f"{r.verb} {r.resource}" for r in requests)),
        "agent_wide_reads": [w for w in (r.wide() for r in requests) if w],
        "slice_probe_events": len(window.slices.stamps),
        "probe_events": len(window.claims.stamps),
        "probe_events_per_s": window.claims.rate(window.started, ended),
    }


def churn(bench: Bench, stage: str) -> dict[str, Any]:
    """The churn window: `churn_pods` pods with claims created, scheduled and deleted, over and over for
    churn_seconds; the measured nodes' slices and a tenth of the others' change twice."""
    handle, kube, sizes = bench.handle, bench.kube, bench.sizes
    toggled = bench.others[: len(bench.others) // 10]
    log(
        f"{stage}: churn of {sizes.churn_pods} pods with claims for {sizes.churn_seconds:.0f} s; "
        f"{len(MEASURED) + len(toggled)} nodes' slices changed twice"
    )
    window = _window(bench)
    change_slices(bench, toggled, CHANGED_MTU)
    cycles = 0
    while time.monotonic() - window.started < sizes.churn_seconds:
        cycles += 1
        create_pods(handle, CHURN_NAMESPACE, f"{stage}{cycles}", sizes.churn_pods, arms.NIC, CHURN_ASKS)
        wait_for(lambda: not _unbound_left(kube, CHURN_NAMESPACE), 120, f"{stage} churn pods scheduled")
        delete_all(kube, CHURN_NAMESPACE, wait=False)
    change_slices(bench, toggled, MTU)
    result = _close(bench, window, lambda: _empty(kube, CHURN_NAMESPACE))
    result["cycles"] = cycles
    result["changed_nodes"] = len(MEASURED) + len(toggled)
    log(
        f"  {cycles} cycles; each agent was sent {result['agent_events_per_agent']:g} watch events "
        f"({result['agent_events_per_s']:.3f}/s) and made {result['agent_requests']} requests in all; "
        f"a watch on every slice {result['slice_probe_events']}, on every claim "
        f"{result['probe_events_per_s']:.1f}/s; agent RSS {result['agent_rss_mean_mib']:.1f} MiB"
    )
    return result


def _bind_seconds(kube: Client) -> list[float]:
    stamps: list[float] = []
    for pod in kube.list(Pod, namespace=NAMESPACE):
        conditions = (pod.status.conditions if pod.status else None) or []
        for condition in conditions:
            if condition.type == "PodScheduled" and condition.status == "True":
                assert condition.lastTransitionTime is not None
                stamps.append(condition.lastTransitionTime.timestamp())
    return stamps


def schedule(bench: Bench, arm: Arm, repeat: int) -> dict[str, Any]:
    """`pods` pods of the arm created while the scheduler is stopped, then scheduled from a standing start."""
    handle, kube, work, sizes = bench.handle, bench.kube, bench.work, bench.sizes
    log(f"large: {sizes.pods} pods {arm.what} (run {repeat + 1} of {sizes.repeats}), the scheduler stopped")
    plane = ControlPlane(handle.spec, handle.layout, binaries.bin_dir())
    processes.stop(handle.layout.pids, "kube-scheduler")
    create_pods(handle, NAMESPACE, arm.name.replace("_", "-"), sizes.pods, arm, ASKS)
    measure.wait_quiet()
    log("  scheduler started")
    plane.start_scheduler()
    profile = SchedulerProfile(handle, work / f"scheduler-{arm.name}-{repeat}.pprof", sizes.profile_seconds)
    # the same window once most pods are placed: what a pod costs once the others' claims are allocated
    # (pods without claims are placed in seconds: no second window)
    late = (
        None
        if arm.claim is None
        else SchedulerProfile(
            handle,
            work / f"scheduler-{arm.name}-{repeat}-late.pprof",
            sizes.profile_seconds,
            round(sizes.pods * sizes.late_profile_after),
        )
    )
    controller = ipam_load.controller_figures(work)
    profile.start()
    if late is not None:
        late.start()
    _wait_scheduled(kube, sizes.schedule_timeout)
    binds = sorted(_bind_seconds(kube))
    if len(binds) != sizes.pods:
        raise SystemExit(f"bench-scale: {len(binds)} of {sizes.pods} pods scheduled")
    # PodScheduled's time has whole seconds: the run spans from the first bind's second to the last's end
    span = binds[-1] - binds[0] + 1
    fifth = len(binds) // 5
    result: dict[str, Any] = {
        "pods": sizes.pods,
        "span_s": span,
        "pods_per_s": sizes.pods / span,
        # does the pace fall as pods and claims pile up? (whole seconds: coarse when a fifth is quick)
        "first_fifth_pods_per_s": fifth / (binds[fifth] - binds[0] + 1),
        "last_fifth_pods_per_s": fifth / (binds[-1] - binds[-fifth - 1] + 1),
        "scheduler": scheduler_figures(handle),
        "profile": profile.shares(),
        "profile_late": None if late is None else late.shares(),
        "noop_slices": sum(_noop_slices(kube).values()),  # every node's, or none (arms.py says why)
    }
    if controller is not None:  # what netclaim's controller did meanwhile (it reacts to every claim change)
        after = ipam_load.controller_figures(work)
        assert after is not None
        result["controller"] = {key: after[key] - controller[key] for key in controller}
    if arm.netclaim:
        result["allocation_problems"] = allocation_problems(kube)
    if arm.claim is not None:
        result["allocated"] = sum(
            1 for c in kube.list(ResourceClaim, namespace=NAMESPACE) if c.status and c.status.allocation
        )
    figures = result["scheduler"]
    log(
        f"  {result['pods_per_s']:.1f} pods/s over {span:.0f} s; p99: attempt "
        f"{figures['attempt_p99_s'] * 1000:.0f} ms, algorithm {figures['algorithm_p99_s'] * 1000:.1f} ms; "
        f"attempts {figures['attempts']}"
    )
    if "controller" in result:
        spent = result["controller"]
        log(
            f"  netclaim's controller meanwhile: {spent['passes']:.0f} passes, "
            f"{spent['cpu_s']:.1f} CPU-seconds"
        )
    return result


def _wait_scheduled(kube: Client, timeout: float) -> None:
    """Until no pod of NAMESPACE is unbound; else stop, saying how many were bound and why one was not."""
    deadline = time.monotonic() + timeout
    while _unbound_left(kube, NAMESPACE):
        if time.monotonic() > deadline:
            pods = list(kube.list(Pod, namespace=NAMESPACE))
            unbound = [p for p in pods if p.spec and not p.spec.nodeName]
            reasons = [
                str(c.message)
                for p in unbound[:1]
                for c in ((p.status.conditions if p.status else None) or [])
                if c.type == "PodScheduled"
            ]
            raise SystemExit(
                f"bench-scale: {len(pods) - len(unbound)} of {len(pods)} pods scheduled after "
                f"{timeout:.0f} s; one left: {reasons}"
            )
        time.sleep(1)


def allocation_problems(kube: Client) -> list[str]:
    """What breaks the scheduler's promise: a claim's NIC result without consumed bandwidth and attachments,
    bandwidth consumed below what the claim asked, or a device (a NIC, the pool) whose claims together
    consume more than its slice publishes."""
    capacity: dict[tuple[str, str, str], Decimal] = {}
    for resource_slice in kube.list(ResourceSlice):
        spec = resource_slice.to_dict()["spec"]
        if spec["driver"] != DRIVER_DOMAIN:
            continue
        for device in spec.get("devices") or []:
            for name, value in (device.get("capacity") or {}).items():
                capacity[(spec["pool"]["name"], device["name"], name)] = parse_quantity(value["value"])
    problems: list[str] = []
    used: dict[tuple[str, str, str], Decimal] = {}
    for claim in kube.list(ResourceClaim, namespace=NAMESPACE):
        data = claim.to_dict()
        name = data["metadata"]["name"]
        asked = parse_quantity(
            data["spec"]["devices"]["requests"][0]["exactly"]["capacity"]["requests"][BANDWIDTH]
        )
        allocation = (data.get("status") or {}).get("allocation") or {}
        for result in (allocation.get("devices") or {}).get("results") or []:
            consumed = result.get("consumedCapacity") or {}
            if result["request"] == "nic":
                if BANDWIDTH not in consumed or ATTACHMENTS not in consumed:
                    problems.append(f"{name}: no consumed bandwidth or attachments: {consumed}")
                    continue
                if parse_quantity(consumed[BANDWIDTH]) < asked:
                    problems.append(f"{name}: consumes {consumed[BANDWIDTH]} of bandwidth, asked {asked}")
            for capacity_name, value in consumed.items():
                key = (result["pool"], result["device"], capacity_name)
                used[key] = used.get(key, Decimal(0)) + parse_quantity(value)
    for key in sorted(used):
        if used[key] > capacity.get(key, Decimal(0)):
            pool, device, what = key
            problems.append(f"{pool}/{device}: {what} {used[key]} allocated of {capacity.get(key, 0)}")
    return problems


# --- the run -------------------------------------------------------------------------------------------
def _published(kube: Client) -> dict[str, tuple[int, int]]:
    """netclaim's (slices, devices) per node."""
    found: dict[str, tuple[int, int]] = {}
    for resource_slice in kube.list(ResourceSlice):
        node = resource_slice.spec.nodeName
        if resource_slice.spec.driver == DRIVER_DOMAIN and node:
            slices, devices = found.get(node, (0, 0))
            found[node] = (slices + 1, devices + len(resource_slice.spec.devices or []))
    return found


def grow(bench: Bench, nodes: Nodes, total: int) -> dict[str, Any]:
    """Nodes up to `total`, their slices published; checks each has one slice with all of its NICs."""
    handle, kube, work = bench.handle, bench.kube, bench.work
    present = len(MEASURED) + len(nodes.names)
    added = [node_name(i) for i in range(present + 1, total + 1)]
    log(f"grow: {len(added)} nodes ({present} -> {total}), their slices by netclaim's publish code")
    nodes.add(added)
    bench.others.extend(added)
    seconds = asyncio.run(_publish_nodes(handle.kubeconfig, work, added))
    wait_for(lambda: _ready_nodes(kube) == total, 180, f"{total} nodes Ready")
    published = _published(kube)
    expected = {node: (1, nic_count(node)) for node in [*MEASURED, *nodes.names]}
    if published != expected:
        wrong = sorted(n for n in expected if published.get(n) != expected[n])
        raise SystemExit(f"bench-scale: nodes without one slice of all their NICs: {wrong[:10]}")
    devices = sum(d for _, d in published.values())
    log(f"  published {len(added)} nodes in {seconds:.2f} s; {devices} NICs in the cluster")
    return {"nodes": total, "added": len(added), "publish_s": seconds, "devices": devices}


def _noop_slices(kube: Client) -> dict[str, int]:
    """How many of the no-op driver's slices are published, by the kind of devices they hold."""
    kinds: dict[str, int] = {}
    for found in kube.list(ResourceSlice, fields={"spec.driver": arms.NOOP_DRIVER}):
        shared = any(device.allowMultipleAllocations for device in found.spec.devices or [])
        kind = "shared_nics" if shared else "gpus"
        kinds[kind] = kinds.get(kind, 0) + 1
    return kinds


def noop_driver(bench: Bench, devices: arms.NoopDevices | None) -> None:
    """The no-op driver's class and every node's slice of these devices (what its kubelet plugins would
    publish), or no slice of it; waits until the API server lists what was asked."""
    nodes = [*MEASURED, *bench.others]
    wanted = {devices: len(nodes)} if devices else {}
    present = _noop_slices(bench.kube)
    if present == wanted:
        return
    if present:
        for node in nodes:
            bench.kube.delete(ResourceSlice, arms.noop_slice(node)["metadata"]["name"])
        log(f"  the no-op driver's {sum(present.values())} slices deleted")
        wait_for(lambda: not _noop_slices(bench.kube), 120, "no slice of the no-op driver")
    if devices:
        classes = {c.metadata.name for c in bench.kube.list(DeviceClass) if c.metadata}
        shared = devices == "shared_nics"
        bodies = [arms.noop_slice(node, nic_count(node) if shared else 0) for node in nodes]
        if arms.NOOP_DRIVER not in classes:
            bodies.append(arms.noop_device_class())
        asyncio.run(bulk.create_all(bench.handle.kubeconfig, bodies))
        what = "2-8 shared NIC-like devices" if shared else f"{arms.NOOP_DEVICES_PER_NODE} devices"
        log(f"  the no-op driver's {len(nodes)} slices ({what} each)")
    wait_for(lambda: _noop_slices(bench.kube) == wanted, 120, f"the no-op driver's slices: {wanted}")


def _pool_published(kube: Client) -> bool:
    return any(
        s.spec.driver == DRIVER_DOMAIN and not s.spec.nodeName and s.spec.devices
        for s in kube.list(ResourceSlice)
    )


def arms_of_repeat(sizes: Sizes, repeat: int) -> list[Arm]:
    """The arms run in `repeat` (from 0), in order."""
    return [
        arm
        for arm in arms.ARMS
        if (arm.name in sizes.only if sizes.only else True) and (repeat == 0 or not arm.once)
    ]


def arm_runs(bench: Bench) -> dict[str, list[dict[str, Any]]]:
    """The arms in turn, `repeats` times; the last arm's pods and claims are left in place. netclaim's
    controller runs from the first pool arm on (its pool device published), as long as the benchmark."""
    handle, kube, work, sizes = bench.handle, bench.kube, bench.work, bench.sizes
    runs: dict[str, list[dict[str, Any]]] = {arm.name: [] for arm in arms_of_repeat(sizes, 0)}
    for repeat in range(sizes.repeats):
        for arm in arms_of_repeat(sizes, repeat):
            if arm is arms.NIC_AND_POOL and processes.recorded(work, ipam_load.CONTROLLER) is None:
                asyncio.run(bulk.create_all(handle.kubeconfig, [arms.ip_pool()]))
                ipam_load.start_controller(handle, work)
                wait_for(lambda: _pool_published(kube), 120, "the pool's device published by the controller")
            noop_driver(bench, arm.noop_devices)
            run = schedule(bench, arm, repeat)
            if arm is arms.NIC_AND_POOL:
                run["ipam"] = ipam_load.take_addresses(handle, kube, work, NAMESPACE)
            runs[arm.name].append(run)
            bench.partial.write_text(json.dumps(runs, indent=1) + "\n")
            if arm is arms.ARMS[-1] and repeat == sizes.repeats - 1 and not sizes.only:
                break
            deleted = time.monotonic()
            delete_all(kube, NAMESPACE)
            if arm is arms.NIC_AND_POOL:
                run["ipam"]["claims_deleted_s"] = time.monotonic() - deleted
                run["ipam"].update(ipam_load.addresses_freed(kube, work, time.monotonic()))
    return runs


def _median(values: list[float]) -> float:
    return float(statistics.median(values))


def arms_summary(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Per arm: pods/s, median and spread over the repeats; the NIC arms' ratios to the others."""
    rates = {name: [float(r["pods_per_s"]) for r in arm_runs] for name, arm_runs in runs.items()}
    summary: dict[str, Any] = {
        name: {
            "pods_per_s_median": _median(values),
            "pods_per_s_min": min(values),
            "pods_per_s_max": max(values),
        }
        for name, values in rates.items()
    }
    for name in (arms.NIC.name, arms.NIC_AND_POOL.name, arms.NIC_BESIDE_GPUS.name):
        for base in (arms.NONE.name, arms.NOOP.name):
            summary[name][f"ratio_vs_{base}"] = (
                summary[name]["pods_per_s_median"] / summary[base]["pods_per_s_median"]
            )
    for name, base in ((arms.NIC.name, arms.NOOP_SHARED.name), (arms.NIC_AND_POOL.name, arms.NIC.name)):
        if base in rates:  # per repeat: the two arms ran minutes apart, under the same conditions
            ratios = [mine / theirs for mine, theirs in zip(rates[name], rates[base], strict=True)]
            summary[name][f"ratios_vs_{base}"] = ratios
            summary[name][f"ratio_vs_{base}"] = _median(ratios)
    ipam = [r["ipam"] for r in runs[arms.NIC_AND_POOL.name]]
    summary["ipam_alloc_p99_ms_median"] = _median([float(i["alloc_p99_ms"]) for i in ipam])
    summary["ipam_alloc32_p99_ms_median"] = _median([float(i["bulk_p99_ms"]) for i in ipam])
    return summary


def start_agents(handle: ClusterHandle, work: Path) -> None:
    for node in MEASURED:
        agents.start_virtual_agent(
            handle, node, work, nic_count(node), server=agents_server(handle), kubelet_plugin=True
        )
    with Client(KubeConfig.from_file(handle.kubeconfig)) as kube:
        wait_for(lambda: set(MEASURED) <= set(_published(kube)), 120, "the measured agents' slices")


def scale_line(result: dict[str, Any]) -> str:
    large = result["large"]
    claims, window, summary = large["runs"][arms.NIC.name][-1], large["churn"], large["summary"]
    nic = summary[arms.NIC.name]
    fields = {
        "nodes": str(result["sizes"]["nodes"]),
        "claims": str(claims["allocated"]),
        "publish_s": f"{result['publish_s']:.2f}",
        "sched_pods_per_s": f"{nic['pods_per_s_median']:.1f}",
        "sched_p99_s": f"{claims['scheduler']['attempt_p99_s']:.3f}",
        "agent_events_per_s": f"{window['agent_events_per_s']:.3f}",
        "agent_rss_mib": f"{window['agent_rss_mean_mib']:.1f}",
        "dense_claims": str(result["dense"]["claims"]),
        "dense_agent_anon_mib": f"{result['dense']['memory_mib']['prepared']['anon']:.1f}",
        "dense_agent_pss_mib": f"{result['dense']['memory_mib']['prepared']['pss']:.1f}",
        "sched_ratio_vs_dra": f"{nic['ratio_vs_dra']:.2f}",
        "sched_ratio_vs_none": f"{nic['ratio_vs_none']:.2f}",
        "ipam_alloc_p99_ms": f"{summary['ipam_alloc_p99_ms_median']:.0f}",
        "sched_ratio_vs_dra_shared": f"{nic['ratio_vs_dra_shared']:.2f}",
        "sched_ratio_pool_vs_nic": f"{summary[arms.NIC_AND_POOL.name]['ratio_vs_netclaim']:.2f}",
        "ipam_alloc32_p99_ms": f"{summary['ipam_alloc32_p99_ms_median']:.0f}",
    }
    return "SCALE " + " ".join(f"{k}={v}" for k, v in fields.items())


def run(handle: ClusterHandle, sizes: Sizes, work: Path, partial: Path) -> dict[str, Any]:
    agents.apply_manifests(handle)
    internal = open_watches(handle)  # before any agent or probe: the API server's own
    start_agents(handle, work)
    result: dict[str, Any] = {"when": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")}
    result["sizes"] = dataclasses.asdict(sizes)
    config = KubeConfig.from_file(handle.kubeconfig)
    # deleting 5,000 pods is one request the API server answers when it is done
    with Client(config, field_manager="netclaim-bench", timeout=httpx2.Timeout(300.0)) as kube:
        for namespace in (NAMESPACE, CHURN_NAMESPACE):
            try:
                kube.create(Namespace(metadata={"name": namespace}))  # type: ignore[arg-type]
            except ApiError as err:
                if err.status.code != 409:
                    raise
        bench = Bench(handle, kube, work, sizes, internal, [], partial)
        nodes = Nodes(kube)
        try:
            result["slices_match_agents"] = slices_match_agents(kube, work)
            if not sizes.only:  # the churn windows
                result["small"] = {"nodes": len(MEASURED), "churn": churn(bench, "small")}
                result["mid"] = grow(bench, nodes, sizes.mid_nodes)
                result["mid"]["churn"] = churn(bench, "mid")
            result["large"] = grow(bench, nodes, sizes.nodes)
            result["large"]["runs"] = arm_runs(bench)
            if sizes.only:
                return result
            result["large"]["churn"] = churn(bench, "large")
            delete_all(kube, NAMESPACE)
            result["dense"] = dense.run(
                handle, kube, work, sizes.dense_claims, lambda node: nodes.add([node]), agents_server(handle)
            )
        finally:
            nodes.stop()
            processes.stop(work, ipam_load.CONTROLLER)
    result["publish_s"] = result["mid"]["publish_s"] + result["large"]["publish_s"]
    result["large"]["summary"] = arms_summary(result["large"]["runs"])
    return result


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="make bench-scale", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes: make test's run")
    parser.add_argument("--out", type=Path, default=REPO_ROOT, help="where bench/ and docs/ are")
    parser.add_argument("--repeats", type=int, help="runs of the scheduling arms (default: 3, --quick 1)")
    parser.add_argument(
        "--only",
        help=f"these arms alone, comma-separated ({', '.join(a.name for a in arms.ARMS)}): their runs are "
        "written to bench/scale-only.json, README and bench/scale.json are left alone",
    )
    args = parser.parse_args(argv)
    sizes = QUICK if args.quick else FULL
    if args.quick:
        measure.skip_quiet_waits()
    if args.repeats is not None:
        sizes = dataclasses.replace(sizes, repeats=args.repeats)
    if args.only:
        chosen, names = tuple(args.only.split(",")), [a.name for a in arms.ARMS]
        unknown = sorted(set(chosen) - set(names))
        if unknown:  # else nothing would run, and the run would still write its file
            parser.error(f"--only: no arm {', '.join(unknown)} (arms: {', '.join(names)})")
        sizes = dataclasses.replace(sizes, only=chosen)
    processes.exit_on_sigterm()
    started = time.monotonic()
    partial = args.out / "bench" / "scale-partial.json"  # the arms' runs so far (git ignores it)
    partial.parent.mkdir(exist_ok=True)
    handle = cluster.up(HERE / "scale-cluster.yaml")
    keep = os.environ.get("NETCLAIM_KEEP_CLUSTER") == "1"
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        try:
            result = run(handle, sizes, work, partial)
        finally:
            for node in MEASURED:
                processes.stop(work, f"{node}-agent")
            if not keep:
                cluster.down(handle.spec.name)
    result["machine"] = report.machine()
    result["seconds"] = time.monotonic() - started
    partial.unlink(missing_ok=True)  # all of it is in the result
    if sizes.only:
        only = args.out / "bench" / "scale-only.json"
        only.write_text(json.dumps(result, indent=1) + "\n")
        log(f"wrote {only} in {result['seconds'] / 60:.1f} min")
        return 0
    result["scale_line"] = scale_line(result)
    out = args.out / "bench" / "scale.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    report.render_scale(result, args.out)
    log(f"wrote {out} and docs/scale.md's table in {result['seconds'] / 60:.1f} min")
    print(result["scale_line"])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

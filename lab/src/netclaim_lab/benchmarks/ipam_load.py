"""`make bench-scale`'s IPAM figures at 5,000 claims: netclaim's controller (the real process, beside the
cluster as the measured agents are) publishing the pool, and the addresses of every allocated pool claim
taken as agents take them at NodePrepareResources (netclaim.core.ipam.addresses.AddressBook, the agents' own
code, on each claim's node), many at once; then the controller's status pass over 5,000 IPAllocations, its
CPU and RSS, and how long it takes to free the addresses of 5,000 deleted claims."""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from lightkube import Client
from lightkube.resources.core_v1 import Pod
from prometheus_client.parser import text_string_to_metric_families

from netclaim.adapters.kube.addresses import IPAllocationResource, IPPoolResource, KubeAddresses
from netclaim.adapters.kube.claims import KubeClaims
from netclaim.adapters.kube.connection import KubeConnection
from netclaim.core.ipam.addresses import AddressBook
from netclaim.core.names import DRIVER_DOMAIN
from netclaim.core.plan import address_requests
from netclaim_lab import processes
from netclaim_lab.benchmarks import measure
from netclaim_lab.benchmarks.arms import POOL
from netclaim_lab.benchmarks.suite import log, wait_for
from netclaim_lab.cluster import ClusterHandle

CONTROLLER = "controller"
ALLOCATORS = 32  # prepares taking addresses at once across the cluster
METRICS_PORT = 29178
# the last claims, one at a time: the latency of one prepare in a pool 15 % full (POOL_SUBNET), n enough
# for its p99 to be a quantile of ten samples above it
ALONE = 1000


def start_controller(handle: ClusterHandle, work: Path) -> int:
    """`netclaim controller` with the admin's kubeconfig; its pid."""
    processes.start(
        CONTROLLER,
        [
            sys.executable,
            "-m",
            "netclaim",
            "controller",
            f"--kubeconfig={handle.kubeconfig}",
            "--namespace=netclaim-system",
            f"--metrics-address=127.0.0.1:{METRICS_PORT}",
        ],
        pid_dir=work,
        log_dir=handle.layout.logs,
    )
    entry = processes.recorded(work, CONTROLLER)
    assert entry is not None
    return entry[0]


def controller_pid(work: Path) -> int:
    entry = processes.recorded(work, CONTROLLER)
    if entry is None or not processes.alive(*entry):
        raise SystemExit(f"bench-scale: netclaim's controller is not running (see its log, {CONTROLLER}.log)")
    return entry[0]


def controller_figures(work: Path) -> dict[str, float] | None:
    """The controller's CPU seconds and reconcile passes so far; None when it is not running."""
    entry = processes.recorded(work, CONTROLLER)
    if entry is None:
        return None
    with urllib.request.urlopen(f"http://127.0.0.1:{METRICS_PORT}/metrics", timeout=10) as response:
        text = response.read().decode()
    passes = sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "netclaim_reconcile_total"
    )
    return {"cpu_s": measure.cpu_seconds(entry[0]), "passes": passes}


def pool_status(kube: Client) -> dict[str, Any]:
    found: Any = kube.get(IPPoolResource, POOL)
    status: dict[str, Any] = found.status or {}
    return status


class _TimedAddresses(KubeAddresses):
    """The agents' adapter, each call's seconds kept in `calls` (method, seconds) while `timing` is set: a
    slow take is then told apart into the API server's answers and the rest."""

    timing = False
    calls: list[tuple[str, float]]

    def __init__(self, kube: KubeConnection) -> None:
        super().__init__(kube)
        self.calls = []

    async def _timed(self, what: str, call: Any) -> Any:
        started = time.monotonic()
        try:
            return await call
        finally:
            if self.timing:
                self.calls.append((what, time.monotonic() - started))

    async def list_ip_allocations(self, **selected: Any) -> Any:
        return await self._timed("list", super().list_ip_allocations(**selected))

    async def held_ip_allocations(self, claim_uid: str, not_older_than: str | None) -> Any:
        return await self._timed("held", super().held_ip_allocations(claim_uid, not_older_than))

    async def get_ippool(self, name: str) -> Any:
        return await self._timed("get_pool", super().get_ippool(name))

    async def create_ip_allocation(self, allocation: Any) -> Any:
        return await self._timed("create", super().create_ip_allocation(allocation))


async def _take_addresses(
    kubeconfig: Path, namespace: str, nodes: dict[str, str], alone: int
) -> tuple[list[float], float, list[float], list[dict[str, float]]]:
    """Each allocated claim of `namespace` takes its address on its pod's node: all but the last `alone`
    ALLOCATORS at once (what the API server and the pool bear), then those one at a time (what one prepare
    waits once the others hold their addresses). The seconds each took: the agent's whole step (the held
    list, the pool read, the create); the bulk's span; and of each one-at-a-time take, its calls' seconds
    by kind."""
    kube = KubeConnection.connect(kubeconfig, DRIVER_DOMAIN)
    api = _TimedAddresses(kube)
    books = {node: AddressBook(api, node) for node in set(nodes.values())}  # each node's agent has one

    async def take(claim: Any) -> float:
        requests = address_requests(claim, DRIVER_DOMAIN)
        if not requests:
            raise SystemExit(f"bench-scale: claim {claim.name} has no pool result")
        started = time.monotonic()
        await books[nodes[claim.name]].allocate(claim, requests)
        return time.monotonic() - started

    def split(seconds: float) -> dict[str, float]:
        parts: dict[str, float] = {"total": seconds}
        for what, spent in api.calls:
            parts[what] = parts.get(what, 0.0) + spent
        parts["other"] = seconds - sum(spent for _, spent in api.calls)
        api.calls.clear()
        return parts

    limit = asyncio.Semaphore(ALLOCATORS)

    async def bounded(claim: Any) -> float:
        async with limit:
            return await take(claim)

    try:
        claims = [c for c in await KubeClaims(kube).list_claims() if c.namespace == namespace and c.allocated]
        started = time.monotonic()
        bulk = list(await asyncio.gather(*(bounded(c) for c in claims[:-alone])))
        span = time.monotonic() - started
        api.timing = True
        single, parts = [], []
        for claim in claims[-alone:]:
            single.append(await take(claim))
            parts.append(split(single[-1]))
    finally:
        await kube.close()
    return bulk, span, single, parts


def _quantiles(seconds: list[float], prefix: str) -> dict[str, float]:
    ordered = sorted(seconds)
    return {
        f"{prefix}_p50_ms": statistics.median(ordered) * 1000,
        f"{prefix}_p99_ms": ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1000,
        f"{prefix}_max_ms": ordered[-1] * 1000,
    }


def take_addresses(handle: ClusterHandle, kube: Client, work: Path, namespace: str) -> dict[str, Any]:
    """With every pool claim of `namespace` allocated: their addresses taken, then the controller's pass."""
    pid = controller_pid(work)
    nodes = {
        str(p.metadata.name): str(p.spec.nodeName)
        for p in kube.list(Pod, namespace=namespace)
        if p.spec and p.metadata
    }
    alone = min(ALONE, len(nodes) // 5)
    cpu_before = measure.cpu_seconds(pid)
    started = time.monotonic()
    bulk, bulk_span, single, parts = asyncio.run(_take_addresses(handle.kubeconfig, namespace, nodes, alone))
    span = time.monotonic() - started
    wanted = len(bulk) + len(single)

    def counted() -> bool:
        held = (pool_status(kube).get("addresses") or {}).get("ipv4", {}).get("held", 0)
        return int(held) == wanted

    wait_for(counted, 300, f"the controller's status counting {wanted} addresses held")
    counted_after = time.monotonic() - started - span
    result: dict[str, Any] = {
        "addresses": wanted,
        "concurrency": ALLOCATORS,
        **_quantiles(bulk, "bulk"),
        "bulk_per_s": len(bulk) / bulk_span,
        "alone": len(single),
        **_quantiles(single, "alloc"),
        "alone_slowest": sorted(parts, key=lambda p: -p["total"])[:5],  # seconds by call: where a tail goes
        "alone_samples": parts,
        "status_counted_after_s": counted_after,
        "controller_cpu_s": measure.cpu_seconds(pid) - cpu_before,
        "controller_rss_mib": measure.rss_mib(pid),
    }
    log(
        f"  {len(bulk)} addresses taken {ALLOCATORS} at once ({result['bulk_per_s']:.0f}/s): p50 "
        f"{result['bulk_p50_ms']:.0f} ms, p99 {result['bulk_p99_ms']:.0f} ms; then {len(single)} one at a "
        f"time: p50 {result['alloc_p50_ms']:.0f} ms, p99 {result['alloc_p99_ms']:.0f} ms; the controller's "
        f"status counted them {counted_after:.1f} s later; its RSS {result['controller_rss_mib']:.1f} MiB"
    )
    for slow in result["alone_slowest"][:2]:
        log(
            "  a slow one-at-a-time take, ms by call: "
            + ", ".join(f"{k} {v * 1000:.0f}" for k, v in slow.items())
        )
    return result


def addresses_freed(kube: Client, work: Path, gone: float) -> dict[str, Any]:
    """Once the pool claims are gone (at monotonic `gone`; kube-controller-manager removes their finalizers
    at its own pace): until the controller freed every address."""
    pid = controller_pid(work)
    wait_for(
        lambda: not any(True for _ in kube.list(IPAllocationResource, chunk_size=1)),
        600,
        "the deleted claims' addresses freed by the controller",
    )
    seconds = time.monotonic() - gone
    log(f"  the controller freed the deleted claims' addresses in {seconds:.1f} s")
    return {"freed_after_s": seconds, "controller_rss_mib": measure.rss_mib(pid)}

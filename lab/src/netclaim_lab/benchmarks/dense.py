"""`make bench-scale`'s dense node: one agent holding 1,000 prepared claims, as no real node here can (the
lab's kubelets stop at 110 pods). A kubelet-less node with 32 NICs of 32 shares, its agent run with its
kubelet plugin; the real scheduler allocates the claims of 1,000 pods pinned to the node, and this module
calls the agent's DRA service over its socket as kubelet would (one claim per call, several pods at once).
The agent's memory is read from /proc before, with every claim prepared, and after every claim unprepared;
its prepare and unprepare times from outside, per call."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from grpclib.client import Channel
from lightkube import Client
from lightkube.core.exceptions import ApiError
from lightkube.resources.core_v1 import Namespace, Pod
from lightkube.resources.resource_v1 import ResourceClaim, ResourceSlice

from netclaim._proto import dra_v1_grpc, dra_v1_pb2
from netclaim.adapters.kubeletplugin import socket_paths
from netclaim.core.names import DRIVER_DOMAIN
from netclaim_lab import agents, processes
from netclaim_lab.benchmarks import arms, bulk, measure
from netclaim_lab.benchmarks.suite import log, wait_for
from netclaim_lab.cluster import ClusterHandle

NODE = "scale-dense"
NAMESPACE = "scale-dense"
NICS = 32  # of 32 shares each (agents.VIRTUAL_POLICY): 1,024 claims fit
ASK = "500M"  # 32 shares of a 25G NIC
KUBELET_CALLS = 8  # pods kubelet prepares at once
CNI_CONFIG = {  # docs/config.md's macvlan on the allocated NIC
    "apiVersion": "netclaim.dev/v1alpha1",
    "kind": "CNIConfig",
    "interfaceName": "net1",
    "config": {
        "cniVersion": "1.0.0",
        "name": "dense",
        "plugins": [{"type": "macvlan", "master": "{{ device.ifName }}", "mode": "bridge"}],
    },
}


def claim_body(name: str) -> dict[str, Any]:
    body = arms.nic_claim(name, NAMESPACE, ASK)
    body["spec"]["devices"]["config"] = [
        {"requests": ["nic"], "opaque": {"driver": DRIVER_DOMAIN, "parameters": CNI_CONFIG}}
    ]
    return body


def memory(pid: int) -> dict[str, float]:
    """MiB: the agent process's RSS, its anonymous part (what no file backs) and its PSS."""
    status = Path(f"/proc/{pid}/status").read_text().splitlines()
    anon = next(int(line.split()[1]) for line in status if line.startswith("RssAnon:"))
    rollup = Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()
    pss = next(int(line.split()[1]) for line in rollup if line.startswith("Pss:"))
    return {"rss": measure.rss_mib(pid), "anon": anon / 1024, "pss": pss / 1024}


def _claim_ref(claim: ResourceClaim) -> Any:
    assert claim.metadata is not None and claim.metadata.uid and claim.metadata.name
    return dra_v1_pb2.Claim(namespace=NAMESPACE, uid=claim.metadata.uid, name=claim.metadata.name)


async def _call_each(socket: Path, claims: list[ResourceClaim], unprepare: bool) -> list[float]:
    """Each claim in its own NodePrepareResources (or Unprepare) call, KUBELET_CALLS at once; the seconds
    each took. A claim the agent answers with an error stops the run, naming it."""
    limit = asyncio.Semaphore(KUBELET_CALLS)
    channel = Channel(path=str(socket))
    stub = dra_v1_grpc.DRAPluginStub(channel)

    async def one(claim: ResourceClaim) -> float:
        ref = _claim_ref(claim)
        async with limit:
            started = time.monotonic()
            answer: Any
            if unprepare:
                answer = await stub.NodeUnprepareResources(
                    dra_v1_pb2.NodeUnprepareResourcesRequest(claims=[ref])
                )
            else:
                answer = await stub.NodePrepareResources(dra_v1_pb2.NodePrepareResourcesRequest(claims=[ref]))
            took = time.monotonic() - started
        error = answer.claims[ref.uid].error
        if error:
            raise SystemExit(f"bench-scale: the dense node's agent refused {ref.name}: {error}")
        return took

    try:
        return list(await asyncio.gather(*(one(c) for c in claims)))
    finally:
        channel.close()


def _allocated(kube: Client) -> list[ResourceClaim]:
    return [c for c in kube.list(ResourceClaim, namespace=NAMESPACE) if c.status and c.status.allocation]


def _published(kube: Client) -> bool:
    return any(
        s.spec.devices
        for s in kube.list(ResourceSlice, fields={"spec.nodeName": NODE})
        if s.spec.driver == DRIVER_DOMAIN
    )


def run(
    handle: ClusterHandle,
    kube: Client,
    work: Path,
    claims: int,
    add_node: Callable[[str], None],
    server: str,
) -> dict[str, Any]:
    log(f"dense: {claims} claims prepared by one agent (a kubelet-less node, {NICS} NICs)")
    with contextlib.suppress(ApiError):  # there from a kept cluster
        kube.create(Namespace(metadata={"name": NAMESPACE}))  # type: ignore[arg-type]
    add_node(NODE)
    name, _ = agents.start_virtual_agent(handle, NODE, work, NICS, server=server, kubelet_plugin=True)
    try:
        entry = processes.recorded(work, name)
        assert entry is not None
        pid = entry[0]
        wait_for(lambda: _published(kube), 120, f"{NODE}'s slices")
        measure.wait_quiet()
        idle = memory(pid)
        names = [f"dense-{i:05d}" for i in range(1, claims + 1)]
        bodies = [claim_body(n) for n in names]
        bodies += [bulk.pod_body(n, NAMESPACE, n, node=NODE) for n in names]
        asyncio.run(bulk.create_all(handle.kubeconfig, bodies))
        wait_for(lambda: len(_allocated(kube)) == claims, 900, f"{claims} claims allocated on {NODE}")
        allocated = _allocated(kube)
        socket = socket_paths(agents.virtual_agent_files(work, NODE) / "kubelet", DRIVER_DOMAIN)[1]
        prepare_s = asyncio.run(_call_each(socket, allocated, unprepare=False))
        measure.wait_quiet()  # the claims' status writes done
        prepared = memory(pid)
        unprepare_s = asyncio.run(_call_each(socket, allocated, unprepare=True))
        measure.wait_quiet()
        unprepared = memory(pid)
    finally:
        processes.stop(work, name)
        kube.deletecollection(Pod, namespace=NAMESPACE, grace_period=0)
        kube.deletecollection(ResourceClaim, namespace=NAMESPACE)
    result: dict[str, Any] = {
        "claims": claims,
        "memory_mib": {"idle": idle, "prepared": prepared, "unprepared": unprepared},
        "prepare_ms": measure.distribution([s * 1000 for s in prepare_s]),
        "unprepare_ms": measure.distribution([s * 1000 for s in unprepare_s]),
    }
    log(
        f"  agent RSS/anon/PSS MiB: idle {idle['rss']:.1f}/{idle['anon']:.1f}/{idle['pss']:.1f}, "
        f"{claims} prepared {prepared['rss']:.1f}/{prepared['anon']:.1f}/{prepared['pss']:.1f}, "
        f"unprepared {unprepared['rss']:.1f}/{unprepared['anon']:.1f}/{unprepared['pss']:.1f}; "
        f"prepare p50 {result['prepare_ms']['p50']:.1f} ms, "
        f"unprepare p50 {result['unprepare_ms']['p50']:.1f} ms"
    )
    return result

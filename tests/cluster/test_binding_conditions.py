"""Pool addresses reserved before the pod binds, on the real scheduler's binding conditions (KEP-5007, on by
default in Kubernetes 1.36 and 1.37; netclaim's --address-reservation=before-binding, opt-in): the pools'
devices carry AddressReserved, the controller takes the address once the scheduler has allocated the claim,
and kubelet's prepare only reads it. (The default path, the address taken at prepare, is
tests/cluster/test_ipam.py's.)"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Iterator

import pytest
from lightkube import Client
from lightkube.core.client import FieldSelector
from lightkube.resources.core_v1 import Event, Pod

from netclaim_lab import agents
from netclaim_lab.benchmarks import measure
from netclaim_lab.cluster import ClusterHandle
from tests.cluster.helpers import apply, kubectl_json, pod_claim_name, running
from tests.cluster.ipam import (
    Allocation,
    allocations,
    ip_pool,
    pod_on,
    pool_template,
)
from tests.kube import wait_for

CONTROLLER_MANAGER = "netclaim.dev-controller"  # the controller's field manager


@pytest.fixture(scope="module")
def pool(cluster: ClusterHandle) -> Iterator[str]:
    """An IPPool, its addresses reserved before binding (the controller run with
    --address-reservation=before-binding for this module, at-prepare again after it)."""
    apply(cluster, "default", ip_pool("reserved", {"subnet": "10.66.0.0/24", "gateway": "10.66.0.1"}))
    wait_for(lambda: _published(cluster), 60, "IPPool reserved published")
    agents.set_address_reservation(cluster, "before-binding")
    try:
        yield "reserved"
    finally:
        agents.set_address_reservation(cluster, "at-prepare")
        cluster.kubectl("delete", "ippool", "reserved", "--ignore-not-found")


def _published(cluster: ClusterHandle) -> bool:
    slices = kubectl_json(cluster, "get", "resourceslices")["items"]
    return any(d["name"] == "reserved" for s in slices for d in s["spec"].get("devices") or [])


def _held(cluster: ClusterHandle, ns: str, pool: str) -> list[Allocation]:
    """The pool's IPAllocations of this test's claims (an earlier test's may be in their quarantine)."""
    return [a for a in allocations(cluster, pool) if a.claim.startswith(f"{ns}/")]


def _time(stamp: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00"))


def _events(kube: Client, ns: str, pod: str, reason: str) -> list[Event]:
    selector: FieldSelector = {"involvedObject.name": pod, "reason": reason}
    return list(kube.list(Event, namespace=ns, fields=selector))


def _pool_entry(cluster: ClusterHandle, ns: str, claim: str) -> dict[str, object]:
    found = kubectl_json(cluster, "get", "resourceclaim", "-n", ns, claim)
    [entry] = [d for d in found["status"]["devices"] if d["pool"] == "netclaim.dev/ip-pools"]
    return dict(entry)


def test_a_pool_pod_binds_once_its_address_is_reserved_and_its_prepare_writes_nothing(
    cluster: ClusterHandle, kube: Client, ns: str, pool: str, figures: Callable[[str], None]
) -> None:
    assert agents.pools_reserve_before_binding(cluster), "the pools' devices carry binding conditions"
    offset = cluster.layout.audit_log.stat().st_size
    apply(cluster, ns, pool_template("t", pool), pod_on("a", "t", "node-2"))
    wait_for(lambda: len(running(kube, ns)) == 1, 120, "pod a running")

    claim = pod_claim_name(kube, ns, "a")
    [held] = _held(cluster, ns, pool)
    assert (held.claim, held.node) == (f"{ns}/{claim}", "node-2")
    record = kubectl_json(cluster, "get", "ipallocation", held.name, "--show-managed-fields")["metadata"]
    assert {m["manager"] for m in record["managedFields"]} == {CONTROLLER_MANAGER}, record["managedFields"]
    # the scheduler waited on the condition, and bound the pod after the address was taken
    assert _events(kube, ns, "a", "BindingConditionsPending"), "the scheduler did not wait"
    pod = kube.get(Pod, "a", namespace=ns)
    assert pod.status is not None and pod.status.conditions is not None
    [scheduled] = [c for c in pod.status.conditions if c.type == "PodScheduled"]
    bound_at = scheduled.lastTransitionTime
    created = _time(record["creationTimestamp"])
    assert bound_at is not None and created <= bound_at, (created, bound_at)
    entry = _pool_entry(cluster, ns, claim)
    conditions = {c["type"]: c["status"] for c in entry["conditions"]}  # type: ignore[attr-defined]
    assert conditions == {"Ready": "True", "AddressReserved": "True"}, entry
    assert entry["networkData"]["ips"] == [held.address]  # type: ignore[index]
    shown = cluster.kubectl("exec", "-n", ns, "a", "--", "ip", "-o", "addr", "show", "net1")
    assert f"inet {held.address} " in shown, shown

    # the agent of node-2 took nothing: no IPAllocation write, and of the claim it wrote only the status
    made = [r for r in measure.agent_requests(cluster.layout.audit_log, offset) if r.node == "node-2"]
    writes = [r for r in made if r.verb in ("create", "update", "patch", "delete")]
    concerning = [(r.verb, r.resource) for r in writes if r.resource == "ipallocations" or r.name == claim]
    assert any(r.verb == "get" and r.resource == "resourceclaims" and r.name == claim for r in made)
    assert concerning and set(concerning) == {("patch", "resourceclaims/status")}, concerning
    reads = sorted({f"{r.verb} {r.resource}" for r in made if r.resource in ("ipallocations", "ippools")})
    figures(
        f"binding conditions: address reserved {(bound_at - created).total_seconds():.0f} s before the pod "
        f"bound; node-2's agent: 0 IPAllocation writes, {len(concerning)} status write(s) of the claim "
        f"(after the attach), address reads: {', '.join(reads)}"
    )


def test_a_reservation_that_fails_keeps_the_pod_pending_until_the_address_is_free(
    cluster: ClusterHandle, kube: Client, ns: str, pool: str
) -> None:
    apply(
        cluster,
        ns,
        pool_template("fifty", pool, static=["10.66.0.50"]),
        pool_template("fifty-again", pool, static=["10.66.0.50"]),
        pod_on("a", "fifty", "node-1"),
    )
    wait_for(lambda: len(running(kube, ns)) == 1, 120, "pod a running")
    [holder] = _held(cluster, ns, pool)
    apply(cluster, ns, pod_on("b", "fifty-again", "node-2"))

    wait_for(lambda: bool(_events(kube, ns, "b", "IPPoolReservationFailed")), 120, "b's reservation refused")
    told = str(_events(kube, ns, "b", "IPPoolReservationFailed")[0].message)
    assert f"address 10.66.0.50 of IPPool {pool} is held by claim {holder.claim}" in told, told
    b = kube.get(Pod, "b", namespace=ns)
    assert b.spec is not None and b.spec.nodeName is None, "b was bound without its address"
    assert b.status is not None and b.status.phase == "Pending"
    assert not _events(kube, ns, "b", "NetclaimPrepareFailed"), "b reached a node"
    assert [a.claim for a in _held(cluster, ns, pool)] == [holder.claim], "b's failure took an address"

    cluster.kubectl("delete", "pod", "-n", ns, "a", "--wait=false")
    wait_for(lambda: "b" in {p.metadata.name for p in running(kube, ns) if p.metadata}, 240, "b running")
    [taken] = _held(cluster, ns, pool)
    assert taken.address.startswith("10.66.0.50/") and taken.claim != holder.claim

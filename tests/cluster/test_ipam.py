"""Cluster-wide IPAM against the real cluster: addresses owned by claims, pools as schedulable capacity,
static and dual-stack addresses, and no address lost or leaked through crashes, node loss or lost state.

Every node keeps its own host-local directory (tests/cluster/cluster.yaml); the pools here span the three
nodes with an ipn0 NIC on segment lan3."""

from __future__ import annotations

import ipaddress
import re
import time
from collections.abc import Callable, Iterator

import pytest
from lightkube import Client
from lightkube.core.client import FieldSelector
from lightkube.resources.core_v1 import Event, Pod

from netclaim_lab import agents
from netclaim_lab.cluster import ClusterHandle
from tests.cluster.helpers import apply, kubectl_json, name_of, network_status, ping, running
from tests.cluster.ipam import (
    IPAM_NODES,
    allocation_ms,
    allocations,
    claim_uids,
    ip_pool,
    leak_report,
    lose_node,
    percentiles,
    pod_addresses,
    pod_on,
    pool_template,
    restore_node,
    spread,
)
from tests.kube import wait_for


@pytest.fixture
def pools(cluster: ClusterHandle) -> Iterator[list[str]]:
    """Names of the IPPools a test creates; deleted after it (their addresses are released by then)."""
    created: list[str] = []
    yield created
    for name in created:
        cluster.kubectl("delete", "ippool", name, "--ignore-not-found")


def _create_pool(cluster: ClusterHandle, pools: list[str], manifest: dict[str, object]) -> None:
    apply(cluster, "default", manifest)
    pools.append(str(manifest["metadata"]["name"]))  # type: ignore[index]


def _ips_in_pod(cluster: ClusterHandle, namespace: str, pod: str) -> set[str]:
    shown = cluster.kubectl("exec", "-n", namespace, pod, "--", "ip", "-o", "addr", "show", "net1")
    return {a for a in re.findall(r"inet6? (\S+)", shown) if not a.startswith("fe80:")}


def _pods_on(kube: Client, namespace: str) -> dict[str, str]:
    return {name_of(p): str(p.spec.nodeName) for p in kube.list(Pod, namespace=namespace) if p.spec}


def _all_running(kube: Client, namespace: str, count: int) -> bool:
    return len(running(kube, namespace)) == count


def test_sixty_pods_at_once_from_one_pool_get_sixty_distinct_addresses(
    cluster: ClusterHandle, kube: Client, ns: str, pools: list[str], figures: Callable[[str], None]
) -> None:
    _create_pool(cluster, pools, ip_pool("sixty", {"subnet": "10.60.0.0/24", "gateway": "10.60.0.1"}))
    apply(cluster, ns, pool_template("t", "sixty"), *spread("p", "t", 60))
    wait_for(lambda: _all_running(kube, ns, 60), 420, "60 pods running")
    wait_for(lambda: len(pod_addresses(cluster, ns)) == 60, 60, "60 claims showing their address")

    shown = pod_addresses(cluster, ns)
    addresses = [a for ips in shown.values() for a in ips]
    held = allocations(cluster, "sixty")
    assert len(addresses) == 60 and len(set(addresses)) == 60, f"duplicates among {sorted(addresses)}"
    assert sorted(a.address for a in held) == sorted(addresses), "status and IPAllocations differ"
    nodes = _pods_on(kube, ns)
    assert set(nodes.values()) == set(IPAM_NODES)
    first_on = {node: pod for pod, node in sorted(nodes.items(), reverse=True)}
    for pod in first_on.values():  # what the status says is what the pod has
        assert _ips_in_pod(cluster, ns, pod) == set(shown[pod])
    source = first_on["node-1"]
    for node in ("node-2", "node-4"):
        ping(cluster, ns, source, str(ipaddress.ip_interface(shown[first_on[node]][0]).ip))

    times = allocation_ms(cluster, ns)
    assert len(times) == 60, f"{len(times)} allocations logged for 60 claims"
    p50, p99 = percentiles(times)
    figures(
        f"\n60 claims, 3 nodes, one pool: 60 distinct addresses; allocation p50 {p50:.1f} ms p99 {p99:.1f} ms"
    )

    cluster.kubectl("delete", "pods", "--all", "-n", ns, "--wait=false")
    wait_for(lambda: not allocations(cluster, "sixty"), 240, "every address back in the pool")


def test_a_full_pool_keeps_pods_pending_and_a_release_lets_exactly_one_run(
    cluster: ClusterHandle, kube: Client, ns: str, pools: list[str]
) -> None:
    """A /29 hands out 6 addresses: 6 of 8 pods run, 2 stay Pending (the scheduler's own verdict, and an
    Event naming the pool); one deleted, exactly one more runs."""
    _create_pool(cluster, pools, ip_pool("tiny", {"subnet": "10.61.0.0/29"}))
    apply(cluster, ns, pool_template("t", "tiny"), *spread("p", "t", 8))
    wait_for(lambda: _all_running(kube, ns, 6), 240, "6 pods running")

    def pending() -> list[Pod]:
        return [p for p in kube.list(Pod, namespace=ns) if p.status and p.status.phase == "Pending"]

    def unschedulable(pod: Pod) -> str:
        conditions = pod.status.conditions if pod.status else None
        found = [c for c in conditions or [] if c.type == "PodScheduled" and c.reason == "Unschedulable"]
        return str(found[0].message) if found else ""

    wait_for(lambda: len(pending()) == 2 and all(unschedulable(p) for p in pending()), 60, "2 pods Pending")
    for pod in pending():
        assert "cannot allocate all claims" in unschedulable(pod), unschedulable(pod)

        def warned(name: str = name_of(pod)) -> list[Event]:
            selector: FieldSelector = {"involvedObject.name": name, "reason": "IPPoolExhausted"}
            return list(kube.list(Event, namespace=ns, fields=selector))

        wait_for(lambda: bool(warned()), 60, f"an IPPoolExhausted event on {name_of(pod)}")
        message = str(warned()[0].message)
        assert "IPPool tiny has no free address: 6 of 6 (netclaim.dev/addresses)" in message, message
    status = kubectl_json(cluster, "get", "ippool", "tiny")["status"]
    assert (status["capacity"], status["free"]) == (6, 0), status
    assert len(allocations(cluster, "tiny")) == 6

    victim = name_of(running(kube, ns)[0])
    kube.delete(Pod, victim, namespace=ns, grace_period=0)
    wait_for(lambda: _all_running(kube, ns, 6) and len(pending()) == 1, 180, "one Pending pod running")
    time.sleep(5)  # and no second one: the pool is full again
    assert len(running(kube, ns)) == 6 and len(pending()) == 1
    addresses = [a.address for a in allocations(cluster, "tiny")]
    assert len(addresses) == 6 == len(set(addresses))


def test_a_static_address_is_granted_when_free_and_refused_naming_its_holder(
    cluster: ClusterHandle, kube: Client, ns: str, pools: list[str]
) -> None:
    _create_pool(cluster, pools, ip_pool("fixed", {"subnet": "10.62.0.0/24"}))
    apply(
        cluster,
        ns,
        pool_template("fifty", "fixed", static=["10.62.0.50"]),
        pool_template("fifty-again", "fixed", static=["10.62.0.50"]),
        pod_on("a", "fifty", "node-1"),
    )
    wait_for(lambda: _all_running(kube, ns, 1), 120, "pod a running")
    assert _ips_in_pod(cluster, ns, "a") == {"10.62.0.50/24"}
    holder = allocations(cluster, "fixed")[0]

    apply(cluster, ns, pod_on("b", "fifty-again", "node-2"))
    # reserved before binding (--address-reservation), b is refused before it has a node; else at prepare
    before_binding = agents.pools_reserve_before_binding(cluster)
    reason = "IPPoolReservationFailed" if before_binding else "NetclaimPrepareFailed"

    def refusal() -> str:
        selector: FieldSelector = {"involvedObject.name": "b", "reason": reason}
        events = list(kube.list(Event, namespace=ns, fields=selector))
        return str(events[0].message) if events else ""

    wait_for(lambda: bool(refusal()), 120, f"pod b refused ({reason})")
    assert f"address 10.62.0.50 of IPPool fixed is held by claim {holder.claim}" in refusal(), refusal()
    assert [a.claim for a in allocations(cluster, "fixed")] == [holder.claim], "b's failure left an address"
    assert not running(kube, ns, "fifty-again")
    b = kube.get(Pod, "b", namespace=ns)
    assert (b.spec is not None and b.spec.nodeName is None) is before_binding, "bound with no address"


def test_dual_stack_addresses_reach_the_pod_and_ping_over_both_families(
    cluster: ClusterHandle, kube: Client, ns: str, pools: list[str]
) -> None:
    _create_pool(
        cluster,
        pools,
        ip_pool("dual", {"subnet": "10.63.0.0/24", "gateway": "10.63.0.1"}, {"subnet": "fd00:63::/64"}),
    )
    apply(
        cluster, ns, pool_template("t", "dual"), pod_on("left", "t", "node-1"), pod_on("right", "t", "node-2")
    )
    wait_for(lambda: _all_running(kube, ns, 2), 120, "both pods running")
    shown = pod_addresses(cluster, ns)
    for pod in ("left", "right"):
        families = sorted(ipaddress.ip_interface(a).version for a in shown[pod])
        assert families == [4, 6], shown
        assert _ips_in_pod(cluster, ns, pod) == set(shown[pod])
        nic = [
            d
            for c in kubectl_json(cluster, "get", "resourceclaims", "-n", ns)["items"]
            for d in c["status"].get("devices", [])
            if d["pool"] in IPAM_NODES and c["metadata"]["name"].startswith(pod)
        ]
        assert set(nic[0]["networkData"]["ips"]) == set(shown[pod]), nic
        # the Multus annotation (on in the test cluster) has both families too
        annotated = {ip for e in network_status(kube, ns, pod) for ip in e["ips"]}
        assert annotated == {str(ipaddress.ip_interface(a).ip) for a in shown[pod]}, annotated

    def both_families_held() -> bool:  # the controller's next pass counts them
        held = kubectl_json(cluster, "get", "ippool", "dual")["status"].get("addresses", {})
        return bool(held.get("ipv4", {}).get("held") == 2 and held.get("ipv6", {}).get("held") == 2)

    wait_for(both_families_held, 45, "the pool's status holding 2 addresses of each family")
    x4, x6 = (str(ipaddress.ip_interface(a).ip) for a in sorted(shown["left"], key=lambda a: ":" in a))
    y4, y6 = (str(ipaddress.ip_interface(a).ip) for a in sorted(shown["right"], key=lambda a: ":" in a))
    ping(cluster, ns, "right", x4)

    def ping6(pod: str, address: str) -> bool:  # DAD keeps a fresh IPv6 address tentative for a moment
        args = ("exec", "-n", ns, pod, "--", "ping", "-6", "-c", "2", "-W", "3", "-I", "net1", address)
        return " 0% packet loss" in cluster.kubectl(*args, check=False, timeout=30)

    wait_for(lambda: ping6("left", y6), 30, "left pings right over IPv6")
    wait_for(lambda: ping6("right", x6), 30, "right pings left over IPv6")
    assert x4 != y4


def _leak_line(
    scenario: str, cluster: ClusterHandle, ns: str, pool: str, figures: Callable[[str], None]
) -> None:
    report = leak_report(cluster, ns, pool)
    figures(f"\n{scenario}: {report.line()}")
    assert (report.leaked, report.duplicates, report.lost) == (0, 0, 0), report


def test_an_agent_killed_while_allocating_neither_leaks_nor_duplicates(
    cluster: ClusterHandle, kube: Client, ns: str, pools: list[str], figures: Callable[[str], None]
) -> None:
    """SIGKILL right after the IPAllocation is created, before the claim is recorded: kubelet asks again,
    the restarted agent finds the address by the claim's UID and keeps it."""
    _create_pool(cluster, pools, ip_pool("crash", {"subnet": "10.64.0.0/24"}))
    agents.restart_agent(cluster, "node-2", faults="after-address")
    try:
        apply(cluster, ns, pool_template("t", "crash"), pod_on("k", "t", "node-2"))
        wait_for(lambda: agents.restarts(cluster, "node-2") > 0, 120, "the agent killed at after-address")
        taken = allocations(cluster, "crash")
        assert len(taken) == 1, taken
    finally:
        agents.restart_agent(cluster, "node-2")
    wait_for(lambda: _all_running(kube, ns, 1), 120, "the pod running after the restart")
    assert allocations(cluster, "crash") == taken, "the retried prepare must keep the address"
    assert _ips_in_pod(cluster, ns, "k") == {taken[0].address}
    _leak_line("agent kill -9 during allocation", cluster, ns, "crash", figures)
    kube.delete(Pod, "k", namespace=ns, grace_period=0)
    wait_for(lambda: not allocations(cluster, "crash"), 120, "the address released with the pod")


def test_a_node_lost_for_good_gives_back_its_claims_addresses(
    cluster: ClusterHandle, kube: Client, ns: str, pools: list[str], figures: Callable[[str], None]
) -> None:
    """node-4 dies with its agent and never comes back (its Node is deleted): the pod garbage collector
    deletes its pods, their claims go, and the controller frees their addresses; pods elsewhere keep
    theirs. (node-4 is registered again afterwards for the tests that follow.)"""
    _create_pool(cluster, pools, ip_pool("loss", {"subnet": "10.66.0.0/24"}))
    apply(cluster, ns, pool_template("t", "loss"), *spread("p", "t", 6))
    wait_for(lambda: _all_running(kube, ns, 6), 180, "6 pods running")
    before = {a.claim_uid: a.address for a in allocations(cluster, "loss")}
    on_lost = {pod for pod, node in _pods_on(kube, ns).items() if node == "node-4"}
    assert len(before) == 6 and len(on_lost) == 2
    try:
        lose_node(cluster, kube, "node-4")
        wait_for(
            lambda: not on_lost & set(_pods_on(kube, ns)), 240, "the lost node's pods deleted by the pod GC"
        )
        wait_for(lambda: len(allocations(cluster, "loss")) == 4, 120, "their addresses freed")
        after = {a.claim_uid: a.address for a in allocations(cluster, "loss")}
        assert after.items() <= before.items(), "a surviving claim lost or changed its address"
        assert set(after) <= claim_uids(cluster)
        _leak_line("node lost for good", cluster, ns, "loss", figures)
    finally:
        restore_node(cluster, kube, "node-4")


def test_a_wiped_state_directory_loses_no_address(
    cluster: ClusterHandle, kube: Client, ns: str, pools: list[str], figures: Callable[[str], None]
) -> None:
    """The agent of node-2 restarts with an empty state directory: pods deleted afterwards still give
    their addresses back (found by claim UID in the API), the others keep theirs."""
    _create_pool(cluster, pools, ip_pool("wipe", {"subnet": "10.67.0.0/24"}))
    apply(cluster, ns, pool_template("t", "wipe"), *(pod_on(f"w{i}", "t", "node-2") for i in range(4)))
    wait_for(lambda: _all_running(kube, ns, 4), 180, "4 pods running")
    before = {a.claim: a.address for a in allocations(cluster, "wipe")}
    agents.stop_agent(cluster, "node-2")
    state = cluster.node("node-2").layout.state_dir
    lost = [p for p in state.iterdir() if p.name.startswith("netclaim.db")]
    assert lost, f"no state in {state}"
    for path in lost:  # the directory itself is the node's hostPath: its content is what a loss takes
        path.unlink()
    agents.start_agent(cluster, "node-2")
    for pod in ("w0", "w1"):
        kube.delete(Pod, pod, namespace=ns, grace_period=0)
    wait_for(lambda: len(allocations(cluster, "wipe")) == 2, 120, "the deleted pods' addresses freed")
    after = {a.claim: a.address for a in allocations(cluster, "wipe")}
    assert after.items() <= before.items() and len(after) == 2
    _leak_line("state directory wiped", cluster, ns, "wipe", figures)


def test_narrowing_a_pool_never_takes_an_address_in_use(
    cluster: ClusterHandle, kube: Client, ns: str, pools: list[str]
) -> None:
    _create_pool(cluster, pools, ip_pool("narrow", {"subnet": "10.65.0.0/24"}))
    apply(cluster, ns, pool_template("t", "narrow"), pod_on("a", "t", "node-1"), pod_on("b", "t", "node-2"))
    wait_for(lambda: _all_running(kube, ns, 2), 120, "both pods running")
    held = sorted(a.address.split("/")[0] for a in allocations(cluster, "narrow"))
    narrowed = ip_pool("narrow", {"subnet": "10.65.0.0/24", "start": "10.65.0.250", "end": "10.65.0.254"})
    apply(cluster, "default", narrowed)
    inside = sum(1 for a in held if int(a.rsplit(".", 1)[1]) >= 250)

    def capacity() -> int:
        return int(kubectl_json(cluster, "get", "ippool", "narrow").get("status", {}).get("capacity", -1))

    # the claims holding addresses keep their unit; the new range's free addresses make the rest
    expected = 2 + (5 - inside)
    wait_for(lambda: capacity() == expected, 60, f"the narrowed pool's capacity {expected}")
    assert sorted(a.address.split("/")[0] for a in allocations(cluster, "narrow")) == held
    assert len(running(kube, ns)) == 2

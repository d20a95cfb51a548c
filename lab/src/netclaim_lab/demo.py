"""The KubeCon demo on the local cluster: guaranteed bandwidth scheduling and a configured net1.

Pod-A asks for 10Gi of an `enp0s10`, Deployment-B for 3 x 5Gi: Pod-A gets one node's NIC to itself, two B
replicas share the other node's, the third waits (Pending, with the scheduler's reason). Every claim also
takes an address from the cluster-wide IPPool demo-net (each node keeps its own host-local directory, so
only cluster IPAM gives pods on different nodes distinct addresses). `ip a` in Pod-A shows the IP and MAC
its claim's status reports, and pods ping each other across nodes over net1.
`run()` prints a report and raises ExpectationError listing every expectation that did not hold.
"""

from __future__ import annotations

import json
import re
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

from netclaim.core.quantity import format_quantity, parse_quantity
from netclaim.errors import NetclaimError
from netclaim_lab.cluster import ClusterHandle
from netclaim_lab.layout import REPO_ROOT

DRIVER = "netclaim.dev"
BANDWIDTH = "netclaim.dev/bandwidth"
POOLS_POOL = "netclaim.dev/ip-pools"  # the DRA pool of the IP pools' devices
POOL = "demo-net"
EXAMPLES = REPO_ROOT / "examples" / "demo"
POLICY = EXAMPLES / "policy.yaml"  # the demo's publish policy: netclaim ships none
NAMESPACE = "netclaim-demo"


class ExpectationError(NetclaimError):
    """What the local demo saw differs from what it expects; the message lists every difference."""


@dataclass
class Outcome:
    pods: list[dict[str, Any]]
    claims: dict[str, dict[str, Any]]
    slices: list[dict[str, Any]]
    pool: dict[str, Any] = field(default_factory=dict)  # the IPPool as the API has it
    allocations: list[dict[str, Any]] = field(default_factory=list)  # its IPAllocations
    problems: list[str] = field(default_factory=list)


def _json(handle: ClusterHandle, *args: str) -> Any:
    return json.loads(handle.kubectl(*args, "-o", "json"))


def _wait(check: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(1)
    return False


def apply(handle: ClusterHandle, b_request: str = "5Gi") -> None:
    """A fresh demo namespace with Pod-A and Deployment-B (B's request can be changed to break the demo)."""
    handle.kubectl("delete", "namespace", NAMESPACE, "--ignore-not-found", "--wait=true", timeout=240)
    handle.kubectl("create", "namespace", NAMESPACE)
    _wait(lambda: bool(handle.kubectl("get", "serviceaccount", "default", "-n", NAMESPACE, check=False)), 60)
    deployment = (
        (EXAMPLES / "deployment-b.yaml").read_text().replace(f"{BANDWIDTH}: 5Gi", f"{BANDWIDTH}: {b_request}")
    )
    handle.kubectl("apply", "-f", str(EXAMPLES / "ippool.yaml"))
    # Pods created before the controller publishes the pool are all unschedulable for a moment, which
    # reads exactly like the demo's one Pending replica: observe() would take that moment as the outcome.
    handle.kubectl("wait", "--for=condition=Ready", f"ippool/{POOL}", "--timeout=120s", timeout=130)
    handle.kubectl("apply", "-n", NAMESPACE, "-f", str(EXAMPLES / "pod-a.yaml"))
    handle.kubectl("apply", "-n", NAMESPACE, "-f", "-", input_text=deployment)


def _pod_ready(pod: dict[str, Any]) -> bool:
    return any(
        c["type"] == "Ready" and c["status"] == "True" for c in pod.get("status", {}).get("conditions", [])
    )


def _scheduler_message(pod: dict[str, Any]) -> str:
    for condition in pod.get("status", {}).get("conditions", []):
        if condition["type"] == "PodScheduled" and condition["status"] == "False":
            return str(condition.get("message", ""))
    return ""


def observe(handle: ClusterHandle, timeout: float = 180) -> Outcome:
    """Wait until the demo settles (every pod Ready or unschedulable), then read everything once."""

    def settled() -> bool:
        pods = _json(handle, "get", "pods", "-n", NAMESPACE)["items"]
        return len(pods) == 4 and all(_pod_ready(p) or _scheduler_message(p) for p in pods)

    _wait(settled, timeout)
    pods = _json(handle, "get", "pods", "-n", NAMESPACE)["items"]
    claims = {
        c["metadata"]["name"]: c for c in _json(handle, "get", "resourceclaims", "-n", NAMESPACE)["items"]
    }
    slices = [s for s in _json(handle, "get", "resourceslices")["items"] if s["spec"]["driver"] == DRIVER]
    pool = _json(handle, "get", "ippool", POOL)
    allocations = [a for a in _json(handle, "get", "ipallocations")["items"] if a["spec"]["pool"] == POOL]
    return Outcome(pods, claims, slices, pool, allocations)


def _claim_of(outcome: Outcome, pod: dict[str, Any]) -> dict[str, Any] | None:
    for status in pod.get("status", {}).get("resourceClaimStatuses", []):
        claim = outcome.claims.get(status.get("resourceClaimName", ""))
        if claim is not None:
            return claim
    return None


def _our_results(claim: dict[str, Any]) -> list[dict[str, Any]]:
    """The claim's NICs (not its address from the pool)."""
    results = claim.get("status", {}).get("allocation", {}).get("devices", {}).get("results", [])
    return [r for r in results if r["driver"] == DRIVER and r["pool"] != POOLS_POOL]


def _network(claim: dict[str, Any]) -> dict[str, Any]:
    """networkData of the claim's NIC entry."""
    for entry in claim.get("status", {}).get("devices") or []:
        if entry["driver"] == DRIVER and entry["pool"] != POOLS_POOL:
            return dict(entry.get("networkData", {}))
    return {}


def nic_table(outcome: Outcome) -> list[tuple[str, str, str, int, int]]:
    """(node, device, ifName, total, used) for every published device with bandwidth."""
    used: dict[tuple[str, str], int] = {}
    for claim in outcome.claims.values():
        for result in _our_results(claim):
            amount = result.get("consumedCapacity", {}).get(BANDWIDTH)
            if amount:
                key = (result["pool"], result["device"])
                used[key] = used.get(key, 0) + int(parse_quantity(amount))
    rows = []
    node_slices = [s for s in outcome.slices if s["spec"].get("nodeName")]
    for item in sorted(node_slices, key=lambda s: s["spec"]["nodeName"]):
        for device in item["spec"].get("devices") or []:  # 1.34 sends an empty pool's as null
            total = device.get("capacity", {}).get(BANDWIDTH, {}).get("value")
            if total:
                node = item["spec"]["nodeName"]
                if_name = device["attributes"].get(f"{DRIVER}/ifName", {}).get("string", "?")
                rows.append(
                    (
                        node,
                        device["name"],
                        if_name,
                        int(parse_quantity(total)),
                        used.get((node, device["name"]), 0),
                    )
                )
    return rows


def _table(rows: Sequence[tuple[str, ...]], out: TextIO) -> None:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print(
            "  " + "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip(),
            file=out,
        )


def check(handle: ClusterHandle, outcome: Outcome, out: TextIO) -> list[str]:
    """Print the report; return the expectations that failed."""
    problems: list[str] = []
    print("\n== NICs and bandwidth (ResourceSlices, claims' consumedCapacity)", file=out)
    nics = nic_table(outcome)
    _table(
        [("NODE", "DEVICE", "NIC", "TOTAL", "USED", "FREE")]
        + [
            (
                node,
                device,
                if_name,
                format_quantity(total),
                format_quantity(used),
                format_quantity(total - used),
            )
            for node, device, if_name, total, used in nics
        ],
        out,
    )
    enp_nodes = sorted({node for node, _, if_name, _, _ in nics if if_name == "enp0s10"})
    if len(enp_nodes) != 2:
        problems.append(f"expected enp0s10 published on two nodes, found {enp_nodes}")

    print("\n== Pods", file=out)
    rows: list[tuple[str, ...]] = [("POD", "NODE", "CLAIM", "DEVICE", "BANDWIDTH", "NET1 IP", "MAC")]
    placement: dict[str, list[str]] = {}
    pending: list[dict[str, Any]] = []
    for pod in sorted(outcome.pods, key=lambda p: p["metadata"]["name"]):
        name, node = pod["metadata"]["name"], pod["spec"].get("nodeName", "")
        claim = _claim_of(outcome, pod)
        results = _our_results(claim) if claim else []
        network = _network(claim) if claim else {}
        if not node:
            pending.append(pod)
        else:
            placement.setdefault(pod["metadata"].get("labels", {}).get("app", ""), []).append(node)
        rows.append(
            (
                name,
                node or "(Pending)",
                claim["metadata"]["name"] if claim else "-",
                results[0]["device"] if results else "-",
                results[0].get("consumedCapacity", {}).get(BANDWIDTH, "-") if results else "-",
                ", ".join(network.get("ips", [])) or "-",
                network.get("hardwareAddress", "-"),
            )
        )
    _table(rows, out)

    a_nodes = placement.get("pod-a", [])
    b_nodes = placement.get("deployment-b", [])
    if len(a_nodes) != 1 or a_nodes[0] not in enp_nodes:
        problems.append(f"expected Pod-A on one of the enp0s10 nodes {enp_nodes}, got {a_nodes}")
    if len(b_nodes) != 2 or len(set(b_nodes)) != 1 or (a_nodes and b_nodes[0] == a_nodes[0]):
        problems.append(
            f"expected two B replicas sharing the other NIC (Pod-A on {a_nodes}), got {sorted(b_nodes)}"
        )
    if "node-3" in a_nodes + b_nodes:
        problems.append("a demo pod landed on node-3, which has no enp0s10")

    print(f"\n== IP pool {POOL} (cluster-wide IPAM: IPPool, its IPAllocations)", file=out)
    status = outcome.pool.get("status", {})
    print(
        f"  capacity {status.get('capacity', '?')} claims, {status.get('allocatedClaims', '?')} allocated, "
        f"{status.get('free', '?')} free",
        file=out,
    )
    _table(
        [("ADDRESS", "CLAIM", "NODE")]
        + [
            (a["spec"]["address"], a["spec"]["claim"]["name"], a["spec"]["node"])
            for a in sorted(outcome.allocations, key=lambda a: str(a["spec"]["address"]))
        ],
        out,
    )
    running_ips = [
        ip
        for pod in outcome.pods
        if pod["spec"].get("nodeName")
        for ip in _network(_claim_of(outcome, pod) or {}).get("ips", [])
    ]
    held = sorted(str(a["spec"]["address"]) for a in outcome.allocations)
    if len(held) != 3 or sorted(running_ips) != held:
        problems.append(
            f"expected the 3 running pods' addresses {sorted(running_ips)} held in IPPool {POOL}, got {held}"
        )

    print("\n== Pending", file=out)
    for pod in pending:
        print(f"  {pod['metadata']['name']}: {_scheduler_message(pod)}", file=out)
    if len(pending) != 1 or "cannot allocate all claims" not in _scheduler_message(pending[0]):
        problems.append(
            f"expected exactly one Pending B replica that the scheduler cannot allocate, "
            f"got {[p['metadata']['name'] for p in pending]}"
        )

    pod_a = next((p for p in outcome.pods if p["metadata"]["name"] == "pod-a"), None)
    claim_a = _claim_of(outcome, pod_a) if pod_a else None
    network = _network(claim_a) if claim_a else {}
    print(
        "\n== Pod-A: `ip a show net1` inside the pod, next to its claim's status.devices[].networkData",
        file=out,
    )
    inside = handle.kubectl("exec", "-n", NAMESPACE, "pod-a", "--", "ip", "a", "show", "net1", check=False)
    print("  " + "\n  ".join(inside.strip().splitlines() or ["(no net1)"]), file=out)
    print(f"  networkData: {json.dumps(network)}", file=out)
    mac = re.search(r"link/ether ([0-9a-f:]{17})", inside)
    addresses = re.findall(r"inet (\S+)", inside)
    if not mac or mac.group(1) != network.get("hardwareAddress") or addresses != network.get("ips"):
        problems.append(
            f"Pod-A's net1 ({mac.group(1) if mac else None}, {addresses}) differs from its "
            f"claim's networkData ({network.get('hardwareAddress')}, {network.get('ips')})"
        )

    print("\n== Ping over net1 between pods on different nodes", file=out)
    for pod in outcome.pods:
        if pod["metadata"]["name"] == "pod-a" or not pod["spec"].get("nodeName"):
            continue
        claim = _claim_of(outcome, pod)
        ips = _network(claim).get("ips", []) if claim else []
        if not ips:
            problems.append(f"{pod['metadata']['name']} has no net1 address in its claim status")
            continue
        target = ips[0].split("/")[0]
        reply = handle.kubectl(
            "exec",
            "-n",
            NAMESPACE,
            "pod-a",
            "--",
            "ping",
            "-c",
            "2",
            "-W",
            "3",
            "-I",
            "net1",
            target,
            check=False,
            timeout=30,
        )
        summary = next((line for line in reply.splitlines() if "packet loss" in line), "no reply")
        print(
            f"  pod-a ({a_nodes[0] if a_nodes else '?'}) -> {pod['metadata']['name']} "
            f"({pod['spec']['nodeName']}, {target}): {summary.strip()}",
            file=out,
        )
        if " 0% packet loss" not in reply:
            problems.append(f"pod-a cannot ping {pod['metadata']['name']} over net1")
    return problems


def run(handle: ClusterHandle, out: TextIO = sys.stdout, b_request: str = "5Gi") -> Outcome:
    started = time.monotonic()
    apply(handle, b_request)
    outcome = observe(handle)
    outcome.problems = check(handle, outcome, out)
    print(f"\n(demo settled and checked in {time.monotonic() - started:.1f} s)", file=out)
    if outcome.problems:
        raise ExpectationError("the demo did not behave as expected:\n- " + "\n- ".join(outcome.problems))
    return outcome

"""Soak: many pod create/delete cycles; afterwards nothing may be left over, and the agent must not grow.

Counts, per node, before and after: links in the node's namespace, host-local reservations, state rows,
the agent's open file descriptors and resident memory; and claims that still carry our status entries.
`make soak` runs 100 rounds of 10 pods (1,000 cycles) on its own cluster; a test runs a few rounds.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from netclaim_lab import agents, cluster, processes
from netclaim_lab.cluster import ClusterHandle
from netclaim_lab.layout import REPO_ROOT

HERE = Path(__file__).resolve().parent
NETWORK = "soak-net"
NAMESPACE = "soak"
ON_ENP0S10 = 'device.attributes["netclaim.dev"].ifName == "enp0s10"'


@dataclass
class Snapshot:
    links: dict[str, int]
    reservations: int
    rows: dict[str, int]
    fds: dict[str, int]
    rss_mib: dict[str, float]
    status_entries: int


def _agent_pid(handle: ClusterHandle, node: str) -> int:
    pid = agents.agent_pid(handle, node)
    assert pid is not None
    return pid


def _rows(handle: ClusterHandle, node: str) -> int:
    import sqlite3

    path = handle.node(node).layout.state_dir / "netclaim.db"
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
        return int(db.execute("SELECT count(*) FROM attachments").fetchone()[0])


def snapshot(handle: ClusterHandle, nodes: list[str]) -> Snapshot:
    directories = [
        d for n in nodes for d in handle.node(n).layout.claims_host_local_dir.glob(f"**/{NETWORK}")
    ]
    entries = json.loads(handle.kubectl("get", "resourceclaims", "-A", "-o", "json"))["items"]
    return Snapshot(
        links={
            n: len(processes.run([*handle.node(n).enter(), "ip", "-o", "link", "show"]).splitlines())
            for n in nodes
        },
        reservations=sum(
            len([p for p in directory.iterdir() if p.name[0].isdigit()])
            for directory in directories
            if directory.exists()
        ),
        rows={n: _rows(handle, n) for n in nodes},
        fds={n: len(list(Path(f"/proc/{_agent_pid(handle, n)}/fd").iterdir())) for n in nodes},
        rss_mib={
            n: int(
                next(
                    line.split()[1]
                    for line in Path(f"/proc/{_agent_pid(handle, n)}/status").read_text().splitlines()
                    if line.startswith("VmRSS:")
                )
            )
            / 1024
            for n in nodes
        },
        status_entries=sum(
            1
            for c in entries
            for d in c.get("status", {}).get("devices", [])
            if d["driver"] == "netclaim.dev"
        ),
    )


def _manifests(pods: int, round_number: int) -> str:
    # new pod names every round: kubelet's claim lookup races the Node authorizer's graph when a pod
    # is recreated under the same name at once ("no relationship found"), then backs off for a minute
    config = {
        "apiVersion": "netclaim.dev/v1alpha1",
        "kind": "CNIConfig",
        "config": {
            "cniVersion": "1.0.0",
            "name": NETWORK,
            "plugins": [
                {
                    "type": "macvlan",
                    "master": "{{ device.ifName }}",
                    "mode": "bridge",
                    "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.93.0.0/24"}]]},
                }
            ],
        },
    }
    documents: list[dict[str, Any]] = [
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": "soak"},
            "spec": {
                "spec": {
                    "devices": {
                        "requests": [
                            {
                                "name": "nic",
                                "exactly": {
                                    "deviceClassName": "netclaim-shared",
                                    "selectors": [{"cel": {"expression": ON_ENP0S10}}],
                                    "capacity": {"requests": {"netclaim.dev/bandwidth": "100Mi"}},
                                },
                            }
                        ],
                        "config": [
                            {"requests": ["nic"], "opaque": {"driver": "netclaim.dev", "parameters": config}}
                        ],
                    }
                }
            },
        }
    ]
    for index in range(pods):
        documents.append(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": f"soak-{round_number}-{index}", "labels": {"app": "soak"}},
                "spec": {
                    "terminationGracePeriodSeconds": 1,
                    "automountServiceAccountToken": False,
                    "resourceClaims": [{"name": "net", "resourceClaimTemplateName": "soak"}],
                    "containers": [
                        {
                            "name": "main",
                            "image": "netclaim.local/busybox:1.35",
                            "imagePullPolicy": "Never",
                            "command": ["sleep", "3600"],
                            "resources": {"claims": [{"name": "net"}]},
                        }
                    ],
                },
            }
        )
    return yaml.safe_dump_all(documents)


def _wait(handle: ClusterHandle, check: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check == "gone" and not handle.kubectl("get", "pods", "-n", NAMESPACE, "-o", "name"):
            return
        if check == "ready":
            pods = json.loads(handle.kubectl("get", "pods", "-n", NAMESPACE, "-o", "json"))["items"]
            if pods and all(
                any(
                    c["type"] == "Ready" and c["status"] == "True"
                    for c in p.get("status", {}).get("conditions", [])
                )
                for p in pods
            ):
                return
        time.sleep(0.5)
    raise TimeoutError(f"soak pods not {check} after {timeout:.0f} s")


def run(
    handle: ClusterHandle, nodes: list[str], rounds: int, pods: int, out: Any = sys.stdout
) -> tuple[Snapshot, Snapshot]:
    """`rounds` x (create `pods` pods, wait Ready, delete, wait gone); snapshots after a warm-up round and at
    the end."""
    handle.kubectl("create", "namespace", NAMESPACE, check=False)
    while not handle.kubectl("get", "serviceaccount", "default", "-n", NAMESPACE, check=False):
        time.sleep(0.5)
    before: Snapshot | None = None
    started = time.monotonic()
    for round_number in range(rounds + 1):
        handle.kubectl("apply", "-n", NAMESPACE, "-f", "-", input_text=_manifests(pods, round_number))
        _wait(handle, "ready", 300)
        handle.kubectl("delete", "pods", "-n", NAMESPACE, "-l", "app=soak", "--wait=false")
        _wait(handle, "gone", 300)
        time.sleep(1)  # unprepare and status removal settle
        if before is None:
            before = snapshot(handle, nodes)  # after one warm-up round: caches and pools are filled
        elif round_number % 10 == 0:
            print(
                f"  round {round_number}/{rounds}: {round_number * pods} cycles, "
                f"{time.monotonic() - started:.0f} s",
                file=out,
                flush=True,
            )
    after = snapshot(handle, nodes)
    assert before is not None
    handle.kubectl("delete", "namespace", NAMESPACE, "--wait=true", timeout=300)
    return before, after


def report(before: Snapshot, after: Snapshot, cycles: int, out: Any = sys.stdout) -> dict[str, int]:
    def growth(now: int, then: int) -> int:
        return max(0, now - then)  # fewer than before (a connection closed) is no leak

    leaks = {
        "links": growth(sum(after.links.values()), sum(before.links.values())),
        "ip reservations": growth(after.reservations, before.reservations),
        "state rows": sum(after.rows.values()),
        "status entries": after.status_entries,
        "file descriptors": growth(sum(after.fds.values()), sum(before.fds.values())),
    }
    print(f"soak: {cycles} pod create/delete cycles; leaked {json.dumps(leaks)}", file=out)
    for node in before.rss_mib:
        print(
            f"  {node}: agent RSS {before.rss_mib[node]:.1f} MiB -> {after.rss_mib[node]:.1f} MiB, "
            f"fds {before.fds[node]} -> {after.fds[node]}",
            file=out,
        )
    return leaks


def main(rounds: int = 100, pods: int = 10) -> int:
    handle = cluster.up(HERE / "cluster.yaml")
    agents.deploy(handle, REPO_ROOT / "tests" / "cluster" / "policy.yaml")
    nodes = [n.name for n in handle.spec.nodes if n.kubelet]
    before, after = run(handle, nodes, rounds, pods)
    leaks = report(before, after, rounds * pods)
    cluster.down(handle.spec.name)
    return 1 if any(leaks.values()) else 0


if __name__ == "__main__":
    sys.exit(main(*(int(a) for a in sys.argv[1:3])))

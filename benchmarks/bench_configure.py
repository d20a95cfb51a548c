"""Figures of the configure path on a real local cluster (printed, never asserted):

- the raw CNI plugin exec of a macvlan + host-local config list into a fresh netns (the floor);
- netclaim's attach of the same config list in RunPodSandbox (ADD + read-back + state writes);
- NodePrepareResources per claim; the agent's resident memory before and after.

Usage: .venv/bin/python benchmarks/bench_configure.py [pods] [raw runs]   (make bench)
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from netclaim.cluster import agents, cluster, processes
from netclaim.cluster.cluster import ClusterHandle

HERE = Path(__file__).resolve().parent
NODE = "node-1"


def _summary(name: str, values: list[float]) -> str:
    ordered = sorted(values)
    p90 = ordered[max(0, int(len(ordered) * 0.9) - 1)]
    return f"{name}: median {statistics.median(ordered):.1f} ms, p90 {p90:.1f} ms, n={len(ordered)}"


def _agent_rss_mib(handle: ClusterHandle) -> float:
    pid = agents.agent_pid(handle, NODE)
    assert pid is not None
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _agent_log_values(handle: ClusterHandle, offset: int, message: str, key: str = "ms") -> list[float]:
    text = agents.agent_log(handle, NODE)[offset:]
    lines = [json.loads(line) for line in text.splitlines() if line.startswith("{")]
    return [float(entry[key]) for entry in lines if entry.get("msg") == message and key in entry]


def _template() -> dict[str, Any]:
    config = {
        "apiVersion": "netclaim.dev/v1alpha1",
        "kind": "CNIConfig",
        "interfaceName": "net1",
        "bandwidth": "none",
        "config": {
            "cniVersion": "1.0.0",
            "name": "bench-net",
            "plugins": [
                {
                    "type": "macvlan",
                    "master": "{{ device.ifName }}",
                    "mode": "bridge",
                    "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.98.0.0/24"}]]},
                }
            ],
        },
    }
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "bench"},
        "spec": {
            "spec": {
                "devices": {
                    "requests": [{"name": "nic", "exactly": {"deviceClassName": "netclaim-shared"}}],
                    "config": [
                        {"requests": ["nic"], "opaque": {"driver": "netclaim.dev", "parameters": config}}
                    ],
                }
            }
        },
    }


def _pod_spec() -> dict[str, Any]:
    return {
        "terminationGracePeriodSeconds": 0,
        "resourceClaims": [{"name": "net", "resourceClaimTemplateName": "bench"}],
        "containers": [
            {
                "name": "main",
                "image": "netclaim.local/busybox:1.35",
                "imagePullPolicy": "Never",
                "command": ["sleep", "3600"],
                "resources": {"claims": [{"name": "net"}]},
            }
        ],
    }


def _deployment(pods: int) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "bench"},
        "spec": {
            "replicas": pods,
            "selector": {"matchLabels": {"app": "bench"}},
            "template": {"metadata": {"labels": {"app": "bench"}}, "spec": _pod_spec()},
        },
    }


def _wait_gone(handle: ClusterHandle) -> None:
    deadline = time.monotonic() + 180
    while handle.kubectl("get", "pods", "-l", "app=bench", "-o", "name") and time.monotonic() < deadline:
        time.sleep(1)


def main(pods: int = 20, raw_runs: int = 30) -> None:
    handle = cluster.up(HERE / "cluster.yaml")
    agents.deploy(handle)  # deploy/ as it is, its policy ConfigMap included
    node = handle.node(NODE)
    raw = json.loads(
        processes.run(
            [*node.enter(), sys.executable, str(HERE / "raw_cni.py"), str(raw_runs), "enp0s10"], timeout=300
        )
    )
    rss_start = _agent_rss_mib(handle)
    handle.kubectl("apply", "-f", "-", input_text=yaml.safe_dump(_template()))

    offset = len(
        agents.agent_log(handle, NODE)
    )  # one pod at a time: the latency of one attach on a quiet node
    for index in range(pods):
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": f"bench-{index}", "labels": {"app": "bench"}},
            "spec": _pod_spec(),
        }
        handle.kubectl("apply", "-f", "-", input_text=yaml.safe_dump(pod))
        handle.kubectl("wait", "--for=condition=Ready", f"pod/bench-{index}", "--timeout=120s", timeout=130)
    attach = _agent_log_values(handle, offset, "attached")
    add_in_agent = _agent_log_values(handle, offset, "attached", "cni_ms")
    prepare = _agent_log_values(handle, offset, "prepared")
    handle.kubectl("delete", "pods", "-l", "app=bench", "--wait=true", timeout=300)
    _wait_gone(handle)

    offset = len(agents.agent_log(handle, NODE))  # a burst: every replica at once on 2 cores
    started = time.monotonic()
    handle.kubectl("apply", "-f", "-", input_text=yaml.safe_dump(_deployment(pods)))
    handle.kubectl("rollout", "status", "deployment/bench", "--timeout=300s", timeout=320)
    burst_seconds = time.monotonic() - started
    burst = _agent_log_values(handle, offset, "attached")
    handle.kubectl("delete", "deployment/bench", "resourceclaimtemplate/bench", "--wait=true", timeout=300)
    _wait_gone(handle)
    rss_end = _agent_rss_mib(handle)

    raw_add = statistics.median(raw["add_ms"])
    print("configure path, macvlan + host-local into a fresh pod netns, one node, this machine:")
    print("  " + _summary("raw plugin ADD (exec of the same config list)", raw["add_ms"]))
    print("  " + _summary("raw plugin DEL", raw["del_ms"]))
    print("  " + _summary("netclaim: the ADD exec inside the attach", add_in_agent))
    print(
        "  "
        + _summary("netclaim attach, one pod at a time (ADD + read-back + state)", attach)
        + f"  -> {statistics.median(attach) / raw_add:.2f}x the raw ADD"
    )
    print(
        "  "
        + _summary(f"netclaim attach, {pods} pods at once", burst)
        + f"  ({pods} pods Ready in {burst_seconds:.1f} s)"
    )
    print("  " + _summary("NodePrepareResources per claim", prepare))
    print(f"  agent RSS {rss_start:.1f} MiB before, {rss_end:.1f} MiB after {2 * pods} pods")
    cluster.down(handle.spec.name)


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:3]))

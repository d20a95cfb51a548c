"""MultiNetworkPolicy at scale on the lab (docs/scale.md), measured from outside the programs: `pods` pods
on an IP pool of network lan3 (node-1, node-2, node-4), labelled `app=a<i mod policies>` and
`role=r<i mod 10>`; `policies` policies, policy i selecting `app=a<i>` and letting in `role=r<i mod 10>` on
TCP 8080 and one /24 on TCP 9090. So every pod is selected, and each selected pod's table holds two allow
rules, one of them with the addresses of a tenth of the pods.

Figures:
- rules per pod: the agents' `netclaim_policy_rules` (allow rules, isolated directions) over the pods;
- apply: from creating every policy at once to every pod's table being in place (the agents' metrics);
- relabel: from relabelling one pod out of one role into another to the tables of the pods whose peers it
  left and joined all showing it (`nft list ruleset` in each of their namespaces);
- the controller's pass and the agents' sync seconds (their histograms' sums over counts).

`make bench-policy-tables` runs 200 pods and 100 policies on a cluster of its own; a test runs a small one.
"""

from __future__ import annotations

import collections
import ipaddress
import json
import re
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml

from netclaim_lab import agents, cluster, processes
from netclaim_lab.cluster import ClusterHandle
from netclaim_lab.images import BUSYBOX_IMAGE
from netclaim_lab.layout import REPO_ROOT

NAMESPACE = "polscale"
POOL = "polscale"
SUBNET = "10.66.0.0/22"
NETWORK = "lan3"  # ipn0 on node-1, node-2 and node-4 of tests/cluster/cluster.yaml
NODES = ("node-1", "node-2", "node-4")
ROLES = 10
TEST_POLICY = REPO_ROOT / "tests" / "cluster" / "policy.yaml"
CONTROLLER_METRICS = "/api/v1/namespaces/netclaim-system/pods/{pod}:9178/proxy/metrics"


def manifests(pods: int, policies: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(the pool, claim template and pods; the policies)."""
    pool = {
        "apiVersion": "netclaim.dev/v1alpha1",
        "kind": "IPPool",
        "metadata": {"name": POOL},
        "spec": {"network": NETWORK, "ranges": [{"subnet": SUBNET}]},
    }
    on_ipn0 = 'device.attributes["netclaim.dev"].ifName == "ipn0"'
    nic = {
        "name": "nic",
        "exactly": {
            "deviceClassName": "netclaim-shared",
            "selectors": [{"cel": {"expression": on_ipn0}}],
            "capacity": {"requests": {"netclaim.dev/bandwidth": "10M"}},
        },
    }
    address = {
        "name": "ip",
        "exactly": {
            "deviceClassName": "netclaim-address",
            "selectors": [{"cel": {"expression": f'device.attributes["netclaim.dev"].pool == "{POOL}"'}}],
        },
    }
    macvlan = {
        "apiVersion": "netclaim.dev/v1alpha1",
        "kind": "CNIConfig",
        "config": {
            "cniVersion": "1.0.0",
            "name": POOL,
            "plugins": [{"type": "macvlan", "master": "{{ device.ifName }}", "mode": "bridge"}],
        },
    }
    template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "net", "namespace": NAMESPACE},
        "spec": {
            "spec": {
                "devices": {
                    "requests": [nic, address],
                    "constraints": [{"requests": ["nic", "ip"], "matchAttribute": "netclaim.dev/network"}],
                    "config": [
                        {"requests": ["nic"], "opaque": {"driver": "netclaim.dev", "parameters": macvlan}}
                    ],
                }
            }
        },
    }
    made = [pool, template]
    for i in range(pods):
        made.append(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": f"p-{i}",
                    "namespace": NAMESPACE,
                    "labels": {"app": f"a{i % policies}", "role": f"r{i % ROLES}"},
                },
                "spec": {
                    "nodeSelector": {"kubernetes.io/hostname": NODES[i % len(NODES)]},
                    "terminationGracePeriodSeconds": 0,
                    "resourceClaims": [{"name": "net", "resourceClaimTemplateName": "net"}],
                    "containers": [
                        {
                            "name": "main",
                            "image": BUSYBOX_IMAGE,
                            "imagePullPolicy": "Never",
                            "command": ["sleep", "3600"],
                            "resources": {"claims": [{"name": "net"}]},
                        }
                    ],
                },
            }
        )
    policy_objects = [
        {
            "apiVersion": "k8s.cni.cncf.io/v1beta1",
            "kind": "MultiNetworkPolicy",
            "metadata": {
                "name": f"allow-{i}",
                "namespace": NAMESPACE,
                "annotations": {"k8s.v1.cni.cncf.io/policy-for": f"netclaim.dev/{NETWORK}"},
            },
            "spec": {
                "podSelector": {"matchLabels": {"app": f"a{i}"}},
                "ingress": [
                    {
                        "from": [{"podSelector": {"matchLabels": {"role": f"r{i % ROLES}"}}}],
                        "ports": [{"protocol": "TCP", "port": 8080}],
                    },
                    {
                        "from": [{"ipBlock": {"cidr": f"10.99.{i % 256}.0/24"}}],
                        "ports": [{"protocol": "TCP", "port": 9090}],
                    },
                ],
            },
        }
        for i in range(policies)
    ]
    return made, policy_objects


def _apply(handle: ClusterHandle, documents: list[dict[str, Any]]) -> None:
    handle.kubectl("apply", "--server-side", "-f", "-", input_text=yaml.safe_dump_all(documents), timeout=300)


def _wait(check: Callable[[], bool], timeout: float, what: str) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if check():
            return time.monotonic() - started
        time.sleep(0.2)
    raise TimeoutError(f"{what}: not after {timeout:.0f} s")


def _metrics(text: str) -> dict[str, float]:
    found = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            found[name] = float(value)
    return found


def agent_metrics(handle: ClusterHandle, node: str) -> dict[str, float]:
    url = f"http://{handle.node(node).address.ip}:{agents.METRICS_PORT}/metrics"
    with urllib.request.urlopen(url, timeout=10) as response:
        return _metrics(response.read().decode())


def controller_metrics(handle: ClusterHandle) -> dict[str, float]:
    pod = agents.controller_pod(handle)
    return _metrics(handle.kubectl("get", "--raw", CONTROLLER_METRICS.format(pod=pod["metadata"]["name"])))


def _summed(handle: ClusterHandle, name: str) -> float:
    return sum(agent_metrics(handle, node).get(name, 0.0) for node in NODES)


def _pods(handle: ClusterHandle) -> list[dict[str, Any]]:
    return list(json.loads(handle.kubectl("get", "pods", "-n", NAMESPACE, "-o", "json"))["items"])


def _net1(handle: ClusterHandle) -> dict[str, str]:
    """Pod name → its address on the network, from its claim's status."""
    claims = json.loads(handle.kubectl("get", "resourceclaims", "-n", NAMESPACE, "-o", "json"))["items"]
    found = {}
    for claim in claims:
        reserved: list[dict[str, Any]] = claim["status"].get("reservedFor") or []
        owner = reserved[0].get("name") if reserved else None
        for entry in claim["status"].get("devices") or []:
            ips = (entry.get("networkData") or {}).get("ips") or []
            if owner and ips and "data" in entry:
                found[str(owner)] = str(ipaddress.ip_interface(ips[0]).ip)
    return found


def _netns(handle: ClusterHandle, pod: dict[str, Any]) -> str:
    """The pod sandbox's network namespace, as its node's containerd has it."""
    crictl = handle.node(pod["spec"]["nodeName"]).crictl()
    uid = pod["metadata"]["uid"]
    sandbox = processes.run(
        [*crictl, "pods", "--state", "ready", "--label", f"io.kubernetes.pod.uid={uid}", "-q"]
    )
    info = json.loads(processes.run([*crictl, "inspectp", sandbox.split()[0]]))
    return str(
        next(n["path"] for n in info["info"]["runtimeSpec"]["linux"]["namespaces"] if n["type"] == "network")
    )


def _lets_in(handle: ClusterHandle, node: str, netns: str, address: str) -> bool:
    """Whether the namespace's ruleset names `address` (not as the prefix of a longer one)."""
    ruleset = processes.run(
        [*handle.node(node).enter(), "nsenter", f"--net={netns}", "nft", "list", "ruleset"]
    )
    return re.search(rf"(?<![\d.]){re.escape(address)}(?![\d])", ruleset) is not None


def run(handle: ClusterHandle, pods: int, policies: int, out: Any = sys.stdout) -> dict[str, float]:
    workload, policy_objects = manifests(pods, policies)
    handle.kubectl("create", "namespace", NAMESPACE, check=False)
    _wait(
        lambda: bool(handle.kubectl("get", "serviceaccount", "default", "-n", NAMESPACE, check=False)),
        60,
        "the namespace's default ServiceAccount",
    )
    try:
        _apply(handle, workload)
        try:
            started_s = _wait(
                lambda: sum(p["status"].get("phase") == "Running" for p in _pods(handle)) == pods,
                60 + pods * 3,
                f"{pods} pods running",
            )
        except TimeoutError:
            phases = collections.Counter(str(p["status"].get("phase")) for p in _pods(handle))
            events = handle.kubectl("get", "events", "-n", NAMESPACE, "--field-selector", "type=Warning")
            print(f"pods by phase: {dict(phases)}\n{events[-3000:]}", file=out, flush=True)
            raise
        _apply(handle, policy_objects)
        # every pod isolated with its two allow rules: a guard's isolation alone (nothing allowed, while the
        # controller compiles) is not the end
        apply_s = _wait(
            lambda: (
                _summed(handle, 'netclaim_policy_rules{kind="isolated"}') >= pods
                and _summed(handle, 'netclaim_policy_rules{kind="allow"}') >= 2 * pods
            ),
            300,
            "every pod's table in place",
        )
        rules_per_pod = (_summed(handle, 'netclaim_policy_rules{kind="allow"}')) / pods
        addresses = _net1(handle)
        listed = {p["metadata"]["name"]: p for p in _pods(handle)}
        mover = "p-0"  # role r0 → r1: out of the peers of policies i ≡ 0, into those of i ≡ 1 (mod 10)
        affected = [
            listed[f"p-{i}"] for i in range(pods) if (i % policies) % ROLES in (0, 1) and f"p-{i}" != mover
        ]
        # each affected pod's node, netns and whether the mover is to be let in: looked up before the clock
        wanted = [
            (
                p["spec"]["nodeName"],
                _netns(handle, p),
                (int(p["metadata"]["name"][2:]) % policies) % ROLES == 1,
            )
            for p in affected
        ]
        handle.kubectl("label", "pod", "-n", NAMESPACE, mover, "role=r1", "--overwrite")
        moved = time.monotonic()

        def followed() -> bool:
            with ThreadPoolExecutor(8) as pool:
                seen = list(
                    pool.map(lambda w: _lets_in(handle, w[0], w[1], addresses[mover]) == w[2], wanted)
                )
            return all(seen)

        _wait(followed, 300, "the affected pods' tables following the relabel")
        relabel_s = time.monotonic() - moved
        controller = controller_metrics(handle)
        figures = {
            "pods": pods,
            "policies": policies,
            "pods_started_s": round(started_s, 1),
            "rules_per_pod": round(rules_per_pod, 2),
            "peers_per_rule": round(pods / ROLES, 1),
            "apply_all_s": round(apply_s, 1),
            "relabel_s": round(relabel_s, 1),
            "relabel_tables": len(affected),
            "controller_pass_s_mean": round(
                controller.get("netclaim_policy_pass_seconds_sum", 0.0)
                / max(1.0, controller.get("netclaim_policy_pass_seconds_count", 0.0)),
                3,
            ),
            "agent_sync_s_mean": round(
                _summed(handle, "netclaim_policy_sync_seconds_sum")
                / max(1.0, _summed(handle, "netclaim_policy_sync_seconds_count")),
                3,
            ),
            "agent_failures": _summed(handle, 'netclaim_policy_failures_total{when="sync"}')
            + _summed(handle, 'netclaim_policy_failures_total{when="sandbox"}'),
        }
    finally:
        handle.kubectl("delete", "namespace", NAMESPACE, "--wait=true", timeout=600)
        handle.kubectl("delete", "ippool", POOL, "--ignore-not-found")
    print(f"TABLES {json.dumps(figures)}", file=out, flush=True)
    return figures


def publish_policy(pods: int, path: Path) -> Path:
    """The test suite's publish policy with room for `pods` shares of ipn0 across NODES (32 a NIC by
    default, docs/policy.md), written to `path`."""
    policy = yaml.safe_load(TEST_POLICY.read_text())
    for rule in policy["rules"]:
        if rule["match"].get("names") == ["ipn0"]:
            rule["attachments"] = max(32, -(-pods // len(NODES)) + 4)
    path.write_text(yaml.safe_dump(policy))
    return path


def main(pods: int = 200, policies: int = 100) -> int:
    handle = cluster.up(REPO_ROOT / "tests" / "cluster" / "cluster.yaml")
    with tempfile.TemporaryDirectory() as scratch:
        agents.deploy(handle, publish_policy(pods, Path(scratch) / "policy.yaml"))
    try:
        run(handle, pods, policies)
    finally:
        cluster.down(handle.spec.name)
    return 0


if __name__ == "__main__":
    sys.exit(main(*(int(a) for a in sys.argv[1:3])))

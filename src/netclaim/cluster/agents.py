"""Deploy netclaim into the local cluster as in production, with the agents as node processes.

The manifests of `deploy/` are applied as they are (RBAC, DeviceClasses…); each kubelet node then runs
`netclaim agent` inside its namespaces with a real bound ServiceAccount token (bound to its Node object,
so the token carries the node name, as a DaemonSet pod's token would).
"""

from __future__ import annotations

import json
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from netclaim.cluster import processes
from netclaim.cluster.cluster import ClusterHandle
from netclaim.cluster.controlplane import write_kubeconfig
from netclaim.cluster.layout import REPO_ROOT
from netclaim.cluster.node import LocalNode
from netclaim.errors import TransientError

AGENT = "netclaim-agent"
METRICS_PORT = 9177
NAMESPACE = "netclaim-system"
SERVICE_ACCOUNT = "netclaim-agent"
DEPLOY_DIR = REPO_ROOT / "deploy"
CLUSTER_MANIFESTS = ("rbac.yaml", "deviceclasses.yaml", "policy.yaml", "admission.yaml")


def apply_manifests(handle: ClusterHandle, names: tuple[str, ...] = CLUSTER_MANIFESTS) -> None:
    for name in names:
        handle.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(DEPLOY_DIR / name))


def policy_from_configmap(handle: ClusterHandle) -> Path:
    """The policy the agents read, fetched from the ConfigMap of deploy/ as a kubelet would mount it."""
    text = handle.kubectl(
        "get", "configmap", "netclaim-policy", "-n", NAMESPACE, "-o", "jsonpath={.data.policy\\.yaml}"
    )
    path = handle.layout.root / "policy.yaml"
    path.write_text(text)
    return path


def agent_kubeconfig(handle: ClusterHandle, node: str, path: Path) -> None:
    token = handle.kubectl(
        "create",
        "token",
        SERVICE_ACCOUNT,
        "-n",
        NAMESPACE,
        "--duration=48h",
        "--bound-object-kind=Node",
        f"--bound-object-name={node}",
    ).strip()
    server = f"https://{handle.spec.management_gateway().ip}:{handle.spec.ports.apiserver}"
    write_kubeconfig(path, server, handle.layout.pki / "ca.crt", SERVICE_ACCOUNT, {"token": token})


def agent_command(
    handle: ClusterHandle, node: LocalNode, policy: Path, extra: tuple[str, ...] = ()
) -> list[str]:
    layout = node.layout
    return [
        sys.executable,
        "-m",
        "netclaim",
        "agent",
        f"--node-name={node.node.name}",
        f"--kubeconfig={layout.root / 'agent.kubeconfig'}",
        f"--policy-file={policy.resolve()}",
        f"--nic-overrides={layout.nic_overrides}",
        f"--cni-conf-dir={layout.cni_conf_dir}",
        f"--kubelet-root-dir={layout.kubelet_dir}",
        f"--nri-socket={layout.nri_socket}",
        f"--state-dir={layout.root / 'netclaim'}",
        f"--metrics-address={node.address.ip}:{METRICS_PORT}",
        "--cni-bin-dir=/usr/lib/cni",
        f"--ipam-data-dir={handle.layout.ipam_data_dir}",
        *extra,
    ]


def start_agent(
    handle: ClusterHandle, node_name: str, policy: Path, extra: tuple[str, ...] = (), faults: str = ""
) -> None:
    node = handle.node(node_name)
    agent_kubeconfig(handle, node_name, node.layout.root / "agent.kubeconfig")
    env = {"PYTHONUNBUFFERED": "1", "NETCLAIM_FAULTS": faults}
    node.start_daemon(AGENT, agent_command(handle, node, policy, extra), env=env)


def stop_agent(handle: ClusterHandle, node_name: str, *, kill: bool = False) -> None:
    node = handle.node(node_name)
    processes.stop(node.pid_dir, AGENT, grace=0 if kill else 10)


def agent_running(handle: ClusterHandle, node_name: str) -> bool:
    return processes.running(handle.node(node_name).pid_dir, AGENT)


def deploy(handle: ClusterHandle, policy: Path | None = None, extra: tuple[str, ...] = ()) -> None:
    """Manifests, then one agent per kubelet node (policy: a file, else deploy/'s ConfigMap); waits until
    every agent is ready."""
    apply_manifests(handle)
    policy = policy or policy_from_configmap(handle)
    nodes = [n.name for n in handle.spec.nodes if n.kubelet]
    for name in nodes:
        if not agent_running(handle, name):
            start_agent(handle, name, policy, extra)
    wait_ready(handle, nodes)


def readiness(handle: ClusterHandle, node_name: str) -> dict[str, bool] | None:
    """The agent's /readyz report (None while it does not answer)."""
    url = f"http://{handle.node(node_name).address.ip}:{METRICS_PORT}/readyz"
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return dict(json.loads(response.read()))
    except urllib.error.HTTPError as err:
        return dict(json.loads(err.read()))
    except (OSError, ValueError):
        return None


def wait_ready(handle: ClusterHandle, nodes: list[str], timeout: float = 60) -> None:
    """Every agent published its slices, is registered with kubelet and configured by containerd."""
    deadline = time.monotonic() + timeout
    waiting = set(nodes)
    while waiting and time.monotonic() < deadline:
        for name in sorted(waiting):
            if not agent_running(handle, name):
                log = handle.layout.logs / name / f"{AGENT}.log"
                raise TransientError(f"the netclaim agent of {name} exited; see {log}")
            report = readiness(handle, name)
            if report and all(report.values()):
                waiting.discard(name)
        if waiting:
            time.sleep(0.2)
    if waiting:
        reports = {name: readiness(handle, name) for name in sorted(waiting)}
        raise TransientError(f"netclaim agents not ready after {timeout:.0f} s: {reports}")

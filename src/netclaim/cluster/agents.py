"""Deploy netclaim into the local cluster as in production, with the agents as node processes.

The manifests of `deploy/` are applied as they are (CRDs, RBAC, DeviceClasses…); each kubelet node then
runs `netclaim agent` inside its namespaces with a real bound ServiceAccount token (bound to its Node
object, so the token carries the node name, as a DaemonSet pod's token would), and the machine runs one
`netclaim controller` with its own ServiceAccount's token.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from netclaim.cluster import binaries, processes
from netclaim.cluster.cluster import CONTROLLER, ClusterHandle
from netclaim.cluster.controlplane import write_kubeconfig
from netclaim.cluster.layout import REPO_ROOT
from netclaim.cluster.node import LocalNode
from netclaim.errors import TransientError

AGENT = "netclaim-agent"
METRICS_PORT = 9177
CONTROLLER_METRICS_PORT = 9178
NAMESPACE = "netclaim-system"
SERVICE_ACCOUNT = "netclaim-agent"
DEPLOY_DIR = REPO_ROOT / "deploy"
CLUSTER_MANIFESTS = (
    "00-namespace.yaml",
    "crds.yaml",
    "rbac.yaml",
    "deviceclasses.yaml",
    "policy.yaml",
    "admission.yaml",
)
CRDS = ("ippools.netclaim.dev", "ipallocations.netclaim.dev")
DEBIAN_CNI_DIR = Path("/usr/lib/cni")  # containernetworking-plugins


def apply_manifests(handle: ClusterHandle, names: tuple[str, ...] = CLUSTER_MANIFESTS) -> None:
    for name in names:
        handle.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(DEPLOY_DIR / name))
        if name == "crds.yaml":
            for crd in CRDS:
                handle.kubectl("wait", "--for=condition=Established", "--timeout=60s", f"crd/{crd}")


def policy_from_configmap(handle: ClusterHandle) -> Path:
    """The policy the agents read, fetched from the ConfigMap of deploy/ as a kubelet would mount it."""
    text = handle.kubectl(
        "get", "configmap", "netclaim-policy", "-n", NAMESPACE, "-o", "jsonpath={.data.policy\\.yaml}"
    )
    path = handle.layout.root / "policy.yaml"
    path.write_text(text)
    return path


def agent_kubeconfig(handle: ClusterHandle, node: str, path: Path) -> None:
    bound = ("--bound-object-kind=Node", f"--bound-object-name={node}")
    service_account_kubeconfig(handle, SERVICE_ACCOUNT, path, bound)


def service_account_kubeconfig(
    handle: ClusterHandle, account: str, path: Path, bound: tuple[str, ...] = ()
) -> None:
    token = handle.kubectl("create", "token", account, "-n", NAMESPACE, "--duration=48h", *bound).strip()
    server = f"https://{handle.spec.management_gateway().ip}:{handle.spec.ports.apiserver}"
    write_kubeconfig(path, server, handle.layout.pki / "ca.crt", account, {"token": token})


def cni_bin_dir(handle: ClusterHandle) -> Path:
    """The agents' plugin directory, `<state>/cni-bin`: Debian's plugins and the pinned ones the cluster
    programs include (binaries.CNI_PLUGINS: whereabouts), hard-linked (copied across file systems). Not
    symlinks: the agent runs only plugins whose real file is in its --cni-bin-dir. Entries already there
    are kept, so a test may wrap a plugin; `down` removes the directory with the rest of the state."""
    directory = handle.layout.root / "cni-bin"
    directory.mkdir(parents=True, exist_ok=True)
    sources = [p for p in sorted(DEBIAN_CNI_DIR.iterdir()) if p.is_file()]
    for source in sources + [handle.bin_dir / name for name in binaries.CNI_PLUGINS]:
        target = directory / source.name
        if target.exists():
            continue
        try:
            os.link(source, target)
        except FileExistsError:
            pass  # another agent's start made it first
        except OSError:  # another file system: a copy, renamed into place whole
            partial = target.with_name(f".{target.name}.{os.getpid()}")
            shutil.copy2(source, partial)
            partial.rename(target)
    return directory


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
        f"--policy-file={policy.absolute()}",
        f"--nic-overrides={layout.nic_overrides}",
        f"--cni-conf-dir={layout.cni_conf_dir}",
        f"--kubelet-root-dir={layout.kubelet_dir}",
        f"--nri-socket={layout.nri_socket}",
        f"--state-dir={layout.root / 'netclaim'}",
        f"--cdi-spec-dir={layout.root / 'cdi'}",
        f"--metrics-address={node.address.ip}:{METRICS_PORT}",
        f"--cni-bin-dir={cni_bin_dir(handle)}",
        f"--ipam-data-dir={layout.ipam_data_dir}",
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


def controller_address(handle: ClusterHandle) -> str:
    return f"{handle.spec.management_gateway().ip}:{CONTROLLER_METRICS_PORT}"


def start_controller(handle: ClusterHandle) -> None:
    kubeconfig = handle.layout.root / "controller.kubeconfig"
    service_account_kubeconfig(handle, CONTROLLER, kubeconfig)
    command = [
        sys.executable,
        "-m",
        "netclaim",
        "controller",
        f"--kubeconfig={kubeconfig}",
        f"--metrics-address={controller_address(handle)}",
    ]
    processes.start(
        CONTROLLER,
        command,
        pid_dir=handle.layout.pids,
        log_dir=handle.layout.logs,
        env={"PYTHONUNBUFFERED": "1"},
    )


def stop_controller(handle: ClusterHandle, *, kill: bool = False) -> None:
    processes.stop(handle.layout.pids, CONTROLLER, grace=0 if kill else 10)


def controller_ready(handle: ClusterHandle, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not processes.running(handle.layout.pids, CONTROLLER):
            raise TransientError(f"the netclaim controller exited; see {handle.layout.logs / CONTROLLER}.log")
        try:
            with urllib.request.urlopen(f"http://{controller_address(handle)}/readyz", timeout=2) as answer:
                if all(json.loads(answer.read()).values()):
                    return
        except (OSError, ValueError):
            pass
        time.sleep(0.2)
    raise TransientError(f"the netclaim controller is not ready after {timeout:.0f} s")


def deploy(handle: ClusterHandle, policy: Path | None = None, extra: tuple[str, ...] = ()) -> None:
    """Manifests, the controller, then one agent per kubelet node (policy: a file, else deploy/'s
    ConfigMap); waits until the controller and every agent are ready."""
    apply_manifests(handle)
    if not processes.running(handle.layout.pids, CONTROLLER):
        start_controller(handle)
    controller_ready(handle)
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

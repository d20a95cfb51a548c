"""`netclaim-lab cluster up|down|status`: a real multi-node Kubernetes cluster on one Linux machine."""

from __future__ import annotations

import io
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import msgspec
import yaml

from netclaim.errors import ConfigError, NetclaimError, PrerequisiteError, TransientError
from netclaim_lab import binaries, processes
from netclaim_lab.controlplane import ControlPlane
from netclaim_lab.images import build_images
from netclaim_lab.layout import ClusterLayout
from netclaim_lab.node import CONMON, DEBIAN_CNI_DIR, LocalNode, install_cni_plugins
from netclaim_lab.spec import ClusterSpec, load_cluster_spec

CONTROL_PLANE = ("kube-scheduler", "kube-controller-manager", "kube-apiserver", "etcd")
AGENT_APISERVER = "kube-apiserver-agents"
KEEPER = "node-keeper"
_READY_JSONPATH = (
    "jsonpath={range .items[*]}{.metadata.name}={.status.conditions[?(@.type=='Ready')].status}{'\\n'}{end}"
)


@dataclass(frozen=True)
class ClusterHandle:
    """What a running cluster offers its users (the CLI, pytest fixtures)."""

    spec: ClusterSpec
    layout: ClusterLayout
    bin_dir: Path

    @property
    def kubeconfig(self) -> Path:
        return self.layout.admin_kubeconfig

    def node(self, name: str) -> LocalNode:
        for index, node in enumerate(self.spec.nodes):
            if node.name == name:
                return LocalNode(self.spec, index, self.layout, self.bin_dir)
        raise KeyError(name)

    def kubectl(
        self, *args: str, check: bool = True, timeout: float = 60, input_text: str | None = None
    ) -> str:
        command = [str(self.bin_dir / "kubectl"), f"--kubeconfig={self.kubeconfig}", *args]
        return processes.run(command, check=check, timeout=timeout, input_text=input_text)


def _require_prerequisites() -> None:
    import os

    if os.geteuid() != 0:
        raise PrerequisiteError("netclaim-lab cluster needs root (network namespaces, mounts, cgroups)")
    for program in ("ip", "nsenter", "unshare", "mount", "sysctl"):
        if not shutil.which(program):
            raise PrerequisiteError(f"{program} is missing: apt-get install iproute2 util-linux procps")
    for path, package in (
        (Path("/usr/sbin/runc"), "runc"),
        (Path("/usr/lib/cni/macvlan"), "containernetworking-plugins"),
        (Path("/bin/busybox"), "busybox-static"),
    ):
        if not path.exists():
            raise PrerequisiteError(f"{path} is missing: apt-get install {package} (or run `make deps`)")


def _require_fixed_ports(spec: ClusterSpec, spec_path: Path) -> None:
    """The control plane's ports outside the kernel's ephemeral range: a port there may be held by any
    outgoing connection at that moment, and etcd or the apiserver then fails to bind now and then."""
    low, high = (int(v) for v in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    for name, port in msgspec.structs.asdict(spec.ports).items():
        if port is not None and low <= port <= high:
            raise ConfigError(
                f"{spec_path}: ports.{name}: {port} is in the ephemeral port range {low}-{high} "
                "(net.ipv4.ip_local_port_range), where an outgoing connection may hold it: choose one below "
                f"{low}"
            )


# Every kubelet and containerd of every node of every local cluster takes inotify instances of the one
# kernel, where real nodes each have their own: the kernel's default of 128 per user ran out with two
# clusters up (a side cluster's kubelet: "inotify_init: too many open files").
INOTIFY_INSTANCES = 1024


def _room_for_inotify() -> None:
    limit = Path("/proc/sys/fs/inotify/max_user_instances")
    if int(limit.read_text()) < INOTIFY_INSTANCES:
        limit.write_text(str(INOTIFY_INSTANCES))


def _bridges(spec: ClusterSpec) -> tuple[str, dict[str, str]]:
    management = f"{spec.link_prefix}m"
    segments = {segment.name: f"{spec.link_prefix}s{i}" for i, segment in enumerate(spec.segments)}
    return management, segments


def _is_up(layout: ClusterLayout) -> bool:
    return all(processes.running(layout.pids, name) for name in CONTROL_PLANE)


def up(spec_path: Path, log: TextIO = sys.stderr) -> ClusterHandle:
    """Bring the cluster of `spec_path` up; a no-op when that same cluster already runs."""
    spec = load_cluster_spec(spec_path)
    _require_prerequisites()
    _require_fixed_ports(spec, spec_path)
    _room_for_inotify()
    bin_dir = binaries.cluster_bin_dir(spec.kubernetes, spec.containerd)
    if spec.runtime == "crio":
        binaries.built_crio_dir()
        if not CONMON.is_file():
            raise PrerequisiteError(
                f"{CONMON} is missing (CRI-O's container monitor): apt-get install conmon"
            )
    layout = ClusterLayout.for_cluster(spec.name)
    handle = ClusterHandle(spec, layout, bin_dir)
    if _is_up(layout):
        # compared as specs, not as YAML: one definition may be written two ways (a NIC's unset properties
        # as null, as older copies have them, or left out)
        if _recorded_spec(layout) == spec:
            print(f"cluster {spec.name} is already up; kubeconfig: {layout.admin_kubeconfig}", file=log)
            return handle
        raise NetclaimError(
            f"cluster {spec.name} is up with another definition; run `netclaim-lab cluster down` first"
        )
    down(spec.name, log=io.StringIO())  # leftovers of a crashed run, quietly
    started = time.monotonic()
    step = _Stepper(log)
    try:
        _bring_up(handle, step)
    except (NetclaimError, subprocess.CalledProcessError, OSError) as err:
        print(f"cluster up failed at step '{step.current}': {_describe(err)}", file=log)
        print(f"logs of every component: {layout.logs}", file=log)
        down(spec.name, log=log, keep_logs=True)
        raise
    print(f"cluster {spec.name} up in {time.monotonic() - started:.1f} s", file=log)
    print(f"export KUBECONFIG={layout.admin_kubeconfig} PATH={bin_dir}:$PATH", file=log)
    return handle


class _Stepper:
    def __init__(self, log: TextIO) -> None:
        self.log = log
        self.current = "start"
        self.started = time.monotonic()

    def __call__(self, name: str) -> None:
        self.current = name
        print(f"[{time.monotonic() - self.started:5.1f}s] {name}", file=self.log, flush=True)


def _describe(err: BaseException) -> str:
    if isinstance(err, subprocess.CalledProcessError):
        return f"{' '.join(map(str, err.cmd))} exited {err.returncode}: {err.stderr}"
    return str(err)


def _bring_up(handle: ClusterHandle, step: Callable[[str], None]) -> None:
    spec, layout, bin_dir = handle.spec, handle.layout, handle.bin_dir
    layout.root.mkdir(parents=True, exist_ok=True)
    layout.root.chmod(0o700)
    layout.spec_copy.write_text(yaml.safe_dump(msgspec.to_builtins(spec), sort_keys=False))
    step("certificates")
    control_plane = ControlPlane(spec, layout, bin_dir)
    control_plane.write_pki()
    step("machine networks")
    management, segments = _bridges(spec)
    processes.run(["ip", "link", "add", management, "type", "bridge"])
    processes.run(["ip", "addr", "add", str(spec.management_gateway()), "dev", management])
    processes.run(["ip", "link", "set", management, "up"])
    for bridge in segments.values():
        processes.run(["ip", "link", "add", bridge, "type", "bridge"])
        processes.run(["ip", "link", "set", bridge, "up"])
    step("etcd")
    control_plane.start_etcd()
    step("kube-apiserver")
    control_plane.start_apiserver()
    if spec.ports.agentApiserver is not None:
        step("kube-apiserver for the agents")
        # RBAC alone: the Node authorizer is for kubelets, and its graph is one more watcher of every slice
        control_plane.start_apiserver(AGENT_APISERVER, spec.ports.agentApiserver, authorization="RBAC")
    step("kube-controller-manager, kube-scheduler")
    control_plane.start_controller_manager()
    control_plane.start_scheduler()
    step("images")
    archives = build_images(binaries.cache_root() / "images", bin_dir / "pause")
    plugins = binaries.built_reference_cni_dir() if spec.cniPlugins == "reference" else DEBIAN_CNI_DIR
    install_cni_plugins(layout, plugins, bin_dir, binaries.CNI_PLUGINS)
    for index, node_spec in enumerate(spec.nodes):
        if not node_spec.kubelet:
            continue
        node = LocalNode(spec, index, layout, bin_dir)
        step(f"node {node_spec.name}: namespaces and NICs")
        node.create_host(management, segments)
        node.create_cgroup_root()
        node.write_cni_config()
        step(f"node {node_spec.name}: {spec.runtime}")
        node.start_runtime()
        node.import_images(archives)
        step(f"node {node_spec.name}: kubelet")
        node.start_kubelet(control_plane)
    if any(not n.kubelet for n in spec.nodes):
        step("node keeper (kubelet: false nodes)")
        processes.start(
            KEEPER,
            [sys.executable, "-m", "netclaim_lab", "cluster", "keep-nodes", spec.name],
            pid_dir=layout.pids,
            log_dir=layout.logs,
        )
    step("nodes Ready, default ServiceAccount")
    _wait_usable(handle)


def _wait_usable(handle: ClusterHandle, timeout: float = 180) -> None:
    """Every node Ready and pods admissible (the default ServiceAccount exists)."""
    wanted = {n.name for n in handle.spec.nodes}
    deadline = time.monotonic() + timeout
    ready: set[str] = set()
    while time.monotonic() < deadline:
        for component in CONTROL_PLANE:
            if not processes.running(handle.layout.pids, component):
                raise TransientError(f"{component} exited; see {handle.layout.logs / component}.log")
        for node in handle.spec.nodes:
            if node.kubelet and not processes.running(handle.layout.node(node.name).root / "pids", "kubelet"):
                raise TransientError(
                    f"kubelet of {node.name} exited; see {handle.layout.logs / node.name}/kubelet.log"
                )
        output = handle.kubectl(
            "get",
            "nodes",
            "-o",
            _READY_JSONPATH,
            check=False,
        )
        ready = {line.split("=")[0] for line in output.splitlines() if line.endswith("=True")}
        if wanted <= ready and handle.kubectl("get", "serviceaccount", "default", check=False):
            return
        time.sleep(1)
    raise TransientError(
        f"nodes not Ready after {timeout:.0f} s: {sorted(wanted - ready)}; see {handle.layout.logs}"
    )


def down(name: str, log: TextIO = sys.stderr, keep_logs: bool = False) -> None:
    """Stop every process of cluster `name` and remove its namespaces, links, cgroups and state."""
    layout = ClusterLayout.for_cluster(name)
    if not layout.root.exists():
        print(f"cluster {name} is not up", file=log)
        return
    spec = _recorded_spec(layout)
    bin_dir = binaries.bin_dir()
    processes.stop(layout.pids, KEEPER, grace=2)
    if spec is not None:
        for index, node_spec in enumerate(spec.nodes):
            if node_spec.kubelet:
                LocalNode(spec, index, layout, bin_dir).destroy()
    for component in (AGENT_APISERVER, *CONTROL_PLANE):
        processes.stop(layout.pids, component)
    prefix = spec.link_prefix if spec is not None else None
    if prefix:
        for link in _links_with_prefix(prefix):
            subprocess.run(["ip", "link", "delete", link], capture_output=True, check=False)
    for entry in layout.root.iterdir():
        if entry.name != "logs" or not keep_logs:
            if entry.is_dir():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)
    if not keep_logs:
        layout.root.rmdir()
    print(f"cluster {name} is down", file=log)


def _recorded_spec(layout: ClusterLayout) -> ClusterSpec | None:
    try:
        return load_cluster_spec(layout.spec_copy)
    except ConfigError:
        return None


def _links_with_prefix(prefix: str) -> list[str]:
    output = processes.run(["ip", "-o", "link", "show"])
    names = [line.split(":")[1].strip().split("@")[0] for line in output.splitlines()]
    return [n for n in names if n.startswith(prefix)]


def status(name: str) -> dict[str, object]:
    """Which components run, for `netclaim-lab cluster status`."""
    layout = ClusterLayout.for_cluster(name)
    spec = _recorded_spec(layout)
    if spec is None:
        return {"cluster": name, "up": False}
    components = {c: processes.running(layout.pids, c) for c in CONTROL_PLANE}
    nodes = {}
    for node in spec.nodes:
        pid_dir = layout.node(node.name).root / "pids"
        nodes[node.name] = (
            {c: processes.running(pid_dir, c) for c in ("holder", spec.runtime, "kubelet")}
            if node.kubelet
            else {"kubelet": "none (kept Ready by node-keeper)"}
        )
    return {
        "cluster": name,
        "up": all(components.values()),
        "kubeconfig": str(layout.admin_kubeconfig),
        "controlPlane": components,
        "nodes": nodes,
    }

"""One local node: a network + mount + UTS namespace ("host") with its own runtime (containerd, or CRI-O)
and kubelet.

Every process of a node is started with `nsenter` into one long-lived holder process, so they all
share the node's mount namespace (kubelet's volume mounts are visible to runc) and its network
namespace; inside it /sys is remounted, so /sys/class/net lists the node's own interfaces, and the node's
own directories are bound at the standard paths (/var/lib/kubelet, /etc/cni/net.d, /opt/cni/bin, an
empty /usr/lib/cni, /var/run/nri…), so a DaemonSet's hostPath volumes reach this node's and no other's.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import msgspec
import yaml

from netclaim.errors import TransientError
from netclaim_lab import binaries, processes
from netclaim_lab.controlplane import SERVICE_IP, ControlPlane
from netclaim_lab.images import PAUSE_IMAGE
from netclaim_lab.layout import CRIO_RUN, ClusterLayout, NodeLayout
from netclaim_lab.spec import ClusterSpec, Node

DEBIAN_CNI_DIR = Path("/usr/lib/cni")  # containernetworking-plugins
RUNC = Path("/usr/sbin/runc")
CONMON = Path("/usr/bin/conmon")  # CRI-O's container monitor, Debian's (apt-get install conmon)
CRIO_STORAGE_DRIVER = "overlay"
# the capabilities a CRI-O node's containers get unless they drop them (_crio_config)
CRIO_CAPABILITIES = (
    "CHOWN", "DAC_OVERRIDE", "FSETID", "FOWNER", "SETGID", "SETUID", "SETPCAP", "NET_BIND_SERVICE", "KILL",
    "NET_RAW",
)  # fmt: skip
CGROUP_V1_ROOT = Path("/sys/fs/cgroup")
_HOLDER = "holder"

# Runs inside `unshare --mount --uts --propagation slave`: keep the machine's cgroup tree, enter the
# node's netns, remount /sys there (so /sys/class/net is the node's), put cgroups back, bind the node's
# directories at the standard paths ($BINDS: "source=target" words; shared, so that a pod's hostPath with
# HostToContainer propagation sees containerd's later netns pins), then wait.
_HOLDER_SCRIPT = """
set -e
hostname "$NODE"
mkdir -p "$STASH"
mount --rbind /sys/fs/cgroup "$STASH"
exec nsenter --net="/run/netns/$NETNS" sh -c '
  set -e
  umount -l /sys
  mount -t sysfs sysfs /sys
  mount --move "$STASH" /sys/fs/cgroup
  for bind in $BINDS; do
    source=${bind%%=*} target=${bind#*=}
    if [ -d "$source" ]; then mkdir -p "$target"; else mkdir -p "${target%/*}"; touch "$target"; fi
    mount --bind "$source" "$target"
    mount --make-rshared "$target"
  done
  mount -o remount,bind,ro /opt/cni/bin
  echo ready
  exec sleep infinity'
"""


class LocalNode:
    def __init__(self, spec: ClusterSpec, index: int, cluster: ClusterLayout, bin_dir: Path) -> None:
        self.spec = spec
        self.index = index
        self.node: Node = spec.nodes[index]
        self.cluster = cluster
        self.layout: NodeLayout = cluster.node(self.node.name)
        self.bin = bin_dir
        self.address = spec.node_address(index)
        self.pod_cidr = spec.node_pod_cidr(index)
        self.pid_dir = self.layout.root / "pids"
        self.log_dir = cluster.logs / self.node.name

    # --- naming --------------------------------------------------------------------------------
    @property
    def uplink_peer(self) -> str:
        return f"{self.spec.link_prefix}u{self.index}"

    def nic_peer(self, nic_index: int) -> str:
        return f"{self.spec.link_prefix}n{self.index}x{nic_index}"

    # --- bring-up ------------------------------------------------------------------------------
    def create_host(self, management_bridge: str, segment_bridges: dict[str, str]) -> None:
        netns = self.layout.netns
        processes.run(["ip", "netns", "add", netns])
        processes.run(
            ["ip", "link", "add", self.uplink_peer, "type", "veth", "peer", "name", "eth0", "netns", netns]
        )
        processes.run(["ip", "link", "set", self.uplink_peer, "master", management_bridge, "up"])
        inside = ["ip", "-n", netns]
        processes.run([*inside, "link", "set", "lo", "up"])
        processes.run([*inside, "addr", "add", str(self.address), "dev", "eth0"])
        processes.run([*inside, "link", "set", "eth0", "up"])
        gateway = str(self.spec.management_gateway().ip)
        processes.run([*inside, "route", "add", "default", "via", gateway])
        for other in range(len(self.spec.nodes)):
            if other != self.index and self.spec.nodes[other].kubelet:
                processes.run(
                    [
                        *inside,
                        "route",
                        "add",
                        str(self.spec.node_pod_cidr(other)),
                        "via",
                        str(self.spec.node_address(other).ip),
                    ]
                )
        for nic_index, nic in enumerate(self.node.nics):
            peer = self.nic_peer(nic_index)
            processes.run(
                ["ip", "link", "add", peer, "type", "veth", "peer", "name", nic.name, "netns", netns]
            )
            processes.run(
                ["ip", "link", "set", peer, "mtu", str(nic.mtu), "master", segment_bridges[nic.segment], "up"]
            )
            settings = ["mtu", str(nic.mtu)] + (["address", nic.mac] if nic.mac else [])
            processes.run([*inside, "link", "set", nic.name, *settings, "up"])
        for key in ("net.ipv4.ip_forward", "net.ipv4.conf.all.rp_filter"):
            value = "1" if key.endswith("forward") else "0"
            processes.run(["ip", "netns", "exec", netns, "sysctl", "-qw", f"{key}={value}"])
        # the machine (the apiserver's side of the management network) reaches the node's pods, as a
        # cluster network would route them
        processes.run(["ip", "route", "replace", str(self.pod_cidr), "via", str(self.address.ip)])
        self._route_kubernetes_service()
        self._write_nic_overrides()
        self._start_holder()

    def _route_kubernetes_service(self) -> None:
        """What kube-proxy does for the `kubernetes` Service on a real node, and all pods here need of it:
        its ClusterIP leads to the apiserver (in-cluster clients: the agents' DaemonSet pods)."""
        apiserver = f"{self.spec.management_gateway().ip}:{self.spec.ports.apiserver}"
        for chain in ("OUTPUT", "PREROUTING"):
            processes.run(
                [
                    *("ip", "netns", "exec", self.layout.netns, "iptables", "-t", "nat", "-A", chain),
                    *("-d", f"{SERVICE_IP}/32", "-p", "tcp", "--dport", "443"),
                    *("-j", "DNAT", "--to-destination", apiserver),
                ]
            )

    def _write_nic_overrides(self) -> None:
        overrides = {
            nic.name: properties
            for nic in self.node.nics
            if (properties := msgspec.to_builtins(nic.properties))
        }
        self.layout.nic_overrides.parent.mkdir(parents=True, exist_ok=True)
        self.layout.nic_overrides.write_text(
            yaml.safe_dump(
                {"apiVersion": "netclaim.dev/v1alpha1", "kind": "NicOverrides", "interfaces": overrides}
            )
        )

    def _start_holder(self) -> None:
        env = {
            "NODE": self.node.name,
            "NETNS": self.layout.netns,
            "STASH": str(self.layout.root / "cgroup-stash"),
            "BINDS": " ".join(f"{source}={target}" for source, target in self._host_paths()),
        }
        daemon = processes.start(
            _HOLDER,
            ["unshare", "--mount", "--uts", "--propagation", "slave", "sh", "-c", _HOLDER_SCRIPT],
            pid_dir=self.pid_dir,
            log_dir=self.log_dir,
            env=env,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if "ready" in daemon.log.read_text():
                return
            if not processes.alive(daemon.pid):
                break
            time.sleep(0.05)
        raise TransientError(f"node {self.node.name}: namespace holder failed; see {daemon.log}")

    def _host_paths(self) -> tuple[tuple[Path, str], ...]:
        paths = self.layout.host_paths(self.cluster.cni_bin)
        if self.spec.runtime == "crio":
            paths += self.layout.crio_host_paths()
        for source, _ in paths:
            if source == self.layout.xtables_lock:
                source.touch()
            else:
                source.mkdir(parents=True, exist_ok=True)
        return paths

    def holder_pid(self) -> int:
        entry = processes.recorded(self.pid_dir, _HOLDER)
        if entry is None or not processes.alive(*entry):
            raise TransientError(f"node {self.node.name} is not running (no namespace holder)")
        # The recorded pid is `unshare`; after its execs it is `sleep infinity` inside all namespaces.
        return entry[0]

    def enter(self) -> list[str]:
        """Command prefix that runs a program inside this node's namespaces."""
        return ["nsenter", "-t", str(self.holder_pid()), "-m", "-n", "-u", "--"]

    def start_daemon(self, name: str, command: list[str], env: dict[str, str] | None = None) -> None:
        processes.start(name, [*self.enter(), *command], pid_dir=self.pid_dir, log_dir=self.log_dir, env=env)

    def create_cgroup_root(self) -> None:
        for hierarchy in _cgroup_hierarchies():
            path = hierarchy / self.layout.cgroup_root.lstrip("/")
            path.mkdir(exist_ok=True)
            if hierarchy.name == "cpuset":
                for knob in ("cpuset.cpus", "cpuset.mems"):
                    (path / knob).write_text((hierarchy / knob).read_text())

    def write_cni_config(self) -> None:
        self.layout.cni_conf_dir.mkdir(parents=True, exist_ok=True)
        gateway = str(next(self.pod_cidr.hosts()))
        conflist = {
            "cniVersion": "1.0.0",
            "name": "netclaim-pods",
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": "cni0",
                    "isGateway": True,
                    "ipMasq": False,
                    "hairpinMode": True,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{"subnet": str(self.pod_cidr), "gateway": gateway}]],
                        "routes": [{"dst": "0.0.0.0/0"}],
                    },
                }
            ],
        }
        (self.layout.cni_conf_dir / "10-netclaim-pods.conflist").write_text(json.dumps(conflist, indent=2))

    @property
    def runtime(self) -> str:
        """The node's runtime, as its process is named: containerd or crio."""
        return self.spec.runtime

    @property
    def runtime_socket(self) -> Path:
        """The CRI socket of the node's runtime (kubelet's containerRuntimeEndpoint, crictl's)."""
        return self.layout.crio_socket if self.runtime == "crio" else self.layout.containerd_socket

    def start_runtime(self) -> None:
        if self.runtime == "crio":
            self.start_crio()
        else:
            self.start_containerd()

    def share_root(self) -> None:
        """CRI-O and containerd 1.7 check a HostToContainer hostPath's propagation on the mount its path
        falls under without resolving a symlinked parent: /var/run/netns (the agent's) falls under "/",
        which must then be shared or a slave, as systemd makes it on a real node; the node's "/" is private
        otherwise (this machine's PID 1 is not systemd), and the runtime refuses the agent's container
        ("path /var/run/netns is mounted on / but it is not a shared or slave mount")."""
        processes.run([*self.enter(), "mount", "--make-shared", "/"])

    def start_crio(self) -> None:
        root = self.layout.crio_dir
        for directory in (root / "conf.d", root / "hooks", root / "nri-plugins", root / "nri-conf"):
            directory.mkdir(parents=True, exist_ok=True)
        (root / "policy.json").write_text(json.dumps({"default": [{"type": "insecureAcceptAnything"}]}))
        runc = root / "runc"
        runc.write_text(runc_wrapper(RUNC, withheld_capabilities(Path("/proc/self/status").read_text())))
        runc.chmod(0o755)
        self.share_root()
        config = root / "crio.conf"
        config.write_text(
            _crio_config(
                self.layout,
                self.spec.nriRequestTimeout,
                nri=self.node.nri,
                programs=binaries.built_crio_dir(),
            )
        )
        self.start_daemon(
            "crio",
            [
                str(binaries.built_crio_dir() / "crio"),
                f"--config={config}",
                f"--config-dir={root / 'conf.d'}",  # empty: never the machine's /etc/crio/crio.conf.d
            ],
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.layout.crio_socket.is_socket() and self._crictl_answers():
                return
            if not processes.running(self.pid_dir, "crio"):
                break
            time.sleep(0.2)
        raise TransientError(f"node {self.node.name}: CRI-O did not start; see {self.log_dir / 'crio.log'}")

    def _crictl_answers(self) -> bool:
        result = subprocess.run(
            [*self.crictl(), "--timeout", "5s", "version"], capture_output=True, timeout=30, check=False
        )
        return result.returncode == 0

    def start_containerd(self) -> None:
        root = self.layout.containerd_dir
        if self.spec.containerd.startswith("1."):
            self.share_root()
        self.layout.containerd_socket.parent.mkdir(parents=True, exist_ok=True)
        config = root / "config.toml"
        root.mkdir(parents=True, exist_ok=True)
        config.write_text(
            _containerd_config(
                self.layout, self.spec.nriRequestTimeout, nri=self.node.nri, containerd=self.spec.containerd
            )
        )
        self.start_daemon(
            "containerd",
            [str(self.bin / "containerd"), "--config", str(config)],
            env={"PATH": f"{self.bin}:{os.environ.get('PATH', '/usr/bin:/bin')}"},
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.layout.containerd_socket.is_socket() and self._ctr(["version"], check=False):
                return
            time.sleep(0.2)
        raise TransientError(
            f"node {self.node.name}: containerd did not start; see {self.log_dir / 'containerd.log'}"
        )

    def crictl(self) -> list[str]:
        """The command prefix of crictl talking to this node's runtime."""
        return [str(self.bin / "crictl"), "--runtime-endpoint", f"unix://{self.runtime_socket}"]

    def _ctr(self, args: list[str], check: bool = True) -> bool:
        command = [
            str(self.bin / "ctr"),
            "--address",
            str(self.layout.containerd_socket),
            "-n",
            "k8s.io",
            *args,
        ]
        result = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
        if check and result.returncode != 0:
            raise TransientError(
                f"node {self.node.name}: {' '.join(args[:3])} failed: {result.stderr.strip()}"
            )
        return result.returncode == 0

    def import_images(self, archives: dict[str, Path]) -> None:
        """The images of `archives` ({reference: OCI archive}) into the node's runtime, running or not."""
        if self.runtime == "crio":
            self._crio_import(archives)
            return
        for archive in archives.values():
            self._ctr(["images", "import", "--local", str(archive)])

    def _crio_import(self, archives: dict[str, Path]) -> None:
        """Into CRI-O's storage (crio-import: the storage library CRI-O is built from), inside the node,
        whose mount namespace CRI-O's storage mounts live in."""
        root = self.layout.crio_dir
        command = [
            *self.enter(),
            str(binaries.built_crio_dir() / "crio-import"),
            *(str(root / "storage"), str(root / "run" / "storage"), CRIO_STORAGE_DRIVER),
            *(f"{reference}={archive}" for reference, archive in archives.items()),
        ]
        result = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
        if result.returncode != 0:
            raise TransientError(
                f"node {self.node.name}: importing {', '.join(archives)} into CRI-O failed: "
                f"{result.stderr.strip()[-2000:]}"
            )

    def start_kubelet(self, control_plane: ControlPlane) -> None:
        kubelet_dir = self.layout.kubelet_dir
        kubelet_dir.mkdir(parents=True, exist_ok=True)
        control_plane.node_kubeconfig(self.node.name, self.layout.kubeconfig)
        config = self.layout.root / "kubelet-config.yaml"
        config.write_text(yaml.safe_dump(self._kubelet_config(control_plane)))
        labels = ",".join(f"{k}={v}" for k, v in sorted(self.node.labels.items()))
        self.start_daemon(
            "kubelet",
            [
                str(self.bin / "kubelet"),
                f"--config={config}",
                f"--kubeconfig={self.layout.kubeconfig}",
                "--root-dir=/var/lib/kubelet",  # this node's (the holder binds it)
                f"--cert-dir={self.layout.root / 'kubelet-pki'}",
                f"--hostname-override={self.node.name}",
                f"--node-ip={self.address.ip}",
                *([f"--node-labels={labels}"] if labels else []),
                "--v=2",
            ],
        )

    def _kubelet_config(self, control_plane: ControlPlane) -> dict[str, object]:
        return {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "authentication": {
                "anonymous": {"enabled": False},
                "webhook": {"enabled": True},
                "x509": {"clientCAFile": str(control_plane.layout.pki / "ca.crt")},
            },
            "authorization": {"mode": "Webhook"},
            "address": str(self.address.ip),
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "containerRuntimeEndpoint": f"unix://{self.runtime_socket}",
            # This machine runs cgroup v1 (hybrid) and PID 1 is not systemd: kubelet ≥ 1.35 refuses v1
            # unless told otherwise, and only the cgroupfs driver can work without systemd.
            "failCgroupV1": False,
            "cgroupDriver": "cgroupfs",
            "cgroupRoot": self.layout.cgroup_root,
            "failSwapOn": False,
            "podLogsDir": str(self.layout.pod_logs),
            "clusterDomain": "cluster.local",
            "resolvConf": "/etc/resolv.conf",
            "serializeImagePulls": False,
            "evictionHard": {
                "memory.available": "100Mi",
                "nodefs.available": "1%",
                "imagefs.available": "1%",
                "nodefs.inodesFree": "1%",
            },
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "featureGates": dict(self.spec.featureGates),
            "nodeStatusReportFrequency": "10s",
            "maxPods": self.spec.maxPods,
            # On a busy 2-core machine the apiserver's Node authorizer graph can lag a pod's binding by tens
            # of ms; kubelet's first claim lookup is then refused ("no relationship found") and the pod waits
            # for the next full resync, 1 min by default. 10 s keeps churny tests and the soak moving.
            "syncFrequency": "10s",
        }

    # --- teardown ------------------------------------------------------------------------------
    def destroy(self) -> None:
        """Stop everything of this node and remove its namespaces, links and cgroups; safe to repeat.

        Pods are removed while the netclaim agent still runs, so its StopPodSandbox hook undoes their
        interfaces and releases their addresses as it would on a real node."""
        processes.stop(self.pid_dir, "kubelet", grace=10)
        if processes.running(self.pid_dir, self.runtime) and processes.running(self.pid_dir, _HOLDER):
            crictl = [*self.crictl(), "--timeout", "30s"]
            sandboxes = set(processes.run([*crictl, "pods", "-q"], check=False).split())
            agents = set(
                processes.run(
                    [*crictl, "pods", "-q", "--label", "io.kubernetes.pod.namespace=netclaim-system"],
                    check=False,
                ).split()
            )
            # the workloads first, while the agent's pod still answers their StopPodSandbox hooks
            for group in (sorted(sandboxes - agents), sorted(agents)):
                if group:
                    subprocess.run(
                        [*crictl, "rmp", "--force", *group], capture_output=True, timeout=120, check=False
                    )
        processes.stop(self.pid_dir, self.runtime, grace=10)
        if self.runtime == "crio":  # conmon, each in its pod's cgroup: the cgroup kill below ends any left
            for pid in processes.pids_matching(f"--exit-dir {self.layout.crio_socket.parent / 'exits'}"):
                processes.stop_pid(pid, grace=2)
        else:
            for pid in processes.pids_matching(f"-address {self.layout.containerd_socket}"):
                processes.stop_pid(pid, grace=2)
        self._kill_cgroup_tree()
        processes.stop(self.pid_dir, _HOLDER, grace=2)
        subprocess.run(["ip", "netns", "delete", self.layout.netns], capture_output=True, check=False)
        self._remove_cgroup_tree()

    def _cgroup_dirs(self) -> list[Path]:
        found: list[Path] = []
        for hierarchy in _cgroup_hierarchies():
            top = hierarchy / self.layout.cgroup_root.lstrip("/")
            if top.is_dir():
                found += sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts))
                found.append(top)
        return found

    def _kill_cgroup_tree(self) -> None:
        for _ in range(20):
            pids = set()
            for directory in self._cgroup_dirs():
                with contextlib.suppress(OSError):
                    pids |= {int(p) for p in (directory / "cgroup.procs").read_text().split()}
            if not pids:
                return
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.1)

    def _remove_cgroup_tree(self) -> None:
        for _ in range(50):
            leftovers = []
            for directory in self._cgroup_dirs():
                try:
                    directory.rmdir()
                except OSError:
                    leftovers.append(directory)
            if not leftovers:
                return
            time.sleep(0.1)


def install_cni_plugins(layout: ClusterLayout, plugins: Path, bin_dir: Path, pinned: tuple[str, ...]) -> None:
    """Every node's /opt/cni/bin: the plugins of the `plugins` directory (the reference set or Debian's)
    and the pinned ones the cluster programs include, hard-linked (copied across file systems). Not
    symlinks: the agent runs only plugins whose real file is in its --cni-bin-dir. Entries already there
    are kept, so a test may wrap a plugin."""
    directory = layout.cni_bin
    directory.mkdir(parents=True, exist_ok=True)
    sources = [p for p in sorted(plugins.iterdir()) if p.is_file() and not p.name.startswith(".")]
    for source in sources + [bin_dir / name for name in pinned]:
        target = directory / source.name
        if target.exists():
            continue
        try:
            os.link(source, target)
        except OSError:  # another file system: a copy, renamed into place whole
            partial = target.with_name(f".{target.name}.{os.getpid()}")
            shutil.copy2(source, partial)
            partial.rename(target)


def _cgroup_hierarchies() -> list[Path]:
    return sorted(p for p in CGROUP_V1_ROOT.iterdir() if p.is_dir() and not p.is_symlink())


def _containerd_config(layout: NodeLayout, nri_request_timeout: str, *, nri: bool, containerd: str) -> str:
    """The node's containerd configuration: version 3 (containerd 2.x) or version 2 (containerd 1.7, whose
    CRI settings live in one plugin and whose NRI is off unless enabled here)."""
    root = layout.containerd_dir
    cri = _cri_config_v2(root) if containerd.startswith("1.") else _cri_config_v3(root)
    return f"""version = {2 if containerd.startswith("1.") else 3}
root = "{root / "root"}"
state = "{root / "state"}"

[grpc]
  address = "{layout.containerd_socket}"

[ttrpc]
  address = "{layout.containerd_socket}.ttrpc"

[plugins.'io.containerd.internal.v1.opt']
  path = "{root / "opt"}"
{cri}
[plugins.'io.containerd.nri.v1.nri']
  disable = {"false" if nri else "true"}
  socket_path = "/var/run/nri/nri.sock"
  plugin_path = "{root / "nri-plugins"}"
  plugin_config_path = "{root / "nri-conf"}"
  plugin_registration_timeout = "5s"
  plugin_request_timeout = "{nri_request_timeout}"
"""


# This VM withholds CAP_SYS_RESOURCE even from root, so the negative oom_score_adj kubelet asks for
# (sandboxes -998, Guaranteed pods -997) cannot be written: restrict_oom_score_adj clamps to containerd's own.
def _cri_config_v3(root: Path) -> str:
    return f"""
[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "{PAUSE_IMAGE}"

[plugins.'io.containerd.cri.v1.runtime']
  restrict_oom_score_adj = true
  enable_cdi = true
  cdi_spec_dirs = ["/var/run/cdi"]
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["/opt/cni/bin"]
    conf_dir = "/etc/cni/net.d"
    max_conf_num = 1
  [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
      BinaryName = "{RUNC}"
      Root = "{root / "runc"}"
      SystemdCgroup = false

[plugins.'io.containerd.grpc.v1.cri']
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
"""


def _cri_config_v2(root: Path) -> str:
    return f"""
[plugins.'io.containerd.grpc.v1.cri']
  sandbox_image = "{PAUSE_IMAGE}"
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  restrict_oom_score_adj = true
  enable_cdi = true
  cdi_spec_dirs = ["/var/run/cdi"]
  [plugins.'io.containerd.grpc.v1.cri'.cni]
    bin_dir = "/opt/cni/bin"
    conf_dir = "/etc/cni/net.d"
    max_conf_num = 1
  [plugins.'io.containerd.grpc.v1.cri'.containerd]
    snapshotter = "overlayfs"
    [plugins.'io.containerd.grpc.v1.cri'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins.'io.containerd.grpc.v1.cri'.containerd.runtimes.runc.options]
        BinaryName = "{RUNC}"
        Root = "{root / "runc"}"
        SystemdCgroup = false
"""


# CRI-O's runtime: runc behind this wrapper, which smooths over three things of this VM in a bundle's
# config.json (create) or an exec's process file (indented JSON: sed -z edits it whole), as containerd's
# options or defaults do for its nodes:
# - a negative oomScoreAdj becomes 0: the VM withholds CAP_SYS_RESOURCE even from root, so the -998 CRI-O
#   gives every sandbox (hard-coded) and the -997 kubelet gives a Guaranteed pod's containers cannot be
#   written; CRI-O has no option to restrict them (containerd: restrict_oom_score_adj);
# - the capabilities the machine's bounding set lacks (CAP_SYS_RESOURCE) are left out: CRI-O gives a
#   privileged container every capability the kernel knows, and runc fails to apply one it does not hold
#   ("unable to apply caps: operation not permitted"); containerd gives the ones it holds;
# - hugepageLimits become none: the kernel lists hugetlb in /proc/cgroups, which is all CRI-O checks, but
#   no hugetlb hierarchy is mounted, so runc fails every container with limits ("cannot set hugetlb
#   limit"); CRI-O has no option to leave them out (containerd: tolerate_missing_hugetlb_controller).
_RUNC_WRAPPER = """#!/bin/sh
previous=
for argument in "$@"; do
  case "$previous" in --bundle|-b) edit="$argument/config.json";; --process|-p) edit="$argument";; esac
  case "$argument" in
    --bundle=*) edit="${{argument#--bundle=}}/config.json";;
    --process=*) edit="${{argument#--process=}}";;
  esac
  previous=$argument
done
if [ -n "$edit" ] && [ -f "$edit" ]; then
  sed -z -i -E -e 's/"oomScoreAdj":[[:space:]]*-[0-9]+/"oomScoreAdj":0/g' \\
    -e 's/"hugepageLimits":[[:space:]]*\\[[^]]*\\]/"hugepageLimits":[]/g' {capabilities}"$edit"
fi
exec {runc} "$@"
"""
# capability(7)'s numbers, 0 to 40
_CAPABILITIES = (
    "CHOWN", "DAC_OVERRIDE", "DAC_READ_SEARCH", "FOWNER", "FSETID", "KILL", "SETGID", "SETUID", "SETPCAP",
    "LINUX_IMMUTABLE", "NET_BIND_SERVICE", "NET_BROADCAST", "NET_ADMIN", "NET_RAW", "IPC_LOCK", "IPC_OWNER",
    "SYS_MODULE", "SYS_RAWIO", "SYS_CHROOT", "SYS_PTRACE", "SYS_PACCT", "SYS_ADMIN", "SYS_BOOT", "SYS_NICE",
    "SYS_RESOURCE", "SYS_TIME", "SYS_TTY_CONFIG", "MKNOD", "LEASE", "AUDIT_WRITE", "AUDIT_CONTROL", "SETFCAP",
    "MAC_OVERRIDE", "MAC_ADMIN", "SYSLOG", "WAKE_ALARM", "BLOCK_SUSPEND", "AUDIT_READ", "PERFMON", "BPF",
    "CHECKPOINT_RESTORE",
)  # fmt: skip


def withheld_capabilities(status: str) -> list[str]:
    """The capabilities of capability(7) missing from the bounding set of a /proc/<pid>/status."""
    bounding = int(next(line.split()[1] for line in status.splitlines() if line.startswith("CapBnd:")), 16)
    return [f"CAP_{name}" for bit, name in enumerate(_CAPABILITIES) if not bounding >> bit & 1]


def runc_wrapper(runc: Path, withheld: list[str]) -> str:
    """_RUNC_WRAPPER, leaving the capabilities `withheld` out of every list (first, middle, last, only)."""
    edits = "".join(
        f"-e 's/\"{cap}\",[[:space:]]*//g' -e 's/,[[:space:]]*\"{cap}\"//g' -e 's/\"{cap}\"//g' "
        for cap in withheld
    )
    return _RUNC_WRAPPER.format(runc=runc, capabilities=edits)


def _crio_config(layout: NodeLayout, nri_request_timeout: str, *, nri: bool, programs: Path) -> str:
    """The node's CRI-O configuration: every path under the node's directory (or at a path the node binds
    to its own: CRIO_RUN, /var/run/netns, /var/run/nri, /etc/cni/net.d, /opt/cni/bin, /var/run/cdi),
    cgroupfs as kubelet's driver, runc through _RUNC_WRAPPER, NRI as containerd's."""
    root = layout.crio_dir
    run = CRIO_RUN  # layout.crio_socket's directory, inside the node: short (attach sockets)
    capabilities = ", ".join(f'"{c}"' for c in CRIO_CAPABILITIES)
    return f"""[crio]
root = "{root / "storage"}"
runroot = "{root / "run" / "storage"}"
storage_driver = "{CRIO_STORAGE_DRIVER}"
log_dir = "{root / "pod-logs"}"
version_file = "{run}/version"
version_file_persist = "{root / "version"}"
clean_shutdown_file = "{root / "clean.shutdown"}"

[crio.api]
listen = "{layout.crio_socket}"
stream_address = "127.0.0.1"
stream_port = "0"

[crio.runtime]
default_runtime = "runc"
cgroup_manager = "cgroupfs"
conmon_cgroup = "pod"
pinns_path = "{programs / "pinns"}"
namespaces_dir = "/var/run"
container_exits_dir = "{run}/exits"
container_attach_socket_dir = "{run}"
hooks_dir = ["{root / "hooks"}"]
cdi_spec_dirs = ["/var/run/cdi"]
selinux = false
seccomp_profile = ""
apparmor_profile = ""
# CRI-O's defaults and NET_RAW, which containerd's include: the demo and the tests ping from pods, and
# baseline Pod Security (the apiserver's default here) forbids a pod to ask for it
default_capabilities = [{capabilities}]

[crio.runtime.runtimes.runc]
runtime_path = "{root / "runc"}"
runtime_type = "oci"
runtime_root = "{root / "runc-state"}"
monitor_path = "{CONMON}"
monitor_cgroup = "pod"

[crio.image]
signature_policy = "{root / "policy.json"}"
signature_policy_dir = "{root / "policies"}"
pause_image = "{PAUSE_IMAGE}"

[crio.network]
network_dir = "/etc/cni/net.d/"
plugin_dirs = ["/opt/cni/bin/"]

[crio.metrics]
enable_metrics = false

[crio.nri]
enable_nri = {"true" if nri else "false"}
nri_listen = "/var/run/nri/nri.sock"
nri_plugin_dir = "{root / "nri-plugins"}"
nri_plugin_config_dir = "{root / "nri-conf"}"
nri_plugin_registration_timeout = "5s"
nri_plugin_request_timeout = "{nri_request_timeout}"
"""

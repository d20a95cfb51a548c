"""Where everything of one local cluster lives on disk, and how its kernel objects are named."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

# The checkout the lab runs from (deploy/, examples/, image/, tools/), three levels above this package's
# directory (lab/src/netclaim_lab/): the lab is installed editable from it, never alone.
REPO_ROOT = Path(__file__).resolve().parents[3]

# a CRI-O node's run directory inside the node (NodeLayout.crio_host_paths)
CRIO_RUN = "/run/lab-crio"
STATE_ROOT = Path(os.environ.get("NETCLAIM_CLUSTER_ROOT", "/var/lib/netclaim-cluster"))


@dataclass(frozen=True)
class NodeLayout:
    cluster: str
    name: str
    root: Path

    @property
    def netns(self) -> str:
        return f"nc-{self.cluster}-{self.name}"

    @property
    def kubelet_dir(self) -> Path:
        return self.root / "kubelet"

    @property
    def containerd_dir(self) -> Path:
        return self.root / "containerd"

    @property
    def containerd_socket(self) -> Path:
        return self.root / "run" / "containerd.sock"

    @property
    def crio_dir(self) -> Path:
        """CRI-O's state on a node whose runtime is crio: its storage, configuration and runtime files."""
        return self.root / "crio"

    @property
    def crio_socket(self) -> Path:
        return self.crio_dir / "run" / "crio.sock"

    def crio_host_paths(self) -> tuple[tuple[Path, str], ...]:
        """What a CRI-O node binds beside host_paths: its run directory (socket, exit files, attach sockets,
        whose full path CRI-O dials: it must be short) at /run/lab-crio, not at CRI-O's default /run/crio,
        and the directories where CRI-O pins a sandbox's IPC, UTS, user and PID namespaces (its
        namespaces_dir is /var/run, so that the network namespace lands in the node's /var/run/netns as
        containerd's does), this node's and no other's.

        Not /run/crio: kubelet's cAdvisor asks the CRI-O it finds at /var/run/crio/crio.sock about every
        crio-<id> cgroup it sees, here every node's (one cgroup tree on this machine), and retries 3 s for
        each container of another node: a kubelet's start took minutes (node registration waits for it).
        Without that socket cAdvisor takes them for plain cgroups, as on containerd's nodes; kubelet's
        stats come from the CRI (its endpoint does not end in run/crio/crio.sock)."""
        pins = tuple(
            (self.crio_dir / "ns" / kind, f"/run/{kind}") for kind in ("ipcns", "utsns", "userns", "pidns")
        )
        return ((self.crio_socket.parent, CRIO_RUN), *pins)

    @property
    def nri_dir(self) -> Path:
        """The node's /var/run/nri."""
        return self.root / "nri"

    @property
    def cdi_dir(self) -> Path:
        """The node's /var/run/cdi."""
        return self.root / "cdi"

    @property
    def netns_dir(self) -> Path:
        """The node's /var/run/netns, where containerd pins pod network namespaces."""
        return self.root / "netns"

    @property
    def state_dir(self) -> Path:
        """The node's /var/lib/netclaim: the agent's durable state."""
        return self.root / "netclaim"

    @property
    def cni_dir(self) -> Path:
        """The node's /var/lib/cni (host-local reservations under networks/)."""
        return self.root / "cni"

    @property
    def cni_conf_dir(self) -> Path:
        """The node's /etc/cni/net.d."""
        return self.root / "cni-conf"

    @property
    def ipam_data_dir(self) -> Path:
        """host-local's default /var/lib/cni/networks of this node: the primary pod network's
        reservations (each network its own directory), as on a real node."""
        return self.cni_dir / "networks"

    @property
    def claims_host_local_dir(self) -> Path:
        """The agent's own host-local directory (its default, in /var/lib/netclaim): a DeviceClass's
        networks under admin/, a claim's under tenant/<namespace>/."""
        return self.state_dir / "host-local"

    @property
    def etc_netclaim(self) -> Path:
        """The node's /etc/netclaim, which the DaemonSet mounts (deploy/daemonset.yaml)."""
        return self.root / "etc-netclaim"

    @property
    def nic_overrides(self) -> Path:
        """Declared NIC properties (speed, NUMA, PCI…) the inventory reads, since veths have none: the
        node's /etc/netclaim/nic-overrides.yaml."""
        return self.etc_netclaim / "nic-overrides.yaml"

    @property
    def pod_logs(self) -> Path:
        """kubelet's podLogsDir of this node."""
        return self.root / "pod-logs"

    @property
    def xtables_lock(self) -> Path:
        return self.root / "xtables.lock"

    def host_paths(self, cni_bin: Path) -> tuple[tuple[Path, str], ...]:
        """(this node's directory, the standard path its processes and pods see it at)."""
        return (
            (self.kubelet_dir, "/var/lib/kubelet"),
            (self.cni_conf_dir, "/etc/cni/net.d"),
            (self.cni_dir, "/var/lib/cni"),
            (cni_bin, "/opt/cni/bin"),
            # empty: a node sees only the lab's /opt/cni/bin, as a kubeadm node does, never this machine's
            # Debian plugins (the agent would find them there, second in its search path)
            (self.root / "no-debian-cni", "/usr/lib/cni"),
            (self.nri_dir, "/run/nri"),
            (self.cdi_dir, "/run/cdi"),
            (self.netns_dir, "/run/netns"),
            (self.state_dir, "/var/lib/netclaim"),
            (self.xtables_lock, "/run/xtables.lock"),
            (self.etc_netclaim, "/etc/netclaim"),
            (self.containerd_socket.parent, "/run/containerd"),  # `ctr` and `crictl` find it there
        )

    @property
    def kubeconfig(self) -> Path:
        return self.root / "kubelet.kubeconfig"

    @property
    def cgroup_root(self) -> str:
        return f"/netclaim-{self.cluster}-{self.name}"


@dataclass(frozen=True)
class ClusterLayout:
    name: str
    root: Path

    @classmethod
    def for_cluster(cls, name: str) -> ClusterLayout:
        return cls(name, STATE_ROOT / name)

    @property
    def spec_copy(self) -> Path:
        return self.root / "cluster.yaml"

    @property
    def pki(self) -> Path:
        return self.root / "pki"

    @property
    def pids(self) -> Path:
        return self.root / "pids"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def etcd_data(self) -> Path:
        return self.root / "etcd"

    @property
    def admin_kubeconfig(self) -> Path:
        return self.root / "admin.kubeconfig"

    @property
    def cni_bin(self) -> Path:
        """Every node's /opt/cni/bin: Debian's plugins and the pinned ones (netclaim_lab.node)."""
        return self.root / "cni-bin"

    @property
    def audit_log(self) -> Path:
        return self.logs / "audit.log"

    def apiserver_audit_log(self, apiserver: str) -> Path:
        """The audit log of the API server `apiserver` (a process name): the main one's is audit_log."""
        return self.audit_log if apiserver == "kube-apiserver" else self.logs / f"audit-{apiserver}.log"

    def node(self, name: str) -> NodeLayout:
        return NodeLayout(self.name, name, self.root / "nodes" / name)

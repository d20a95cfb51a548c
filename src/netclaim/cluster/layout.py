"""Where everything of one local cluster lives on disk, and how its kernel objects are named."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

# The checkout this tooling runs from (deploy/, examples/, tools/): it is dev tooling, never installed alone.
REPO_ROOT = Path(__file__).resolve().parents[3]

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
    def nri_socket(self) -> Path:
        return self.root / "run" / "nri.sock"

    @property
    def cni_conf_dir(self) -> Path:
        return self.root / "cni" / "net.d"

    @property
    def cni_data_dir(self) -> Path:
        """host-local IPAM state of the node's primary pod network."""
        return self.root / "cni" / "networks"

    @property
    def ipam_data_dir(self) -> Path:
        """host-local reservations of the node's claims: the node's own, as on a real node."""
        return self.root / "ipam"

    @property
    def nic_overrides(self) -> Path:
        """Declared NIC properties (speed, NUMA, PCI…) the inventory reads, since veths have none."""
        return self.root / "nic-overrides.yaml"

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
    def audit_log(self) -> Path:
        return self.logs / "audit.log"

    def node(self, name: str) -> NodeLayout:
        return NodeLayout(self.name, name, self.root / "nodes" / name)

"""The local cluster file: a versioned, strict description of nodes and their NICs.

Example::

    apiVersion: netclaim.dev/v1alpha1
    kind: LocalCluster
    name: demo
    segments: [{name: lan0}]
    nodes:
    - name: node-1
      nics:
      - {name: enp0s10, segment: lan0, properties: {speed: 10Gi, numaNode: 0}}
"""

from __future__ import annotations

import hashlib
import ipaddress
from pathlib import Path
from typing import Annotated, Literal

import msgspec

from netclaim.core.config.files import load_yaml_model
from netclaim.core.config.overrides import NicOverride
from netclaim.core.names import DNS_LABEL, MAC, PCIE_ROOT, check_interface_name, pattern
from netclaim.errors import ConfigError

DnsLabel = Annotated[str, msgspec.Meta(min_length=1, max_length=63, pattern=pattern(DNS_LABEL))]
Port = Annotated[int, msgspec.Meta(ge=1024, le=65535)]
# \Z, not $: msgspec matches with re.search, where $ also matches before a final newline
FeatureGate = Annotated[str, msgspec.Meta(pattern=r"^[A-Z][A-Za-z0-9]+\Z")]


def _ipv4_network(field: str, value: str, largest_prefix: int) -> ipaddress.IPv4Network:
    try:
        net = ipaddress.ip_network(value, strict=True)
    except ValueError as err:
        raise ValueError(f"{field}: {err}") from None
    if not isinstance(net, ipaddress.IPv4Network) or net.prefixlen > largest_prefix:
        raise ValueError(f"{field}: must be an IPv4 network of /{largest_prefix} or larger")
    return net


def _duplicates(names: list[str]) -> str:
    return ", ".join(sorted({n for n in names if names.count(n) > 1}))


class Nic(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    name: str  # interface name inside the node, e.g. enp0s10
    segment: str  # the L2 segment (a bridge on the machine) the NIC is cabled to
    mac: str | None = None
    mtu: Annotated[int, msgspec.Meta(ge=68, le=65535)] = 1500
    properties: NicOverride = NicOverride()

    def __post_init__(self) -> None:
        if self.name == "eth0":
            raise ValueError("name: eth0 is the pod network's interface inside the node")
        try:
            check_interface_name(self.name)
        except ValueError as err:
            raise ValueError(f"name: {err}") from None
        if self.mac is not None:
            mac = self.mac.lower()
            if not MAC.fullmatch(mac) or int(mac[:2], 16) & 1:
                raise ValueError("mac: must be a unicast MAC address such as 02:00:00:00:00:01")
            msgspec.structs.force_setattr(self, "mac", mac)


class Gpu(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Fake GPUs of one PCIe root (netclaim_lab.fake_gpus), to align NICs with."""

    pcieRoot: Annotated[str, msgspec.Meta(pattern=pattern(PCIE_ROOT))]
    numaNode: Annotated[int, msgspec.Meta(ge=0, le=63)] = 0
    count: Annotated[int, msgspec.Meta(ge=1, le=64)] = 1


class Node(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    name: DnsLabel
    kubelet: bool = True  # false: a Node object only, kept Ready by the tool
    podCIDR: str | None = None
    nics: list[Nic] = msgspec.field(default_factory=list)
    # fake GPUs published by the node keeper (kubelet: false nodes only)
    gpus: list[Gpu] = msgspec.field(default_factory=list)
    labels: dict[str, str] = msgspec.field(default_factory=dict)
    nri: bool = True  # false: the runtime's NRI is off on this node

    def __post_init__(self) -> None:
        if self.podCIDR is not None:
            _ipv4_network("podCIDR", self.podCIDR, 28)
        if duplicates := _duplicates([nic.name for nic in self.nics]):
            raise ValueError(f"nics: names must be unique within a node: {duplicates}")
        if not self.kubelet and self.nics:
            raise ValueError(
                "nics: a node with kubelet: false has no network namespace and cannot carry nics"
            )
        if self.kubelet and self.gpus:
            # nothing prepares a fake GPU: a pod given one on a kubelet node would never start
            raise ValueError("gpus: only for nodes with kubelet: false (no kubelet plugin prepares them)")


class Segment(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    name: DnsLabel


class Ports(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    apiserver: Port = 6443
    etcdClient: Port = 2379
    etcdPeer: Port = 2380
    # a second kube-apiserver on the same etcd, for the agents only (as HA clusters run several; RBAC
    # authorization alone): its metrics then count exactly what the agents are sent
    agentApiserver: Port | None = None
    schedulerMetrics: Port | None = None  # kube-scheduler's /metrics on 127.0.0.1 (unset: none)


class ClusterSpec(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    apiVersion: Literal["netclaim.dev/v1alpha1"]
    kind: Literal["LocalCluster"]
    name: Annotated[str, msgspec.Meta(min_length=1, max_length=20, pattern=pattern(DNS_LABEL))]
    managementCIDR: str = "10.201.0.0/24"
    podCIDR: str = "10.244.0.0/16"  # split into one /24 per node
    ports: Ports = Ports()
    segments: list[Segment] = msgspec.field(default_factory=list)
    nodes: Annotated[list[Node], msgspec.Meta(min_length=1)]
    # the runtime's NRI plugin request timeout (README: raise it for slow chains)
    nriRequestTimeout: Annotated[str, msgspec.Meta(pattern=r"^[1-9][0-9]?s\Z")] = "2s"
    maxPods: Annotated[int, msgspec.Meta(ge=10, le=250)] = 110  # kubelet's maxPods on every node
    # the Kubernetes minor version of the control plane and the kubelets (1.37.2 is the pinned programs';
    # the others, 1.34.4, 1.35.4 and 1.36.3, are built for make test-matrix)
    kubernetes: Literal["1.34", "1.35", "1.36", "1.37"] = "1.37"
    # the containerd minor version of every node (2.4.2 is the pinned programs'; 1.7.35, 2.0.14 and 2.2.9,
    # whose NRI v0.8 and v0.11 send pod events as StateChange, are built for make test-matrix; 1.7 only
    # with Kubernetes 1.34 or 1.35, the last releases whose kubelet runs on containerd 1.x)
    containerd: Literal["1.7", "2.0", "2.2", "2.4"] = "2.4"
    # every node's container runtime: containerd (of the version above), or CRI-O 1.36.3 (NRI v0.11: pod
    # events as StateChange) with Debian's conmon and runc, built for make test-matrix
    runtime: Literal["containerd", "crio"] = "containerd"
    # --feature-gates of kube-apiserver, kube-controller-manager, kube-scheduler and kubelet
    featureGates: dict[FeatureGate, bool] = msgspec.field(
        default_factory=lambda: {"DRAConsumableCapacity": True}
    )
    # every node's /opt/cni/bin: containernetworking/plugins as pinned in tools/k8s/cni-plugins (CNI 1.1:
    # STATUS, GC), or Debian's containernetworking-plugins (1.0-level)
    cniPlugins: Literal["reference", "debian"] = "reference"
    # kube-scheduler's clientConnection.qps (burst: twice it)
    schedulerQPS: Annotated[int, msgspec.Meta(ge=1, le=10000)] = 50
    # kube-controller-manager's --kube-api-qps (burst: twice it)
    controllerManagerQPS: Annotated[int, msgspec.Meta(ge=1, le=10000)] = 20

    def __post_init__(self) -> None:
        management = _ipv4_network("managementCIDR", self.managementCIDR, 24)
        _ipv4_network("podCIDR", self.podCIDR, 24)
        if duplicates := _duplicates([n.name for n in self.nodes]):
            raise ValueError(f"nodes: names must be unique: {duplicates}")
        segment_names = {s.name for s in self.segments}
        for index, node in enumerate(self.nodes):
            for nic_index, nic in enumerate(node.nics):
                if nic.segment not in segment_names:
                    raise ValueError(
                        f"nodes[{index}].nics[{nic_index}].segment: {nic.segment!r} is not one of "
                        f"the declared segments {sorted(segment_names)}"
                    )
        if len(self.nodes) > management.num_addresses - 12:
            raise ValueError("managementCIDR: too small for that many nodes")
        if self.runtime == "crio" and self.containerd != "2.4":
            raise ValueError("containerd: a version is for runtime: containerd only (this cluster runs crio)")
        if self.containerd == "1.7" and self.kubernetes not in ("1.34", "1.35"):
            raise ValueError(
                f"containerd: 1.7 runs only with kubernetes 1.34 or 1.35 (kubelet {self.kubernetes} "
                "needs containerd 2)"
            )

    @property
    def link_prefix(self) -> str:
        """Prefix of every link this cluster creates in the machine's netns (≤ 6 chars)."""
        return "nc" + hashlib.sha256(self.name.encode()).hexdigest()[:4]

    def management_gateway(self) -> ipaddress.IPv4Interface:
        net = ipaddress.IPv4Network(self.managementCIDR)
        return ipaddress.IPv4Interface(f"{net.network_address + 1}/{net.prefixlen}")

    def node_address(self, index: int) -> ipaddress.IPv4Interface:
        net = ipaddress.IPv4Network(self.managementCIDR)
        return ipaddress.IPv4Interface(f"{net.network_address + 10 + index}/{net.prefixlen}")

    def node_pod_cidr(self, index: int) -> ipaddress.IPv4Network:
        declared = self.nodes[index].podCIDR
        if declared:
            return ipaddress.IPv4Network(declared)
        subnets = ipaddress.IPv4Network(self.podCIDR).subnets(new_prefix=24)
        for position, subnet in enumerate(subnets):
            if position == index + 1:
                return subnet
        raise ConfigError(f"podCIDR {self.podCIDR} has too few /24s for node {index}")


def load_cluster_spec(path: Path) -> ClusterSpec:
    """Read and validate a cluster file; every error names the file and the field."""
    return load_yaml_model(path, ClusterSpec, "kind: LocalCluster")

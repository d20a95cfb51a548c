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

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from netclaim.core.config.files import load_yaml_model
from netclaim.core.config.overrides import NicOverride
from netclaim.core.names import DNS_LABEL, MAC, check_interface_name, pattern
from netclaim.errors import ConfigError

DnsLabel = Annotated[str, Field(min_length=1, max_length=63, pattern=pattern(DNS_LABEL))]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=False)


class Nic(_Strict):
    name: str = Field(description="interface name inside the node, e.g. enp0s10")
    segment: str = Field(description="the L2 segment (a bridge on the machine) the NIC is cabled to")
    mac: str | None = None
    mtu: int = Field(default=1500, ge=68, le=65535)
    properties: NicOverride = NicOverride()

    @field_validator("name")
    @classmethod
    def _ifname(cls, value: str) -> str:
        if value == "eth0":
            raise ValueError("eth0 is the pod network's interface inside the node")
        return check_interface_name(value)

    @field_validator("mac")
    @classmethod
    def _mac(cls, value: str | None) -> str | None:
        if value is not None:
            value = value.lower()
            if not MAC.fullmatch(value) or int(value[:2], 16) & 1:
                raise ValueError("must be a unicast MAC address such as 02:00:00:00:00:01")
        return value


class Gpu(_Strict):
    """Fake GPUs of one PCIe root (netclaim_lab.fake_gpus), to align NICs with."""

    pcieRoot: Annotated[str, Field(pattern=r"^pci[0-9a-f]{4}:[0-9a-f]{2}$")]
    numaNode: int = Field(default=0, ge=0, le=63)
    count: int = Field(default=1, ge=1, le=64)


class Node(_Strict):
    name: DnsLabel
    kubelet: bool = Field(default=True, description="false: a Node object only, kept Ready by the tool")
    podCIDR: str | None = None
    nics: list[Nic] = []
    gpus: list[Gpu] = Field(
        default=[], description="fake GPUs published by the node keeper (kubelet: false nodes only)"
    )
    labels: dict[str, str] = {}
    nri: bool = Field(default=True, description="false: containerd's NRI is off on this node")

    @field_validator("podCIDR")
    @classmethod
    def _pod_cidr(cls, value: str | None) -> str | None:
        if value is not None:
            net = ipaddress.ip_network(value, strict=True)
            if net.version != 4 or net.prefixlen > 28:
                raise ValueError("must be an IPv4 network of /28 or larger")
        return value

    @model_validator(mode="after")
    def _unique_nics(self) -> Node:
        names = [nic.name for nic in self.nics]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"nic names must be unique within a node: {', '.join(duplicates)}")
        if not self.kubelet and self.nics:
            raise ValueError("a node with kubelet: false has no network namespace and cannot carry nics")
        if self.kubelet and self.gpus:
            # nothing prepares a fake GPU: a pod given one on a kubelet node would never start
            raise ValueError("gpus are for nodes with kubelet: false (no kubelet plugin prepares them)")
        return self


class Segment(_Strict):
    name: DnsLabel


class Ports(_Strict):
    apiserver: int = Field(default=6443, ge=1024, le=65535)
    etcdClient: int = Field(default=2379, ge=1024, le=65535)
    etcdPeer: int = Field(default=2380, ge=1024, le=65535)
    agentApiserver: int | None = Field(
        default=None,
        ge=1024,
        le=65535,
        description="a second kube-apiserver on the same etcd, for the agents only (as HA clusters run "
        "several; RBAC authorization alone): its metrics then count exactly what the agents are sent",
    )
    schedulerMetrics: int | None = Field(
        default=None, ge=1024, le=65535, description="kube-scheduler's /metrics on 127.0.0.1 (unset: none)"
    )


class ClusterSpec(_Strict):
    apiVersion: Literal["netclaim.dev/v1alpha1"]
    kind: Literal["LocalCluster"]
    name: Annotated[str, Field(min_length=1, max_length=20, pattern=pattern(DNS_LABEL))]
    managementCIDR: str = "10.201.0.0/24"
    podCIDR: str = Field(default="10.244.0.0/16", description="split into one /24 per node")
    ports: Ports = Ports()
    segments: list[Segment] = []
    nodes: list[Node] = Field(min_length=1)
    nriRequestTimeout: Annotated[str, Field(pattern=r"^[1-9][0-9]?s$")] = Field(
        default="2s", description="containerd's NRI plugin_request_timeout (README: raise it for slow chains)"
    )
    maxPods: int = Field(default=110, ge=10, le=250, description="kubelet's maxPods on every node")
    kubernetes: Literal["1.34", "1.35", "1.36", "1.37"] = Field(
        default="1.37",
        description="the Kubernetes minor version of the control plane and the kubelets (1.37.2 is the "
        "pinned programs'; the others, 1.34.4, 1.35.4 and 1.36.3, are built for make test-matrix)",
    )
    containerd: Literal["2.0", "2.2", "2.4"] = Field(
        default="2.4",
        description="the containerd minor version of every node (2.4.2 is the pinned programs'; 2.0.14 and "
        "2.2.9, whose NRI v0.8 and v0.11 send pod events as StateChange, are built for make test-matrix)",
    )
    featureGates: dict[Annotated[str, Field(pattern=r"^[A-Z][A-Za-z0-9]+$")], bool] = Field(
        default={"DRAConsumableCapacity": True},
        description="--feature-gates of kube-apiserver, kube-controller-manager, kube-scheduler and kubelet",
    )
    cniPlugins: Literal["reference", "debian"] = Field(
        default="reference",
        description="every node's /opt/cni/bin: containernetworking/plugins as pinned in "
        "tools/k8s/cni-plugins (CNI 1.1: STATUS, GC), or Debian's containernetworking-plugins (1.0-level)",
    )
    schedulerQPS: int = Field(
        default=50, ge=1, le=10000, description="kube-scheduler's clientConnection.qps (burst: twice it)"
    )
    controllerManagerQPS: int = Field(
        default=20, ge=1, le=10000, description="kube-controller-manager's --kube-api-qps (burst: twice it)"
    )

    @field_validator("managementCIDR", "podCIDR")
    @classmethod
    def _cidr(cls, value: str) -> str:
        net = ipaddress.ip_network(value, strict=True)
        if net.version != 4 or net.prefixlen > 24:
            raise ValueError("must be an IPv4 network of /24 or larger")
        return value

    @model_validator(mode="after")
    def _references(self) -> ClusterSpec:
        node_names = [n.name for n in self.nodes]
        duplicates = sorted({n for n in node_names if node_names.count(n) > 1})
        if duplicates:
            raise ValueError(f"node names must be unique: {', '.join(duplicates)}")
        segment_names = {s.name for s in self.segments}
        for index, node in enumerate(self.nodes):
            for nic_index, nic in enumerate(node.nics):
                if nic.segment not in segment_names:
                    raise ValueError(
                        f"nodes[{index}].nics[{nic_index}].segment: {nic.segment!r} is not one of "
                        f"the declared segments {sorted(segment_names)}"
                    )
        if len(self.nodes) > ipaddress.ip_network(self.managementCIDR).num_addresses - 12:
            raise ValueError("managementCIDR is too small for that many nodes")
        return self

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

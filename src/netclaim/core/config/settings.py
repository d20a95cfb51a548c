"""Agent settings from flags, environment (NETCLAIM_<NAME>) and an optional file, in that precedence."""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator

from netclaim.core.config.files import validate_strict
from netclaim.core.names import DRIVER_DOMAIN
from netclaim.errors import ConfigError


def _driver_name() -> Any:
    return Field(
        default=DRIVER_DOMAIN,
        pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$",
        max_length=63,
        description="the DRA driver's name",
    )


def _log_level() -> Any:
    return Field(
        default="info", pattern=r"^(debug|info|warning|error)$", description="debug, info, warning or error"
    )


def _kubeconfig() -> Any:
    return Field(default=None, description="default: the in-cluster ServiceAccount, else $KUBECONFIG")


class AgentSettings(BaseModel):
    """`netclaim agent`: one per node. Each field is a flag (--kebab-case), a variable (NETCLAIM_UPPER_CASE)
    and a key of the --config file."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    node_name: str = Field(min_length=1, max_length=253, description="this node (default $NODE_NAME)")
    kubeconfig: Path | None = _kubeconfig()
    driver_name: str = _driver_name()
    namespace: str = Field(
        default="netclaim-system",
        pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
        max_length=63,
        description="netclaim's own, where the controller writes the network policy rules",
    )
    kubelet_root_dir: Path = Field(default=Path("/var/lib/kubelet"), description="kubelet's --root-dir")
    kubelet_plugin: bool = Field(default=True, description="serve the kubelet DRA plugin")
    nri_socket: Path | None = Field(
        default=Path("/var/run/nri/nri.sock"), description="containerd's NRI socket ('': no NRI hooks)"
    )
    policy_file: Path | None = Field(
        default=None, description="PublishPolicy YAML (none: nothing is published)"
    )
    nic_overrides: Path | None = Field(default=None, description="NicOverrides YAML: declared NIC facts")
    cni_conf_dir: Path | None = Field(
        default=Path("/etc/cni/net.d"),
        description="the primary network's CNI configs (its bridges are never published)",
    )
    cni_bin_dir: Path = Field(
        default=Path("/opt/cni/bin"), description="the only directory CNI plugins run from"
    )
    cni_plugins: str = Field(default="", description="comma-separated allow-list of plugin types; empty: all")
    check_seconds: float = Field(
        default=300.0,
        ge=0,
        description="CNI CHECK of every attached interface this often, repaired by DEL and ADD when it "
        "fails (0: never)",
    )
    ipam_data_dir: Path | None = Field(
        default=None,
        description="where host-local IPAM naming no dataDir keeps reservations (default: in state_dir)",
    )
    reserved_cidrs: str = Field(
        default="",
        description="comma-separated networks a claim's own IPAM never uses (the pod and Service CIDRs)",
    )
    inventory_file: Path | None = Field(
        default=None, description="a synthetic inventory instead of netlink (tests)"
    )
    state_dir: Path = Field(default=Path("/var/lib/netclaim"), description="durable state")
    cdi_spec_dir: Path | None = Field(
        default=Path("/var/run/cdi"),
        description="where containerd reads CDI specs: each claim's fail-closed hook goes there; '' disables",
    )
    device_metadata: bool = Field(
        default=True,
        description="each claim's interfaces and devices in a file inside its containers (KEP-5304); needs "
        "the CDI spec directory",
    )
    metrics_address: str = Field(default="127.0.0.1:9177", description="host:port for /metrics ('' disables)")
    network_status_annotation: bool = Field(
        default=False,
        description="write Multus's k8s.v1.cni.cncf.io/network-status annotation on pods (two requests per "
        "pod start, and the right to patch pods): for tools that read it; status.devices says the same",
    )
    remove_slices_on_exit: bool = Field(default=False, description="delete this node's slices when stopping")
    log_level: str = _log_level()

    @property
    def host_local_dir(self) -> Path:
        """netclaim's own directory for host-local reservations (never the node's /var/lib/cni)."""
        return self.ipam_data_dir or self.state_dir / "host-local"

    @property
    def reserved_networks(self) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
        return tuple(ipaddress.ip_network(n.strip()) for n in self.reserved_cidrs.split(",") if n.strip())

    @field_validator("reserved_cidrs")
    @classmethod
    def _cidrs(cls, value: str) -> str:
        for network in (n.strip() for n in value.split(",") if n.strip()):
            try:
                ipaddress.ip_network(network)
            except ValueError as err:
                raise ValueError(f"{network!r} is not a network in CIDR form: {err}") from None
        return value


FIELDS = tuple(AgentSettings.model_fields)


class ControllerSettings(BaseModel):
    """`netclaim controller`: one per cluster (IP pools' devices, the address reconciler, Services'
    endpoints, network policies). Each field is a flag (--kebab-case)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kubeconfig: Path | None = _kubeconfig()
    driver_name: str = _driver_name()
    resync_seconds: float = Field(default=30.0, gt=0, description="a full reconcile at least this often")
    address_quarantine_seconds: float = Field(
        default=15.0,
        ge=5,
        description="the least a released pool address stays taken, while rules and Services follow "
        "(netclaim.core.ipam.pools.Quarantine)",
    )
    namespace: str = Field(
        default="netclaim-system",
        pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
        max_length=63,
        description="its own, where it keeps the admission policies' parameters",
    )
    metrics_address: str = Field(default="127.0.0.1:9178", description="host:port for /metrics ('' disables)")
    log_level: str = _log_level()


def load_settings(flags: dict[str, object], config_file: Path | None) -> AgentSettings:
    """Flags (non-None) override NETCLAIM_* variables, which override the file, which overrides defaults."""
    merged: dict[str, object] = {}
    if config_file is not None:
        try:
            from_file = yaml.safe_load(config_file.read_text()) or {}
        except (OSError, yaml.YAMLError) as err:
            raise ConfigError(f"{config_file}: cannot read the agent settings: {err}") from err
        if not isinstance(from_file, dict):
            raise ConfigError(f"{config_file}: expected a mapping of settings")
        merged.update({str(k).replace("-", "_"): v for k, v in from_file.items()})
    for name in FIELDS:
        value = os.environ.get(f"NETCLAIM_{name.upper()}")
        if value is not None:
            merged[name] = from_text(AgentSettings, name, value, f"NETCLAIM_{name.upper()}")
    if "node_name" not in merged and os.environ.get("NODE_NAME"):
        merged["node_name"] = os.environ["NODE_NAME"]
    merged.update({k: v for k, v in flags.items() if v is not None})
    merged = {k: (str(v) if isinstance(v, Path) else v) for k, v in merged.items()}
    for name in ("nri_socket", "cni_conf_dir", "cdi_spec_dir"):
        if merged.get(name) == "":
            merged[name] = None
    return validate_strict(AgentSettings, merged, "agent settings")


TRUE, FALSE = frozenset({"true", "1", "yes", "on"}), frozenset({"false", "0", "no", "off"})


def from_text(model: type[BaseModel], name: str, text: str, source: str) -> object:
    """A setting's value from a flag's or a variable's text, as its field's type reads it: a word that is
    neither true nor false is an error naming `source`, never false."""
    annotation = model.model_fields[name].annotation
    if annotation is bool:
        if text.lower() in TRUE:
            return True
        if text.lower() in FALSE:
            return False
        raise ConfigError(f"{source}: {text!r} is not a boolean (true or false)")
    if annotation in (int, float):
        try:
            return annotation(text)
        except ValueError:
            raise ConfigError(f"{source}: {text!r} is not a number") from None
    return text

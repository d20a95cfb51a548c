"""Agent settings from flags, environment (NETCLAIM_<NAME>) and an optional file, in that precedence."""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator

from netclaim.core.config.files import validate_strict
from netclaim.errors import ConfigError


class AgentSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    node_name: str = Field(min_length=1, max_length=253)
    kubeconfig: Path | None = None
    driver_name: str = Field(
        default="netclaim.dev", pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$", max_length=63
    )
    namespace: str = Field(  # netclaim's own: where the controller writes the network policy rules
        default="netclaim-system", pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", max_length=63
    )
    kubelet_root_dir: Path = Path("/var/lib/kubelet")
    kubelet_plugin: bool = True
    nri_socket: Path | None = Path("/var/run/nri/nri.sock")
    policy_file: Path | None = None
    nic_overrides: Path | None = None
    cni_conf_dir: Path | None = Path("/etc/cni/net.d")
    cni_bin_dir: Path = Path("/opt/cni/bin")
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
    inventory_file: Path | None = None
    state_dir: Path = Path("/var/lib/netclaim")
    cdi_spec_dir: Path | None = Field(
        default=Path("/var/run/cdi"),
        description="where containerd reads CDI specs: each claim's fail-closed hook goes there; '' disables",
    )
    device_metadata: bool = Field(
        default=True,
        description="each claim's interfaces and devices in a file inside its containers (KEP-5304); needs "
        "the CDI spec directory",
    )
    metrics_address: str = "127.0.0.1:9177"
    network_status_annotation: bool = Field(
        default=False,
        description="write Multus's k8s.v1.cni.cncf.io/network-status annotation on pods (two requests per "
        "pod start, and the right to patch pods): for tools that read it; status.devices says the same",
    )
    remove_slices_on_exit: bool = False
    log_level: str = Field(default="info", pattern=r"^(debug|info|warning|error)$")

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
    """`netclaim controller`: one per cluster (IP pools' devices, the address reconciler)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kubeconfig: Path | None = None
    driver_name: str = Field(
        default="netclaim.dev", pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$", max_length=63
    )
    resync_seconds: float = Field(default=30.0, gt=0)
    # the least a released pool address stays taken before another claim may have it (ipam.pools.Quarantine)
    address_quarantine_seconds: float = Field(default=15.0, ge=5)
    namespace: str = Field(  # its own: where it keeps the admission policies' parameters
        default="netclaim-system", pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", max_length=63
    )
    metrics_address: str = "127.0.0.1:9178"
    log_level: str = Field(default="info", pattern=r"^(debug|info|warning|error)$")


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
            merged[name] = value.lower() in {"1", "true", "yes"} if _is_bool(name) else value
    if "node_name" not in merged and os.environ.get("NODE_NAME"):
        merged["node_name"] = os.environ["NODE_NAME"]
    merged.update({k: v for k, v in flags.items() if v is not None})
    merged = {k: (str(v) if isinstance(v, Path) else v) for k, v in merged.items()}
    for name in ("nri_socket", "cni_conf_dir", "cdi_spec_dir"):
        if merged.get(name) == "":
            merged[name] = None
    return validate_strict(AgentSettings, merged, "agent settings")


def _is_bool(name: str) -> bool:
    return AgentSettings.model_fields[name].annotation is bool

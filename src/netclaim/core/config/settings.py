"""Agent settings from flags, environment (NETCLAIM_<NAME>) and an optional file, in that precedence."""

from __future__ import annotations

import ipaddress
import math
import os
from pathlib import Path
from typing import Annotated, NamedTuple, TypeVar, get_args, get_origin

import msgspec
import yaml

from netclaim.core.config import strict
from netclaim.core.names import DRIVER_DOMAIN
from netclaim.errors import ConfigError

S = TypeVar("S", bound=msgspec.Struct)

DriverName = Annotated[
    str,
    msgspec.Meta(
        pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?\Z", max_length=63, description="the DRA driver's name"
    ),
]
LogLevel = Annotated[
    str, msgspec.Meta(pattern=r"^(debug|info|warning|error)\Z", description="debug, info, warning or error")
]
Kubeconfig = Annotated[
    Path | None, msgspec.Meta(description="default: the in-cluster ServiceAccount, else $KUBECONFIG")
]


# where the reference plugins are installed (kubeadm, most distributions), then Debian's and Ubuntu's package
CNI_BIN_DIRS = "/opt/cni/bin:/usr/lib/cni"


class AgentSettings(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """`netclaim agent`: one per node. Each field is a flag (--kebab-case), a variable (NETCLAIM_UPPER_CASE)
    and a key of the --config file."""

    node_name: Annotated[
        str, msgspec.Meta(min_length=1, max_length=253, description="this node (default $NODE_NAME)")
    ]
    kubeconfig: Kubeconfig = None
    driver_name: DriverName = DRIVER_DOMAIN
    namespace: Annotated[
        str,
        msgspec.Meta(
            pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?\Z",
            max_length=63,
            description="netclaim's own, where the controller writes the network policy rules",
        ),
    ] = "netclaim-system"
    kubelet_root_dir: Annotated[Path, msgspec.Meta(description="kubelet's --root-dir")] = Path(
        "/var/lib/kubelet"
    )
    kubelet_plugin: Annotated[bool, msgspec.Meta(description="serve the kubelet DRA plugin")] = True
    nri_socket: Annotated[
        Path | None, msgspec.Meta(description="containerd's NRI socket ('': no NRI hooks)")
    ] = Path("/var/run/nri/nri.sock")
    policy_file: Annotated[
        Path | None, msgspec.Meta(description="PublishPolicy YAML (none: nothing is published)")
    ] = None
    nic_overrides: Annotated[
        Path | None, msgspec.Meta(description="NicOverrides YAML: declared NIC facts")
    ] = None
    cni_conf_dir: Annotated[
        Path | None,
        msgspec.Meta(description="the primary network's CNI configs (its bridges are never published)"),
    ] = Path("/etc/cni/net.d")
    cni_bin_dir: Annotated[
        str,
        msgspec.Meta(
            description="the directories CNI plugins run from, searched in order (DIR:DIR, as CNI_PATH)"
        ),
    ] = CNI_BIN_DIRS
    cni_plugins: Annotated[
        str, msgspec.Meta(description="comma-separated allow-list of plugin types; empty: all")
    ] = ""
    check_seconds: Annotated[
        float,
        msgspec.Meta(
            ge=0,
            description="CNI CHECK of every attached interface this often, repaired by DEL and ADD when it "
            "fails (0: never)",
        ),
    ] = 300.0
    ipam_data_dir: Annotated[
        Path | None,
        msgspec.Meta(
            description="where host-local IPAM naming no dataDir keeps reservations (default: in state_dir)"
        ),
    ] = None
    reserved_cidrs: Annotated[
        str,
        msgspec.Meta(
            description="comma-separated networks a claim's own IPAM never uses (the pod and Service CIDRs)"
        ),
    ] = ""
    inventory_file: Annotated[
        Path | None, msgspec.Meta(description="a synthetic inventory instead of netlink (tests)")
    ] = None
    state_dir: Annotated[Path, msgspec.Meta(description="durable state")] = Path("/var/lib/netclaim")
    cdi_spec_dir: Annotated[
        Path | None,
        msgspec.Meta(
            description="where containerd reads CDI specs: each claim's fail-closed hook goes there; "
            "'' disables"
        ),
    ] = Path("/var/run/cdi")
    device_metadata: Annotated[
        bool,
        msgspec.Meta(
            description="each claim's interfaces and devices in a file inside its containers (KEP-5304); "
            "needs the CDI spec directory"
        ),
    ] = True
    metrics_address: Annotated[str, msgspec.Meta(description="host:port for /metrics ('' disables)")] = (
        "127.0.0.1:9177"
    )
    network_status_annotation: Annotated[
        bool,
        msgspec.Meta(
            description="write Multus's k8s.v1.cni.cncf.io/network-status annotation on pods (two requests "
            "per pod start, and the right to patch pods): for tools that read it; status.devices says the "
            "same"
        ),
    ] = False
    remove_slices_on_exit: Annotated[
        bool, msgspec.Meta(description="delete this node's slices when stopping")
    ] = False
    log_level: LogLevel = "info"

    @property
    def host_local_dir(self) -> Path:
        """netclaim's own directory for host-local reservations (never the node's /var/lib/cni)."""
        return self.ipam_data_dir or self.state_dir / "host-local"

    @property
    def cni_bin_dirs(self) -> tuple[Path, ...]:
        return tuple(Path(d) for d in self.cni_bin_dir.split(":") if d)

    @property
    def reserved_networks(self) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
        return tuple(ipaddress.ip_network(n.strip()) for n in self.reserved_cidrs.split(",") if n.strip())

    def __post_init__(self) -> None:
        if not self.cni_bin_dirs or not all(d.is_absolute() for d in self.cni_bin_dirs):
            raise ValueError(
                f"cni_bin_dir: {self.cni_bin_dir!r} is not a list of absolute directories (DIR:DIR)"
            )
        for network in (n.strip() for n in self.reserved_cidrs.split(",") if n.strip()):
            try:
                ipaddress.ip_network(network)
            except ValueError as err:
                raise ValueError(
                    f"reserved_cidrs: {network!r} is not a network in CIDR form: {err}"
                ) from None


class ControllerSettings(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """`netclaim controller`: one per cluster (IP pools' devices, the address reconciler, Services'
    endpoints, network policies). Each field is a flag (--kebab-case)."""

    kubeconfig: Kubeconfig = None
    driver_name: DriverName = DRIVER_DOMAIN
    resync_seconds: Annotated[
        float, msgspec.Meta(gt=0, description="a full reconcile at least this often")
    ] = 30.0
    address_quarantine_seconds: Annotated[
        float,
        msgspec.Meta(
            ge=5,
            description="the least a released pool address stays taken, while rules and Services follow "
            "(netclaim.core.ipam.pools.Quarantine)",
        ),
    ] = 15.0
    address_reservation: Annotated[
        str,
        msgspec.Meta(
            pattern=r"^(before-binding|at-prepare)\Z",
            description="when a claim's pool address is taken: at-prepare (kubelet's prepare takes it) or "
            "before-binding (Kubernetes 1.36+: the pools' devices carry a binding condition, the scheduler "
            "binds the pod once the controller holds the address; up to 5 s a pod; docs/ipam.md)",
        ),
    ] = "at-prepare"
    namespace: Annotated[
        str,
        msgspec.Meta(
            pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?\Z",
            max_length=63,
            description="its own, where it keeps the admission policies' parameters",
        ),
    ] = "netclaim-system"
    metrics_address: Annotated[str, msgspec.Meta(description="host:port for /metrics ('' disables)")] = (
        "127.0.0.1:9178"
    )
    log_level: LogLevel = "info"


class Setting(NamedTuple):
    """A settings field as a flag shows it and its text is read."""

    name: str
    kind: object  # its type, without the constraints and the description
    default: object  # None: required
    description: str


def settings_of(model: type[msgspec.Struct]) -> tuple[Setting, ...]:
    """`model`'s fields, their types and descriptions read from their `msgspec.Meta`."""
    return tuple(_setting(field) for field in msgspec.structs.fields(model))


def _setting(field: msgspec.structs.FieldInfo) -> Setting:
    kind, *meta = get_args(field.type) if get_origin(field.type) is Annotated else (field.type,)
    description = next((m.description for m in meta if isinstance(m, msgspec.Meta) and m.description), "")
    return Setting(field.name, kind, None if field.required else field.default, description)


FIELDS = tuple(s.name for s in settings_of(AgentSettings))


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
    return strict.decode(AgentSettings, merged, "agent settings")


TRUE, FALSE = frozenset({"true", "1", "yes", "on"}), frozenset({"false", "0", "no", "off"})


def from_text(model: type[msgspec.Struct], name: str, text: str, source: str) -> object:
    """A setting's value from a flag's or a variable's text, as its field's type reads it: a word that is
    neither true nor false is an error naming `source`, never false."""
    [kind] = [s.kind for s in settings_of(model) if s.name == name]
    if kind is bool:
        if text.lower() in TRUE:
            return True
        if text.lower() in FALSE:
            return False
        raise ConfigError(f"{source}: {text!r} is not a boolean (true or false)")
    if kind is int or kind is float:
        try:
            number = int(text) if kind is int else float(text)
        except ValueError:
            raise ConfigError(f"{source}: {text!r} is not a number") from None
        if not math.isfinite(number):
            raise ConfigError(f"{source}: {text!r} is not a finite number")
        return number
    return text

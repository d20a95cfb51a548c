"""The user and admin config API: `apiVersion: netclaim.dev/v1alpha1` in a DRA opaque config.

    apiVersion: netclaim.dev/v1alpha1
    kind: CNIConfig
    interfaceName: net1              # name inside the pod (default net1)
    bandwidth: enforce               # enforce | none: shape the interface to the consumed bandwidth
    config:                          # a CNI network configuration list, or a single plugin config
      cniVersion: 1.0.0
      name: demo
      plugins:
      - type: macvlan
        master: "{{ device.ifName }}"
        mode: bridge
        ipam: {type: host-local, ranges: [[{subnet: 10.10.1.0/24}]]}

Configs apply in allocation order, DeviceClass (admin) first then claim (user); a later config overrides
the fields it sets. Decoding is strict: unknown apiVersion, kind or field is an error that names the field.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import msgspec

from netclaim.core.config import strict
from netclaim.core.config.cnikeys import CONFLIST_KEYS, spelling_problems
from netclaim.core.config.placeholders import check_placeholders, holds_placeholder
from netclaim.core.ipam.ippool import AddressConfig
from netclaim.core.names import API_VERSION, NETWORK_NAME, PLUGIN_TYPE, check_pod_interface_name
from netclaim.errors import ConfigError

KINDS = ("CNIConfig", "AddressConfig")
MAX_PARAMETERS_BYTES = 10 * 1024
MAX_PLUGINS = 16
MAX_DEVICES_PER_REQUEST = 16
CNI_VERSIONS = ("0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0")
LIFECYCLE_VERSION = (1, 1, 0)  # the spec version that brings STATUS and GC


def version_key(version: str) -> tuple[int, ...]:
    """A CNI spec version (one of CNI_VERSIONS) as numbers, to compare."""
    return tuple(int(part) for part in version.split("."))


def speaks_lifecycle(conflist: dict[str, Any]) -> bool:
    """Whether the chain runs at cniVersion 1.1.0 or later: STATUS and GC exist only there."""
    version = str(conflist.get("cniVersion", ""))
    return version in CNI_VERSIONS and version_key(version) >= LIFECYCLE_VERSION


def garbage_collected(conflist: dict[str, Any]) -> bool:
    """Whether the chain's plugins are sent GC: at 1.1.0 or later, unless the list says `disableGC: true`
    (the spec's key: its plugins' state is someone else's too). What they hold for an attachment the agent
    no longer knows of is then freed by the network's next GC."""
    return speaks_lifecycle(conflist) and conflist.get("disableGC") is not True


RESERVED_PLUGIN_KEYS = ("runtimeConfig", "args", "prevResult")
DEFAULT_INTERFACE = "net1"


Pinnable = Literal["config", "plugins", "ipam", "master", "interfaceName", "bandwidth"]
# Per-plugin parts a DeviceClass can pin, and the keys they are in (compared as Go reads keys).
PINNED_PLUGIN_KEYS: dict[str, tuple[str, ...]] = {"ipam": ("ipam",), "master": ("master", "device")}


class CNIConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True, omit_defaults=True):
    """Its `config` is checked by `decode` (cni_problems), which reports each of its problems."""

    apiVersion: Literal["netclaim.dev/v1alpha1"]
    kind: Literal["CNIConfig"]
    interfaceName: str | None = None  # inside the pod
    bandwidth: Literal["enforce", "none"] | None = None  # default: enforce
    config: dict[str, Any] | None = None  # CNI network config (list) or plugin
    pinned: list[Pinnable] | None = None  # DeviceClass configs only: what a claim's config may not change
    # DeviceClass configs only: devices one request may be allocated (allocationMode All, a count); each
    # gets an interface of its own (net1, net1-1…). Default 1
    devicesPerRequest: Annotated[int, msgspec.Meta(ge=1, le=MAX_DEVICES_PER_REQUEST)] | None = None

    def __post_init__(self) -> None:
        if self.interfaceName is not None:
            try:
                check_pod_interface_name(self.interfaceName)
            except ValueError as err:
                raise ValueError(f"interfaceName: {err}") from None


LIST_ONLY_KEYS = tuple(key for key in CONFLIST_KEYS if key != "plugins")  # beside one plugin's keys


def as_conflist(config: dict[str, Any]) -> dict[str, Any]:
    """A single plugin config becomes a one-plugin list (what libcni does for .conf files)."""
    if "plugins" in config:
        return config
    listed = {key.lower() for key in LIST_ONLY_KEYS}
    plugin = {k: v for k, v in config.items() if k.lower() not in listed}
    return {**{k: v for k, v in config.items() if k.lower() in listed}, "plugins": [plugin]}


def plugin_types(conflist: dict[str, Any]) -> list[str]:
    """Every binary a chain will run: each plugin and each delegated IPAM plugin."""
    types = []
    for plugin in conflist["plugins"]:
        types.append(str(plugin["type"]))
        ipam = plugin.get("ipam")
        if isinstance(ipam, dict) and "type" in ipam:
            types.append(str(ipam["type"]))
    return types


def cni_problems(config: dict[str, Any]) -> Iterator[str]:
    """Everything wrong with a CNI config before placeholders are rendered, as `path: problem`."""
    if len(json.dumps(config)) > MAX_PARAMETERS_BYTES:
        yield f": larger than {MAX_PARAMETERS_BYTES} bytes"
        return
    misspelled = list(spelling_problems(config))
    if misspelled:
        yield from misspelled
        return
    conflist = as_conflist(config)
    name = conflist.get("name")
    if not isinstance(name, str) or not name:
        yield "name: required (the network name; host-local keys its reservations by it)"
    elif not NETWORK_NAME.fullmatch(name) and not holds_placeholder(name):
        yield (
            f"name: {name!r} is not a CNI network name: 1-63 of A-Z a-z 0-9 _ . -, starting with a letter "
            "or digit"
        )
    version = conflist.get("cniVersion")
    versions = conflist.get("cniVersions")
    if version is None and versions is None:
        yield "cniVersion: required"
    if version is not None and version not in CNI_VERSIONS:
        yield f"cniVersion: {version!r} is not one of {list(CNI_VERSIONS)}"
    if versions is not None and (
        not isinstance(versions, list) or not versions or any(v not in CNI_VERSIONS for v in versions)
    ):
        yield f"cniVersions: must be a non-empty list of {list(CNI_VERSIONS)}"
    plugins = conflist.get("plugins")
    if not isinstance(plugins, list) or not plugins:
        yield "plugins: a non-empty list of plugin configs is required"
        return
    if len(plugins) > MAX_PLUGINS:
        yield f"plugins: at most {MAX_PLUGINS}"
    prefix = "plugins" if "plugins" in config else ""
    for index, plugin in enumerate(plugins):
        where = f"{prefix}[{index}]." if prefix else ""
        if not isinstance(plugin, dict):
            yield f"{where.rstrip('.')}: must be an object"
            continue
        yield from _plugin_problems(plugin, where)
    yield from (f"{path}: {problem}" for path, problem in check_placeholders(config))


def _plugin_problems(plugin: dict[str, Any], where: str) -> Iterator[str]:
    kind = plugin.get("type")
    if not isinstance(kind, str) or not PLUGIN_TYPE.fullmatch(kind):
        yield f"{where}type: {kind!r} must be a plugin name (letters, digits, '_', '.', '-'; no path)"
    reserved = {key.lower() for key in RESERVED_PLUGIN_KEYS}
    for key in plugin:
        if key.lower() in reserved:  # CNI plugins read keys case-insensitively
            yield f"{where}{key}: is set by the runtime, not by a config"
    for key in plugin:
        if key.startswith("cni.dev/"):
            yield f"{where}{key}: the cni.dev/ prefix is reserved"
    ipam = plugin.get("ipam")
    if ipam is not None:
        if not isinstance(ipam, dict):
            yield f"{where}ipam: must be an object"
        else:
            ipam_type = ipam.get("type")
            if not isinstance(ipam_type, str) or not PLUGIN_TYPE.fullmatch(ipam_type):
                yield f"{where}ipam.type: {ipam_type!r} must be a plugin name (no path)"
            yield from _address_problems(ipam, f"{where}ipam")


def _address_problems(ipam: dict[str, Any], where: str) -> Iterator[str]:
    def cidr(value: Any, path: str) -> Iterator[str]:
        if holds_placeholder(value):
            return
        try:
            valid = "/" in str(value) and bool(ipaddress.ip_interface(str(value)))
        except ValueError:
            valid = False
        if not valid:
            yield f"{path}: {value!r} is not a CIDR (like 10.10.1.0/24)"

    def address(value: Any, path: str) -> Iterator[str]:
        if holds_placeholder(value):
            return
        try:
            ipaddress.ip_address(str(value))
        except ValueError:
            yield f"{path}: {value!r} is not an IP address"

    if "subnet" in ipam:
        yield from cidr(ipam["subnet"], f"{where}.subnet")
    for key, shape in (
        ("ranges", "a list of lists of range objects"),
        ("routes", "a list of route objects"),
        ("addresses", "a list of address objects"),
    ):
        if key in ipam and not isinstance(ipam[key], list):
            yield f"{where}.{key}: must be {shape}"
    for key in ("routes", "addresses"):
        for i, entry in enumerate(_list(ipam, key)):
            if not isinstance(entry, dict):
                yield f"{where}.{key}[{i}]: must be an object"
    ranges = _list(ipam, "ranges")
    for i, range_set in enumerate(ranges):
        if not isinstance(range_set, list) or not range_set:
            yield f"{where}.ranges[{i}]: must be a non-empty list of range objects"
            continue
        for j, entry in enumerate(range_set):
            base = f"{where}.ranges[{i}][{j}]"
            if not isinstance(entry, dict):
                yield f"{base}: must be an object"
                continue
            if "subnet" in entry:
                yield from cidr(entry["subnet"], f"{base}.subnet")
            for key in ("rangeStart", "rangeEnd", "gateway"):
                if key in entry:
                    yield from address(entry[key], f"{base}.{key}")
    for i, entry in enumerate(_list(ipam, "addresses")):
        if isinstance(entry, dict) and "address" in entry:
            yield from cidr(entry["address"], f"{where}.addresses[{i}].address")
    for i, route in enumerate(_list(ipam, "routes")):
        if isinstance(route, dict):
            if "dst" in route:
                yield from cidr(route["dst"], f"{where}.routes[{i}].dst")
            if "gw" in route:
                yield from address(route["gw"], f"{where}.routes[{i}].gw")


def _list(ipam: dict[str, Any], key: str) -> list[Any]:
    value = ipam.get(key)
    return value if isinstance(value, list) else []


@dataclass(frozen=True)
class SourcedConfig:
    """One decoded config and where it came from (FromClass: the admin; FromClaim: the user)."""

    config: CNIConfig | AddressConfig
    source: str
    location: str  # how an error message points at it
    requests: tuple[str, ...] = ()  # the requests it names (none: every request)


@dataclass(frozen=True)
class EffectiveConfig:
    interface_name: str
    bandwidth: str
    cni: dict[str, Any]
    cni_from_admin: bool
    # parts of the DeviceClass's config a claim's config left out but the class pinned: filled in after the
    # claim's own config passed the tenant checks (they are the admin's)
    admin_parts: tuple[tuple[int, str, Any], ...] = ()
    devices_per_request: int = 1


def decode(parameters: object, location: str) -> CNIConfig | AddressConfig:
    """Strictly decode one opaque `parameters` object; the error names `location` and the field."""
    if not isinstance(parameters, dict):
        raise ConfigError(f"{location}: parameters must be an object with apiVersion: {API_VERSION}")
    deep = strict.too_deep(parameters)
    if deep is not None:
        raise ConfigError(f"{location}.{deep}: nested deeper than {strict.MAX_DEPTH} levels")
    if parameters.get("apiVersion") != API_VERSION:
        raise ConfigError(f"{location}.apiVersion: {parameters.get('apiVersion')!r} is not {API_VERSION!r}")
    nulls = sorted(str(key) for key, value in parameters.items() if value is None)
    if nulls:
        raise ConfigError(f"{location}.{nulls[0]}: must not be null (leave the field out for its default)")
    if parameters.get("kind") not in KINDS:
        raise ConfigError(f"{location}.kind: {parameters.get('kind')!r} is not one of {list(KINDS)}")
    model: type[CNIConfig | AddressConfig] = CNIConfig if parameters["kind"] == "CNIConfig" else AddressConfig
    try:
        decoded = strict.read(model, parameters)
    except strict.Invalid as err:
        raise ConfigError(f"{strict.under(location, err.path)}: {err.message}") from err
    if isinstance(decoded, CNIConfig) and decoded.config is not None:
        problems = [
            f"{strict.under(f'{location}.config', path)}: {detail}"
            for path, _, detail in (line.partition(": ") for line in cni_problems(decoded.config))
        ]
        if problems:
            raise ConfigError("\n".join(problems))
    return decoded


def merge(configs: list[SourcedConfig], request: str) -> EffectiveConfig:
    """Apply configs in order (class before claim); a later config overrides the fields it sets, except
    what a DeviceClass config pinned: a claim may restate a pinned part unchanged or leave it out (it is
    then the class's), never change it."""
    interface, bandwidth, cni, cni_source = None, None, None, ""
    devices_per_request = 1
    admin_cni: dict[str, Any] | None = None
    pins: set[str] = set()
    carried: list[tuple[int, str, Any]] = []
    for sourced in configs:
        cfg, where = sourced.config, sourced.location
        if not isinstance(cfg, CNIConfig):
            continue  # an AddressConfig meant for the claim's pool requests
        if sourced.source != "FromClass":
            if cfg.pinned is not None:
                raise ConfigError(f"{where}.pinned: only a DeviceClass config may pin parts of the config")
            if cfg.devicesPerRequest is not None:
                raise ConfigError(
                    f"{where}.devicesPerRequest: only a DeviceClass config may let a request take several "
                    "devices"
                )
            if "interfaceName" in pins and cfg.interfaceName not in (None, interface):
                raise ConfigError(f"{where}.interfaceName: pinned by the DeviceClass to {interface!r}")
            if "bandwidth" in pins and cfg.bandwidth not in (None, bandwidth):
                raise ConfigError(f"{where}.bandwidth: pinned by the DeviceClass to {bandwidth!r}")
            if cfg.bandwidth == "none":
                raise ConfigError(
                    f"{where}.bandwidth: a claim cannot turn shaping off: on a shared NIC its share is "
                    "what it consumed (an exclusive NIC is never shaped); only a DeviceClass may"
                )
            if cfg.config is not None and admin_cni is not None:
                if "config" in pins:
                    raise ConfigError(f"{where}.config: the DeviceClass pinned its whole config")
                carried = _pinned_parts(as_conflist(cfg.config), admin_cni, pins, f"{where}.config")
        else:
            pins |= set(cfg.pinned or ())
            devices_per_request = cfg.devicesPerRequest or devices_per_request
            if cfg.config is not None:
                admin_cni = as_conflist(cfg.config)
        interface = cfg.interfaceName or interface
        bandwidth = cfg.bandwidth or bandwidth
        if cfg.config is not None:
            cni, cni_source = cfg.config, sourced.source
    if cni is None:
        raise ConfigError(
            f"request {request}: no netclaim.dev CNIConfig with a `config` in the DeviceClass or the claim; "
            "add one (see docs/config.md)"
        )
    return EffectiveConfig(
        interface_name=interface or DEFAULT_INTERFACE,
        bandwidth=bandwidth or "enforce",
        cni=as_conflist(cni),
        cni_from_admin=cni_source == "FromClass",
        admin_parts=tuple(carried),
        devices_per_request=devices_per_request,
    )


def _pinned_parts(
    claim: dict[str, Any], admin: dict[str, Any], pins: set[str], where: str
) -> list[tuple[int, str, Any]]:
    """Check a claim's config list against the class's pinned parts; return the parts to carry over
    (plugin index, key, the class's value) where the claim left them out."""
    claim_plugins, admin_plugins = claim.get("plugins", []), admin.get("plugins", [])
    if "plugins" in pins:
        claim_types = [p.get("type") for p in claim_plugins if isinstance(p, dict)]
        admin_types = [p.get("type") for p in admin_plugins if isinstance(p, dict)]
        if claim_types != admin_types:
            raise ConfigError(
                f"{where}.plugins: the DeviceClass pinned the plugin chain {admin_types}; got {claim_types}"
            )
    carried: list[tuple[int, str, Any]] = []
    for part in sorted(pins & set(PINNED_PLUGIN_KEYS)):
        for index, plugin in enumerate(claim_plugins):
            admin_plugin = admin_plugins[index] if index < len(admin_plugins) else {}
            for key in PINNED_PLUGIN_KEYS[part]:  # spelled canonically by both (spelling_problems)
                if key in admin_plugin and plugin.get(key, admin_plugin[key]) == admin_plugin[key]:
                    carried.append((index, key, admin_plugin[key]))  # the class's, restated or not
                elif key in plugin:
                    raise ConfigError(
                        f"{where}.plugins[{index}].{key}: pinned by the DeviceClass"
                        + (f" to {admin_plugin[key]!r}" if key in admin_plugin else " (it sets none)")
                        + ": a claim may leave it out or restate it unchanged"
                    )
    return carried

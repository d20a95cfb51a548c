"""`netclaim validate FILE...`: check manifests offline, before they reach a cluster.

Every netclaim.dev opaque config in a ResourceClaim, ResourceClaimTemplate or DeviceClass is decoded as the
agent decodes it at prepare time (strict fields, CNI shape, addresses, placeholders). A claim's or
template's config (a tenant's) is checked against the tenant allow-list (netclaim.api.tenancy) as far as it
is decidable before placeholders are filled; a DeviceClass's plugin types against the allow-list of the
admission policy (deploy/admission.yaml; a test keeps the two lists equal). What needs the node (is the
plugin installed? does the device have that attribute? is it shared?) is left to prepare time. An IPPool
is checked as the controller and the agents read it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from netclaim.api.cniconfig import CNIConfig, as_conflist, decode, plugin_types
from netclaim.api.ippool import IPPool
from netclaim.api.tenancy import Target, tenant_problems
from netclaim.errors import ConfigError

DRIVER = "netclaim.dev"
# The CNI plugins admission lets claims name (deploy/admission.yaml, variable allowedPlugins).
ALLOWED_PLUGINS = frozenset({
    "bandwidth", "bridge", "dhcp", "firewall", "host-device", "host-local", "ipvlan", "loopback",
    "macvlan", "portmap", "ptp", "sbr", "static", "tuning", "vlan", "vrf", "whereabouts",
})  # fmt: skip


def config_paths(manifest: dict[str, Any]) -> tuple[str, list[Any]]:
    """Where a kind keeps its device configs, and the list found there."""
    kind = manifest.get("kind")
    spec = manifest.get("spec") or {}
    if kind == "DeviceClass":
        return "spec.config", list(spec.get("config") or [])
    if kind == "ResourceClaim":
        return "spec.devices.config", list((spec.get("devices") or {}).get("config") or [])
    if kind == "ResourceClaimTemplate":
        return "spec.spec.devices.config", list(
            ((spec.get("spec") or {}).get("devices") or {}).get("config") or []
        )
    return "", []


def problems(manifest: dict[str, Any]) -> Iterator[str]:
    """Every problem of one manifest, each naming the field."""
    if manifest.get("kind") == "IPPool":
        try:
            IPPool.from_api(manifest)
        except ConfigError as err:
            yield from str(err).splitlines()
        return
    path, configs = config_paths(manifest)
    for index, entry in enumerate(configs):
        opaque = entry.get("opaque") if isinstance(entry, dict) else None
        if not isinstance(opaque, dict) or opaque.get("driver") != DRIVER:
            continue
        location = f"{path}[{index}].opaque.parameters"
        try:
            config = decode(opaque.get("parameters"), location)
        except ConfigError as err:
            yield from str(err).splitlines()
            continue
        if not isinstance(config, CNIConfig):
            continue  # an AddressConfig: decoding is all there is to check offline
        if config.pinned is not None and manifest.get("kind") != "DeviceClass":
            yield f"{location}.pinned: only a DeviceClass config may pin parts of the config"
        if config.config is None:
            continue
        if manifest.get("kind") != "DeviceClass":  # a tenant's: the allow-list, as far as it is decidable
            offline = Target(if_name="{{ device.ifName }}", shared=False, offline=True)
            yield from tenant_problems(as_conflist(config.config), offline, f"{location}.config")
        else:
            for kind in plugin_types(as_conflist(config.config)):
                if kind not in ALLOWED_PLUGINS:
                    yield (
                        f"{location}.config: plugin type {kind!r} is not one of the allowed plugins "
                        f"{sorted(ALLOWED_PLUGINS)}"
                    )


def validate_files(paths: list[Path]) -> list[str]:
    """`FILE: KIND/NAME: problem` lines for every manifest in the files (empty: all good)."""
    found = []
    for path in paths:
        try:
            documents = list(yaml.safe_load_all(path.read_text()))
        except (OSError, yaml.YAMLError) as err:
            found.append(f"{path}: cannot read: {err}")
            continue
        for document in documents:
            if not isinstance(document, dict):
                continue
            name = f"{document.get('kind')}/{(document.get('metadata') or {}).get('name', '?')}"
            found += [f"{path}: {name}: {problem}" for problem in problems(document)]
    return found

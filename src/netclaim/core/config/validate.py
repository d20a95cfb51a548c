"""`netclaim validate FILE...`: check manifests offline, before they reach a cluster.

Every netclaim.dev opaque config in a ResourceClaim, ResourceClaimTemplate or DeviceClass is decoded as the
agent decodes it at prepare time (strict fields, CNI shape, addresses, placeholders). A claim's or
template's config (a tenant's) is checked against the tenant allow-list (netclaim.core.config.tenancy) as far
as it is decidable before placeholders are filled; a DeviceClass's plugin types against the allow-list of the
admission policy (deploy/admission.yaml; a test keeps the two lists equal). What needs the node (is the
plugin installed? does the device have that attribute? is it shared?) is left to prepare time. An IPPool
is checked as the controller and the agents read it.

Across the files: a pod (or a workload's pod template) whose claims would give two interfaces the same name;
a claim's static addresses outside the subnets of the IPPool its request selects; `{{ device.X }}`
placeholders naming attributes netclaim does not publish (the caller passes the known ones: the built-in
attributes and those a PublishPolicy adds). A file with nothing netclaim can check is said to be so.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from netclaim.core.config.cniconfig import DEFAULT_INTERFACE, CNIConfig, as_conflist, decode, plugin_types
from netclaim.core.config.placeholders import placeholder_names
from netclaim.core.config.tenancy import Target, tenant_problems
from netclaim.core.ipam.ippool import AddressConfig, IPPool
from netclaim.core.names import DRIVER_DOMAIN
from netclaim.errors import ConfigError

POOL_CLASS = "netclaim-address"  # its requests take an address of a pool, not an interface
POOL_SELECTOR = re.compile(r'device\.attributes\["netclaim\.dev"\]\.pool\s*==\s*"([^"]+)"')
# where each workload kind keeps its pod spec
POD_SPECS: dict[str, tuple[str, ...]] = {
    "Pod": ("spec",),
    "Deployment": ("spec", "template", "spec"),
    "ReplicaSet": ("spec", "template", "spec"),
    "StatefulSet": ("spec", "template", "spec"),
    "DaemonSet": ("spec", "template", "spec"),
    "Job": ("spec", "template", "spec"),
    "CronJob": ("spec", "jobTemplate", "spec", "template", "spec"),
}
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


def problems(manifest: dict[str, Any], known_attributes: frozenset[str] | None = None) -> Iterator[str]:
    """Every problem of one manifest, each naming the field. `known_attributes`: the device attributes a
    placeholder may name (None: not checked)."""
    if manifest.get("kind") == "IPPool":
        try:
            IPPool.from_api(manifest)
        except ConfigError as err:
            yield from str(err).splitlines()
        return
    path, configs = config_paths(manifest)
    for index, entry in enumerate(configs):
        opaque = entry.get("opaque") if isinstance(entry, dict) else None
        if not isinstance(opaque, dict) or opaque.get("driver") != DRIVER_DOMAIN:
            continue
        location = f"{path}[{index}].opaque.parameters"
        try:
            config = decode(opaque.get("parameters"), location)
        except ConfigError as err:
            yield from str(err).splitlines()
            continue
        if not isinstance(config, CNIConfig):
            continue  # an AddressConfig: decoding is all there is to check alone
        if config.pinned is not None and manifest.get("kind") != "DeviceClass":
            yield f"{location}.pinned: only a DeviceClass config may pin parts of the config"
        if config.config is None:
            continue
        if known_attributes is not None:
            for where, name in placeholder_names(config.config):
                attribute = name.removeprefix("device.")
                if name.startswith("device.") and attribute not in known_attributes | {"name", "pool"}:
                    yield (
                        f"{location}.config.{where}: {{{{ {name} }}}}: netclaim publishes no attribute "
                        f"{attribute!r} (a PublishPolicy's own attributes count with --policy-file)"
                    )
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


def _name(document: dict[str, Any]) -> str:
    return str((document.get("metadata") or {}).get("name", "?"))


def _dig(document: dict[str, Any], keys: tuple[str, ...]) -> Any:
    for key in keys:
        document = document.get(key) if isinstance(document, dict) else None  # type: ignore[assignment]
    return document


def _claim_spec(document: dict[str, Any]) -> dict[str, Any]:
    spec = document.get("spec") or {}
    if document.get("kind") == "ResourceClaimTemplate":
        spec = spec.get("spec") or {}
    return spec if isinstance(spec, dict) else {}


def _our_configs(configs: list[Any]) -> Iterator[tuple[list[str] | None, dict[str, Any]]]:
    """(the requests it applies to, None: all; the parameters) of each netclaim.dev config."""
    for entry in configs:
        opaque = entry.get("opaque") if isinstance(entry, dict) else None
        if (
            isinstance(opaque, dict)
            and opaque.get("driver") == DRIVER_DOMAIN
            and isinstance(opaque.get("parameters"), dict)
        ):
            requests = entry.get("requests")
            yield (list(requests) if isinstance(requests, list) else None), opaque["parameters"]


def _requests(spec: dict[str, Any]) -> list[dict[str, Any]]:
    requests = (spec.get("devices") or {}).get("requests") or []
    return [r for r in requests if isinstance(r, dict)]


def interface_names(claim: dict[str, Any], classes: dict[str, dict[str, Any]]) -> dict[str, str]:
    """request -> the interface it makes in the pod, for each request that makes one: a netclaim NIC
    request (not a pool's address), named by the last interfaceName of its configs, class first."""
    spec = _claim_spec(claim)
    claim_configs = list(_our_configs((spec.get("devices") or {}).get("config") or []))
    names = {}
    for request in _requests(spec):
        exactly = request.get("exactly") or request
        class_name = str(exactly.get("deviceClassName", ""))
        device_class = classes.get(class_name, {})
        class_configs = list(_our_configs(((device_class.get("spec") or {}).get("config")) or []))
        named = [c for c in claim_configs if c[0] is not None and request.get("name") in c[0]]
        # a claim-wide config (no `requests`) reaches only the requests that are netclaim's anyway
        ours = bool(class_configs or named) or (
            class_name.startswith("netclaim-") and class_name != POOL_CLASS
        )
        configs = class_configs + [c for c in claim_configs if c[0] is None or request.get("name") in c[0]]
        if not ours or class_name == POOL_CLASS or any(p.get("kind") == "AddressConfig" for _, p in configs):
            continue
        name = DEFAULT_INTERFACE
        for _, parameters in configs:
            if isinstance(parameters.get("interfaceName"), str):
                name = parameters["interfaceName"]
        names[str(request.get("name", ""))] = name
    return names


@dataclass
class Collection:
    """The documents of all the files, by kind and name (claims and templates by name alone: a file set
    is one namespace's)."""

    classes: dict[str, dict[str, Any]] = field(default_factory=dict)
    claims: dict[str, dict[str, Any]] = field(default_factory=dict)
    templates: dict[str, dict[str, Any]] = field(default_factory=dict)
    pools: dict[str, dict[str, Any]] = field(default_factory=dict)

    def add(self, document: dict[str, Any]) -> None:
        kinds = {
            "DeviceClass": self.classes,
            "ResourceClaim": self.claims,
            "ResourceClaimTemplate": self.templates,
            "IPPool": self.pools,
        }
        found = kinds.get(str(document.get("kind")))
        if found is not None:
            found[_name(document)] = document


def clash_problems(workload: dict[str, Any], known: Collection) -> Iterator[str]:
    """Two of the pod's claims (or requests) that would both make the same interface: the second ADD
    would fail at pod start; here it is found before."""
    keys = POD_SPECS.get(str(workload.get("kind")))
    pod_spec = _dig(workload, keys) if keys else None
    if not isinstance(pod_spec, dict):
        return
    where = ".".join(keys or ()) + ".resourceClaims"
    taken: dict[str, str] = {}
    for index, ref in enumerate(pod_spec.get("resourceClaims") or []):
        if not isinstance(ref, dict):
            continue
        if ref.get("resourceClaimTemplateName"):
            claim = known.templates.get(str(ref["resourceClaimTemplateName"]))
            shown = f"template {ref['resourceClaimTemplateName']}"
        else:
            claim = known.claims.get(str(ref.get("resourceClaimName")))
            shown = f"claim {ref.get('resourceClaimName')}"
        if claim is None:
            continue  # not in these files: prepare time decides
        for request, interface in interface_names(claim, known.classes).items():
            this = f"{where}[{index}] ({shown}, request {request})"
            if interface in taken:
                yield (
                    f"{this}: interface {interface} is also made by {taken[interface]}; "
                    "give each an interfaceName"
                )
            else:
                taken[interface] = this


def pool_address_problems(claim: dict[str, Any], known: Collection) -> Iterator[str]:
    """Static addresses a claim asks of a pool (AddressConfig) that are not in the pool's ranges."""
    spec = _claim_spec(claim)
    path, _ = config_paths(claim)
    configs = (spec.get("devices") or {}).get("config") or []
    requests = {str(r.get("name")): r for r in _requests(spec)}
    for index, entry in enumerate(configs):
        opaque = entry.get("opaque") if isinstance(entry, dict) else None
        parameters = opaque.get("parameters") if isinstance(opaque, dict) else None
        if not isinstance(parameters, dict) or parameters.get("kind") != "AddressConfig":
            continue
        try:
            config = decode(parameters, f"{path}[{index}].opaque.parameters")
        except ConfigError:
            continue  # reported by problems()
        if not isinstance(config, AddressConfig) or not config.addresses:
            continue
        for request_name in entry.get("requests") or list(requests):
            request = requests.get(str(request_name)) or {}
            selectors = (request.get("exactly") or request).get("selectors") or []
            for selector in selectors:
                match = POOL_SELECTOR.search(str((selector.get("cel") or {}).get("expression", "")))
                pool = known.pools.get(match.group(1)) if match else None
                if pool is None or match is None:
                    continue
                try:
                    subnets = [r.network for r in IPPool.from_api(pool).spec.ranges]
                except ConfigError:
                    continue  # the pool's own problems are reported with it
                for i, value in enumerate(config.addresses):
                    if not any(ipaddress.ip_address(value) in net for net in subnets):
                        yield (
                            f"{path}[{index}].opaque.parameters.addresses[{i}]: {value} is not in IPPool "
                            f"{match.group(1)} ({', '.join(map(str, subnets))})"
                        )


@dataclass
class Report:
    problems: list[str] = field(default_factory=list)  # `FILE: KIND/NAME: problem`
    unchecked: list[Path] = field(default_factory=list)  # files with nothing netclaim can check


def _checkable(document: dict[str, Any]) -> bool:
    if document.get("kind") == "IPPool":
        return True
    if any(True for _ in _our_configs(config_paths(document)[1])):
        return True
    keys = POD_SPECS.get(str(document.get("kind")))
    return bool(keys and (_dig(document, keys) or {}).get("resourceClaims"))


def validate_files(paths: list[Path], known_attributes: frozenset[str] | None = None) -> Report:
    """Every problem in the files' manifests, alone and together."""
    report = Report()
    loaded: list[tuple[Path, dict[str, Any]]] = []
    for path in paths:
        try:
            documents = list(yaml.safe_load_all(path.read_text()))
        except (OSError, yaml.YAMLError) as err:
            report.problems.append(f"{path}: cannot read: {err}")
            continue
        ours = [d for d in documents if isinstance(d, dict)]
        loaded += [(path, d) for d in ours]
        if not any(_checkable(d) for d in ours):
            report.unchecked.append(path)
    known = Collection()
    for _, document in loaded:
        known.add(document)
    for path, document in loaded:
        name = f"{document.get('kind')}/{_name(document)}"
        found = [
            *problems(document, known_attributes),
            *clash_problems(document, known),
            *(
                pool_address_problems(document, known)
                if document.get("kind") in ("ResourceClaim", "ResourceClaimTemplate")
                else ()
            ),
        ]
        report.problems += [f"{path}: {name}: {problem}" for problem in found]
    return report

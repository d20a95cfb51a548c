"""What a tenant's CNI config may set: an allow-list per plugin, read the way the plugins read it.

A claim's config comes from a tenant and runs as root on the node, so everything in it is refused unless
listed here. CNI plugins are Go programs: encoding/json matches object keys to struct fields without
regard to case, so `Master`, `MASTER` and `master` are one field to the plugin. Keys are compared
lower-cased, and an object with two keys that differ only in case is refused (which one a plugin would
take is not ours to guess). Checks run on the rendered config (placeholders filled), so a placeholder
cannot smuggle a value past them.

Plugins a tenant may use: macvlan, ipvlan (children of the allocated NIC), host-device (the allocated NIC
itself, exclusive devices only), tuning (pod-side settings), sbr, vrf; IPAM host-local and static. Every
other plugin (bridge, ptp, portmap, firewall, dhcp, bandwidth, vlan…) reaches the node's own routing,
firewall or sockets: only a DeviceClass (admin) config may use it.

Whoever wrote the config, a device published `shared` is only attached through plugins that leave the NIC
on the node (`exclusive_problems`).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from netclaim.names import MAC, check_interface_name

Check = Callable[[Any, str, "Target"], Iterator[str]]

LIST_KEYS = frozenset({"cniversion", "cniversions", "name", "plugins", "disablecheck", "disablegc"})
SYSCTL = re.compile(r"net\.[A-Za-z0-9_\-]+(\.[A-Za-z0-9_\-]+)*")


@dataclass(frozen=True)
class Target:
    """The allocated device a config is checked against."""

    if_name: str
    shared: bool
    offline: bool = False  # `netclaim validate`: placeholders are not rendered yet, prepare checks them


def _string(value: Any, path: str, _: Target) -> Iterator[str]:
    if not isinstance(value, str):
        yield f"{path}: must be a string"


def _boolean(value: Any, path: str, _: Target) -> Iterator[str]:
    if not isinstance(value, bool):
        yield f"{path}: must be true or false"


def _integer(low: int, high: int) -> Check:
    def check(value: Any, path: str, _: Target) -> Iterator[str]:
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            yield f"{path}: must be a whole number from {low} to {high}"

    return check


def _one_of(*allowed: str) -> Check:
    def check(value: Any, path: str, _: Target) -> Iterator[str]:
        if value not in allowed:
            yield f"{path}: {value!r} is not one of {list(allowed)}"

    return check


def _allocated_interface(value: Any, path: str, target: Target) -> Iterator[str]:
    if value != target.if_name:
        yield (
            f"{path}: {value!r} is not the allocated device's interface {target.if_name!r}; a claim may only "
            "name the device it was allocated (write {{ device.ifName }})"
        )


def _interface_name(value: Any, path: str, _: Target) -> Iterator[str]:
    try:
        check_interface_name(value if isinstance(value, str) else "")
    except ValueError as err:
        yield f"{path}: {err}"


def _mac(value: Any, path: str, _: Target) -> Iterator[str]:
    if not isinstance(value, str) or not MAC.fullmatch(value.lower()) or int(value[:2], 16) & 1:
        yield f"{path}: {value!r} is not a unicast MAC address such as 02:00:00:00:00:01"


def _macvlan_mode(value: Any, path: str, target: Target) -> Iterator[str]:
    yield from _one_of("bridge", "private", "vepa", "passthru")(value, path, target)
    if value == "passthru" and target.shared:
        yield f"{path}: passthru takes the whole NIC: only on an exclusive device"


def _sysctls(value: Any, path: str, _: Target) -> Iterator[str]:
    if not isinstance(value, dict):
        yield f"{path}: must be an object of sysctl names and values"
        return
    for name, setting in value.items():
        if not SYSCTL.fullmatch(name) or ".." in name or "/" in name:
            yield f"{path}.{name}: only net.* sysctls of the pod's network namespace (no '..' or '/')"
        if not isinstance(setting, str):
            yield f"{path}.{name}: must be a string"


def _objects(fields: Mapping[str, Check]) -> Check:
    """A list of objects with the given fields."""

    def check(value: Any, path: str, target: Target) -> Iterator[str]:
        if not isinstance(value, list):
            yield f"{path}: must be a list"
            return
        for index, item in enumerate(value):
            yield from _object(item, f"{path}[{index}]", fields, target)

    return check


def _ranges(value: Any, path: str, target: Target) -> Iterator[str]:
    if not isinstance(value, list):
        yield f"{path}: must be a list of lists of range objects"
        return
    for index, range_set in enumerate(value):
        yield from _objects(_RANGE)(range_set, f"{path}[{index}]", target)


def _dns(value: Any, path: str, target: Target) -> Iterator[str]:
    yield from _object(value, path, _DNS, target)


def _strings(value: Any, path: str, _: Target) -> Iterator[str]:
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        yield f"{path}: must be a list of strings"


_RANGE: dict[str, Check] = {"subnet": _string, "rangestart": _string, "rangeend": _string, "gateway": _string}
_ROUTE: dict[str, Check] = {"dst": _string, "gw": _string}
_DNS: dict[str, Check] = {"nameservers": _strings, "domain": _string, "search": _strings, "options": _strings}

IPAM: dict[str, dict[str, Check]] = {
    "host-local": {
        "type": _string,
        "ranges": _ranges,
        "routes": _objects(_ROUTE),
        **{key: _string for key in ("subnet", "rangestart", "rangeend", "gateway")},
    },
    "static": {
        "type": _string,
        "addresses": _objects({"address": _string, "gateway": _string}),
        "routes": _objects(_ROUTE),
        "dns": _dns,
    },
}


def _ipam(value: Any, path: str, target: Target) -> Iterator[str]:
    if not isinstance(value, dict):
        yield f"{path}: must be an object"
        return
    kind = _get(value, "type")
    fields = IPAM.get(kind) if isinstance(kind, str) else None
    if fields is None:
        yield f"{path}.type: {kind!r} is not an IPAM a claim may use {sorted(IPAM)} (others: admin only)"
        return
    yield from _object(value, path, fields, target)
    yield from _address_families(value, path)


PLUGINS: dict[str, dict[str, Check]] = {
    "macvlan": {
        "master": _allocated_interface,
        "mode": _macvlan_mode,
        "mtu": _integer(68, 65535),
        "ipam": _ipam,
    },
    "ipvlan": {
        "master": _allocated_interface,
        "mode": _one_of("l2", "l3", "l3s"),
        "mtu": _integer(68, 65535),
        "ipam": _ipam,
    },
    "host-device": {"device": _allocated_interface, "ipam": _ipam},
    "tuning": {
        "mtu": _integer(68, 65535),
        "mac": _mac,
        "promisc": _boolean,
        "allmulti": _boolean,
        "sysctl": _sysctls,
    },
    "sbr": {"table": _integer(1, 2**31 - 1)},
    "vrf": {"vrfname": _interface_name, "table": _integer(1, 2**31 - 1)},
}
# Without these a plugin falls back to a host default: macvlan/ipvlan to the default-route uplink.
REQUIRED = {"macvlan": ("master",), "ipvlan": ("master",), "host-device": ("device",)}
# Plugins that move the NIC itself into the pod: never on a device other pods share.
EXCLUSIVE_ONLY = frozenset({"host-device"})


def _get(obj: dict[str, Any], key: str) -> Any:
    """obj[key] compared as Go's encoding/json does: case-insensitively."""
    return next((value for name, value in obj.items() if name.lower() == key), None)


def case_duplicates(value: Any, path: str) -> Iterator[str]:
    """Objects anywhere in `value` with two keys that are one to a Go plugin."""
    if isinstance(value, dict):
        seen: dict[str, str] = {}
        for key, item in value.items():
            first = seen.setdefault(key.lower(), key)
            if first != key:
                yield f"{path}: keys {first!r} and {key!r} differ only in case; CNI plugins read them as one"
            yield from case_duplicates(item, f"{path}.{key}")
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from case_duplicates(item, f"{path}[{index}]")


def _object(value: Any, path: str, fields: Mapping[str, Check], target: Target) -> Iterator[str]:
    if not isinstance(value, dict):
        yield f"{path}: must be an object"
        return
    for key, item in value.items():
        check = fields.get(key.lower())
        if check is None:
            yield f"{path}.{key}: not a field a claim may set here (allowed: {sorted(fields)})"
        elif not (target.offline and isinstance(item, str) and "{{" in item):
            yield from check(item, f"{path}.{key}", target)


def _address_families(ipam: dict[str, Any], path: str) -> Iterator[str]:
    """Gateways and ranges inside their subnet; a range's addresses of one family."""
    for i, range_set in enumerate(_get(ipam, "ranges") or []):
        for j, entry in enumerate(range_set if isinstance(range_set, list) else []):
            if not isinstance(entry, dict):
                continue
            try:
                subnet = ipaddress.ip_network(str(_get(entry, "subnet")), strict=False)
            except ValueError:
                continue  # a malformed subnet was reported by the config's own checks
            for key in ("gateway", "rangestart", "rangeend"):
                address = _get(entry, key)
                if address is None:
                    continue
                try:
                    inside = ipaddress.ip_address(str(address)) in subnet
                except ValueError:
                    continue
                if not inside:
                    yield f"{path}.ranges[{i}][{j}].{key}: {address} is outside the subnet {subnet}"


def tenant_problems(
    conflist: dict[str, Any],
    target: Target,
    path: str = "config",
    from_admin: frozenset[tuple[int, str]] = frozenset(),
) -> Iterator[str]:
    """Everything in a tenant's rendered config list that the allow-list does not allow. `from_admin`:
    (plugin index, key) the DeviceClass's pinned config fills in afterwards."""
    yield from case_duplicates(conflist, path)
    for key in conflist:
        if key.lower() not in LIST_KEYS:
            yield f"{path}.{key}: not a field a claim may set (allowed: {sorted(LIST_KEYS)})"
    for index, plugin in enumerate(_get(conflist, "plugins") or []):
        where = f"{path}.plugins[{index}]"
        if not isinstance(plugin, dict):
            continue  # the config's own checks said so
        kind = _get(plugin, "type")
        fields = PLUGINS.get(kind) if isinstance(kind, str) else None
        if fields is None:
            yield (
                f"{where}.type: {kind!r} is admin-only: it reaches the node's own network, so only a "
                f"DeviceClass config may use it (a claim may use {sorted(PLUGINS)})"
            )
            continue
        yield from _object({k: v for k, v in plugin.items() if k.lower() != "type"}, where, fields, target)
        for required in REQUIRED.get(kind, ()):
            if _get(plugin, required) is None and (index, required) not in from_admin:
                yield (
                    f"{where}.{required}: required: the allocated device's interface "
                    f"({{{{ device.ifName }}}}); without it {kind} falls back to one of the node's choosing"
                )


def exclusive_problems(conflist: dict[str, Any], target: Target, device: str) -> Iterator[str]:
    """On a shared device, plugins that take the NIC itself away from the other pods are refused."""
    if not target.shared:
        return
    for index, plugin in enumerate(_get(conflist, "plugins") or []):
        if not isinstance(plugin, dict):
            continue
        kind = _get(plugin, "type")
        if kind in EXCLUSIVE_ONLY or (kind == "macvlan" and _get(plugin, "mode") == "passthru"):
            yield (
                f"config.plugins[{index}].type: {kind!r} takes the whole NIC, but device {device} is shared: "
                "use a DeviceClass of exclusive devices (netclaim-exclusive)"
            )

"""What a tenant's CNI config may set: an allow-list per plugin, in one spelling, with values that stay
inside the tenant's pod and its share.

A claim's config comes from a tenant and runs as root on the node, so everything in it is refused unless
listed here. CNI plugins are Go programs: encoding/json matches object keys to struct fields without
regard to case, so `Master`, `MASTER` and `master` are one field to the plugin. A claim must write every
key in its canonical case (the one listed here, as the plugins document it): then no spelling can slip past
a check that looks for the canonical one, here, in the admission policy or in the agent's own lookups. Checks
run on the rendered config (placeholders filled), so a placeholder cannot smuggle a value past them.

Plugins a tenant may use: macvlan, ipvlan (children of the allocated NIC), host-device (the allocated NIC
itself, exclusive devices only), tuning (pod-side settings), sbr, vrf; IPAM host-local and static, and only
inside the address ranges the admin declared for the device (`AddressRules`). Every other plugin (bridge,
ptp, portmap, firewall, dhcp, bandwidth, vlan…) reaches the node's own routing, firewall or sockets: only a
DeviceClass (admin) config may use it.

Whoever wrote the config, a device published `shared` is attached only the way its publish rule says
(`sharing_problems`): children of the type the admin chose, an ipvlan in the admin's mode, never a plugin
that takes the whole NIC.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from netclaim.core.config.cnikeys import CONFLIST_KEYS
from netclaim.core.config.placeholders import holds_placeholder
from netclaim.core.names import MAC, check_pod_interface_name

Check = Callable[[Any, str, "Target"], Iterator[str]]
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

# Per-interface sysctls a pod may set on its own interface (net.ipv4.conf.<it>.X, net.ipv6.conf.<it>.X).
# Not forwarding, proxy_arp/proxy_ndp or route_localnet: those make the pod a router or a proxy between
# its networks, which the network's policy does not expect.
IPV4_CONF = frozenset({
    "arp_accept", "arp_announce", "arp_filter", "arp_ignore", "arp_notify", "accept_redirects",
    "secure_redirects", "send_redirects", "rp_filter", "log_martians", "ignore_routes_with_linkdown",
})  # fmt: skip
IPV6_CONF = frozenset({
    "accept_dad", "accept_ra", "accept_redirects", "addr_gen_mode", "autoconf", "dad_transmits",
    "disable_ipv6", "hop_limit", "keep_addr_on_down", "mtu", "ndisc_notify", "use_tempaddr",
})  # fmt: skip
# kubelet's safe sysctls of the network namespace (namespaced, and kubelet lets any pod set them).
SAFE_SYSCTLS = frozenset({
    "net.ipv4.ip_local_port_range", "net.ipv4.ip_local_reserved_ports", "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.ping_group_range", "net.ipv4.tcp_syncookies", "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_keepalive_intvl", "net.ipv4.tcp_keepalive_probes", "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_rmem", "net.ipv4.tcp_wmem",
})  # fmt: skip
SYSCTL_VALUE = re.compile(r"[-0-9 \t]{1,64}")
CHILD_PLUGINS = ("macvlan", "ipvlan")
# sizes a claim's status (networkData.ips ≤ 16, data ≤ 10 KiB) and resolv.conf can carry
MAX_ADDRESSES = 8
MAX_RANGES = 4
MAX_ROUTES = 32
MAX_DNS_ENTRIES = 8


@dataclass(frozen=True)
class AddressRules:
    """Where a tenant's own IPAM may take addresses on the allocated device (the admin's, never the
    tenant's): inside `allowed`, outside every `forbidden` network; nowhere when an IP pool serves it."""

    allowed: tuple[IPNetwork, ...] = ()  # the publish rule's tenantRanges
    forbidden: tuple[tuple[IPNetwork, str], ...] = ()  # (network, whose): IP pools, the cluster's CIDRs
    pool: str | None = None  # the IPPool serving the device's network
    cluster_known: bool = True  # the node's admin gave the cluster's CIDRs (--reserved-cidrs)


@dataclass(frozen=True)
class Target:
    """The allocated device a config is checked against."""

    if_name: str  # the NIC on the node
    shared: bool
    pod_interface: str = "net1"  # what the claim's interface is named inside the pod
    child: str = "macvlan"  # a shared NIC's children: macvlan or ipvlan (the publish rule's)
    ipvlan_mode: str | None = None  # and an ipvlan child's mode
    addresses: AddressRules | None = None  # None: not known here (`netclaim validate`, admission)
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


def _pod_interface_name(value: Any, path: str, _: Target) -> Iterator[str]:
    try:
        check_pod_interface_name(value if isinstance(value, str) else "")
    except ValueError as err:
        yield f"{path}: {err}"


def _mac(value: Any, path: str, _: Target) -> Iterator[str]:
    if not isinstance(value, str) or not MAC.fullmatch(value.lower()) or int(value[:2], 16) & 0b11 != 0b10:
        yield (
            f"{path}: {value!r} is not a locally administered unicast MAC address such as 02:00:00:00:00:01 "
            "(the second-lowest bit of the first octet set, the lowest clear: a claim never takes a "
            "vendor's or a router's address)"
        )


def _flag_on_shared(value: Any, path: str, target: Target) -> Iterator[str]:
    yield from _boolean(value, path, target)
    if value is True and target.shared:
        yield (
            f"{path}: on a shared NIC the flag reaches the NIC itself and every pod on it; only on an "
            "exclusive device"
        )


def _macvlan_mode(value: Any, path: str, target: Target) -> Iterator[str]:
    yield from _one_of("bridge", "private", "vepa", "passthru")(value, path, target)
    if value == "passthru" and target.shared:
        yield f"{path}: passthru takes the whole NIC: only on an exclusive device"


def _sysctls(value: Any, path: str, target: Target) -> Iterator[str]:
    if not isinstance(value, dict):
        yield f"{path}: must be an object of sysctl names and values"
        return
    own = (f"net.ipv4.conf.{target.pod_interface}.", f"net.ipv6.conf.{target.pod_interface}.")
    for name, setting in value.items():
        per_interface = (
            IPV4_CONF if name.startswith(own[0]) else IPV6_CONF if name.startswith(own[1]) else None
        )
        allowed = name in SAFE_SYSCTLS or (
            per_interface is not None and name.rsplit(".", 1)[-1] in per_interface and name.count(".") == 4
        )
        if not allowed:
            yield (
                f"{path}.{name}: a claim may set only its own interface's "
                f"net.ipv4.conf.{target.pod_interface}.X ({', '.join(sorted(IPV4_CONF))}) and "
                f"net.ipv6.conf.{target.pod_interface}.X "
                f"({', '.join(sorted(IPV6_CONF))}), and kubelet's safe sysctls"
            )
        if not isinstance(setting, str) or not SYSCTL_VALUE.fullmatch(setting):
            yield f'{path}.{name}: must be a string of numbers, e.g. "1"'


def _objects(fields: Mapping[str, Check], most: int) -> Check:
    """A list of at most `most` objects with the given fields."""

    def check(value: Any, path: str, target: Target) -> Iterator[str]:
        if not isinstance(value, list):
            yield f"{path}: must be a list"
            return
        if len(value) > most:
            yield f"{path}: at most {most} (a claim's status carries what its interface got)"
            return
        for index, item in enumerate(value):
            yield from _object(item, f"{path}[{index}]", fields, target)

    return check


def _ranges(value: Any, path: str, target: Target) -> Iterator[str]:
    if not isinstance(value, list):
        yield f"{path}: must be a list of lists of range objects"
        return
    if len(value) > MAX_RANGES:
        yield f"{path}: at most {MAX_RANGES} range sets"
        return
    for index, range_set in enumerate(value):
        yield from _objects(_RANGE, MAX_RANGES)(range_set, f"{path}[{index}]", target)


def _dns(value: Any, path: str, target: Target) -> Iterator[str]:
    yield from _object(value, path, _DNS, target)


def _strings(value: Any, path: str, _: Target) -> Iterator[str]:
    if not isinstance(value, list) or not all(isinstance(item, str) and len(item) <= 253 for item in value):
        yield f"{path}: must be a list of strings (of at most 253 characters)"
    elif len(value) > MAX_DNS_ENTRIES:
        yield f"{path}: at most {MAX_DNS_ENTRIES} (what resolv.conf takes)"


_RANGE: dict[str, Check] = {"subnet": _string, "rangeStart": _string, "rangeEnd": _string, "gateway": _string}
_ROUTE: dict[str, Check] = {"dst": _string, "gw": _string}
_DNS: dict[str, Check] = {"nameservers": _strings, "domain": _string, "search": _strings, "options": _strings}

IPAM: dict[str, dict[str, Check]] = {
    "host-local": {
        "type": _string,
        "ranges": _ranges,
        "routes": _objects(_ROUTE, MAX_ROUTES),
        **{key: _string for key in ("subnet", "rangeStart", "rangeEnd", "gateway")},
    },
    "static": {
        "type": _string,
        "addresses": _objects({"address": _string, "gateway": _string}, MAX_ADDRESSES),
        "routes": _objects(_ROUTE, MAX_ROUTES),
        "dns": _dns,
    },
}


def _ipam(value: Any, path: str, target: Target) -> Iterator[str]:
    if not isinstance(value, dict):
        yield f"{path}: must be an object"
        return
    kind = value.get("type")
    fields = IPAM.get(kind) if isinstance(kind, str) else None
    if fields is None:
        spelled = next((k for k in value if k.lower() == "type" and k != "type"), None)
        yield (
            f"{path}.{spelled}: write it 'type': a claim's keys must be in their canonical case"
            if spelled is not None
            else f"{path}.type: {kind!r} is not an IPAM a claim may use {sorted(IPAM)} (others: admin only)"
        )
        return
    problems = list(_object(value, path, fields, target))
    if problems:
        yield from problems
        return
    yield from _address_problems(value, path, target)


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
        "promisc": _flag_on_shared,
        "allmulti": _flag_on_shared,
        "sysctl": _sysctls,
    },
    "sbr": {"table": _integer(1, 2**31 - 1)},
    "vrf": {"vrfname": _pod_interface_name, "table": _integer(1, 2**31 - 1)},
}
# Without these a plugin falls back to a host default: macvlan/ipvlan to the default-route uplink.
REQUIRED = {"macvlan": ("master",), "ipvlan": ("master",), "host-device": ("device",)}
# Plugins that move the NIC itself into the pod: never on a device other pods share.
EXCLUSIVE_ONLY = frozenset({"host-device"})


def _object(value: Any, path: str, fields: Mapping[str, Check], target: Target) -> Iterator[str]:
    if not isinstance(value, dict):
        yield f"{path}: must be an object"
        return
    canonical = {name.lower(): name for name in fields}
    for key, item in value.items():
        name = canonical.get(key.lower())
        if name is None:
            yield f"{path}.{key}: not a field a claim may set here (allowed: {sorted(fields)})"
        elif name != key:
            yield f"{path}.{key}: write it {name!r}: a claim's keys must be in their canonical case"
        elif not (target.offline and holds_placeholder(item)):
            yield from fields[name](item, f"{path}.{key}", target)


def _special(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str | None:
    """Why an address is never a tenant's, whatever the admin's ranges say; None when it may be."""
    mapped = getattr(address, "ipv4_mapped", None)
    if mapped is not None:  # ::ffff:a.b.c.d is an IPv4 address to the kernel: never a claim's IPv6 one
        return "an IPv4-mapped IPv6 address"
    for test, what in (
        (address.is_loopback, "loopback"),
        (address.is_link_local, "link-local (the cloud's metadata service lives there)"),
        (address.is_multicast, "multicast"),
        (address.is_unspecified, "unspecified"),
        (address.is_reserved, "reserved"),
    ):
        if test:
            return what
    return None


def _inside(network: IPNetwork, outer: IPNetwork) -> bool:
    if isinstance(network, ipaddress.IPv4Network) and isinstance(outer, ipaddress.IPv4Network):
        return network.subnet_of(outer)
    if isinstance(network, ipaddress.IPv6Network) and isinstance(outer, ipaddress.IPv6Network):
        return network.subnet_of(outer)
    return False


def _network_problems(network: IPNetwork, path: str, rules: AddressRules | None) -> Iterator[str]:
    """A network a tenant's IPAM would configure or hand out from, against the admin's rules."""
    for address in (network.network_address, network.broadcast_address):
        reason = _special(address)
        if reason is not None:
            yield f"{path}: {network} is {reason}: never a claim's"
            return
    if rules is None:
        return
    if not any(_inside(network, allowed) for allowed in rules.allowed):
        yield (
            f"{path}: {network} is outside the ranges the admin gave tenants on this device "
            f"({', '.join(map(str, rules.allowed))})"
        )
        return
    for forbidden, whose in rules.forbidden:
        if network.version == forbidden.version and network.overlaps(forbidden):
            yield f"{path}: {network} overlaps {forbidden} ({whose}): never a claim's own"


def _address_problems(ipam: dict[str, Any], path: str, target: Target) -> Iterator[str]:
    """Where the tenant's IPAM takes addresses: admin-declared ranges only, no pool's, nothing special;
    gateways and range bounds inside their subnet."""
    rules = target.addresses
    if rules is not None and rules.pool is not None:
        yield (
            f"{path}: the device's network is served by IPPool {rules.pool}: a claim takes its addresses "
            "from the pool (a request of DeviceClass netclaim-address, docs/ipam.md), never from its own "
            "config"
        )
        return
    if rules is not None and rules.allowed and not rules.cluster_known:
        yield (
            f"{path}: the node's admin has not given netclaim the cluster's pod and Service CIDRs "
            "(--reserved-cidrs, chart value agent.reservedCIDRs): a claim's own IPAM is refused until then"
        )
        return
    if rules is not None and not rules.allowed:
        yield (
            f"{path}: the admin gave tenants no address ranges on this device (the publish rule's "
            "tenantRanges): take addresses from an IPPool (docs/ipam.md)"
        )
        return
    ranges: list[tuple[str, dict[str, Any]]] = []
    if "subnet" in ipam:
        ranges.append((path, ipam))
    for i, range_set in enumerate(ipam.get("ranges") or []):
        ranges += [(f"{path}.ranges[{i}][{j}]", entry) for j, entry in enumerate(range_set)]
    for where, entry in ranges:
        text = entry.get("subnet")
        if target.offline and holds_placeholder(text):
            continue
        try:
            subnet = ipaddress.ip_network(str(text), strict=False)
        except ValueError:
            yield f"{where}.subnet: {text!r} is not a CIDR (like 10.10.1.0/24)"
            continue
        yield from _network_problems(subnet, f"{where}.subnet", rules)
        for key in ("gateway", "rangeStart", "rangeEnd"):
            address = entry.get(key)
            if address is None or (target.offline and holds_placeholder(address)):
                continue
            try:
                inside = ipaddress.ip_address(str(address)) in subnet
            except ValueError:
                yield f"{where}.{key}: {address!r} is not an IP address"
                continue
            if not inside:
                yield f"{where}.{key}: {address} is outside the subnet {subnet}"
    for i, entry in enumerate(ipam.get("addresses") or []):
        text = entry.get("address")
        if text is None or (target.offline and holds_placeholder(text)):
            continue
        try:
            interface = ipaddress.ip_interface(str(text))
        except ValueError:
            yield f"{path}.addresses[{i}].address: {text!r} is not an address with a prefix (10.10.1.5/24)"
            continue
        reason = _special(interface.ip)
        if reason is not None:
            yield f"{path}.addresses[{i}].address: {interface.ip} is {reason}: never a claim's"
            continue
        yield from _network_problems(interface.network, f"{path}.addresses[{i}].address", rules)


def tenant_problems(
    conflist: dict[str, Any],
    target: Target,
    path: str = "config",
    from_admin: frozenset[tuple[int, str]] = frozenset(),
) -> Iterator[str]:
    """Everything in a tenant's rendered config list that the allow-list does not allow. `from_admin`:
    (plugin index, lower-cased key) the DeviceClass's pinned config fills in afterwards (a claim may
    restate them: the class's value replaces them all the same)."""
    canonical = {key.lower(): key for key in CONFLIST_KEYS}
    for key in conflist:
        name = canonical.get(key.lower())
        if name is None:
            yield f"{path}.{key}: not a field a claim may set (allowed: {sorted(CONFLIST_KEYS)})"
        elif name != key:
            yield f"{path}.{key}: write it {name!r}: a claim's keys must be in their canonical case"
    for index, plugin in enumerate(conflist.get("plugins") or []):
        where = f"{path}.plugins[{index}]"
        if not isinstance(plugin, dict):
            continue  # the config's own checks said so
        kind = plugin.get("type")
        fields = PLUGINS.get(kind) if isinstance(kind, str) else None
        if fields is None:
            spelled = next((k for k in plugin if k.lower() == "type" and k != "type"), None)
            yield (
                f"{where}.{spelled}: write it 'type': a claim's keys must be in their canonical case"
                if spelled is not None
                else f"{where}.type: {kind!r} is admin-only: it reaches the node's own network, so only a "
                f"DeviceClass config may use it (a claim may use {sorted(PLUGINS)})"
            )
            continue
        own = {k: v for k, v in plugin.items() if k != "type" and (index, k.lower()) not in from_admin}
        yield from _object(own, where, fields, target)
        for required in REQUIRED.get(str(kind), ()):
            if required not in plugin and (index, required) not in from_admin:
                yield (
                    f"{where}.{required}: required: the allocated device's interface "
                    f"({{{{ device.ifName }}}}); without it {kind} falls back to one of the node's choosing"
                )


def sharing_problems(conflist: dict[str, Any], target: Target, device: str) -> Iterator[str]:
    """On a shared device, whoever wrote the config: children only of the type (and an ipvlan only in the
    mode) the publish rule gives the NIC, never a plugin that takes the whole NIC away from the other pods.
    The kernel keeps one ipvlan mode per NIC (the latest wins, for every pod on it) and lets a NIC carry
    macvlans or ipvlans, never both."""
    if not target.shared:
        return
    for index, plugin in enumerate(conflist.get("plugins") or []):
        if not isinstance(plugin, dict):
            continue
        where = f"config.plugins[{index}]"
        kind = plugin.get("type")
        mode = plugin.get("mode")
        if kind in EXCLUSIVE_ONLY or (kind == "macvlan" and mode == "passthru"):
            yield (
                f"{where}.type: {kind!r} takes the whole NIC, but device {device} is shared: "
                "use a DeviceClass of exclusive devices (netclaim-exclusive)"
            )
        elif kind in CHILD_PLUGINS and kind != target.child:
            yield (
                f"{where}.type: device {device} is shared through {target.child} children (its publish "
                f"rule); a NIC carries one kind, so {kind} is refused"
            )
        elif kind == "ipvlan" and mode is not None and mode != target.ipvlan_mode:
            yield (
                f"{where}.mode: device {device}'s ipvlans are in mode {target.ipvlan_mode} (its publish "
                f"rule): the kernel keeps one mode per NIC, for every pod on it"
            )

"""Planning: a claim, what was gathered for it and this node's devices → one typed AttachPlan per device.

Pure functions, no I/O, no adapter's protocol. Prepare (netclaim.agent.claims.prepare) calls them twice:
- `claim_needs` before anything is gathered: what the claim asks of the world outside, read from it alone
  (the IP pools' devices it was allocated and the addresses it asks of each, whether its own config names
  IPAM, the plugins its configs name);
- `plan_claim`, once, with all that was gathered (netclaim.agent.claims.gather): it decodes the configs
  (DeviceClass first, then claim), merges them, fills placeholders from the allocated device, checks a
  tenant's config against the allow-list (netclaim.core.config.tenancy) and every config against the device's
  sharing, configures the granted pool addresses (static IPAM), fills the node's defaults and settles the
  CNI version every plugin of each chain speaks (`negotiate`).
Every error is a ConfigError naming the field.

The plan is what the store keeps (netclaim.agent.store): AttachPlan and its parts are its schema,
versioned, the allocated NIC a NicRecord of its own rather than publish.devices.Device.
"""

from __future__ import annotations

import functools
import hashlib
import ipaddress
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import msgspec

from netclaim.core.config.cniconfig import (
    EffectiveConfig,
    SourcedConfig,
    as_conflist,
    decode,
    merge,
    plugin_types,
    version_key,
)
from netclaim.core.config.placeholders import ScalarValue, render
from netclaim.core.config.publishpolicy import AttributeValue
from netclaim.core.config.tenancy import AddressRules, IPNetwork, Target, sharing_problems, tenant_problems
from netclaim.core.devices.catalog import ATTACHMENTS, BANDWIDTH, Capacity, Device
from netclaim.core.ipam.addresses import AddressRequest, Grant
from netclaim.core.ipam.ippool import POOLS_POOL, AddressConfig, IPPool
from netclaim.core.names import DRIVER_DOMAIN, NETWORK, NETWORK_NAME, PLUGIN_TYPE, check_pod_interface_name
from netclaim.core.objects import AllocatedDevice, Claim
from netclaim.core.quantity import parse_quantity
from netclaim.errors import ConfigError

POOL_IPAM = "static"  # the IPAM plugin that configures the addresses granted from IP pools
MTU, MAC, PCI_ADDRESS = (f"{DRIVER_DOMAIN}/{key}" for key in ("mtu", "mac", "pciAddress"))


class PoolAddresses(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Addresses granted from one IP pool's device of the claim (its status entry shows them)."""

    request: str
    pool: str  # the DRA pool of the device (POOLS_POOL)
    device: str  # = the IPPool's name
    share_id: str
    ips: tuple[str, ...]


class NicCapacity(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One capacity of the NIC as it was published: its value, and a shared NIC's request policy."""

    value: int
    default: int | None = None
    minimum: int | None = None
    step: int | None = None
    maximum: int | None = None


class NicRecord(msgspec.Struct, frozen=True, forbid_unknown_fields=True, dict=True):
    """The allocated NIC as a stored plan keeps it: a schema of its own, so that publish.devices.Device
    may change without changing what the store reads back. After prepare it is read for: whether the NIC
    is shared (an exclusive one moves into the pod), the name, MTU and MAC an exclusive NIC is restored to
    when it comes back, its PCI address (the network-status `device-info`), and the whole of what was
    published (attributes, capacity): a NIC inside a pod is no longer on the node, and is published from
    here meanwhile, after a restart too. The admin's tenant ranges are not kept: they only bound planning."""

    name: str  # the DRA device
    if_name: str  # on the node
    shared: bool
    attributes: dict[str, AttributeValue]  # fully qualified names, as published
    capacity: dict[str, NicCapacity]

    @classmethod
    def of(cls, device: Device) -> NicRecord:
        return cls(
            name=device.name,
            if_name=device.if_name,
            shared=device.shared,
            attributes=dict(device.attributes),
            capacity={
                name: NicCapacity(c.value, c.default, c.minimum, c.step, c.maximum)
                for name, c in device.capacity.items()
            },
        )

    def published(self) -> Device:
        """The device as it was published (without tenant ranges: nothing is planned on it meanwhile)."""
        capacity = {name: Capacity(**msgspec.structs.asdict(c)) for name, c in self.capacity.items()}
        return Device(self.name, self.if_name, self.shared, dict(self.attributes), capacity)

    @functools.cached_property
    def guarded(self) -> bool:
        """The published device's `guarded`, kept: the port guard asks it of every row at each change."""
        return self.published().guarded

    @property
    def mtu(self) -> int | None:
        mtu = self.attributes.get(MTU)
        return mtu if isinstance(mtu, int) and not isinstance(mtu, bool) else None

    @property
    def mac(self) -> str | None:
        mac = self.attributes.get(MAC)
        return mac if isinstance(mac, str) else None

    @property
    def pci_address(self) -> str | None:
        pci = self.attributes.get(PCI_ADDRESS)
        return pci if isinstance(pci, str) else None


class AttachPlan(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """What RunPodSandbox carries out for one allocated device, stored as JSON (versioned; the store
    migrates older rows when it opens: netclaim.agent.store)."""

    # a newer agent reads older versions (by migrating them), never the reverse; 2 added pool_addresses,
    # 3 keeps the NIC as a NicRecord
    version: Literal[3] = 3
    interface_name: str  # inside the pod
    conflist: dict[str, Any]  # rendered, node defaults filled, cniVersion negotiated
    bandwidth_bps: int | None  # cap both ways; None: not shaped
    nic: NicRecord
    pool_addresses: tuple[PoolAddresses, ...] = ()

    @property
    def shared(self) -> bool:
        return self.nic.shared

    @property
    def may_get_ipv6(self) -> bool:
        """Whether a plugin's IPAM names an IPv6 address or network: then the interface may get one."""
        return any(_names_ipv6(plugin.get("ipam")) for plugin in self.conflist["plugins"])

    @property
    def runs_beside_siblings(self) -> bool:
        """Whether its ADD may run at the same time as another of the pod's: every plugin of the chain
        makes or moves its own interface only, with IPAM that is stateless or locks its own store, and
        no IPv6 (the pod's default for duplicate address detection is swapped around each ADD, which two
        at once would leave swapped). A chain that touches what its siblings share (routes and rules
        of the namespace: sbr; a host's bridge or iptables) runs alone, as libcni's callers run them."""
        return not self.may_get_ipv6 and all(
            plugin.get("type") in SELF_CONTAINED_PLUGINS
            and (plugin.get("ipam") is None or _ipam_type(plugin) in SELF_CONTAINED_IPAM)
            for plugin in self.conflist["plugins"]
        )


# chains of these may ADD in one pod at the same time: the interface makers and the IPAM plugins whose
# state is a locked directory (host-local) or none (static)
SELF_CONTAINED_PLUGINS = frozenset({"macvlan", "ipvlan", "host-device"})
SELF_CONTAINED_IPAM = frozenset({"host-local", "static"})


def _ipam_type(plugin: dict[str, Any]) -> object:
    ipam = plugin.get("ipam")
    return ipam.get("type") if isinstance(ipam, dict) else None


def _names_ipv6(value: object) -> bool:
    if isinstance(value, dict):
        return any(_names_ipv6(item) for item in value.values())
    if isinstance(value, list):
        return any(_names_ipv6(item) for item in value)
    if isinstance(value, str) and ":" in value:
        try:
            return ipaddress.ip_interface(value).version == 6
        except ValueError:
            return False
    return False


@dataclass(frozen=True)
class ClaimNeeds:
    """What a claim asks of the world outside, read from the claim alone: what prepare gathers for it."""

    addresses: list[AddressRequest]  # the IP pools' devices it was allocated, what it asks of each
    pools: bool  # its own config names IPAM: checked against every IP pool of the cluster
    plugin_types: frozenset[str]  # every plugin (and delegated IPAM) its configs name, and POOL_IPAM


@dataclass(frozen=True)
class PluginVersions:
    """What the installed plugins speak: plugin type → CNI versions; or why a type cannot run here."""

    spoken: Mapping[str, Sequence[str]]
    unusable: Mapping[str, str] = field(default_factory=dict)

    def of(self, conflist: dict[str, Any]) -> dict[str, Sequence[str]]:
        """The versions of each plugin of a chain; a ConfigError for one that cannot run on this node."""
        for kind in plugin_types(conflist):
            if kind in self.unusable:
                raise ConfigError(self.unusable[kind])
        return {kind: self.spoken[kind] for kind in plugin_types(conflist)}


@dataclass(frozen=True)
class ClaimInputs:
    """Everything planning a claim needs from outside, gathered before it starts."""

    claim: Claim
    versions: PluginVersions
    grants: Sequence[Grant] = ()  # the addresses it holds from its IP pools
    pools: Sequence[IPPool] = ()  # the cluster's IP pools, when its own config names IPAM


@dataclass(frozen=True)
class NodeContext:
    """What every claim of this node is planned with."""

    driver: str
    node: str
    device: Callable[[str], Device | None]  # the devices the node publishes now, by name
    host_local_dir: Path | None = None  # where host-local IPAM naming no dataDir keeps reservations
    reserved: Sequence[IPNetwork] = ()  # networks no claim's own IPAM may use: the cluster's


@dataclass(frozen=True)
class PlannedDevice:
    """One allocated device of the claim and its plan; `lowered_from`: the CNI version the config asked
    for, when the installed plugins speak only older ones (None: as asked)."""

    allocated: AllocatedDevice
    plan: AttachPlan
    lowered_from: str | None = None


def _where(claim: Claim) -> str:
    return f"claim {claim.namespace}/{claim.name}"


def address_requests(claim: Claim, driver: str) -> list[AddressRequest]:
    """The claim's IP pool devices, each with the addresses its AddressConfig asks for and the interface
    request that gets them (the claim's only interface request, unless `interfaceRequest` says)."""
    interfaces = sorted({r.request for r in claim.results if r.driver == driver and r.pool != POOLS_POOL})
    pool_results = [r for r in claim.results if r.driver == driver and r.pool == POOLS_POOL]
    twice = sorted(pool for pool, count in Counter(r.device for r in pool_results).items() if count > 1)
    if twice:
        raise ConfigError(
            f"{_where(claim)}: requests {sorted(r.request for r in pool_results if r.device in twice)} all "
            f"take addresses from IPPool {twice[0]}: a claim takes one address (per family) of a pool, "
            "through one request"
        )
    found = []
    for allocated in pool_results:
        static: dict[int, Any] = {}
        target = None
        for sourced in configs_for(claim, allocated.request, driver):
            if isinstance(sourced.config, AddressConfig):
                static.update(sourced.config.static())
                target = sourced.config.interfaceRequest or target
            elif allocated.request in sourced.requests or allocated.request.split("/")[0] in sourced.requests:
                raise ConfigError(
                    f"{sourced.location}.kind: request {allocated.request} takes addresses from IPPool "
                    f"{allocated.device}: its config is an AddressConfig, not a CNIConfig"
                )
        if target is None:
            if len(interfaces) != 1:
                raise ConfigError(
                    f"{_where(claim)}: request {allocated.request} takes addresses from IPPool "
                    f"{allocated.device}, the claim has {len(interfaces)} interface requests "
                    f"{interfaces}: say which in its AddressConfig's interfaceRequest"
                )
            target = interfaces[0]
        elif target not in interfaces:
            raise ConfigError(
                f"{_where(claim)}: AddressConfig.interfaceRequest {target!r} of request {allocated.request} "
                f"is not one of the claim's interface requests {interfaces}"
            )
        found.append(AddressRequest(allocated, static, target))
    return found


def claim_needs(claim: Claim, driver: str) -> ClaimNeeds:
    """What to gather for the claim before planning it (a ConfigError when its AddressConfigs cannot work)."""
    addresses = address_requests(claim, driver)
    kinds = named_plugin_types(claim, driver) | ({POOL_IPAM} if addresses else set())
    return ClaimNeeds(addresses=addresses, pools=_names_ipam(claim, driver), plugin_types=kinds)


def named_plugin_types(claim: Claim, driver: str) -> frozenset[str]:
    """Every plugin type (and delegated IPAM type) the driver's configs of the claim name, DeviceClass's
    and claim's: what any of its chains may run. Read before the configs are decoded: what is not a
    plugin name is left to decoding to refuse."""
    found = set()
    for entry in claim.configs:
        config = entry.parameters.get("config") if isinstance(entry.parameters, dict) else None
        if entry.driver != driver or not isinstance(config, dict):
            continue
        plugins = as_conflist(config).get("plugins")
        for plugin in plugins if isinstance(plugins, list) else []:
            ipam = plugin.get("ipam") if isinstance(plugin, dict) else None
            for named in (plugin, ipam):
                kind = named.get("type") if isinstance(named, dict) else None
                if isinstance(kind, str) and PLUGIN_TYPE.fullmatch(kind):
                    found.add(kind)
    return frozenset(found)


def _names_ipam(claim: Claim, driver: str) -> bool:
    """Whether a claim's own config names IPAM anywhere: then planning needs the cluster's IP pools (so
    that no claim configures a pool's address, or any address on a network a pool serves, by itself)."""
    for entry in claim.configs:
        if entry.driver != driver or entry.source == "FromClass" or not isinstance(entry.parameters, dict):
            continue
        config = entry.parameters.get("config")
        plugins = config.get("plugins", [config]) if isinstance(config, dict) else []
        if isinstance(plugins, list) and any(isinstance(p, dict) and "ipam" in p for p in plugins):
            return True
    return False


def plan_claim(inputs: ClaimInputs, node: NodeContext) -> list[PlannedDevice]:
    """Plans for every device of the node's driver allocated to the claim, each chain's CNI version
    settled with what the installed plugins speak."""
    claim, driver, grants, pools = inputs.claim, node.driver, inputs.grants, inputs.pools
    where = _where(claim)
    if not claim.allocated:
        raise ConfigError(f"{where} is not allocated")
    if len(claim.reserved_for) != 1:
        raise ConfigError(
            f"{where} is reserved for {len(claim.reserved_for)} pods; a netclaim.dev claim configures one "
            "pod's interface: use a ResourceClaimTemplate per pod"
        )
    planned: list[PlannedDevice] = []
    interface_names: dict[str, str] = {}
    nics = [r for r in claim.results if r.driver == driver and r.pool != POOLS_POOL]
    per_request = Counter(r.request for r in nics)
    _check_attachments(nics, node, where)
    for allocated in nics:
        if allocated.pool != node.node:
            raise ConfigError(
                f"{where}: device {allocated.pool}/{allocated.device} is not on node {node.node}"
            )
        effective = merge(configs_for(claim, allocated.request, driver), allocated.request)
        siblings = [r for r in nics if r.request == allocated.request]  # in allocation order: one device
        # may be a request's twice (a shared one), so each result, not each device, is numbered
        if per_request[allocated.request] > effective.devices_per_request:
            raise ConfigError(
                f"{where}: request {allocated.request} was allocated {per_request[allocated.request]} "
                f"devices (allocationMode All, or a count); its DeviceClass allows "
                f"{effective.devices_per_request} per request (devicesPerRequest)"
            )
        interface = _interface_name(effective.interface_name, siblings.index(allocated), where)
        other = interface_names.setdefault(interface, allocated.request)
        if other != allocated.request:
            raise ConfigError(
                f"{where}: requests {other} and {allocated.request} both name interface "
                f"{interface}; give each an interfaceName"
            )
        published = node.device(allocated.device)
        if published is None:
            raise ConfigError(f"device {allocated.device} is not published by this node (any more)")
        known = [*pools, *(g.pool for g in grants if g.pool.name not in {p.name for p in pools})]
        rules = None if effective.cni_from_admin else address_rules(published, known, node.reserved)
        plan = _plan(claim, allocated, effective, published, interface, rules, node.host_local_dir)
        mine = [g for g in grants if g.interface_request == allocated.request]
        if mine:
            plan = with_pool_addresses(plan, mine, f"{where}: request {allocated.request}")
        conflist, lowered = negotiate(plan.conflist, inputs.versions.of(plan.conflist))
        asked = str(plan.conflist.get("cniVersion")) if lowered else None
        planned.append(PlannedDevice(allocated, msgspec.structs.replace(plan, conflist=conflist), asked))
    return planned


def _check_attachments(nics: list[AllocatedDevice], node: NodeContext, where: str) -> None:
    """A claim takes at most what one request may take of a shared NIC (its publish rule's
    attachmentsPerClaim, the capacity's validRange.max), however many requests it spreads it over."""
    taken: Counter[str] = Counter()
    for allocated in nics:
        taken[allocated.device] += int(parse_quantity(allocated.consumed_capacity.get(ATTACHMENTS, "0")))
    for device_name, count in sorted(taken.items()):
        device = node.device(device_name)
        limit = device.capacity.get(ATTACHMENTS) if device is not None else None
        if limit is not None and limit.maximum is not None and count > limit.maximum:
            raise ConfigError(
                f"{where}: takes {count} attachments of device {device_name} over its requests; a claim may "
                f"take {limit.maximum} (the NIC's attachmentsPerClaim)"
            )


def with_pool_addresses(plan: AttachPlan, grants: list[Grant], where: str) -> AttachPlan:
    """The plan with the granted addresses configured by `static` IPAM on the chain's first plugin (the
    one creating the interface), which must name no IPAM of its own."""
    for grant in grants:
        network = plan.nic.attributes.get(NETWORK)
        if grant.pool.spec.network is not None and network != grant.pool.spec.network:
            raise ConfigError(
                f"{where}: IPPool {grant.pool.name} serves network {grant.pool.spec.network!r}, device "
                f"{plan.nic.name} is on {network!r} (add a matchAttribute constraint on {NETWORK})"
            )
    first = plan.conflist["plugins"][0]
    if any(key.lower() == "ipam" for key in first):
        raise ConfigError(
            f"{where}: config.plugins[0].ipam: the claim takes its addresses from IPPool "
            f"{', '.join(g.pool.name for g in grants)}; leave ipam out"
        )
    ipam: dict[str, Any] = {"type": POOL_IPAM, "addresses": [a for g in grants for a in g.static_addresses()]}
    routes = [r for g in grants for r in g.routes()]
    if routes:
        ipam["routes"] = routes
    conflist = {**plan.conflist, "plugins": [{**first, "ipam": ipam}, *plan.conflist["plugins"][1:]]}
    pool_addresses = tuple(
        PoolAddresses(
            request=g.allocated.request,
            pool=g.allocated.pool,
            device=g.allocated.device,
            share_id=g.allocated.share_id,
            ips=g.addresses,
        )
        for g in grants
    )
    return msgspec.structs.replace(plan, conflist=conflist, pool_addresses=pool_addresses)


def configs_for(claim: Claim, request: str, driver: str) -> list[SourcedConfig]:
    """The driver's configs that apply to `request` (or its parent request), in allocation order."""
    configs = []
    parent = request.split("/")[0]
    for index, entry in enumerate(claim.configs):
        if entry.driver != driver:
            continue
        if entry.requests and request not in entry.requests and parent not in entry.requests:
            continue
        owner = (
            "DeviceClass config" if entry.source == "FromClass" else f"claim {claim.namespace}/{claim.name}"
        )
        location = f"{owner} (allocation config[{index}]).opaque.parameters"
        configs.append(
            SourcedConfig(decode(entry.parameters, location), entry.source, location, entry.requests)
        )
    return configs


def placeholder_values(
    claim: Claim, allocated: AllocatedDevice, device: Device, node: str
) -> dict[str, ScalarValue]:
    values: dict[str, ScalarValue] = {
        "device.name": device.name,
        "device.pool": node,
        "node.name": node,
        "claim.name": claim.name,
        "claim.namespace": claim.namespace,
        "claim.uid": claim.uid,
        "request": allocated.request,
    }
    consumed = allocated.consumed_capacity.get(BANDWIDTH)
    if consumed is not None:
        values["consumed.bandwidth"] = int(parse_quantity(consumed))
    for key, value in device.attributes.items():
        values[f"device.{key.rsplit('/', 1)[-1]}"] = value
    return values


def _interface_name(name: str, index: int, where: str) -> str:
    """The interface of the `index`-th device of one request: the request's name, then name-1, name-2…"""
    if index == 0:
        return name
    try:
        return check_pod_interface_name(f"{name}-{index}")
    except ValueError as err:
        raise ConfigError(f"{where}: interfaceName {name!r} with its device number: {err}") from None


def address_rules(device: Device, pools: Sequence[IPPool], reserved: Sequence[IPNetwork]) -> AddressRules:
    """Where a claim's own IPAM may take addresses on `device`: the admin's tenant ranges of its publish
    rule, never a pool's network or the cluster's, and nothing at all on a network a pool serves."""
    network = device.attributes.get(NETWORK)
    serving = next((p.name for p in pools if network is not None and p.spec.network == network), None)
    forbidden = [(r.network, f"IPPool {p.name}") for p in pools for r in p.spec.ranges]
    forbidden += [(n, "the cluster's pod or Service network") for n in reserved]
    return AddressRules(
        allowed=tuple(ipaddress.ip_network(r) for r in device.tenant_ranges),
        forbidden=tuple(forbidden),
        pool=serving,
        cluster_known=bool(reserved),
    )


def _plan(
    claim: Claim,
    allocated: AllocatedDevice,
    effective: EffectiveConfig,
    device: Device,
    interface: str,
    rules: AddressRules | None,
    host_local_dir: Path | None,
) -> AttachPlan:
    values = placeholder_values(claim, allocated, device, node=allocated.pool)
    conflist = render(effective.cni, values, "config")
    target = Target(
        if_name=device.if_name,
        shared=device.shared,
        pod_interface=interface,
        child=device.child_type,
        ipvlan_mode=device.ipvlan_mode,
        addresses=rules,
    )
    from_admin = frozenset((index, key.lower()) for index, key, _ in effective.admin_parts)
    problems = (
        [] if effective.cni_from_admin else list(tenant_problems(conflist, target, "config", from_admin))
    )
    for index, key, value in effective.admin_parts:  # the class's pinned parts, after the tenant's checks
        conflist["plugins"][index][key] = render(value, values, f"config.plugins[{index}].{key}")
    problems += sharing_problems(conflist, target, device.name)
    name = conflist.get("name")
    if not isinstance(name, str) or not NETWORK_NAME.fullmatch(name):  # as rendered: `{{ request }}` is a/b
        problems.append(f"config.name: {name!r} is not a CNI network name (1-63 of A-Z a-z 0-9 _ . -)")
    if problems:
        raise ConfigError("\n".join(problems))
    if device.shared and device.ipvlan_mode is not None:  # an ipvlan naming no mode gets the NIC's
        conflist["plugins"] = [
            {**p, "mode": device.ipvlan_mode} if p.get("type") == "ipvlan" and "mode" not in p else p
            for p in conflist["plugins"]
        ]
    if device.guarded:
        conflist["plugins"] = [
            guarded_child(p, child_mac(claim.uid, allocated)) if p.get("type") == "macvlan" else p
            for p in conflist["plugins"]
        ]
    consumed = allocated.consumed_capacity.get(BANDWIDTH)
    owner = None if effective.cni_from_admin else claim.namespace
    return AttachPlan(
        interface_name=interface,
        conflist=with_node_defaults(conflist, host_local_dir, owner),
        bandwidth_bps=(
            int(parse_quantity(consumed)) if consumed and effective.bandwidth == "enforce" else None
        ),
        nic=NicRecord.of(device),
    )


def guarded_child(plugin: dict[str, Any], mac: str) -> dict[str, Any]:
    """A macvlan child on a NIC with port security (netclaim.agent.pods.guard): in VEPA mode, so that every
    frame it sends, to a pod of the same NIC too, leaves through the NIC where the node checks it (the node
    then hands a pod's frames for its neighbours back to them); with its MAC chosen here, so that the node
    knows it before the child exists. `private` stays private (no neighbour gets its frames); a MAC the
    config names is kept."""
    mode = "private" if plugin.get("mode") == "private" else "vepa"
    return {**plugin, "mode": mode, "mac": plugin.get("mac") or mac}


def child_mac(claim_uid: str, allocated: AllocatedDevice) -> str:
    """A stable, locally administered unicast MAC for one allocated share (the same at every prepare)."""
    digest = hashlib.sha256(f"{claim_uid}/{allocated.request}/{allocated.share_id}".encode()).digest()
    first = (digest[0] & 0xFC) | 0x02
    return ":".join(f"{byte:02x}" for byte in (first, *digest[1:6]))


def with_node_defaults(
    conflist: dict[str, Any], host_local_dir: Path | None, tenant: str | None = None
) -> dict[str, Any]:
    """The config list with this node's defaults filled in where the config names none: host-local IPAM
    keeps its reservations in netclaim's own directory, never the node's /var/lib/cni (where the primary
    network keeps its own): a DeviceClass's under `admin/`, a claim's under `tenant/<its namespace>/`, so
    that no tenant can name another's network, or the node's, and take or exhaust its addresses."""
    if host_local_dir is None:
        return conflist
    data_dir = host_local_dir / "admin" if tenant is None else host_local_dir / "tenant" / tenant
    plugins = []
    for plugin in conflist["plugins"]:
        ipam = plugin.get("ipam")
        if isinstance(ipam, dict) and ipam.get("type") == "host-local" and "dataDir" not in ipam:
            plugin = {**plugin, "ipam": {**ipam, "dataDir": str(data_dir)}}
        plugins.append(plugin)
    return {**conflist, "plugins": plugins}


def negotiate(
    conflist: dict[str, Any], supported: Mapping[str, Sequence[str]]
) -> tuple[dict[str, Any], bool]:
    """The config list with `cniVersion` set to the highest version every plugin of the chain speaks
    (`supported`: plugin type → the versions it reports), and whether that is below what was asked.

    `cniVersions` lists what the config accepts; a lone `cniVersion` is the highest it accepts (older
    plugins are then spoken to in the highest version they share, ≥ 0.4.0).
    """
    wanted = conflist.get("cniVersions") or [conflist["cniVersion"]]
    kinds = plugin_types(conflist)
    common = set.intersection(*(set(supported[kind]) for kind in kinds)) if kinds else set()
    candidates = sorted((v for v in common if v in wanted), key=version_key, reverse=True)
    lowered = False
    if not candidates and "cniVersions" not in conflist:
        ceiling = version_key(conflist["cniVersion"])
        candidates = sorted(
            (v for v in common if (0, 4, 0) <= version_key(v) <= ceiling), key=version_key, reverse=True
        )
        lowered = bool(candidates)
    if not candidates:
        raise ConfigError(
            f"cniVersion: the config asks for {wanted}, the installed plugins "
            f"{kinds} share only {sorted(common, key=version_key)}"
        )
    negotiated = {k: v for k, v in conflist.items() if k != "cniVersions"}
    negotiated["cniVersion"] = candidates[0]
    return negotiated, lowered

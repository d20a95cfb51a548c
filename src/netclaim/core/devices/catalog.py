"""From inventory facts and the admin policy to DRA devices, within the API's limits.

A device has at most 32 attributes + capacities and string values of at most 64 characters: what does not
fit is dropped with a log line (never a slice the apiserver rejects, which would hide every device).
"""

from __future__ import annotations

import asyncio
import datetime
import logging
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from netclaim.core.config.publishpolicy import AttributeValue, PublishPolicy, Rule
from netclaim.core.devices.nic import NetworkInterface, facts_as_attributes
from netclaim.core.devices.rules import SHARED_ATTRIBUTE, matches
from netclaim.core.names import DRIVER_DOMAIN, device_name
from netclaim.core.quantity import format_quantity, parse_quantity

log = logging.getLogger(__name__)

MAX_ATTRIBUTES_AND_CAPACITIES = 32
MAX_STRING = 64
BANDWIDTH = f"{DRIVER_DOMAIN}/bandwidth"
ATTACHMENTS = f"{DRIVER_DOMAIN}/attachments"
CHILD_TYPE = f"{DRIVER_DOMAIN}/childType"  # a shared NIC's: macvlan or ipvlan (SHARING_ATTRIBUTES)
IPVLAN_MODE = f"{DRIVER_DOMAIN}/ipvlanMode"
# a shared NIC's macvlan children held to their own MAC and addresses on the node (netclaim.agent.pods.guard)
PORT_SECURITY = f"{DRIVER_DOMAIN}/portSecurity"
ACCEPT_RA = f"{DRIVER_DOMAIN}/acceptRouterAdvertisements"  # the pods' interfaces take the network's RAs
LINK_DOWN = (
    f"{DRIVER_DOMAIN}/link-down"  # the taint of a device whose link is down (netclaim.agent.publish.health)
)


@dataclass(frozen=True)
class Capacity:
    value: int
    default: int | None = None  # requestPolicy, only on shared devices
    minimum: int | None = None
    step: int | None = None
    maximum: int | None = None  # what one request may consume at most (the scheduler refuses more)

    def to_api(self) -> dict[str, Any]:
        api: dict[str, Any] = {"value": format_quantity(self.value)}
        if self.default is not None and self.minimum is not None:
            valid_range: dict[str, str] = {"min": format_quantity(self.minimum)}
            if self.maximum is not None:
                valid_range["max"] = format_quantity(self.maximum)
            if self.step is not None:
                valid_range["step"] = format_quantity(self.step)
            api["requestPolicy"] = {"default": format_quantity(self.default), "validRange": valid_range}
        return api


@dataclass(frozen=True)
class Taint:
    key: str
    effect: str  # NoSchedule or NoExecute
    added: datetime.datetime

    def to_api(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "effect": self.effect,
            "timeAdded": self.added.strftime("%Y-%m-%dT%H:%M:%SZ"),
        }


@dataclass(frozen=True)
class Device:
    name: str
    if_name: str
    shared: bool
    attributes: dict[str, AttributeValue] = field(default_factory=dict)  # fully qualified names
    capacity: dict[str, Capacity] = field(default_factory=dict)
    tenant_ranges: tuple[str, ...] = ()  # not published: where a claim's own IPAM may take addresses
    taints: tuple[Taint, ...] = ()

    @property
    def child_type(self) -> str:
        """How pods share the NIC (its publish rule): macvlan or ipvlan children."""
        return str(self.attributes.get(CHILD_TYPE, "macvlan"))

    @property
    def ipvlan_mode(self) -> str | None:
        mode = self.attributes.get(IPVLAN_MODE)
        return mode if isinstance(mode, str) else None

    @property
    def guarded(self) -> bool:
        """Whether the node holds the pods' macvlan children on this NIC to their own MAC and addresses:
        a shared macvlan NIC unless its rule turned port security off (an attribute dropped at the API's
        limit counts as on)."""
        return (
            self.shared and self.child_type == "macvlan" and self.attributes.get(PORT_SECURITY) is not False
        )

    def to_api(self) -> dict[str, Any]:
        api: dict[str, Any] = {
            "name": self.name,
            "attributes": {k: typed_attribute(v) for k, v in self.attributes.items()},
        }
        if self.capacity:
            api["capacity"] = {k: c.to_api() for k, c in self.capacity.items()}
        if self.shared:
            api["allowMultipleAllocations"] = True
        if self.taints:
            api["taints"] = [taint.to_api() for taint in self.taints]
        return api


@dataclass(frozen=True)
class Decision:
    """What the policy made of one interface: a device, or the reason it is not published."""

    interface: NetworkInterface
    device: Device | None
    reason: str


def typed_attribute(value: AttributeValue) -> dict[str, AttributeValue]:
    if isinstance(value, bool):
        return {"bool": value}
    if isinstance(value, int):
        return {"int": value}
    return {"string": value}


def decide(
    interfaces: list[NetworkInterface],
    policy: PublishPolicy,
    driver: str,
    links_down: Mapping[str, datetime.datetime] | None = None,
) -> list[Decision]:
    """`links_down`: the interfaces whose link is down, and since when (their devices are tainted)."""
    decisions = []
    names: dict[str, str] = {}
    for interface in interfaces:
        if interface.never_publish:
            decisions.append(Decision(interface, None, f"never published: {interface.never_publish}"))
            continue
        grouped = facts_as_attributes(interface)
        position, rule = next(
            ((i, r) for i, r in enumerate(policy.rules) if matches(r, interface.name, grouped, driver)),
            (-1, None),
        )
        if rule is None:
            decisions.append(Decision(interface, None, "no policy rule matches"))
            continue
        if rule.mode == "ignore":
            decisions.append(Decision(interface, None, f"policy rule {position} ignores it"))
            continue
        device = _device(interface, rule, grouped)
        down_since = (links_down or {}).get(interface.name)
        if down_since is not None:
            device = replace(device, taints=(Taint(LINK_DOWN, rule.linkDown, down_since),))
        if device.name in names:
            log.warning(
                "two interfaces map to device %s (%s, %s); keeping the first",
                device.name,
                names[device.name],
                interface.name,
            )
            decisions.append(Decision(interface, None, f"device name {device.name} already taken"))
            continue
        names[device.name] = interface.name
        decisions.append(Decision(interface, device, f"policy rule {position}: {rule.mode}"))
    return decisions


def _device(interface: NetworkInterface, rule: Rule, grouped: dict[str, dict[str, AttributeValue]]) -> Device:
    shared = rule.mode == "shared"
    name = device_name(interface.name, interface.pci_address)
    capacity: dict[str, Capacity] = {}
    total = parse_quantity(rule.bandwidth.total) if rule.bandwidth.total else interface.speed_bps
    if total:
        bandwidth = rule.bandwidth
        capacity[BANDWIDTH] = (
            Capacity(
                int(total),
                default=min(int(parse_quantity(bandwidth.default)), int(total)),
                minimum=int(parse_quantity(bandwidth.min)),
                step=int(parse_quantity(bandwidth.step)),
            )
            if shared
            else Capacity(int(total))
        )
    elif shared:
        log.warning(
            "interface %s: no link speed and no bandwidth.total in the policy: no bandwidth published",
            interface.name,
        )
    sharing: list[tuple[str, AttributeValue]] = []
    if shared:
        capacity[ATTACHMENTS] = Capacity(
            rule.attachments, default=1, minimum=1, step=1, maximum=rule.attachmentsPerClaim
        )
        sharing.append((CHILD_TYPE, rule.childType))
        if rule.childType == "ipvlan":
            sharing.append((IPVLAN_MODE, rule.ipvlanMode))
        else:
            sharing.append((PORT_SECURITY, rule.portSecurity))
    sharing.append((ACCEPT_RA, rule.acceptRouterAdvertisements))
    attributes: dict[str, AttributeValue] = {}
    candidates: list[tuple[str, AttributeValue]] = [  # what netclaim itself reads first: never dropped
        (f"{DRIVER_DOMAIN}/{SHARED_ATTRIBUTE}", shared),
        *sharing,
        *((f"{domain}/{key}", value) for domain, values in grouped.items() for key, value in values.items()),
        *((key if "/" in key else f"{DRIVER_DOMAIN}/{key}", value) for key, value in rule.attributes.items()),
    ]
    room = MAX_ATTRIBUTES_AND_CAPACITIES - len(capacity)
    for key, value in candidates:
        if isinstance(value, str) and len(value) > MAX_STRING:
            log.warning(
                "device %s: attribute %s dropped: %d characters > %d", name, key, len(value), MAX_STRING
            )
        elif len(attributes) >= room:
            log.warning(
                "device %s: attribute %s dropped: %d attributes + capacities is the limit",
                name,
                key,
                MAX_ATTRIBUTES_AND_CAPACITIES,
            )
        else:
            attributes[key] = value
    return Device(
        name=name,
        if_name=interface.name,
        shared=shared,
        attributes=attributes,
        capacity=capacity,
        tenant_ranges=tuple(rule.tenantRanges),
    )


def link_down_since(device: Device) -> datetime.datetime | None:
    return next((t.added for t in device.taints if t.key == LINK_DOWN), None)


def _problem(device: Device) -> str | None:
    since = link_down_since(device)
    if since is None:
        return None
    return f"{device.if_name}: link down (no carrier) since {since.strftime('%Y-%m-%dT%H:%M:%SZ')}"


class DeviceCatalog:
    """The devices this node publishes now, by name (what prepare fills placeholders from), and what is
    wrong with those whose link the node sees (kubelet's health stream, the claims' LinkDown condition):
    not a whole NIC inside a pod's namespace."""

    def __init__(self) -> None:
        self._devices: dict[str, Device] = {}
        self._problems: dict[str, str | None] = {}
        self._health_changed = asyncio.Event()

    def update(self, devices: list[Device], inside_pods: Collection[str] = ()) -> None:
        """`inside_pods`: the names of the devices whose link is out of the node's sight."""
        self._devices = {d.name: d for d in devices}
        problems = {d.name: _problem(d) for d in devices if d.name not in inside_pods}
        if problems != self._problems:
            self._problems = problems
            self._health_changed.set()  # wakes who waits on it; the next wait is on a new one
            self._health_changed = asyncio.Event()

    def get(self, name: str) -> Device | None:
        return self._devices.get(name)

    def device_problems(self) -> dict[str, str | None]:
        return dict(self._problems)

    def link_seen(self, name: str) -> bool:
        """Whether the node sees the device's link (a device it publishes, not inside a pod)."""
        return name in self._problems

    def link_down_since(self, name: str) -> datetime.datetime | None:
        device = self._devices.get(name)
        return link_down_since(device) if device is not None and self.link_seen(name) else None

    async def health_changed(self) -> None:
        await self._health_changed.wait()

"""Cluster-wide IPAM types: the admin's `IPPool` and a claim's `AddressConfig`, and the pool arithmetic.

    apiVersion: netclaim.dev/v1alpha1
    kind: IPPool                         # cluster-scoped; its name is the DRA device name (a DNS label)
    metadata: {name: lan3}
    spec:
      network: lan3                      # serves devices whose netclaim.dev/network is lan3 (optional)
      ranges:                            # IPv4 and/or IPv6; a claim gets one address of each family
      - {subnet: 10.10.3.0/24, start: 10.10.3.10, end: 10.10.3.250, gateway: 10.10.3.1}
      - {subnet: "fd00:10:3::/64"}
      exclude: [10.10.3.64/28, 10.10.3.99]   # never handed out (nor the gateway)
      routes: [{dst: 0.0.0.0/0, gw: 10.10.3.1}]
      namespaces: [team-a]               # whose claims may use it; unset: every namespace

A claim takes addresses by requesting the pool's device (DeviceClass netclaim-address): one unit of its
consumable capacity `netclaim.dev/addresses` is one address of each of the pool's families. An
`AddressConfig` on that request may ask for specific addresses.

The arithmetic here is pure: which addresses a pool hands out (`Family.free_segments`), how many, and
which one a claim gets (`Family.pick`: from an offset given by the claim's UID, so that agents on many
nodes allocating at once rarely try the same address).
"""

from __future__ import annotations

import bisect
import hashlib
import ipaddress
from collections.abc import Iterable, Iterator
from typing import Annotated, Any, Literal

import msgspec

from netclaim.core.config import strict
from netclaim.core.names import DNS_LABEL, DRIVER_DOMAIN, pattern

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

ADDRESSES = f"{DRIVER_DOMAIN}/addresses"  # the consumable capacity of a pool's device
POOLS_POOL = f"{DRIVER_DOMAIN}/ip-pools"  # the DRA pool of the pools' devices: no node can be named so
MAX_CAPACITY = 2**32  # what a pool publishes at most (an IPv6 /64 holds 2**64)


def _network(value: str) -> IPNetwork:
    try:
        return ipaddress.ip_network(value, strict=True)
    except ValueError as err:
        raise ValueError(f"{value!r} is not a network in CIDR form (like 10.10.3.0/24): {err}") from None


def _address(value: str) -> IPAddress:
    try:
        return ipaddress.ip_address(value)
    except ValueError:
        raise ValueError(f"{value!r} is not an IP address") from None


def _excluded(value: str) -> IPNetwork | IPAddress:
    return ipaddress.ip_network(value, strict=False) if "/" in value else _address(value)


class PoolRange(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    subnet: str
    start: str | None = None
    end: str | None = None
    gateway: str | None = None

    def __post_init__(self) -> None:
        network = strict.named("subnet", _network, self.subnet)
        for key in ("start", "end", "gateway"):
            value = getattr(self, key)
            if value is not None and strict.named(key, _address, value) not in network:
                raise ValueError(f"{key}: {value} is not in subnet {self.subnet}")
        if self.start and self.end and int(_address(self.start)) > int(_address(self.end)):
            raise ValueError(f"start: {self.start} is after end {self.end}")

    @property
    def network(self) -> IPNetwork:
        return _network(self.subnet)

    def bounds(self) -> tuple[int, int]:
        """The first and last address handed out: not the network's own address nor (IPv4) broadcast."""
        network = self.network
        first, last = int(network.network_address), int(network.broadcast_address)
        if network.version == 4 and network.prefixlen < 31:
            first, last = first + 1, last - 1
        elif network.version == 6 and network.prefixlen < 127:
            first += 1
        if self.start is not None:
            first = max(first, int(_address(self.start)))
        if self.end is not None:
            last = min(last, int(_address(self.end)))
        return first, last


class Route(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    dst: str
    gw: str | None = None

    def __post_init__(self) -> None:
        strict.named("dst", _network, self.dst)
        if self.gw is not None:
            strict.named("gw", _address, self.gw)


class IPPoolSpec(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    network: Annotated[str, msgspec.Meta(min_length=1, max_length=64)] | None = None
    ranges: Annotated[list[PoolRange], msgspec.Meta(min_length=1, max_length=16)]
    exclude: Annotated[list[str], msgspec.Meta(max_length=256)] = msgspec.field(default_factory=list)
    routes: Annotated[list[Route], msgspec.Meta(max_length=32)] = msgspec.field(default_factory=list)
    namespaces: Annotated[list[str], msgspec.Meta(max_length=256)] | None = None

    def __post_init__(self) -> None:
        for index, value in enumerate(self.exclude):
            strict.named(f"exclude[{index}]", _excluded, value)
        networks = [r.network for r in self.ranges]
        for i, one in enumerate(networks):
            for other in networks[i + 1 :]:
                if one.version == other.version and one.overlaps(other):
                    raise ValueError(f"ranges: {one} and {other} overlap")
        for index, route in enumerate(self.routes):
            if route.gw is not None and _address(route.gw).version != _network(route.dst).version:
                raise ValueError(f"routes[{index}]: dst {route.dst} and gw {route.gw} differ in family")


class IPPool(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A pool as read from the API: its name and its validated spec."""

    name: Annotated[str, msgspec.Meta(pattern=pattern(DNS_LABEL), max_length=63)]
    spec: IPPoolSpec

    @classmethod
    def from_api(cls, data: dict[str, Any]) -> IPPool:
        name = str((data.get("metadata") or {}).get("name", ""))
        return strict.decode(cls, {"name": name, "spec": data.get("spec") or {}}, f"IPPool {name}")

    def families(self) -> dict[int, Family]:
        """The pool's address families (4, 6), each with what it hands out."""
        excluded = [
            ipaddress.ip_network(value, strict=False) if "/" in value else ipaddress.ip_network(value)
            for value in self.spec.exclude
        ]
        families: dict[int, Family] = {}
        for version in (4, 6):
            ranges = [r for r in self.spec.ranges if r.network.version == version]
            if ranges:
                families[version] = Family(self.name, version, ranges, excluded)
        return families

    def serves(self, namespace: str) -> bool:
        return self.spec.namespaces is None or namespace in self.spec.namespaces

    def admits_class(self, device_class: str) -> bool:
        """Whether a request of `device_class` may take the pool's addresses: a pool of some namespaces
        only through its own class (what admission guards), whatever other class an admin made selects
        its device."""
        return self.spec.namespaces is None or device_class == pool_class(self.name)


def pool_class(pool: str) -> str:
    """The DeviceClass through which claims take the addresses of a pool of some namespaces (docs/ipam.md)."""
    return f"netclaim-pool-{pool}"


class Family:
    """The addresses of one family a pool hands out, as sorted disjoint [first, last] integer segments."""

    def __init__(
        self, pool: str, version: int, ranges: list[PoolRange], excluded: Iterable[IPNetwork]
    ) -> None:
        self.pool, self.version, self.ranges = pool, version, ranges
        holes = [(int(n.network_address), int(n.broadcast_address)) for n in excluded if n.version == version]
        holes += [(int(_address(r.gateway)),) * 2 for r in ranges if r.gateway is not None]
        segments: list[tuple[int, int]] = []
        for first, last in sorted(r.bounds() for r in ranges):
            segments.extend(_subtract(first, last, sorted(holes)))
        self.segments = segments
        self._starts = [first for first, _ in segments]
        self._offsets = []
        total = 0
        for first, last in segments:
            self._offsets.append(total)
            total += last - first + 1
        self.size = total

    def hands_out(self, address: IPAddress) -> bool:
        value = int(address)
        index = bisect.bisect_right(self._starts, value) - 1
        return address.version == self.version and index >= 0 and value <= self.segments[index][1]

    def range_of(self, address: IPAddress) -> PoolRange | None:
        return next((r for r in self.ranges if address in r.network), None)

    def pick(self, taken: set[int], seed: int) -> IPAddress | None:
        """A free address, searching on from position `seed` (mod size) and wrapping; None when full."""
        if self.size == 0:
            return None
        position = seed % self.size
        index = bisect.bisect_right(self._offsets, position) - 1
        value = self.segments[index][0] + position - self._offsets[index]
        for _ in range(self.size):
            if value not in taken:
                return _at(self.version, value)
            value += 1
            if value > self.segments[index][1]:
                index = (index + 1) % len(self.segments)
                value = self.segments[index][0]
        return None


def _at(version: int, value: int) -> IPAddress:
    return ipaddress.IPv4Address(value) if version == 4 else ipaddress.IPv6Address(value)


def _subtract(first: int, last: int, holes: list[tuple[int, int]]) -> Iterator[tuple[int, int]]:
    """[first, last] without the (sorted) holes."""
    for hole_first, hole_last in holes:
        if hole_last < first or hole_first > last:
            continue
        if hole_first > first:
            yield first, hole_first - 1
        first = max(first, hole_last + 1)
        if first > last:
            return
    yield first, last


def claim_seed(claim_uid: str, probe: int = 0) -> int:
    """Where a claim looks for a free address on its `probe`-th blind try: spread over the pool,
    independent of the other probes, the same on every retry."""
    key = claim_uid if probe == 0 else f"{claim_uid}#{probe}"
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big")


def allocation_name(pool: str, address: IPAddress) -> str:
    """The IPAllocation object's name: creating it is what takes the address, cluster-wide and atomically."""
    if address.version == 4:
        return f"{pool}.{address}"
    return f"{pool}.{address.exploded.replace(':', '-')}"


def capacity(pool: IPPool, held_by_live_claims: int, in_use: dict[int, int]) -> int:
    """What the pool's device publishes as `netclaim.dev/addresses`.

    The scheduler subtracts one unit per allocated claim from it, so it is the claims holding addresses
    while allocated plus the claims that still fit (the least free family decides). Addresses held outside
    the pool's current ranges (the admin narrowed it) keep counting for their claims until released.
    `in_use`: family → addresses of that family held inside the ranges.
    """
    families = pool.families()
    free = min(family.size - in_use.get(version, 0) for version, family in families.items())
    return min(held_by_live_claims + max(free, 0), MAX_CAPACITY)


class AddressConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """The opaque config of a pool request: specific addresses, and which interface gets them."""

    apiVersion: Literal["netclaim.dev/v1alpha1"]
    kind: Literal["AddressConfig"]
    addresses: (
        Annotated[
            list[str], msgspec.Meta(max_length=2, description="static addresses: one IPv4, one IPv6 at most")
        ]
        | None
    ) = None
    interfaceRequest: (
        Annotated[
            str,
            msgspec.Meta(max_length=63, description="the claim's interface request (default: its only one)"),
        ]
        | None
    ) = None

    def __post_init__(self) -> None:
        if self.addresses is None:
            return
        versions = [
            strict.named(f"addresses[{i}]", _address, value).version for i, value in enumerate(self.addresses)
        ]
        if len(set(versions)) != len(versions):
            raise ValueError("addresses: at most one address per family (one IPv4, one IPv6)")

    def static(self) -> dict[int, IPAddress]:
        return {a.version: a for a in (_address(v) for v in self.addresses or [])}

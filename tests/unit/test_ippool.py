"""IPPool arithmetic: which addresses a pool hands out, which one a claim gets, what the pool publishes."""

from __future__ import annotations

import ipaddress
import re
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from netclaim.core.config.cniconfig import decode
from netclaim.core.ipam.ippool import (
    MAX_CAPACITY,
    AddressConfig,
    Family,
    IPAddress,
    IPPool,
    PoolRange,
    allocation_name,
    capacity,
    claim_seed,
)
from netclaim.errors import ConfigError


def _pool(*ranges: dict[str, Any], name: str = "lan3", **spec: Any) -> IPPool:
    return IPPool.from_api({"metadata": {"name": name}, "spec": {"ranges": list(ranges), **spec}})


def _v4(text: str) -> int:
    return int(ipaddress.IPv4Address(text))


def _v6(text: str) -> int:
    return int(ipaddress.IPv6Address(text))


def _all(family: Family) -> list[IPAddress]:
    """Every address the family hands out, by picking until it is full."""
    taken: set[int] = set()
    while (address := family.pick(taken, 0)) is not None:
        taken.add(int(address))
    make = ipaddress.IPv4Address if family.version == 4 else ipaddress.IPv6Address
    return [make(value) for value in sorted(taken)]


# --- PoolRange.bounds ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("subnet", "first", "last"),
    [
        ("10.10.3.0/24", "10.10.3.1", "10.10.3.254"),  # neither the network's address nor broadcast
        ("10.10.3.0/31", "10.10.3.0", "10.10.3.1"),  # point-to-point (RFC 3021): both
        ("10.10.3.7/32", "10.10.3.7", "10.10.3.7"),
    ],
)
def test_ipv4_bounds_leave_out_network_and_broadcast_unless_there_is_no_room(
    subnet: str, first: str, last: str
) -> None:
    assert PoolRange(subnet=subnet).bounds() == (_v4(first), _v4(last))


@pytest.mark.parametrize(
    ("subnet", "first", "last"),
    [
        ("fd00:10:3::/64", "fd00:10:3::1", "fd00:10:3::ffff:ffff:ffff:ffff"),  # no subnet-router anycast
        ("fd00:10:3::/127", "fd00:10:3::", "fd00:10:3::1"),  # point-to-point (RFC 6164): both
    ],
)
def test_ipv6_bounds_leave_out_the_subnet_router_anycast_address(subnet: str, first: str, last: str) -> None:
    assert PoolRange(subnet=subnet).bounds() == (_v6(first), _v6(last))


@pytest.mark.parametrize(
    ("pool_range", "first", "last"),
    [
        (
            PoolRange(subnet="10.10.3.0/24", start="10.10.3.10", end="10.10.3.250"),
            "10.10.3.10",
            "10.10.3.250",
        ),
        (PoolRange(subnet="10.10.3.0/24", start="10.10.3.0", end="10.10.3.255"), "10.10.3.1", "10.10.3.254"),
        (PoolRange(subnet="10.10.3.0/24", start="10.10.3.200"), "10.10.3.200", "10.10.3.254"),
        (PoolRange(subnet="10.10.3.0/24", end="10.10.3.20"), "10.10.3.1", "10.10.3.20"),
        (PoolRange(subnet="10.10.3.0/31", start="10.10.3.1"), "10.10.3.1", "10.10.3.1"),
    ],
)
def test_start_and_end_narrow_the_bounds_never_widen_them(
    pool_range: PoolRange, first: str, last: str
) -> None:
    assert pool_range.bounds() == (_v4(first), _v4(last))


def test_ipv6_start_and_end_narrow_the_bounds() -> None:
    pool_range = PoolRange(subnet="fd00:10:3::/64", start="fd00:10:3::100", end="fd00:10:3::1ff")
    assert pool_range.bounds() == (_v6("fd00:10:3::100"), _v6("fd00:10:3::1ff"))


# --- what a pool hands out -----------------------------------------------------------------------------


def test_gateway_and_excluded_addresses_and_networks_are_never_handed_out() -> None:
    pool = _pool(
        {"subnet": "10.10.3.0/28", "gateway": "10.10.3.1"},
        exclude=["10.10.3.4/30", "10.10.3.9", "fd00::1"],  # another family's exclude changes nothing
    )
    family = pool.families()[4]
    handed = [str(a) for a in _all(family)]
    assert handed == [f"10.10.3.{host}" for host in (2, 3, 8, 10, 11, 12, 13, 14)]
    assert family.size == 8
    for never in ("10.10.3.0", "10.10.3.1", "10.10.3.4", "10.10.3.7", "10.10.3.9", "10.10.3.15", "10.10.4.2"):
        assert not family.hands_out(ipaddress.ip_address(never)), never
    assert family.hands_out(ipaddress.ip_address("10.10.3.8"))
    assert not family.hands_out(ipaddress.ip_address("::a0a:302"))  # same integer, other family


def test_an_exclude_not_aligned_on_its_prefix_counts_from_its_network() -> None:
    family = _pool({"subnet": "10.10.3.0/29"}, exclude=["10.10.3.5/30"]).families()[4]
    assert [str(a) for a in _all(family)] == ["10.10.3.1", "10.10.3.2", "10.10.3.3"]


@pytest.mark.parametrize(
    ("ranges", "exclude", "size"),
    [
        ([{"subnet": "10.10.3.0/24"}], [], 254),
        (
            [{"subnet": "10.10.3.0/24", "start": "10.10.3.10", "end": "10.10.3.250", "gateway": "10.10.3.1"}],
            [],
            241,
        ),
        (
            [
                {
                    "subnet": "10.10.3.0/24",
                    "start": "10.10.3.10",
                    "end": "10.10.3.250",
                    "gateway": "10.10.3.20",
                }
            ],
            [],
            240,
        ),
        ([{"subnet": "10.10.3.0/24"}], ["10.10.3.64/28", "10.10.3.99", "10.10.3.70"], 254 - 16 - 1),
        ([{"subnet": "10.10.3.0/24"}, {"subnet": "10.10.4.0/30", "gateway": "10.10.4.1"}], [], 254 + 1),
        ([{"subnet": "10.10.3.0/30"}], ["10.10.3.0/30"], 0),
        ([{"subnet": "10.10.3.0/31"}], [], 2),
        ([{"subnet": "10.10.3.0/32"}], [], 1),
    ],
)
def test_family_size_counts_what_it_hands_out(
    ranges: list[dict[str, Any]], exclude: list[str], size: int
) -> None:
    family = _pool(*ranges, exclude=exclude).families()[4]
    assert family.size == size
    assert len(_all(family)) == size


def test_ipv6_family_size_of_a_64() -> None:
    pool = _pool({"subnet": "fd00:10:3::/64", "gateway": "fd00:10:3::1"}, exclude=["fd00:10:3::/120"])
    assert pool.families()[6].size == 2**64 - 256  # the anycast address lies in the excluded /120


def test_families_are_the_pools_ip_versions() -> None:
    assert set(_pool({"subnet": "10.10.3.0/24"}).families()) == {4}
    assert set(_pool({"subnet": "fd00::/64"}).families()) == {6}
    assert set(_pool({"subnet": "10.10.3.0/24"}, {"subnet": "fd00::/64"}).families()) == {4, 6}


def test_range_of_names_the_range_holding_an_address() -> None:
    pool = _pool({"subnet": "10.10.3.0/24"}, {"subnet": "10.10.4.0/24", "gateway": "10.10.4.1"})
    family = pool.families()[4]
    found = family.range_of(ipaddress.ip_address("10.10.4.9"))
    assert found is not None and found.gateway == "10.10.4.1"
    assert family.range_of(ipaddress.ip_address("10.10.5.9")) is None


def test_serves_every_namespace_unless_the_pool_lists_them() -> None:
    assert _pool({"subnet": "10.10.3.0/24"}).serves("anyone")
    listed = _pool({"subnet": "10.10.3.0/24"}, namespaces=["team-a"])
    assert listed.serves("team-a") and not listed.serves("team-b")
    assert not _pool({"subnet": "10.10.3.0/24"}, namespaces=[]).serves("team-a")


# --- pick ----------------------------------------------------------------------------------------------

SMALL = _pool({"subnet": "10.10.3.0/29", "gateway": "10.10.3.1"}).families()[4]  # .2 .. .6


def test_pick_starts_at_the_seeds_position_in_the_pool() -> None:
    assert [str(SMALL.pick(set(), seed)) for seed in range(5)] == [
        "10.10.3.2",
        "10.10.3.3",
        "10.10.3.4",
        "10.10.3.5",
        "10.10.3.6",
    ]
    assert SMALL.pick(set(), 5) == SMALL.pick(set(), 0)  # modulo the size
    assert SMALL.pick(set(), 5 * 10**12 + 3) == ipaddress.ip_address("10.10.3.5")


def test_pick_skips_taken_addresses_and_wraps_around() -> None:
    taken = {_v4("10.10.3.5"), _v4("10.10.3.6")}
    assert SMALL.pick(taken, 3) == ipaddress.ip_address("10.10.3.2")
    assert SMALL.pick(taken | {_v4("10.10.3.2")}, 3) == ipaddress.ip_address("10.10.3.3")


def test_pick_crosses_holes_and_ranges() -> None:
    family = _pool(
        {"subnet": "10.10.3.0/29"}, {"subnet": "10.10.9.0/30"}, exclude=["10.10.3.3/32", "10.10.3.4"]
    ).families()[4]
    # segments: .3.1-.3.2, .3.5-.3.6, .9.1-.9.2
    assert [str(family.pick(set(), seed)) for seed in range(6)] == [
        "10.10.3.1",
        "10.10.3.2",
        "10.10.3.5",
        "10.10.3.6",
        "10.10.9.1",
        "10.10.9.2",
    ]
    taken = {_v4("10.10.3.6"), _v4("10.10.9.1"), _v4("10.10.9.2"), _v4("10.10.3.1")}
    assert family.pick(taken, 3) == ipaddress.ip_address("10.10.3.2")


def test_pick_returns_none_when_the_pool_is_full_or_empty() -> None:
    assert SMALL.pick({_v4(f"10.10.3.{i}") for i in range(2, 7)}, 12345) is None
    empty = _pool({"subnet": "10.10.3.0/30"}, exclude=["10.10.3.0/30"]).families()[4]
    assert empty.size == 0
    assert empty.pick(set(), 0) is None
    assert not empty.hands_out(ipaddress.ip_address("10.10.3.1"))


def test_pick_in_ipv6_gives_ipv6_addresses() -> None:
    family = _pool({"subnet": "fd00:10:3::/64"}).families()[6]
    picked = family.pick(set(), 0)
    assert picked == ipaddress.ip_address("fd00:10:3::1")
    picked = family.pick(set(), claim_seed("claim-uid-1"))
    assert picked is not None and picked.version == 6 and family.hands_out(picked)


def test_claim_seed_is_stable_and_spreads_claims() -> None:
    assert claim_seed("claim-uid-1") == claim_seed("claim-uid-1")
    seeds = {claim_seed(f"claim-uid-{i}") % 1000 for i in range(100)}
    assert len(seeds) > 90  # hashing: nearly every claim starts elsewhere


# --- pick: properties over random small pools ----------------------------------------------------------


@st.composite
def small_pools(draw: st.DrawFn) -> tuple[IPPool, set[ipaddress.IPv4Address]]:
    """A v4 pool of one or two ranges /26../30 with random start, end, gateway and excludes, and the set of
    addresses it must hand out, computed independently (address by address)."""
    ranges: list[dict[str, Any]] = []
    expected: set[ipaddress.IPv4Address] = set()
    excluded: list[str] = []
    for third in draw(st.sampled_from([[3], [3, 9]])):
        prefix = draw(st.integers(26, 30))
        network = ipaddress.IPv4Network(f"10.10.{third}.0/{prefix}")
        hosts = list(network)[1:-1]
        entry: dict[str, Any] = {"subnet": str(network)}
        start = draw(st.none() | st.sampled_from(hosts))
        end = draw(st.none() | st.sampled_from(hosts))
        if start is not None and end is not None and start > end:
            start, end = end, start
        gateway = draw(st.none() | st.sampled_from(hosts))
        for key, value in (("start", start), ("end", end), ("gateway", gateway)):
            if value is not None:
                entry[key] = str(value)
        ranges.append(entry)
        for address in draw(st.lists(st.sampled_from(list(network)), max_size=4)):
            excluded.append(str(address))
        for address in draw(st.lists(st.sampled_from(list(network)), max_size=2)):
            excluded.append(f"{address}/{draw(st.integers(28, 32))}")  # not aligned: counts from its network
        expected |= {
            a for a in hosts if (start is None or a >= start) and (end is None or a <= end) and a != gateway
        }
    holes = [ipaddress.ip_network(e, strict=False) for e in excluded]
    expected = {a for a in expected if not any(a in hole for hole in holes)}
    return _pool(*ranges, exclude=excluded), expected


@settings(max_examples=300, deadline=None)
@given(small_pools(), st.data())
def test_pick_hands_out_a_free_address_of_the_pool(
    case: tuple[IPPool, set[ipaddress.IPv4Address]], data: st.DataObject
) -> None:
    pool, expected = case
    family = pool.families()[4]
    assert family.size == len(expected)
    outside = [ipaddress.IPv4Address("10.10.3.0"), ipaddress.IPv4Address("10.10.200.1")]
    candidates = [*sorted(expected), *outside]
    taken_addresses = data.draw(st.sets(st.sampled_from(candidates)))
    taken = {int(a) for a in taken_addresses}
    seed = data.draw(st.integers(0, 2**64 - 1))
    picked = family.pick(taken, seed)
    if expected - taken_addresses:
        assert picked is not None
        assert family.hands_out(picked)
        assert picked in expected
        assert int(picked) not in taken
    else:
        assert picked is None


@settings(max_examples=300, deadline=None)
@given(small_pools(), st.integers(0, 2**64 - 1))
def test_picking_until_full_yields_exactly_size_distinct_addresses(
    case: tuple[IPPool, set[ipaddress.IPv4Address]], seed: int
) -> None:
    pool, expected = case
    family = pool.families()[4]
    taken: set[int] = set()
    picked: list[IPAddress] = []
    for _ in range(family.size):
        address = family.pick(taken, seed)
        assert address is not None
        picked.append(address)
        taken.add(int(address))
    assert family.pick(taken, seed) is None
    assert len(set(picked)) == family.size
    assert set(picked) == expected
    for address in ipaddress.IPv4Network("10.10.3.0/24"):
        assert family.hands_out(address) == (address in expected)


# --- capacity ------------------------------------------------------------------------------------------

TEN = {"subnet": "10.10.3.0/28", "start": "10.10.3.1", "end": "10.10.3.10"}  # 10 addresses


def test_capacity_in_steady_state_is_the_pools_size() -> None:
    pool = _pool(TEN)
    assert capacity(pool, 0, {}) == 10
    # 4 allocated claims hold 4 addresses: still 10 (the scheduler subtracts the 4 itself)
    assert capacity(pool, 4, {4: 4}) == 10
    # a standalone claim no longer allocated keeps its address: one fewer for the scheduler
    assert capacity(pool, 4, {4: 5}) == 9


def test_capacity_of_a_full_pool_is_its_holders() -> None:
    assert capacity(_pool(TEN), 10, {4: 10}) == 10
    assert capacity(_pool(TEN), 8, {4: 10}) == 8


def test_a_narrowed_pool_keeps_counting_addresses_held_outside_its_ranges() -> None:
    """The admin shrank the range to 10 addresses while 3 claims hold addresses, one now outside: those 3
    claims plus what still fits inside (10 - 2)."""
    assert capacity(_pool(TEN), 3, {4: 2}) == 3 + 8


def test_more_held_inside_than_the_pool_now_has_never_goes_below_the_holders() -> None:
    assert capacity(_pool(TEN), 12, {4: 12}) == 12


def test_dual_stack_capacity_is_decided_by_the_least_free_family() -> None:
    pool = _pool(TEN, {"subnet": "fd00:10:3::/125"})  # v6: ::1 .. ::7 = 7 addresses
    assert capacity(pool, 0, {}) == 7
    assert capacity(pool, 2, {4: 2, 6: 2}) == 7
    assert capacity(pool, 2, {4: 9, 6: 2}) == 2 + 1  # v4 has 1 left, v6 5
    assert capacity(_pool(TEN, {"subnet": "fd00:10:3::/64"}), 0, {}) == 10


def test_capacity_is_capped_at_what_a_device_may_publish() -> None:
    assert capacity(_pool({"subnet": "fd00:10:3::/64"}), 5, {6: 5}) == MAX_CAPACITY


# --- IPPool.from_api: errors name the pool and the field -----------------------------------------------


@pytest.mark.parametrize(
    ("spec", "error"),
    [
        (
            {"ranges": [{"subnet": "10.10.3.0/24", "start": "10.10.4.5"}]},
            "IPPool p: spec.ranges[0].start: 10.10.4.5 is not in subnet 10.10.3.0/24",
        ),
        (
            {"ranges": [{"subnet": "10.10.3.0/24"}, {"subnet": "10.10.9.0/24", "gateway": "10.10.3.1"}]},
            "IPPool p: spec.ranges[1].gateway: 10.10.3.1 is not in subnet 10.10.9.0/24",
        ),
        (
            {"ranges": [{"subnet": "10.10.3.0/24", "start": "10.10.3.9", "end": "10.10.3.3"}]},
            "IPPool p: spec.ranges[0].start: 10.10.3.9 is after end 10.10.3.3",
        ),
        (
            {"ranges": [{"subnet": "10.10.3.1/24"}]},
            "IPPool p: spec.ranges[0].subnet: '10.10.3.1/24' is not a network",
        ),
        ({"ranges": [{"subnet": "10.10.3.0/24", "size": 3}]}, "IPPool p: spec.ranges[0].size: unknown field"),
        ({"ranges": []}, "IPPool p: spec.ranges: Expected `array` of length >= 1"),
        ({}, "IPPool p: spec.ranges: Field required"),
        (
            {"ranges": [{"subnet": "10.10.3.0/24"}], "exclude": ["10.10.3.x"]},
            "IPPool p: spec.exclude[0]: '10.10.3.x' is not an IP address",
        ),
        (
            {"ranges": [{"subnet": "10.10.3.0/24"}], "routes": [{"dst": "default"}]},
            "IPPool p: spec.routes[0].dst: 'default' is not a network in CIDR form",
        ),
    ],
)
def test_an_invalid_pool_names_its_field(spec: dict[str, Any], error: str) -> None:
    with pytest.raises(ConfigError) as caught:
        IPPool.from_api({"metadata": {"name": "p"}, "spec": spec})
    assert str(caught.value).startswith(error), str(caught.value)


@pytest.mark.parametrize(
    "ranges",
    [
        [{"subnet": "10.10.3.0/24"}, {"subnet": "10.10.3.128/25"}],
        [{"subnet": "fd00:10:3::/64"}, {"subnet": "fd00:10:3::/80"}],
        [{"subnet": "10.10.0.0/16"}, {"subnet": "fd00::/64"}, {"subnet": "10.10.200.0/24"}],
    ],
)
def test_overlapping_ranges_are_refused(ranges: list[dict[str, Any]]) -> None:
    with pytest.raises(ConfigError, match=r"IPPool p: spec.ranges: \S+ and \S+ overlap"):
        IPPool.from_api({"metadata": {"name": "p"}, "spec": {"ranges": ranges}})


def test_ranges_of_both_families_do_not_overlap() -> None:
    pool = _pool({"subnet": "10.10.3.0/24"}, {"subnet": "::a0a:300/120"})  # the same integers
    assert set(pool.families()) == {4, 6}


def test_a_route_whose_gateway_is_of_another_family_is_refused() -> None:
    with pytest.raises(
        ConfigError, match=r"IPPool p: spec.routes\[1\]: dst ::/0 and gw 10.10.3.1 differ in family"
    ):
        IPPool.from_api(
            {
                "metadata": {"name": "p"},
                "spec": {
                    "ranges": [{"subnet": "10.10.3.0/24"}],
                    "routes": [{"dst": "0.0.0.0/0", "gw": "10.10.3.1"}, {"dst": "::/0", "gw": "10.10.3.1"}],
                },
            }
        )


@pytest.mark.parametrize("name", ["Lan3", "lan_3", "-lan3", "lan3.example", "", "a" * 64])
def test_a_pool_name_must_be_a_dns_label(name: str) -> None:
    with pytest.raises(ConfigError, match=rf"^IPPool {name}: name: "):
        IPPool.from_api({"metadata": {"name": name}, "spec": {"ranges": [{"subnet": "10.10.3.0/24"}]}})


def test_a_valid_pool_is_read_with_its_spec() -> None:
    pool = IPPool.from_api(
        {
            "apiVersion": "netclaim.dev/v1alpha1",
            "kind": "IPPool",
            "metadata": {"name": "lan3", "uid": "u"},
            "spec": {
                "network": "lan3",
                "ranges": [{"subnet": "10.10.3.0/24", "gateway": "10.10.3.1"}],
                "routes": [{"dst": "0.0.0.0/0", "gw": "10.10.3.1"}],
                "namespaces": ["team-a"],
            },
        }
    )
    assert pool.name == "lan3"
    assert pool.spec.network == "lan3"
    assert pool.spec.routes[0].gw == "10.10.3.1"


# --- AddressConfig -------------------------------------------------------------------------------------

LOCATION = "claim team-a/claim-1 (allocation config[0]).opaque.parameters"


def _address_config(**fields: Any) -> dict[str, Any]:
    return {"apiVersion": "netclaim.dev/v1alpha1", "kind": "AddressConfig", **fields}


def test_an_address_config_asks_for_one_address_per_family() -> None:
    config = decode(
        _address_config(addresses=["10.10.3.7", "fd00:10:3::7"], interfaceRequest="net"), LOCATION
    )
    assert isinstance(config, AddressConfig)
    assert config.static() == {4: ipaddress.ip_address("10.10.3.7"), 6: ipaddress.ip_address("fd00:10:3::7")}
    assert config.interfaceRequest == "net"
    assert msgspec.convert(_address_config(), AddressConfig).static() == {}


@pytest.mark.parametrize(
    ("addresses", "error"),
    [
        (["10.10.3.7", "10.10.3.8"], "addresses: at most one address per family"),
        (["fd00::7", "fd00::8"], "addresses: at most one address per family"),
        (["10.10.3.7/24"], "addresses[0]: '10.10.3.7/24' is not an IP address"),
        (["lan3"], "addresses[0]: 'lan3' is not an IP address"),
        (["10.10.3.7", "fd00::7", "10.10.3.8"], "addresses: Expected `array` of length <= 2"),
    ],
)
def test_a_bad_address_config_is_refused_naming_the_field(addresses: list[str], error: str) -> None:
    with pytest.raises(ConfigError) as caught:
        decode(_address_config(addresses=addresses), LOCATION)
    assert str(caught.value).startswith(f"{LOCATION}.{error}"), str(caught.value)
    with pytest.raises(msgspec.ValidationError):
        msgspec.convert(_address_config(addresses=addresses), AddressConfig)


def test_an_address_config_has_no_cni_fields() -> None:
    with pytest.raises(ConfigError, match=r"\.interfaceName: unknown field"):
        decode(_address_config(interfaceName="net1"), LOCATION)


# --- allocation_name -----------------------------------------------------------------------------------


def test_allocation_name_of_an_ipv4_address() -> None:
    assert allocation_name("lan3", ipaddress.ip_address("10.10.3.7")) == "lan3.10.10.3.7"


def test_allocation_name_of_an_ipv6_address_is_exploded() -> None:
    name = allocation_name("lan3", ipaddress.ip_address("fd00:10:3::7"))
    assert name == "lan3.fd00-0010-0003-0000-0000-0000-0000-0007"


# An object's name as the API server takes it (Kubernetes' IsDNS1123Subdomain; at most 253 characters)
DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


@pytest.mark.parametrize(
    "address",
    ["0.0.0.0", "255.255.255.255", "::", "::1", "fd00::", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"],
)
def test_allocation_names_are_dns_subdomains_and_distinct(address: str) -> None:
    value = ipaddress.ip_address(address)
    name = allocation_name("a" * 63, value)
    assert DNS_SUBDOMAIN.fullmatch(name) is not None, name
    assert len(name) <= 253
    assert allocation_name("lan3", value) != allocation_name("lan4", value)


def test_the_same_integer_in_both_families_names_two_objects() -> None:
    assert allocation_name("lan3", ipaddress.IPv4Address(7)) != allocation_name(
        "lan3", ipaddress.IPv6Address(7)
    )

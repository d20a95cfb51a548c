"""AddressBook: a claim's addresses taken by creating IPAllocation objects, kept on a retry, released."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field, replace
from typing import Any

import pytest

from netclaim.core.ipam import addresses as addresses_module
from netclaim.core.ipam.addresses import BLIND_PROBES, MAX_RACES, AddressBook, AddressRequest, Grant
from netclaim.core.ipam.ippool import POOLS_POOL, IPAddress, IPPool, allocation_name, claim_seed
from netclaim.core.objects import AllocatedDevice, Claim, IPAllocation, RequestSpec
from netclaim.errors import (
    AddressQuarantinedError,
    AlreadyExistsError,
    ConfigError,
    PoolExhaustedError,
    TransientError,
)
from tests.unit.fakes import SAMPLE_DRIVER, SAMPLE_NODE, FakeKubeApi, sample_claim

LAN3: dict[str, Any] = {
    "network": "lan3",
    "ranges": [
        {"subnet": "10.10.3.0/24", "start": "10.10.3.10", "end": "10.10.3.250", "gateway": "10.10.3.1"},
        {"subnet": "fd00:10:3::/64", "gateway": "fd00:10:3::1"},
    ],
    "exclude": ["10.10.3.64/28", "10.10.3.99"],
    "routes": [{"dst": "0.0.0.0/0", "gw": "10.10.3.1"}],
}
V4_ONLY: dict[str, Any] = {"ranges": [{"subnet": "10.10.4.0/24"}]}
TINY: dict[str, Any] = {"ranges": [{"subnet": "10.10.5.0/30"}]}  # 10.10.5.1 and .2
CLAIM = sample_claim((), (), name="claim-1", uid="claim-uid-1")
OTHER = sample_claim((), (), name="claim-2", uid="claim-uid-2")


@pytest.fixture
def api() -> FakeKubeApi:
    found = FakeKubeApi()
    found.add_pool("lan3", LAN3)
    found.add_pool("v4only", V4_ONLY)
    found.add_pool("tiny", TINY)
    return found


@pytest.fixture
def book(api: FakeKubeApi) -> AddressBook:
    return AddressBook(api, SAMPLE_NODE)


def _request(pool: str = "lan3", *static: str, request: str = "addr") -> AddressRequest:
    allocated = AllocatedDevice(request, SAMPLE_DRIVER, POOLS_POOL, pool, f"share-{request}", {})
    wanted: dict[int, IPAddress] = {a.version: a for a in (ipaddress.ip_address(s) for s in static)}
    return AddressRequest(allocated, wanted, "net")


def _pool(api: FakeKubeApi, name: str) -> IPPool:
    return IPPool.from_api(api.ippools[name])


def _held(api: FakeKubeApi, claim: Claim) -> list[str]:
    return sorted(a.address for a in api.allocations.values() if a.claim_uid == claim.uid)


def _holding(claim: Claim, pool: str, address: str, prefix: int = 24) -> IPAllocation:
    return IPAllocation(
        name=allocation_name(pool, ipaddress.ip_address(address)),
        uid="",
        pool=pool,
        address=f"{address}/{prefix}",
        claim_namespace=claim.namespace,
        claim_name=claim.name,
        claim_uid=claim.uid,
        node="node-2",
    )


async def test_a_claim_gets_one_address_of_each_family_of_the_pool(
    api: FakeKubeApi, book: AddressBook
) -> None:
    [grant] = await book.allocate(CLAIM, [_request()])
    v4, v6 = (ipaddress.ip_interface(a) for a in grant.addresses)
    assert (v4.version, v4.network.prefixlen, v6.version, v6.network.prefixlen) == (4, 24, 6, 64)
    families = _pool(api, "lan3").families()
    assert families[4].hands_out(v4.ip) and families[6].hands_out(v6.ip)
    assert grant.pool.name == "lan3" and grant.interface_request == "net"
    assert grant.allocated.device == "lan3"
    # each address is an object named after it, naming the claim and the node
    objects = {a.name: a for a in api.allocations.values()}
    assert set(objects) == {allocation_name("lan3", v4.ip), allocation_name("lan3", v6.ip)}
    for allocation in objects.values():
        assert (allocation.pool, allocation.claim_uid, allocation.node) == ("lan3", CLAIM.uid, SAMPLE_NODE)
        assert (allocation.claim_namespace, allocation.claim_name) == ("team-a", "claim-1")
        assert allocation.address in grant.addresses


async def test_the_first_address_is_where_the_claims_seed_points(api: FakeKubeApi, book: AddressBook) -> None:
    [grant] = await book.allocate(CLAIM, [_request("v4only")])
    expected = _pool(api, "v4only").families()[4].pick(set(), claim_seed(CLAIM.uid))
    assert grant.addresses == (f"{expected}/24",)


async def test_two_claims_get_different_addresses(api: FakeKubeApi, book: AddressBook) -> None:
    [first] = await book.allocate(CLAIM, [_request("tiny")])
    [second] = await book.allocate(OTHER, [_request("tiny")])
    assert {first.addresses[0], second.addresses[0]} == {"10.10.5.1/30", "10.10.5.2/30"}
    assert len(api.allocations) == 2


async def test_an_address_taken_by_another_claim_is_skipped_without_listing_the_pool(
    api: FakeKubeApi, book: AddressBook
) -> None:
    family = _pool(api, "v4only").families()[4]
    seeded = family.pick(set(), claim_seed(CLAIM.uid))
    second = family.pick(set(), claim_seed(CLAIM.uid, 1))
    assert seeded is not None and second is not None and seeded != second
    await api.create_ip_allocation(_holding(OTHER, "v4only", str(seeded)))
    api.calls.clear()
    [grant] = await book.allocate(CLAIM, [_request("v4only")])
    assert grant.addresses == (f"{second}/24",)
    # the seeded address is tried first (one round trip while the pool has room); lost, the next probe's
    assert api.calls.count("create_ip_allocation") == 2
    assert api.calls.count("held_ip_allocations") == 1  # the claim's own only
    assert "list_ip_allocations" not in api.calls


async def test_when_every_probe_is_taken_the_pool_is_listed_once_and_the_next_free_address_taken(
    api: FakeKubeApi, book: AddressBook
) -> None:
    family = _pool(api, "v4only").families()[4]
    probed = {family.pick(set(), claim_seed(CLAIM.uid, probe)) for probe in range(BLIND_PROBES)}
    for n, address in enumerate(sorted(a for a in probed if a is not None)):
        await api.create_ip_allocation(_holding(replace(OTHER, uid=f"other-{n}"), "v4only", str(address)))
    api.calls.clear()
    [grant] = await book.allocate(CLAIM, [_request("v4only")])
    taken = {int(a) for a in probed if a is not None}
    assert grant.addresses == (f"{family.pick(taken, claim_seed(CLAIM.uid))}/24",)
    assert api.calls.count("create_ip_allocation") == BLIND_PROBES + 1
    assert api.calls.count("held_ip_allocations") == 1  # the claim's own
    assert api.calls.count("list_ip_allocations") == 1  # then the pool's


@dataclass
class RacingApi(FakeKubeApi):
    """Another agent creates `rivals` between our list of the pool and our create."""

    rivals: list[IPAllocation] = field(default_factory=list)

    async def create_ip_allocation(self, allocation: IPAllocation) -> IPAllocation:
        while self.rivals:
            rival = self.rivals.pop(0)
            self.allocations[rival.name] = rival
        return await super().create_ip_allocation(allocation)


async def test_a_lost_race_moves_on_to_the_next_free_address() -> None:
    api = RacingApi()
    api.add_pool("v4only", V4_ONLY)
    family = _pool(api, "v4only").families()[4]
    seed = claim_seed(CLAIM.uid)
    seeded = family.pick(set(), seed)
    assert seeded is not None
    api.rivals.append(_holding(OTHER, "v4only", str(seeded)))
    [grant] = await AddressBook(api, SAMPLE_NODE).allocate(CLAIM, [_request("v4only")])
    assert grant.addresses == (f"{family.pick(set(), claim_seed(CLAIM.uid, 1))}/24",)
    assert grant.addresses[0] != f"{seeded}/24"
    assert api.calls.count("create_ip_allocation") == 2
    assert api.allocations[allocation_name("v4only", seeded)].claim_uid == OTHER.uid  # the rival's, untouched


@dataclass
class AlwaysTakenApi(FakeKubeApi):
    """Every create loses to another agent."""

    async def create_ip_allocation(self, allocation: IPAllocation) -> IPAllocation:
        self._call("create_ip_allocation")
        raise AlreadyExistsError(f"IPAllocation {allocation.name}: already exists")


async def test_losing_every_race_is_a_transient_error_after_a_bounded_number_of_tries() -> None:
    api = AlwaysTakenApi()
    api.add_pool("v4only", V4_ONLY)
    with pytest.raises(PoolExhaustedError, match=f"lost {MAX_RACES} races"):
        await AddressBook(api, SAMPLE_NODE).allocate(CLAIM, [_request("v4only")])
    assert api.calls.count("create_ip_allocation") == BLIND_PROBES + MAX_RACES  # the probes, then the races


async def test_a_static_address_is_granted_with_its_gateway_and_the_pools_routes(
    api: FakeKubeApi, book: AddressBook
) -> None:
    [grant] = await book.allocate(CLAIM, [_request("lan3", "10.10.3.17", "fd00:10:3::7")])
    assert grant.addresses == ("10.10.3.17/24", "fd00:10:3::7/64")
    assert sorted(api.allocations) == ["lan3.10.10.3.17", "lan3.fd00-0010-0003-0000-0000-0000-0000-0007"]
    assert grant.static_addresses() == [
        {"address": "10.10.3.17/24", "gateway": "10.10.3.1"},
        {"address": "fd00:10:3::7/64", "gateway": "fd00:10:3::1"},
    ]
    assert grant.routes() == [{"dst": "0.0.0.0/0", "gw": "10.10.3.1"}]


async def test_one_static_family_and_one_dynamic(api: FakeKubeApi, book: AddressBook) -> None:
    [grant] = await book.allocate(CLAIM, [_request("lan3", "fd00:10:3::7")])
    v4, v6 = grant.addresses
    assert v6 == "fd00:10:3::7/64"
    assert _pool(api, "lan3").families()[4].hands_out(ipaddress.ip_interface(v4).ip)


def test_a_range_without_gateway_gives_an_address_without_one() -> None:
    pool = IPPool.from_api({"metadata": {"name": "v4only"}, "spec": V4_ONLY})
    grant = Grant(_request("v4only").allocated, pool, ("10.10.4.9/24",), "net")
    assert grant.static_addresses() == [{"address": "10.10.4.9/24"}]
    assert grant.routes() == []


async def test_a_static_address_held_by_another_claim_names_that_claim(
    api: FakeKubeApi, book: AddressBook
) -> None:
    holder = replace(sample_claim((), (), name="web-0", uid="claim-uid-9"), namespace="team-b")
    await api.create_ip_allocation(_holding(holder, "v4only", "10.10.4.7"))
    with pytest.raises(ConfigError) as caught:
        await book.allocate(CLAIM, [_request("v4only", "10.10.4.7")])
    message = str(caught.value)
    assert "claim team-a/claim-1" in message
    assert "address 10.10.4.7 of IPPool v4only is held by claim team-b/web-0" in message
    assert (
        api.allocations[allocation_name("v4only", ipaddress.ip_address("10.10.4.7"))].claim_uid == holder.uid
    )


async def test_a_static_address_the_claim_holds_already_is_kept_though_its_list_missed_it(
    api: FakeKubeApi, book: AddressBook
) -> None:
    """A held list from the watch cache can miss what another node's agent took for a standalone claim a
    moment before it moved here: the create finds the claim's own, not another claim's."""
    own = await api.create_ip_allocation(_holding(CLAIM, "v4only", "10.10.4.7"))
    api.not_yet_listed.add(own.name)
    [grant] = await book.allocate(CLAIM, [_request("v4only", "10.10.4.7")])
    assert grant.addresses == ("10.10.4.7/24",)
    assert list(api.allocations.values()) == [own]


@pytest.mark.parametrize(
    "address",
    [
        "10.10.9.7",  # outside every range
        "10.10.3.5",  # in the subnet, before start
        "10.10.3.251",  # after end
        "10.10.3.70",  # in an excluded network
        "10.10.3.99",  # an excluded address
        "10.10.3.1",  # the gateway
        "fd00:10:3::1",  # the IPv6 gateway
        "fd00:10:3::",  # the subnet-router anycast address
    ],
)
async def test_a_static_address_the_pool_does_not_hand_out_is_a_config_error(
    api: FakeKubeApi, book: AddressBook, address: str
) -> None:
    with pytest.raises(ConfigError, match=f"address {address} is not handed out by IPPool lan3"):
        await book.allocate(CLAIM, [_request("lan3", address)])
    assert allocation_name("lan3", ipaddress.ip_address(address)) not in api.allocations


async def test_an_ipv6_address_from_a_pool_without_ipv6_is_a_config_error(book: AddressBook) -> None:
    with pytest.raises(ConfigError, match="asks for an IPv6 address; IPPool v4only has no IPv6 range"):
        await book.allocate(CLAIM, [_request("v4only", "fd00::7")])


async def test_a_pool_that_is_gone_is_a_config_error(api: FakeKubeApi, book: AddressBook) -> None:
    with pytest.raises(ConfigError, match="claim team-a/claim-1: IPPool lan9 no longer exists"):
        await book.allocate(CLAIM, [_request("lan9")])
    assert api.allocations == {}


async def test_a_pool_that_became_invalid_is_a_config_error(api: FakeKubeApi, book: AddressBook) -> None:
    api.add_pool("broken", {"ranges": [{"subnet": "10.10.3.1/24"}]})
    with pytest.raises(ConfigError, match=r"IPPool broken: spec.ranges\[0\]"):
        await book.allocate(CLAIM, [_request("broken")])


async def test_a_pool_serves_only_the_namespaces_it_lists(api: FakeKubeApi, book: AddressBook) -> None:
    api.add_pool("team-b-only", {**V4_ONLY, "namespaces": ["team-b", "team-c"]})
    with pytest.raises(ConfigError, match="IPPool team-b-only does not serve namespace team-a"):
        await book.allocate(CLAIM, [_request("team-b-only")])
    assert api.allocations == {}
    api.add_pool("team-a-too", {**V4_ONLY, "namespaces": ["team-b", "team-a"]})
    through_its_class = replace(CLAIM, requests=(RequestSpec("addr", "netclaim-pool-team-a-too", ()),))
    [grant] = await book.allocate(through_its_class, [_request("team-a-too")])
    assert len(grant.addresses) == 1


async def test_a_full_pool_is_a_transient_error(api: FakeKubeApi, book: AddressBook) -> None:
    await book.allocate(OTHER, [_request("tiny")])
    await book.allocate(sample_claim((), (), name="claim-3", uid="claim-uid-3"), [_request("tiny")])
    with pytest.raises(
        PoolExhaustedError, match=r"IPPool tiny: no free IPv4 address \(2 handed out, all held\)"
    ):
        await book.allocate(CLAIM, [_request("tiny")])
    assert issubclass(PoolExhaustedError, TransientError)
    assert _held(api, CLAIM) == []


async def test_a_claim_prepared_again_keeps_its_addresses_without_creating(
    api: FakeKubeApi, book: AddressBook
) -> None:
    [first] = await book.allocate(CLAIM, [_request()])
    api.calls.clear()
    again = AddressBook(api, "node-2")  # the agent restarted, or a standalone claim moved
    [second] = await again.allocate(CLAIM, [_request()])
    assert second.addresses == first.addresses
    assert "create_ip_allocation" not in api.calls
    assert len(api.allocations) == 2


async def test_held_lists_are_read_from_the_watch_cache_past_this_processs_first(
    api: FakeKubeApi, book: AddressBook
) -> None:
    """A consistent list waits until the API server's watch cache has caught up with etcd (up to 100 ms
    on a busy cluster). The first held list of a process is consistent; its version bounds the cached
    reads of every claim the process has not read before (an earlier agent's creates all came before it)."""
    api.list_version = "17"
    await book.allocate(CLAIM, [_request("v4only")])
    api.list_version = "30"
    await book.allocate(OTHER, [_request("v4only")])
    third = replace(OTHER, name="claim-3", uid="claim-uid-3")
    await book.allocate(third, [_request("v4only")])
    assert [c for c in api.calls if c.startswith("held")] == [
        "held_ip_allocations",
        "held_ip_allocations 17",
        "held_ip_allocations 17",
    ]


async def test_a_claim_this_process_read_or_released_is_read_consistently(
    api: FakeKubeApi, book: AddressBook
) -> None:
    """Its own creates and deletes may not be in the cache yet: a retry that missed the address it took
    would take a second one, and one that still saw an address it freed would reuse it."""
    await book.allocate(OTHER, [_request("v4only")])
    [first] = await book.allocate(CLAIM, [_request("v4only")])
    [again] = await book.allocate(CLAIM, [_request("v4only")])
    await book.release(CLAIM.uid)
    await book.allocate(CLAIM, [_request("v4only")])
    third = replace(OTHER, name="claim-3", uid="claim-uid-3")
    await book.release(third.uid)  # an unprepare of a claim prepared by the agent before this one
    await book.allocate(third, [_request("v4only")])
    assert [c for c in api.calls if c.startswith("held")] == [
        "held_ip_allocations",  # the process's first
        "held_ip_allocations 1",  # CLAIM, first read
        "held_ip_allocations",  # CLAIM again: consistent
        "held_ip_allocations",  # after its release
        "held_ip_allocations",  # claim-3 after its release
    ]
    assert again.addresses == first.addresses


async def test_an_unreadable_version_leaves_the_held_lists_consistent(
    api: FakeKubeApi, book: AddressBook
) -> None:
    api.list_version = None
    await book.allocate(CLAIM, [_request("v4only")])
    await book.allocate(OTHER, [_request("v4only")])
    assert [c for c in api.calls if c.startswith("held")] == ["held_ip_allocations"] * 2


async def test_only_the_last_claims_read_are_remembered(
    api: FakeKubeApi, book: AddressBook, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(addresses_module, "REMEMBERED_CLAIMS", 2)
    claims = [replace(OTHER, name=f"c-{n}", uid=f"u-{n}") for n in range(3)]
    for claim in claims:
        await book.allocate(claim, [_request("v4only")])
    api.calls.clear()
    await book.allocate(claims[2], [_request("v4only")])  # remembered: consistent
    await book.allocate(claims[0], [_request("v4only")])  # forgotten: from the cache
    assert [c for c in api.calls if c.startswith("held")] == ["held_ip_allocations", "held_ip_allocations 1"]


async def test_a_claim_holding_only_one_family_takes_the_other(api: FakeKubeApi, book: AddressBook) -> None:
    await api.create_ip_allocation(_holding(CLAIM, "lan3", "10.10.3.17"))
    [grant] = await book.allocate(CLAIM, [_request()])
    assert grant.addresses[0] == "10.10.3.17/24"
    assert ipaddress.ip_interface(grant.addresses[1]).version == 6
    assert len(_held(api, CLAIM)) == 2


async def test_two_pools_give_a_grant_each(api: FakeKubeApi, book: AddressBook) -> None:
    grants = await book.allocate(CLAIM, [_request("lan3"), _request("v4only", "10.10.4.7", request="addr2")])
    assert [g.pool.name for g in grants] == ["lan3", "v4only"]
    assert grants[1].addresses == ("10.10.4.7/24",)
    assert grants[1].allocated.request == "addr2"
    assert len(_held(api, CLAIM)) == 3


async def test_no_request_makes_no_api_call(api: FakeKubeApi, book: AddressBook) -> None:
    assert await book.allocate(CLAIM, []) == []
    assert api.calls == []


async def test_release_deletes_only_the_claims_own_addresses(api: FakeKubeApi, book: AddressBook) -> None:
    [mine] = await book.allocate(CLAIM, [_request()])
    [theirs] = await book.allocate(OTHER, [_request()])
    assert sorted(await book.release(CLAIM.uid)) == sorted(mine.addresses)
    assert _held(api, CLAIM) == []
    assert _held(api, OTHER) == sorted(theirs.addresses)
    assert await book.release(CLAIM.uid) == []  # again: nothing left, fine


async def test_release_leaves_another_nodes_addresses_to_the_controller(
    api: FakeKubeApi, book: AddressBook
) -> None:
    """An agent may release only its own node's (deploy/admission.yaml): a standalone claim that moved here
    still holds the address its first node took; the controller frees it once the claim is gone."""
    here = replace(_holding(CLAIM, "lan3", "10.10.3.11"), node=SAMPLE_NODE)
    moved = _holding(CLAIM, "lan3", "fd00:10:3::11", prefix=64)  # node-2's
    for allocation in (here, moved):
        await api.create_ip_allocation(allocation)
    assert await book.release(CLAIM.uid) == ["10.10.3.11/24"]
    assert _held(api, CLAIM) == ["fd00:10:3::11/64"]


async def test_a_held_address_the_pool_does_not_hand_out_is_not_reused(
    api: FakeKubeApi, book: AddressBook
) -> None:
    """One made in some node's name for an excluded address (the pool's gateway, say) is not the claim's to
    keep: it takes one the pool hands out, and the controller frees the other."""
    await api.create_ip_allocation(_holding(CLAIM, "v4only", "10.10.4.255"))  # its broadcast address
    [grant] = await book.allocate(CLAIM, [_request("v4only")])
    assert grant.addresses != ("10.10.4.255/24",)
    assert ipaddress.ip_interface(grant.addresses[0]).ip in ipaddress.ip_network("10.10.4.0/24")


async def test_a_quarantined_address_asked_for_by_name_waits_and_says_why(
    api: FakeKubeApi, book: AddressBook
) -> None:
    """The client pod that held it was deleted a moment ago: another tenant asking for it by name at once
    must not get it while rules and Services still name it (netclaim.core.ipam.pools.Quarantine)."""
    gone = replace(sample_claim((), (), name="client-0", uid="claim-uid-9"), namespace="team-b")
    held = await api.create_ip_allocation(_holding(gone, "v4only", "10.10.4.7"))
    await api.mark_released(held, "2026-12-06T10:00:00Z")
    with pytest.raises(AddressQuarantinedError) as caught:
        await book.allocate(CLAIM, [_request("v4only", "10.10.4.7")])
    assert "released by claim team-b/client-0 at 2026-12-06T10:00:00Z and is quarantined" in str(caught.value)
    assert isinstance(caught.value, TransientError)  # kubelet retries; the kubelet plugin still tells


async def test_a_claims_own_address_the_controller_is_freeing_is_not_reused(
    api: FakeKubeApi, book: AddressBook
) -> None:
    [grant] = await book.allocate(CLAIM, [_request("v4only")])
    [held] = [a for a in api.allocations.values() if a.claim_uid == CLAIM.uid]
    await api.mark_released(held, "2026-12-06T10:00:00Z")  # beyond its allocation, say
    [again] = await book.allocate(CLAIM, [_request("v4only")])
    assert again.addresses != grant.addresses


@pytest.mark.parametrize(
    ("device_class", "admitted"),
    [("netclaim-pool-team", True), ("every-netclaim-device", False), ("", False)],
)
async def test_a_pool_of_some_namespaces_gives_addresses_only_through_its_own_class(
    api: FakeKubeApi, book: AddressBook, device_class: str, admitted: bool
) -> None:
    """Admission guards the pool's own class; another class an admin made that selects the pool's device
    (any netclaim.dev device, say) must not be a way around it, even for a namespace the pool serves."""
    api.add_pool("team", {**V4_ONLY, "namespaces": ["team-a"]})
    requests = (RequestSpec("addr", device_class, ()),) if device_class else ()
    claim = replace(CLAIM, requests=requests)
    if admitted:
        [grant] = await book.allocate(claim, [_request("team")])
        assert grant.addresses
        return
    with pytest.raises(ConfigError, match="gives addresses only through its own class, netclaim-pool-team"):
        await book.allocate(claim, [_request("team")])
    assert _held(api, claim) == []

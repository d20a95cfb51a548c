"""The controller's side of IPAM: pools as DRA devices, their capacity, orphans, status and Events."""

from __future__ import annotations

import asyncio
import copy
import ipaddress
from dataclasses import dataclass, replace
from typing import Any

import pytest

from netclaim.controller.ipam import ADDRESS_CLASS, RELEASES_AT_ONCE, Reconciler
from netclaim.core.devices.slices import MAX_GENERATION
from netclaim.core.ipam.ippool import ADDRESSES, POOLS_POOL, IPPool, allocation_name
from netclaim.core.ipam.pools import (
    SLICE_PREFIX,
    PoolUse,
    beyond_allocation,
    exhausted_message,
    orphans,
    pool_device,
    pool_slices,
    pool_use,
    read_pools,
)
from netclaim.core.objects import AllocatedDevice, Claim, IPAllocation, RequestSpec
from netclaim.errors import ApiRejectedError, ConflictError
from tests.unit.fakes import SAMPLE_DRIVER, FakeKubeApi, sample_claim

SIX: dict[str, Any] = {"ranges": [{"subnet": "10.10.3.0/29"}]}  # 10.10.3.1 .. .6
TWO: dict[str, Any] = {"network": "lan3", "ranges": [{"subnet": "10.10.3.0/30"}]}  # .1 and .2
WIDE: dict[str, Any] = {"ranges": [{"subnet": "10.20.0.0/24"}, {"subnet": "fd00:20::/64"}]}
SLICE = f"{SLICE_PREFIX}-0"


def _pool(name: str, spec: dict[str, Any]) -> IPPool:
    return IPPool.from_api({"metadata": {"name": name}, "spec": spec})


def _result(
    pool: str, request: str = "addr", *, dra_pool: str = POOLS_POOL, driver: str = SAMPLE_DRIVER
) -> AllocatedDevice:
    return AllocatedDevice(request, driver, dra_pool, pool, f"share-{request}", {ADDRESSES: "1"})


def _claim(name: str, *results: AllocatedDevice, requests: tuple[RequestSpec, ...] = ()) -> Claim:
    claim = sample_claim(results, (), name=name, uid=f"uid-{name}", allocated=bool(results))
    return replace(claim, requests=requests)


def _held(claim: Claim, pool: str, address: str, uid: str = "") -> IPAllocation:
    interface = ipaddress.ip_interface(address)
    return IPAllocation(
        name=allocation_name(pool, interface.ip),
        uid=uid or f"alloc-of-{claim.name}",
        pool=pool,
        address=address,
        claim_namespace=claim.namespace,
        claim_name=claim.name,
        claim_uid=claim.uid,
        node="node-1",
    )


# --- read_pools, pool_use, pool_device -----------------------------------------------------------------


def test_read_pools_sets_invalid_pools_aside_with_their_problems() -> None:
    pools, problems = read_pools(
        [
            {"metadata": {"name": "good"}, "spec": SIX},
            {"metadata": {"name": "bad"}, "spec": {"ranges": [{"subnet": "10.10.3.1/24"}]}},
            {"metadata": {"name": "Bad"}, "spec": SIX},
        ]
    )
    assert [p.name for p in pools] == ["good"]
    assert set(problems) == {"bad", "Bad"}
    assert problems["bad"].startswith("IPPool bad: spec.ranges[0].subnet: '10.10.3.1/24' is not a network")
    assert problems["Bad"].startswith("IPPool Bad: name: ")


def test_pool_use_counts_the_claims_the_scheduler_allocated_from_the_pool() -> None:
    pool = _pool("p", SIX)
    holding = _claim("holding", _result("p"))  # allocated, holds .1
    waiting = _claim("waiting", _result("p"))  # allocated, not prepared yet
    standalone = _claim("standalone")  # its pod went, not allocated now, keeps .2
    outside = _claim("outside", _result("p"))  # holds .9: the admin narrowed the pool meanwhile
    others = [
        _claim("other-pool", _result("q")),
        _claim("a-nic-named-p", _result("p", dra_pool="node-1")),
        _claim("other-driver", _result("p", driver="gpu.example.com")),
    ]
    claims = {c.uid: c for c in [holding, waiting, standalone, outside, *others]}
    allocations = [
        _held(holding, "p", "10.10.3.1/29"),
        _held(standalone, "p", "10.10.3.2/29"),
        _held(outside, "p", "10.10.3.9/29"),
        _held(others[0], "q", "10.10.3.3/29"),  # another pool's (same address, other pool)
    ]
    use = pool_use(pool, allocations, claims, SAMPLE_DRIVER)
    assert use.allocated_claims == 3  # holding, waiting, outside
    assert use.addresses == {4: 3}
    # live holders (holding, outside) + what still fits inside: 6 - 2 (.1 and .2)
    assert use.capacity == 2 + 4
    assert use.free == 3  # waiting takes one of the 4 left: 3 more claims fit


def test_a_pool_with_no_claims_publishes_its_size() -> None:
    use = pool_use(_pool("p", SIX), [], {}, SAMPLE_DRIVER)
    assert (use.capacity, use.allocated_claims, use.addresses, use.free) == (6, 0, {}, 6)


def test_the_pools_claims_are_counted_by_the_configured_driver_name() -> None:
    """A controller run under another driver name (--driver-name) counts its own driver's results."""
    theirs = _claim("theirs", _result("p", driver="net.example.com"))
    ours = _claim("ours", _result("p"))
    claims = {c.uid: c for c in (theirs, ours)}
    assert pool_use(_pool("p", SIX), [], claims, "net.example.com").allocated_claims == 1
    held = [_held(theirs, "p", "10.10.3.1/29")]
    assert beyond_allocation(held, claims, "net.example.com") == []
    assert beyond_allocation(held, claims, SAMPLE_DRIVER) == held  # not allocated from the pool of ours


def test_free_never_goes_below_zero() -> None:
    assert PoolUse(capacity=2, allocated_claims=3, addresses={4: 2}).free == 0


def test_a_pool_device_is_shared_and_consumes_one_address_per_claim() -> None:
    device = pool_device(_pool("lan3", TWO), PoolUse(2, 0, {}))
    assert device == {
        "name": "lan3",
        "attributes": {
            "netclaim.dev/pool": {"string": "lan3"},
            "netclaim.dev/ipv4": {"bool": True},
            "netclaim.dev/ipv6": {"bool": False},
            "netclaim.dev/network": {"string": "lan3"},
            "netclaim.dev/restricted": {"bool": False},
        },
        "capacity": {
            "netclaim.dev/addresses": {
                "value": "2",
                "requestPolicy": {"default": "1", "validRange": {"min": "1", "max": "1"}},
            }
        },
        "allowMultipleAllocations": True,
    }


def test_a_dual_stack_pool_without_network_says_both_families_and_no_network() -> None:
    device = pool_device(_pool("wide", WIDE), PoolUse(7, 1, {4: 1, 6: 1}))
    assert device["attributes"] == {
        "netclaim.dev/pool": {"string": "wide"},
        "netclaim.dev/ipv4": {"bool": True},
        "netclaim.dev/ipv6": {"bool": True},
        "netclaim.dev/restricted": {"bool": False},
    }
    assert device["capacity"][ADDRESSES]["value"] == "7"


def test_a_pool_of_some_namespaces_says_it_is_restricted() -> None:
    """The general class netclaim-address selects no restricted pool (deploy/deviceclasses.yaml)."""
    device = pool_device(_pool("only-a", {**SIX, "namespaces": ["team-a"]}), PoolUse(6, 0, {}))
    assert device["attributes"]["netclaim.dev/restricted"] == {"bool": True}


def test_capacity_counts_allocation_results_not_claims() -> None:
    """A claim with two requests on one pool consumes two units to the scheduler: the controller counts
    the same (prepare refuses such a claim, but its allocation stands until its pod goes)."""
    greedy = _claim("greedy", _result("six", "a"), _result("six", "b"))
    one = _claim("one", _result("six"))
    use = pool_use(_pool("six", SIX), [], {greedy.uid: greedy, one.uid: one}, SAMPLE_DRIVER)
    assert (use.allocated_claims, use.free) == (3, 3)


def test_addresses_beyond_a_claims_allocation_are_found() -> None:
    """What a node's token could make for claims it was never asked to prepare: a second address of a
    family, an address of a pool the claim is not allocated. A claim not allocated keeps one per family of
    each pool it holds (a standalone claim between pods): so many forged for it would drain a pool."""
    nic = _result("pci-0", "nic", dra_pool="node-2")
    claim = _claim("c", nic, _result("six"))
    idle = _claim("idle")
    own = replace(_held(claim, "six", "10.10.3.3/29"), node="node-2")
    forged = _held(claim, "six", "10.10.3.1/29")  # node-1's, for a claim allocated on node-2
    elsewhere = _held(claim, "other", "10.20.0.7/24")
    v6 = _held(claim, "six", "fd00::7/64")
    idle_held = [_held(idle, "six", f"10.10.3.{i}/29") for i in (4, 5, 6)]
    claims = {claim.uid: claim, idle.uid: idle}
    assert beyond_allocation([forged, own, elsewhere, v6, *idle_held], claims, SAMPLE_DRIVER) == [
        forged,
        elsewhere,
        *idle_held[1:],
    ]
    assert beyond_allocation([own, v6], claims, SAMPLE_DRIVER) == []
    # a pod's own claim given back by the scheduler after its address was reserved keeps none
    given_back = replace(idle, owned_by_pod=True)
    assert beyond_allocation(idle_held, {idle.uid: given_back}, SAMPLE_DRIVER) == idle_held


def test_orphans_are_the_allocations_of_claims_that_are_gone() -> None:
    live, gone = _claim("live"), _claim("gone")
    allocations = [
        _held(live, "p", "10.10.3.1/29"),
        _held(gone, "p", "10.10.3.2/29"),
        _held(gone, "q", "fd00::2/64"),
    ]
    assert orphans(allocations, {live.uid}) == allocations[1:]
    assert orphans(allocations, {live.uid, gone.uid}) == []
    assert orphans([], set()) == []


def test_slice_bodies_cut_the_devices_into_slices_of_all_nodes() -> None:
    devices = [pool_device(_pool(f"p{i:03d}", SIX), PoolUse(6, 0, {})) for i in reversed(range(66))]
    bodies = pool_slices(FakeKubeApi(), SAMPLE_DRIVER).bodies(devices, 4, "crd-uid")
    assert [b["metadata"]["name"] for b in bodies] == [f"{SLICE_PREFIX}-0", f"{SLICE_PREFIX}-1"]
    assert [len(b["spec"]["devices"]) for b in bodies] == [64, 2]
    assert bodies[0]["spec"]["devices"][0]["name"] == "p000"
    for body in bodies:
        assert body["spec"]["allNodes"] is True
        assert "nodeName" not in body["spec"]
        assert body["spec"]["pool"] == {"name": POOLS_POOL, "generation": 4, "resourceSliceCount": 2}
    [empty] = pool_slices(FakeKubeApi(), SAMPLE_DRIVER).bodies([], 1, "crd-uid")
    assert empty["spec"]["devices"] == []  # no pool: still published, "there is none"


# --- pool_slices: the one slice writer, for the IP pools -----------------------------------------------


def _device(name: str, capacity: int) -> dict[str, Any]:
    return pool_device(_pool(name, SIX), PoolUse(capacity, 0, {}))


async def test_the_publisher_writes_once_then_not_while_nothing_changes() -> None:
    api = FakeKubeApi()
    publisher = pool_slices(api, SAMPLE_DRIVER)
    assert await publisher.write([_device("lan3", 6)]) == 1
    stored = api.slices[SLICE]
    assert stored["spec"]["driver"] == SAMPLE_DRIVER
    assert stored["spec"]["pool"] == {"name": POOLS_POOL, "generation": 1, "resourceSliceCount": 1}
    assert [d["name"] for d in stored["spec"]["devices"]] == ["lan3"]
    api.calls.clear()
    assert await publisher.write([_device("lan3", 6)]) == 0
    assert api.calls == ["list_slices", "crd_uid"]  # at once


async def test_the_publisher_reads_only_its_own_slices_and_bounds_their_generation() -> None:
    """Another writer's slice in the IP pools' pool (a compromised node's, with a huge generation) never
    decides what the controller writes; its own generation starts again before it could overflow."""
    api = FakeKubeApi()
    publisher = pool_slices(api, SAMPLE_DRIVER)
    await publisher.write([_device("lan3", 6)])
    foreign = copy.deepcopy(api.slices[SLICE])
    foreign["metadata"] = {"name": "intruder", "ownerReferences": []}
    foreign["spec"]["pool"]["generation"] = 2**63 - 1
    api.slices["intruder"] = foreign
    assert await publisher.write([_device("lan3", 5)]) == 1
    assert api.slices[SLICE]["spec"]["pool"]["generation"] == 2
    api.slices[SLICE]["spec"]["pool"]["generation"] = MAX_GENERATION
    assert await publisher.write([_device("lan3", 4)]) == 2  # deleted, then written again
    assert api.slices[SLICE]["spec"]["pool"]["generation"] == 1


async def test_the_pools_slices_are_owned_by_the_ippool_crd_and_a_new_crd_rewrites_them() -> None:
    """Deleting the CRD (uninstall) lets the garbage collector remove the slices; a CRD created again has
    a new UID, and the slices follow it."""
    api = FakeKubeApi()
    publisher = pool_slices(api, SAMPLE_DRIVER)
    await publisher.write([_device("lan3", 6)])
    assert api.slices[SLICE]["metadata"]["ownerReferences"] == [
        {
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "name": "ippools.netclaim.dev",
            "uid": "uid-of-ippools.netclaim.dev",
        }
    ]
    api.crd_uids["ippools.netclaim.dev"] = "a-new-uid"
    assert await publisher.write([_device("lan3", 6)]) == 1
    assert api.slices[SLICE]["metadata"]["ownerReferences"][0]["uid"] == "a-new-uid"


async def test_a_capacity_change_is_written_with_the_next_generation() -> None:
    api = FakeKubeApi()
    publisher = pool_slices(api, SAMPLE_DRIVER)
    await publisher.write([_device("lan3", 6)])
    assert await publisher.write([_device("lan3", 5)]) == 1
    stored = api.slices[SLICE]
    assert stored["spec"]["pool"]["generation"] == 2
    assert stored["spec"]["devices"][0]["capacity"][ADDRESSES]["value"] == "5"
    assert await pool_slices(api, SAMPLE_DRIVER).write([_device("lan3", 5)]) == 0  # a restarted controller


async def test_a_new_pool_is_written_and_a_slice_no_longer_needed_deleted() -> None:
    api = FakeKubeApi()
    publisher = pool_slices(api, SAMPLE_DRIVER)
    many = [_device(f"p{i:03d}", 6) for i in range(65)]
    assert await publisher.write(many) == 2
    assert sorted(api.slices) == [f"{SLICE_PREFIX}-0", f"{SLICE_PREFIX}-1"]
    assert await publisher.write(many[:3]) == 2  # one written, one deleted
    assert sorted(api.slices) == [SLICE]
    assert api.slices[SLICE]["spec"]["pool"] == {"name": POOLS_POOL, "generation": 2, "resourceSliceCount": 1}


async def test_a_slice_of_the_nodes_pool_is_not_the_pools_publishers() -> None:
    api = FakeKubeApi()
    await api.apply_slice(
        {
            "metadata": {"name": "node-1-netclaim.dev-0"},
            "spec": {
                "driver": SAMPLE_DRIVER,
                "nodeName": "node-1",
                "pool": {"name": "node-1", "generation": 9, "resourceSliceCount": 1},
                "devices": [],
            },
        }
    )
    assert await pool_slices(api, SAMPLE_DRIVER).write([_device("lan3", 6)]) == 1
    assert api.slices[SLICE]["spec"]["pool"]["generation"] == 1
    assert "node-1-netclaim.dev-0" in api.slices


# --- exhausted_message ---------------------------------------------------------------------------------

FULL = PoolUse(capacity=2, allocated_claims=2, addresses={4: 2})
ROOM = PoolUse(capacity=6, allocated_claims=1, addresses={4: 1})


def test_the_message_names_the_full_pool_the_selector_quotes() -> None:
    uses = {"lan3": FULL, "lan4": FULL, "lan5": ROOM}
    message = exhausted_message(['device.attributes["netclaim.dev"].pool == "lan3"'], uses)
    assert message == (
        "IPPool lan3 has no free address: 2 of 2 (netclaim.dev/addresses) are allocated. "
        "The pod is scheduled when a claim of the pool is released."
    )
    assert exhausted_message(["device.name in ['lan4', 'lan3']"], uses) == (
        "IPPool lan3 has no free address: 2 of 2 (netclaim.dev/addresses) are allocated; "
        "IPPool lan4 has no free address: 2 of 2 (netclaim.dev/addresses) are allocated. "
        "The pod is scheduled when a claim of the pool is released."
    )


def test_without_a_quoted_pool_every_full_pool_is_named() -> None:
    uses = {"lan4": FULL, "lan3": FULL, "lan5": ROOM}
    for selectors in ([], ["device.attributes['netclaim.dev'].ipv6"]):
        message = exhausted_message(selectors, uses)
        assert message is not None
        assert message.startswith("IPPool lan3 has no free address")
        assert "; IPPool lan4 has no free address" in message
        assert "lan5" not in message


def test_no_message_when_no_pool_is_full() -> None:
    assert exhausted_message(['device.name == "lan5"'], {"lan5": ROOM}) is None
    assert exhausted_message([], {"lan5": ROOM}) is None
    assert exhausted_message([], {}) is None


# --- Reconciler.once -----------------------------------------------------------------------------------

ASKS_LAN3 = (RequestSpec("addr", ADDRESS_CLASS, ('device.attributes["netclaim.dev"].pool == "lan3"',)),)


def _pending_pod(name: str, uid: str, claim: str) -> dict[str, Any]:
    return {
        "metadata": {"namespace": "team-a", "name": name, "uid": uid},
        "spec": {"resourceClaims": [{"name": "addr", "resourceClaimTemplateName": "t"}]},
        "status": {"resourceClaimStatuses": [{"name": "addr", "resourceClaimName": claim}]},
    }


@pytest.fixture
def api() -> FakeKubeApi:
    """lan3 full (two claims hold its two addresses), wide with room, broken invalid; a gone claim still
    holds an address of wide; a pod waits for lan3."""
    api = FakeKubeApi()
    api.add_pool("lan3", TWO)
    api.add_pool("wide", WIDE)
    api.add_pool("broken", {"ranges": [{"subnet": "10.30.0.0/24", "gateway": "10.31.0.1"}]})
    first, second = _claim("first", _result("lan3")), _claim("second", _result("lan3"))
    waiting = _claim("waiting", requests=ASKS_LAN3)
    nic_only = _claim("nic-only", requests=(RequestSpec("net", "netclaim-nic", ()),))
    for claim in (first, second, waiting, nic_only):
        api.add_claim(claim)
    gone = _claim("gone")
    for allocation in (
        _held(first, "lan3", "10.10.3.1/30"),
        _held(second, "lan3", "10.10.3.2/30"),
        _held(gone, "wide", "10.20.0.7/24"),
        _held(gone, "wide", "fd00:20::7/64"),
    ):
        api.allocations[allocation.name] = allocation
    api.pods = [
        _pending_pod("web-2", "pod-uid-2", "waiting"),
        _pending_pod("db-0", "pod-uid-3", "nic-only"),  # asks no address: not the pools' doing
        _pending_pod("x-0", "pod-uid-4", "unknown-claim"),
    ]
    return api


async def test_a_reconcile_frees_only_the_addresses_of_claims_that_are_gone(api: FakeKubeApi) -> None:
    await Reconciler(api, api, api, api, SAMPLE_DRIVER).once()
    assert sorted(a.claim_name for a in api.allocations.values()) == ["first", "second"]
    assert api.calls.count("delete_ip_allocation") == 2
    # allocations are listed before the claims: a claim created meanwhile cannot look gone
    assert api.calls.index("list_ip_allocations") < api.calls.index("list_claims")


async def test_a_reconcile_publishes_the_valid_pools_with_their_capacity(api: FakeKubeApi) -> None:
    uses = await Reconciler(api, api, api, api, SAMPLE_DRIVER).once()
    assert set(uses) == {"lan3", "wide"}
    assert (uses["lan3"].capacity, uses["lan3"].allocated_claims, uses["lan3"].free) == (2, 2, 0)
    assert (uses["wide"].capacity, uses["wide"].addresses) == (
        254,
        {},
    )  # the gone claim's address is free again
    pools = [s for s in api.slices.values() if s["spec"]["pool"]["name"] == POOLS_POOL]
    # pools of different sizes in slices of their own (netclaim.core.devices.slices: Kubernetes 1.34)
    assert [[d["name"] for d in s["spec"]["devices"]] for s in pools] == [["lan3"], ["wide"]]
    devices = {d["name"]: d for s in pools for d in s["spec"]["devices"]}
    assert sorted(devices) == ["lan3", "wide"]  # broken publishes no device
    assert devices["lan3"]["capacity"][ADDRESSES]["value"] == "2"
    assert devices["wide"]["capacity"][ADDRESSES]["value"] == "254"


async def test_a_reconcile_writes_each_pools_status_once(api: FakeKubeApi) -> None:
    reconciler = Reconciler(api, api, api, api, SAMPLE_DRIVER)
    await reconciler.once()
    assert api.calls.count("write_ippool_status") == 3
    lan3 = api.ippool_status["lan3"]
    assert {k: v for k, v in lan3.items() if k != "conditions"} == {
        "capacity": 2,
        "allocatedClaims": 2,
        "free": 0,
        "addresses": {"ipv4": {"size": 2, "held": 2}},
    }
    [ready] = lan3["conditions"]
    assert (ready["type"], ready["status"], ready["reason"]) == ("Ready", "True", "Published")
    assert api.ippool_status["wide"]["addresses"] == {
        "ipv4": {"size": 254, "held": 0},
        "ipv6": {"size": str(2**64 - 1), "held": 0},  # as text: past what JSON numbers hold exactly
    }
    [invalid] = api.ippool_status["broken"]["conditions"]
    assert (invalid["type"], invalid["status"], invalid["reason"]) == ("Ready", "False", "Invalid")
    assert invalid["message"].startswith("IPPool broken: spec.ranges[0].gateway: 10.31.0.1 is not in subnet")

    api.calls.clear()
    await reconciler.once()  # nothing changed: nothing written
    assert "write_ippool_status" not in api.calls
    assert "apply_slice" not in api.calls
    assert "delete_ip_allocation" not in api.calls


async def test_a_released_address_rewrites_the_status_not_the_slice(api: FakeKubeApi) -> None:
    reconciler = Reconciler(api, api, api, api, SAMPLE_DRIVER)
    await reconciler.once()
    del api.claims[("team-a", "second")]  # deleted while its node was lost
    api.calls.clear()
    uses = await reconciler.once()
    assert sorted(a.claim_name for a in api.allocations.values()) == ["first"]
    assert (uses["lan3"].capacity, uses["lan3"].free) == (2, 1)  # one holder + one free: the same capacity
    assert api.calls.count("write_ippool_status") == 1
    assert api.ippool_status["lan3"]["free"] == 1
    assert "apply_slice" not in api.calls


async def test_a_pending_pod_of_a_full_pool_gets_one_event(api: FakeKubeApi) -> None:
    reconciler = Reconciler(api, api, api, api, SAMPLE_DRIVER)
    await reconciler.once()
    assert [(e.namespace, e.pod, e.pod_uid, e.reason) for e in api.events] == [
        ("team-a", "web-2", "pod-uid-2", "IPPoolExhausted")
    ]
    assert api.events[0].message.startswith("IPPool lan3 has no free address: 2 of 2")
    await reconciler.once()
    await reconciler.once()
    assert len(api.events) == 1


async def test_a_pending_pod_naming_a_standalone_claim_of_a_full_pool_gets_the_event_too(
    api: FakeKubeApi,
) -> None:
    """Before, only claims made from a pod's templates (status.resourceClaimStatuses) were looked at."""
    api.pods = [
        {
            "metadata": {"namespace": "team-a", "name": "db-1", "uid": "pod-uid-5"},
            "spec": {"resourceClaims": [{"name": "addr", "resourceClaimName": "waiting"}]},
        }
    ]
    await Reconciler(api, api, api, api, SAMPLE_DRIVER).once()
    assert [(e.pod, e.reason) for e in api.events] == [("db-1", "IPPoolExhausted")]


async def test_no_event_and_no_pod_list_while_no_pool_is_full(api: FakeKubeApi) -> None:
    del api.claims[("team-a", "second")]
    await Reconciler(api, api, api, api, SAMPLE_DRIVER).once()
    assert api.events == []
    assert "unschedulable_pods" not in api.calls


@dataclass
class RetakenApi(FakeKubeApi):
    """Between the controller's list of allocations and of claims, the gone claim's address is released by
    its agent and taken by a new claim (a new object of the same name)."""

    retaken: IPAllocation | None = None

    async def list_claims(self, driver: str | None = None) -> list[Claim]:
        if self.retaken is not None:
            self.allocations[self.retaken.name] = self.retaken
        return await super().list_claims(driver)


async def test_an_address_taken_again_meanwhile_is_never_freed() -> None:
    api = RetakenApi()
    api.add_pool("lan3", TWO)
    gone, new = _claim("gone"), _claim("new", _result("lan3"))
    old = _held(gone, "lan3", "10.10.3.1/30", uid="old-uid")
    api.allocations[old.name] = old
    api.retaken = _held(new, "lan3", "10.10.3.1/30", uid="new-uid")
    api.add_claim(new)
    # the conflict is that address's: the pass goes on
    await Reconciler(api, api, api, api, SAMPLE_DRIVER).once()
    assert api.allocations[old.name].claim_uid == new.uid  # the new holder keeps it


async def test_a_reconcile_frees_what_a_claim_holds_beyond_its_allocation(api: FakeKubeApi) -> None:
    """A second address of lan3 made for claim `first` in another node's name (what a node's token can
    create): freed, and lan3's capacity counts `first` once."""
    first = api.claims[("team-a", "first")]
    forged = replace(_held(first, "lan3", "10.10.3.2/30"), name="lan3.forged", uid="forged", node="node-9")
    api.allocations[forged.name] = forged
    uses = await Reconciler(api, api, api, api, SAMPLE_DRIVER).once()
    assert "lan3.forged" not in api.allocations
    assert sorted(a.claim_name for a in api.allocations.values()) == ["first", "second"]
    assert uses["lan3"].addresses == {4: 2}


async def test_a_restricted_pool_without_its_device_class_says_so(api: FakeKubeApi) -> None:
    api.add_pool("only-a", {**SIX, "namespaces": ["team-a"]})
    reconciler = Reconciler(api, api, api, api, SAMPLE_DRIVER)
    await reconciler.once()
    [missing] = api.ippool_status["only-a"]["conditions"]
    assert (missing["status"], missing["reason"]) == ("False", "DeviceClassMissing")
    assert "through DeviceClass netclaim-pool-only-a, which does not exist" in missing["message"]
    api.device_classes.add("netclaim-pool-only-a")
    await reconciler.once()
    [ready] = api.ippool_status["only-a"]["conditions"]
    assert (ready["status"], ready["reason"]) == ("True", "Published")


def _published(api: FakeKubeApi) -> list[str]:
    return sorted(d["name"] for s in api.slices.values() for d in s["spec"]["devices"])


async def test_a_restricted_pool_is_published_once_its_admission_parameter_is_in_place() -> None:
    """Before, the policy's parameters were the IPPools: a CRD as paramKind, with which kube-apiserver
    denied every ResourceClaim of the cluster after it restarted. Now a ConfigMap per restricted pool."""
    api = FakeKubeApi()
    api.add_pool("open", {"ranges": [{"subnet": "10.1.0.0/24"}]})
    api.add_pool("only-a", {"ranges": [{"subnet": "10.2.0.0/24"}], "namespaces": ["team-a", "team-b"]})
    reconciler = Reconciler(api, api, api, api, SAMPLE_DRIVER)
    await reconciler.once()
    assert api.pool_params == {
        "netclaim-pool-only-a": ({"pool": "only-a", "namespaces": "team-a,team-b"}, "uid-of-pool-only-a")
    }
    assert api.calls.index("apply_pool_params") < api.calls.index("apply_slice")
    assert _published(api) == ["only-a", "open"]
    await reconciler.once()
    assert api.calls.count("apply_pool_params") == 1  # unchanged: not written again
    # the pool opened to every namespace: its parameter goes; a pool newly restricted gets one
    api.add_pool("only-a", {"ranges": [{"subnet": "10.2.0.0/24"}]})
    api.add_pool("open", {"ranges": [{"subnet": "10.1.0.0/24"}], "namespaces": ["team-c"]})
    await reconciler.once()
    assert api.pool_params == {
        "netclaim-pool-open": ({"pool": "open", "namespaces": "team-c"}, "uid-of-pool-open")
    }


async def test_a_restricted_pool_whose_parameter_cannot_be_written_is_not_published() -> None:
    """Published without it, any namespace's claim naming the pool's class would be admitted."""
    api = FakeKubeApi()
    api.add_pool("open", {"ranges": [{"subnet": "10.1.0.0/24"}]})
    api.add_pool("only-a", {"ranges": [{"subnet": "10.2.0.0/24"}], "namespaces": ["team-a"]})
    reconciler = Reconciler(api, api, api, api, SAMPLE_DRIVER)

    async def refused(name: str, data: dict[str, str], pool: str, pool_uid: str) -> None:
        raise ApiRejectedError("configmaps is forbidden")

    api.apply_pool_params = refused  # type: ignore[method-assign]
    await reconciler.once()
    assert _published(api) == ["open"]
    del api.apply_pool_params
    await reconciler.once()
    assert _published(api) == ["only-a", "open"]


class SlowFreesApi(FakeKubeApi):
    """Each free takes 10 ms; the address `refused` cannot be freed (its UID changed)."""

    refused = ""
    in_flight = 0
    most_in_flight = 0

    async def delete_ip_allocation(self, allocation: IPAllocation) -> None:
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            await asyncio.sleep(0.01)
            if allocation.address == self.refused:
                raise ConflictError(f"IPAllocation {allocation.name}: Precondition failed: UID")
            await super().delete_ip_allocation(allocation)
        finally:
            self.in_flight -= 1


async def test_a_deleted_namespaces_addresses_are_freed_a_bounded_number_at_a_time() -> None:
    """One by one, 5,000 took the pass (and every pool's device and status behind it) minutes; one that
    cannot be freed is that address's problem, never the others'."""
    api = SlowFreesApi()
    api.add_pool("wide", WIDE)
    addresses = [f"10.20.0.{n}/24" for n in range(1, 101)]
    for n, address in enumerate(addresses):
        held = _held(_claim(f"gone-{n}"), "wide", address)
        api.allocations[held.name] = held
    api.refused = addresses[40]
    reconciler = Reconciler(api, api, api, api, SAMPLE_DRIVER)
    await reconciler.once()
    assert [a.address for a in api.allocations.values()] == [addresses[40]]
    assert api.most_in_flight == RELEASES_AT_ONCE
    # what the pass's pacing leaves out of its rest: 7 rounds of 16 frees, each round at least 10 ms
    assert reconciler.release_seconds >= 0.07

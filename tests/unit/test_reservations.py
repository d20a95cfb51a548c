"""Pool addresses reserved before the pod binds: the pools' devices with binding conditions, the controller's
work queue of claims the scheduler waits on, and the agent keeping what was reserved."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

import pytest

from netclaim.controller.reservations import Reservations
from netclaim.core.devices.slices import dropped_fields, normalized_device
from netclaim.core.events import EventReason
from netclaim.core.ipam.addresses import AddressBook
from netclaim.core.ipam.ippool import ADDRESSES, POOLS_POOL, IPPool
from netclaim.core.ipam.pools import PoolUse, pool_device
from netclaim.core.ipam.reservation import (
    RESERVATION_FAILED,
    RESERVED,
    awaiting,
    reserved_before_binding,
    with_reservations,
)
from netclaim.core.objects import AllocatedDevice, Claim
from netclaim.core.plan import address_requests
from netclaim.errors import ApiUnavailableError
from tests.unit.fakes import (
    SAMPLE_DRIVER,
    FakeKubeApi,
    sample_allocation,
    sample_claim,
    sample_config,
    sample_device,
)

LAN3_SPEC: dict[str, Any] = {
    "network": "lan3",
    "ranges": [{"subnet": "10.10.3.0/24", "gateway": "10.10.3.1"}],
}
NIC = sample_allocation(sample_device("enp1s0"), "net")  # on node-1's pool
WAITED = AllocatedDevice(
    "addr", SAMPLE_DRIVER, POOLS_POOL, "lan3", "share-a", {ADDRESSES: "1"}, binding_conditions=(RESERVED,)
)
AT_PREPARE = replace(WAITED, binding_conditions=())


def _claim(*configs: Any, pool: AllocatedDevice = WAITED, **options: Any) -> Claim:
    claim = sample_claim((NIC, pool), tuple(sample_config(p, requests=r) for p, r in configs), **options)
    return replace(claim, node="node-1")


def _addresses(*wanted: str) -> dict[str, Any]:
    return {"apiVersion": "netclaim.dev/v1alpha1", "kind": "AddressConfig", "addresses": list(wanted)}


def _entry(claim: Claim) -> dict[str, Any]:
    [entry] = [e for e in claim.devices_status if e.get("pool") == POOLS_POOL]
    return entry


def _types(entry: dict[str, Any]) -> dict[str, str]:
    return {c["type"]: c["status"] for c in entry["conditions"]}


@pytest.fixture
def api() -> FakeKubeApi:
    found = FakeKubeApi()
    found.add_pool("lan3", LAN3_SPEC)
    return found


# --- the pools' devices ---------------------------------------------------------------------------------


def test_a_pool_device_carries_the_binding_conditions_only_when_reserving_before_binding() -> None:
    pool = IPPool.from_api({"metadata": {"name": "lan3"}, "spec": LAN3_SPEC})
    use = PoolUse(capacity=250, allocated_claims=0, addresses={})
    device = pool_device(pool, use, reserve_before_binding=True)
    assert device["bindingConditions"] == [RESERVED]
    assert device["bindingFailureConditions"] == [RESERVATION_FAILED]
    assert "bindingConditions" not in pool_device(pool, use)


def test_a_stored_device_without_the_conditions_is_written_again_unless_the_api_server_drops_them() -> None:
    pool = IPPool.from_api({"metadata": {"name": "lan3"}, "spec": LAN3_SPEC})
    use = PoolUse(capacity=250, allocated_claims=0, addresses={})
    wanted, stored = pool_device(pool, use, True), pool_device(pool, use, False)
    assert normalized_device(wanted) != normalized_device(stored)  # a pass writes them
    dropped = dropped_fields([wanted], [stored])  # the gate is off: the answer lacks them
    assert dropped == {"bindingConditions"}
    assert normalized_device(wanted, dropped) == normalized_device(stored, dropped)  # no write loop


# --- reading claims ---------------------------------------------------------------------------------------


def test_a_claims_binding_conditions_and_node_are_read_from_its_allocation() -> None:
    data = {
        "metadata": {"namespace": "team-a", "name": "c", "uid": "u", "resourceVersion": "7"},
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {
                            "request": "addr",
                            "driver": SAMPLE_DRIVER,
                            "pool": POOLS_POOL,
                            "device": "lan3",
                            "shareID": "s",
                            "bindingConditions": [RESERVED],
                            "bindingFailureConditions": [RESERVATION_FAILED],
                        }
                    ]
                },
                "nodeSelector": {
                    "nodeSelectorTerms": [
                        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-2"]}]}
                    ]
                },
            },
            "devices": [
                {
                    "driver": SAMPLE_DRIVER,
                    "pool": POOLS_POOL,
                    "device": "lan3",
                    "shareID": "s",
                    "conditions": [{"type": RESERVED, "status": "True", "message": "x" * 500}],
                    "networkData": {"ips": ["10.10.3.7/24"]},
                }
            ],
        },
    }
    claim = Claim.from_api(data)
    assert claim.node == "node-2"
    assert claim.results[0].binding_conditions == (RESERVED,)
    assert reserved_before_binding(claim.results[0])
    kept = claim.compact(SAMPLE_DRIVER)  # what the controller's mirror keeps: enough to tell it is settled
    assert kept.devices_status == (
        {
            "driver": SAMPLE_DRIVER,
            "pool": POOLS_POOL,
            "device": "lan3",
            "shareID": "s",
            "conditions": [{"type": RESERVED, "status": "True"}],
        },
    )
    assert awaiting(kept, SAMPLE_DRIVER) == []


def test_a_claim_is_awaited_until_its_pool_device_says_reserved_or_failed() -> None:
    claim = _claim()
    assert awaiting(claim, SAMPLE_DRIVER) == [WAITED]
    pending = {"driver": SAMPLE_DRIVER, "pool": POOLS_POOL, "device": "lan3", "shareID": "share-a"}
    for kind, status, waited in (
        (RESERVED, "False", True),
        (RESERVED, "True", False),
        (RESERVATION_FAILED, "True", False),
    ):
        entry = {**pending, "conditions": [{"type": kind, "status": status}]}
        assert bool(awaiting(replace(claim, devices_status=(entry,)), SAMPLE_DRIVER)) is waited
    assert awaiting(_claim(pool=AT_PREPARE), SAMPLE_DRIVER) == []  # no binding condition: taken at prepare


# --- the controller's reservations ----------------------------------------------------------------------


async def test_a_reservation_takes_the_address_in_the_nodes_name_and_says_so_on_the_claim(
    api: FakeKubeApi,
) -> None:
    claim = _claim()
    api.add_claim(claim)
    reservations = Reservations(api, api, SAMPLE_DRIVER)
    await reservations.reserve(claim.uid, claim.namespace, claim.name)
    [held] = api.allocations.values()
    assert (held.claim_uid, held.node, held.pool) == (claim.uid, "node-1", "lan3")
    written = api.claims[(claim.namespace, claim.name)]
    entry = _entry(written)
    assert _types(entry) == {RESERVED: "True", "Ready": "True"}
    assert entry["networkData"] == {"ips": [held.address]}
    assert awaiting(written, SAMPLE_DRIVER) == []
    before = list(api.calls)
    await reservations.reserve(claim.uid, claim.namespace, claim.name)  # settled: read, nothing written
    assert api.calls[len(before) :] == ["get_claim"]


async def test_an_address_held_by_another_claim_fails_the_binding_with_an_event_and_takes_nothing(
    api: FakeKubeApi,
) -> None:
    holder = _claim((_addresses("10.10.3.50"), ("addr",)), name="holder", uid="holder-uid")
    api.add_claim(holder)
    await Reservations(api, api, SAMPLE_DRIVER).reserve(holder.uid, holder.namespace, holder.name)
    claim = _claim((_addresses("10.10.3.50"), ("addr",)))
    api.add_claim(claim)
    await Reservations(api, api, SAMPLE_DRIVER).reserve(claim.uid, claim.namespace, claim.name)
    entry = _entry(api.claims[(claim.namespace, claim.name)])
    assert _types(entry) == {RESERVATION_FAILED: "True"}
    assert "is held by claim team-a/holder" in entry["conditions"][0]["message"]
    assert [a.claim_uid for a in api.allocations.values()] == ["holder-uid"]
    [event] = api.events
    assert (event.pod, event.reason) == ("pod-1", EventReason.RESERVATION_FAILED)
    assert "10.10.3.50" in event.message
    # the scheduler gives the allocation back and allocates again: the pod is not told twice
    reservations = Reservations(api, api, SAMPLE_DRIVER)
    for _ in range(2):
        api.add_claim(replace(api.claims[(claim.namespace, claim.name)], devices_status=()))
        await reservations.reserve(claim.uid, claim.namespace, claim.name)
        assert _types(_entry(api.claims[(claim.namespace, claim.name)])) == {RESERVATION_FAILED: "True"}
    assert len(api.events) == 2  # the first Reservations' one, and this one's once


async def test_a_claim_no_pod_waits_for_is_left_alone(api: FakeKubeApi) -> None:
    claim = _claim(reserved_for=())  # unprepared, its entries gone, still allocated a moment
    api.add_claim(claim)
    await Reservations(api, api, SAMPLE_DRIVER).reserve(claim.uid, claim.namespace, claim.name)
    assert api.allocations == {} and api.claims[(claim.namespace, claim.name)] == claim


async def test_a_pool_with_no_free_address_fails_the_binding(api: FakeKubeApi) -> None:
    api.add_pool("lan3", {"network": "lan3", "ranges": [{"subnet": "10.10.5.0/30"}]})  # .1 and .2
    for number in (1, 2):
        holder = _claim(name=f"holder-{number}", uid=f"holder-uid-{number}")
        api.add_claim(holder)
        await Reservations(api, api, SAMPLE_DRIVER).reserve(holder.uid, holder.namespace, holder.name)
    claim = _claim()
    api.add_claim(claim)
    await Reservations(api, api, SAMPLE_DRIVER).reserve(claim.uid, claim.namespace, claim.name)
    entry = _entry(api.claims[(claim.namespace, claim.name)])
    assert _types(entry) == {RESERVATION_FAILED: "True"}
    assert "IPPool lan3: no free IPv4 address" in entry["conditions"][0]["message"]
    assert len(api.allocations) == 2


async def test_a_claim_whose_work_fails_for_a_moment_is_tried_again_while_others_go_on(
    api: FakeKubeApi,
) -> None:
    first, second = _claim(), _claim(name="claim-2", uid="claim-uid-2")
    for claim in (first, second):
        api.add_claim(claim)
    reservations = Reservations(api, api, SAMPLE_DRIVER)
    api.fail_next.append(ApiUnavailableError("the API server is restarting"))
    runner = asyncio.create_task(reservations.run())
    try:
        reservations.changed(None, first)
        reservations.changed(None, second)
        for _ in range(100):
            await asyncio.sleep(0.05)
            if all(not awaiting(api.claims[(c.namespace, c.name)], SAMPLE_DRIVER) for c in (first, second)):
                break
        assert sorted(a.claim_uid for a in api.allocations.values()) == ["claim-uid-1", "claim-uid-2"]
        assert all(
            _types(_entry(api.claims[(c.namespace, c.name)]))[RESERVED] == "True" for c in (first, second)
        )
    finally:
        runner.cancel()
        await asyncio.gather(runner, return_exceptions=True)


# --- the agent ----------------------------------------------------------------------------------------------


async def test_prepare_reads_a_reserved_claims_addresses_no_older_than_the_claim_and_writes_nothing(
    api: FakeKubeApi,
) -> None:
    claim = _claim()
    api.add_claim(claim)
    await Reservations(api, api, SAMPLE_DRIVER).reserve(claim.uid, claim.namespace, claim.name)
    written = api.claims[(claim.namespace, claim.name)]
    book = AddressBook(api, "node-1")
    other = _claim(name="other", uid="other-uid", pool=AT_PREPARE)  # the agent's first read: consistent
    await book.allocate(other, address_requests(other, SAMPLE_DRIVER))
    reserved = {a.address for a in api.allocations.values() if a.claim_uid == claim.uid}
    api.calls.clear()
    [grant] = await book.allocate(written, address_requests(written, SAMPLE_DRIVER))
    assert set(grant.addresses) == reserved
    assert api.calls == [f"held_ip_allocations {written.resource_version}", "get_ippool"]  # reads only
    # a claim this process read before is read consistently again, reserved or not
    api.calls.clear()
    await book.allocate(written, address_requests(written, SAMPLE_DRIVER))
    assert api.calls[0] == "held_ip_allocations"


def test_the_agents_entry_of_a_reserved_pool_device_keeps_the_binding_condition() -> None:
    claim = _claim()
    agents: list[dict[str, Any]] = [
        {"driver": SAMPLE_DRIVER, "pool": "node-1", "device": "enp1s0", "conditions": []},
        {
            "driver": SAMPLE_DRIVER,
            "pool": POOLS_POOL,
            "device": "lan3",
            "shareID": "share-a",
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    ]
    nic, pool = with_reservations(claim, agents, "2026-12-07T00:00:00Z")
    assert nic == agents[0]
    assert _types(pool) == {"Ready": "True", RESERVED: "True"}
    assert with_reservations(_claim(pool=AT_PREPARE), agents, "2026-12-07T00:00:00Z") == agents

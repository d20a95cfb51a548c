"""The controller's reconcile keeps succeeding whatever one object of the cluster holds: what cannot be
read is skipped, a write about one object that fails is that object's, and the passes are counted."""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import pytest

from netclaim.adapters.kube.addresses import KubeAddresses
from netclaim.adapters.kube.claims import KubeClaims
from netclaim.adapters.kube.connection import KubeConnection
from netclaim.adapters.kube.params import KubePoolParams
from netclaim.adapters.kube.slices import KubeSlices
from netclaim.controller.ipam import Reconciler, concerns_pools
from netclaim.controller.mirror import Mirror
from netclaim.core.ipam.ippool import POOLS_POOL
from netclaim.core.ipam.pools import Quarantine
from netclaim.core.objects import Claim, IPAllocation
from netclaim.errors import ApiRejectedError, ApiUnavailableError
from netclaim.runtime.metrics import REGISTRY
from netclaim.runtime.trigger import REST_FACTOR, KeyBackoff, Trigger, fire_on_changes, paced_pass
from tests.unit.fakes import (
    KUBECONFIG,
    SAMPLE_DRIVER,
    FakeApiServer,
    FakeKubeApi,
    api_status,
    sample_allocation,
    sample_device,
)

LAN: dict[str, Any] = {"ranges": [{"subnet": "10.10.3.0/24"}]}


def _held(name: str, address: str, claim_uid: str, pool: str = "lan") -> IPAllocation:
    claim = claim_uid.removeprefix("uid-")
    return IPAllocation(name, f"uid-{name}", pool, address, "team-a", claim, claim_uid, "node-1")


@dataclass
class _RefusingApi(FakeKubeApi):
    """Refuses (or fails on a bug at) the writes about the objects named in `refuse`."""

    refuse: dict[str, Exception] = field(default_factory=dict)

    async def delete_ip_allocation(self, allocation: IPAllocation) -> None:
        if allocation.name in self.refuse:
            raise self.refuse[allocation.name]
        await super().delete_ip_allocation(allocation)

    async def write_ippool_status(self, name: str, status: dict[str, Any]) -> None:
        if name in self.refuse:
            raise self.refuse[name]
        await super().write_ippool_status(name, status)


def _passes(result: str) -> float:
    return REGISTRY.get_sample_value("netclaim_reconcile_total", {"result": result}) or 0.0


async def test_a_write_about_one_object_that_fails_never_fails_the_pass() -> None:
    api = _RefusingApi()
    api.add_pool("refused", LAN)
    api.add_pool("lan", LAN)
    for held in (_held("a", "10.10.3.7/24", "gone-1"), _held("b", "10.10.3.8/24", "gone-2")):
        api.allocations[held.name] = held
    api.refuse = {"a": ApiRejectedError("admission webhook denied"), "refused": KeyError("a bug")}
    uses = await Reconciler(api, api, api, api, SAMPLE_DRIVER).once()
    assert set(uses) == {"refused", "lan"}
    assert list(api.allocations) == ["a"]  # b freed; a tried again the next pass
    assert list(api.ippool_status) == ["lan"]
    assert api.slices  # the pools were published


async def test_an_api_that_cannot_serve_fails_the_pass_and_each_pass_is_counted() -> None:
    api = FakeKubeApi()
    api.add_pool("lan", LAN)
    reconciler = Reconciler(api, api, api, api, SAMPLE_DRIVER)
    ok, error = _passes("ok"), _passes("error")
    api.fail_next = [ApiUnavailableError("503")]
    with pytest.raises(ApiUnavailableError):
        await reconciler.reconcile()
    assert (_passes("ok"), _passes("error")) == (ok, error + 1)
    await reconciler.reconcile()
    assert (_passes("ok"), _passes("error")) == (ok + 1, error + 1)
    assert (REGISTRY.get_sample_value("netclaim_last_reconcile_timestamp_seconds") or 0) > 0


# the real adapter, the cluster's answers canned: the objects a tenant or a bug can leave in a cluster

NESTED = "[" * 5000 + "]" * 5000  # as deep as the API server stores an opaque config
CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "ippools.netclaim.dev", "uid": "crd-uid"},
    "spec": {
        "group": "netclaim.dev",
        "names": {"kind": "IPPool", "plural": "ippools"},
        "scope": "Cluster",
        "versions": [{"name": "v1alpha1", "served": True, "storage": True}],
    },
}


def _claim(name: str, pool_device: str, parameters: str = "{}", driver: str = SAMPLE_DRIVER) -> str:
    """A claim allocated a device of IPPool `pool_device`, with an opaque config of `driver` (JSON text)."""
    result = sample_allocation(sample_device(), "addr", pool=POOLS_POOL)
    allocated = {"request": "addr", "driver": result.driver, "pool": result.pool, "device": pool_device}
    opaque = f'{{"driver": "{driver}", "parameters": {parameters}}}'
    return f"""{{
        "metadata": {{"namespace": "team-a", "name": "{name}", "uid": "uid-{name}", "resourceVersion": "1"}},
        "status": {{"allocation": {{"devices": {{
            "results": [{json.dumps(allocated)}],
            "config": [{{"source": "FromClaim", "opaque": {opaque}}}]
        }}}}}}
    }}"""


def _allocation(name: str, address: object, claim_uid: str) -> dict[str, Any]:
    spec = {"pool": "lan", "address": address, "claim": {"namespace": "team-a", "uid": claim_uid}}
    return {"metadata": {"name": name, "uid": f"uid-{name}"}, "spec": spec}


@pytest.fixture
async def hostile_cluster() -> AsyncIterator[tuple[KubeConnection, FakeApiServer]]:
    server = FakeApiServer()
    claims = [_claim("web", "lan"), _claim("gpu", "other-pool", NESTED, driver="gpu.example.com")]
    claims.append(_claim("hostile", "lan", NESTED))
    allocations = [
        _allocation("lan-10-10-3-7", "10.10.3.7/24", "uid-web"),
        _allocation("lan-10-10-3-8", "10.10.3.8/24", "uid-hostile"),  # read in part: still a live claim
        _allocation("lan-10-10-3-9", "10.10.3.9/24", "uid-deleted"),  # an orphan
        _allocation("lan-bad", "not-an-ip", "uid-deleted"),
    ]
    pools = [json.dumps({"metadata": {"name": "lan"}, "spec": LAN})]
    pools.append(f'{{"metadata": {{"name": "deep"}}, "spec": {{}}, "status": {NESTED}}}')
    server.answers |= {
        "/apis/resource.k8s.io/v1/resourceclaims": (
            200,
            '{"kind": "ResourceClaimList", "metadata": {"resourceVersion": "5"}, "items": ['
            + ",".join(claims)
            + "]}",
        ),
        "/apis/netclaim.dev/v1alpha1/ipallocations": (
            200,
            json.dumps({"metadata": {"resourceVersion": "5"}, "items": allocations}),
        ),
        "/apis/netclaim.dev/v1alpha1/ipallocations/lan-10-10-3-9": (200, api_status(200, "deleted")),
        "/apis/netclaim.dev/v1alpha1/ippools": (200, '{"items": [' + ",".join(pools) + "]}"),
        "/apis/netclaim.dev/v1alpha1/ippools/lan/status": (200, pools[0]),
        "/apis/resource.k8s.io/v1/resourceslices": (200, '{"items": []}'),
        "/api/v1/namespaces/netclaim/configmaps": (200, '{"kind": "ConfigMapList", "items": []}'),
        "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/ippools.netclaim.dev": (
            200,
            json.dumps(CRD),
        ),
    }
    kube = KubeConnection(KUBECONFIG, f"{SAMPLE_DRIVER}-controller", transport=server.transport())
    yield kube, server
    await kube.close()


async def test_the_controller_reconciles_a_cluster_holding_what_no_one_can_read(
    hostile_cluster: tuple[KubeConnection, FakeApiServer],
) -> None:
    """Before, one claim nested ~1,000 deep (of any driver) failed every reconcile for 25 minutes, and a
    malformed IPAllocation address crashed the controller."""
    kube, server = hostile_cluster
    ok = _passes("ok")
    params = KubePoolParams(kube, "netclaim")
    reconciler = Reconciler(KubeClaims(kube), KubeAddresses(kube), KubeSlices(kube), params, SAMPLE_DRIVER)
    await reconciler.reconcile()
    assert _passes("ok") == ok + 1
    use = (await reconciler.once())["lan"]
    assert (use.allocated_claims, use.addresses) == (2, {4: 2})  # web and the hostile claim, read in part
    deleted = [r.url.path.rsplit("/", 1)[1] for r in server.requests if r.method == "DELETE"]
    assert set(deleted) == {"lan-10-10-3-9"}  # the orphan only: never the hostile claim's address
    applied = [r for r in server.requests if r.method == "PATCH" and "resourceslices" in r.url.path]
    assert [d["name"] for d in json.loads(applied[0].content)["spec"]["devices"]] == ["lan"]
    warned = {(e["involvedObject"]["kind"], e["involvedObject"]["name"]) for e in server.events}
    assert warned == {
        ("ResourceClaim", "gpu"),
        ("ResourceClaim", "hostile"),
        ("IPAllocation", "lan-bad"),
        ("IPPool", "deep"),
    }


async def test_after_each_pass_the_controller_rests_four_times_as_long_as_it_took() -> None:
    """At 5,000 claims back-to-back passes took half the machine from the scheduler (docs/scale.md)."""
    trigger = Trigger()
    trigger.fire()

    async def slow_pass() -> None:
        await asyncio.sleep(0.2)

    started = time.monotonic()
    await paced_pass(trigger, slow_pass)
    assert time.monotonic() - started >= 0.2 * (1 + REST_FACTOR)


async def test_a_pass_over_what_changed_rests_at_most_its_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    """A large change (1,000 policies at once: a 10 s pass) held every small change after it back 40 s."""
    from netclaim.runtime import trigger as triggers

    rests: list[float] = []
    clock = [0.0]
    real_sleep = asyncio.sleep

    async def recorded(seconds: float) -> None:
        rests.append(seconds)
        await real_sleep(0)

    def monotonic() -> float:
        return clock[0]

    async def long_pass() -> None:
        clock[0] += 10.0

    monkeypatch.setattr(asyncio, "sleep", recorded)
    monkeypatch.setattr(time, "monotonic", monotonic)
    for most, rested in ((math.inf, 10.0 * REST_FACTOR), (triggers.CHANGES_REST, triggers.CHANGES_REST)):
        trigger = Trigger(settle=0)
        trigger.fire()
        rests.clear()
        await paced_pass(trigger, long_pass, most)
        assert rests[-1] == rested
    # 8 of its 10 s went to writes about what changed (a deleted namespace's addresses): rested for 2 s
    trigger = Trigger(settle=0)
    trigger.fire()
    await paced_pass(trigger, long_pass, unpaced=lambda: 8.0)
    assert rests[-1] == 2.0 * REST_FACTOR


async def test_a_failed_pass_leaves_the_trigger_fired_for_the_next() -> None:
    trigger = Trigger()
    trigger.fire()
    passes: list[str] = []

    async def failing() -> None:
        passes.append("failed")
        raise ApiUnavailableError("the API server did not answer")

    async def succeeding() -> None:
        passes.append("ok")

    with pytest.raises(ApiUnavailableError):
        await paced_pass(trigger, failing)
    await asyncio.wait_for(paced_pass(trigger, succeeding), 10)  # no change fired meanwhile
    assert passes == ["failed", "ok"]


def _claim_event(name: str, classes: tuple[str, ...], results: list[dict[str, str]]) -> dict[str, Any]:
    """A claim as a watch event carries it."""
    return {
        "metadata": {"namespace": "team-a", "name": name, "uid": f"uid-{name}", "resourceVersion": "7"},
        "spec": {
            "devices": {
                "requests": [
                    {"name": f"r{i}", "exactly": {"deviceClassName": c}} for i, c in enumerate(classes)
                ]
            }
        },
        "status": {"allocation": {"devices": {"results": results}}} if results else {},
    }


def _result(driver: str, pool: str, device: str) -> dict[str, str]:
    return {"request": "r0", "driver": driver, "pool": pool, "device": device}


class _CountingTrigger(Trigger):
    def __init__(self) -> None:
        super().__init__()
        self.fired = 0

    def fire(self, compare: bool = True) -> None:
        self.fired += 1
        super().fire(compare)


async def test_only_claims_of_the_pools_start_a_pass() -> None:
    """Run G: the controller made 9 passes (14.6 CPU-seconds) on a no-op driver's 5,000 claims alone."""
    api = FakeKubeApi()
    trigger = _CountingTrigger()
    watch = asyncio.create_task(
        fire_on_changes(
            partial(Mirror[Claim]("claims", lambda c: c.uid).follow, api.listed_claims, api.claim_changes),
            (trigger, partial(concerns_pools, driver=SAMPLE_DRIVER)),
        )
    )
    await asyncio.sleep(0)
    assert trigger.fired == 1  # connected: whatever happened meanwhile is reconciled once
    events = [
        (_claim_event("gpu", ("gpu.example.com",), []), False),
        (
            _claim_event("gpu-done", ("gpu.example.com",), [_result("gpu.example.com", "node-1", "gpu-0")]),
            False,
        ),
        (_claim_event("nic", ("netclaim-shared",), [_result(SAMPLE_DRIVER, "node-1", "enp1s0")]), False),
        (_claim_event("asks", ("netclaim-shared", "netclaim-address"), []), True),  # may wait on a full pool
        (_claim_event("held", ("netclaim-pool-lan3",), [_result(SAMPLE_DRIVER, POOLS_POOL, "lan3")]), True),
        ({"metadata": {"name": "x", "namespace": "team-a", "uid": "u"}, "spec": {"devices": 3}}, True),
    ]
    try:
        for body, starts in events:
            before = trigger.fired
            api.claim_events.put_nowait(("MODIFIED", Claim.from_api(body)))
            await asyncio.sleep(0.01)
            assert trigger.fired == before + starts, body["metadata"]["name"]
    finally:
        watch.cancel()


# the mirrors: a pass reads memory, and lists only to decide what it frees


def _pool_claim(name: str) -> Claim:
    return Claim.from_api(
        _claim_event(name, ("netclaim-address",), [_result(SAMPLE_DRIVER, POOLS_POOL, "lan")])
    )


async def _followed(api: FakeKubeApi, reconciler: Reconciler) -> list[asyncio.Task[None]]:
    async def drain(changes: AsyncIterator[object]) -> None:
        async for _ in changes:
            pass

    tasks = [
        asyncio.create_task(drain(reconciler.claims_seen.follow(api.listed_claims, api.claim_changes))),
        asyncio.create_task(
            drain(reconciler.allocations_seen.follow(api.listed_ip_allocations, api.ip_allocation_changes))
        ),
    ]
    await asyncio.sleep(0.01)  # the fake's lists answer at once
    assert reconciler.claims_seen.synced and reconciler.allocations_seen.synced
    return tasks


async def test_with_the_mirrors_synced_a_pass_that_frees_nothing_lists_no_claim_and_no_address() -> None:
    api = FakeKubeApi()
    api.add_pool("lan", LAN)
    api.add_claim(_pool_claim("web"))
    api.allocations["a"] = _held("a", "10.10.3.7/24", "uid-web")
    reconciler = Reconciler(api, api, api, api, SAMPLE_DRIVER)
    tasks = await _followed(api, reconciler)
    try:
        api.add_claim(_pool_claim("db"))  # and its change reaches the mirror
        api.claim_events.put_nowait(("ADDED", _pool_claim("db")))
        held = _held("b", "10.10.3.8/24", "uid-db")
        api.allocations["b"] = held
        api.allocation_events.put_nowait(("ADDED", held))
        await asyncio.sleep(0.01)
        api.calls.clear()
        use = (await reconciler.once())["lan"]
        assert (use.allocated_claims, use.addresses) == (2, {4: 2})
        assert not {"list_claims", "list_ip_allocations"} & set(api.calls)
        assert api.ippool_status["lan"]["addresses"]["ipv4"]["held"] == 2
    finally:
        for task in tasks:
            task.cancel()


async def test_what_a_pass_would_free_is_decided_on_its_claim_read_afresh() -> None:
    """A claim's change can reach its mirror after its address's: a claim the mirror has not seen yet keeps
    its address; one the API no longer has loses it. Each is read by name: never a list of every claim (at
    50,000 claims, a list held whole is hundreds of MiB)."""
    api = FakeKubeApi()
    api.add_pool("lan", LAN)
    api.allocations["old"] = _held("old", "10.10.3.9/24", "uid-deleted")
    reconciler = Reconciler(api, api, api, api, SAMPLE_DRIVER)
    tasks = await _followed(api, reconciler)
    try:
        api.add_claim(_pool_claim("new"))  # its ADDED event is still on its way
        held = _held("new", "10.10.3.8/24", "uid-new")
        api.allocations["new"] = held
        api.allocation_events.put_nowait(("ADDED", held))
        await asyncio.sleep(0.01)
        api.calls.clear()
        await reconciler.once()
        assert api.calls.count("get_claim") == 2 and "list_claims" not in api.calls
        assert list(api.allocations) == ["new"]  # the deleted claim's freed, the new claim's kept
    finally:
        for task in tasks:
            task.cancel()


async def test_until_the_mirrors_are_synced_a_pass_lists() -> None:
    api = FakeKubeApi()
    api.add_pool("lan", LAN)
    api.add_claim(_pool_claim("web"))
    reconciler = Reconciler(api, api, api, api, SAMPLE_DRIVER)
    await reconciler.once()
    assert {"list_claims", "list_ip_allocations"} <= set(api.calls)


async def test_a_released_address_is_quarantined_until_time_and_every_publishing_pass_have_followed() -> None:
    """Other tenants' allow rules and Services named the address: it is freed (and can go to another claim)
    only once `seconds` passed since it was found released and the Services' and policies' passes have
    each succeeded since; a controller whose passes fail frees nothing."""
    api = FakeKubeApi()
    api.add_pool("lan", LAN)
    api.allocations["old"] = _held("old", "10.10.3.9/24", "uid-deleted")
    now, followed = [100.0], [0.0]  # the clock; the last pass both publishing passes made
    woken: list[float] = []
    quarantine = Quarantine(lambda since: followed[0] >= since, 15.0, woken.append, clock=lambda: now[0])
    reconciler = Reconciler(api, api, api, api, SAMPLE_DRIVER, quarantine)
    await reconciler.once()
    held = api.allocations["old"]
    assert held.released_at.endswith("Z") and woken == [15.0]  # annotated, the passes asked for, once
    now[0] += 16.0
    await reconciler.once()
    assert "old" in api.allocations  # time is up, but the passes have not followed
    followed[0] = 101.0
    await reconciler.once()
    assert api.allocations == {} and woken == [15.0]
    assert api.calls.count("mark_released") == 1


async def test_an_address_whose_claim_comes_back_leaves_quarantine() -> None:
    api = FakeKubeApi()
    api.add_pool("lan", LAN)
    api.allocations["web"] = _held("web", "10.10.3.9/24", "uid-web")
    quarantine = Quarantine(lambda since: True, 15.0)
    reconciler = Reconciler(api, api, api, api, SAMPLE_DRIVER, quarantine)
    await reconciler.once()
    assert quarantine._since  # found released (the claim is not listed)
    api.add_claim(_pool_claim("web"))  # a claim the list had missed
    await reconciler.once()
    assert not quarantine._since and "web" in api.allocations


async def test_a_key_that_keeps_failing_backs_off_alone_doubling_to_its_most() -> None:
    now = [0.0]
    woken: list[float] = []
    backoff = KeyBackoff(lambda: woken.append(now[0]), clock=lambda: now[0])
    delays = [backoff.failed("team-a") for _ in range(12)]
    assert delays[:4] == [0.5, 1.0, 2.0, 4.0] and delays[-1] == KeyBackoff.MOST
    assert not backoff.due("team-a") and backoff.due("team-b")  # the others go on
    now[0] += KeyBackoff.MOST
    assert backoff.due("team-a")
    backoff.keep_only({"team-b"})  # team-a is gone: forgotten
    assert len(backoff) == 0
    backoff.failed("team-b")
    await asyncio.sleep(KeyBackoff.BASE + 0.2)
    assert woken  # its pass is woken when it is due


async def test_past_a_hundred_claims_to_read_by_name_a_pass_lists_them_once_instead() -> None:
    """A namespace deleted at once: 150 GETs would hold the pass; one list (in pages) costs less."""
    api = FakeKubeApi()
    api.add_pool("lan", LAN)
    for i in range(150):
        api.allocations[f"a{i}"] = _held(f"a{i}", f"10.10.3.{i + 10}/24", f"uid-gone-{i}")
    reconciler = Reconciler(api, api, api, api, SAMPLE_DRIVER)
    tasks = await _followed(api, reconciler)
    try:
        api.calls.clear()
        await reconciler.once()
        assert api.calls.count("list_claims") == 1 and "get_claim" not in api.calls
        assert api.allocations == {}  # every one of a claim that is gone: freed
    finally:
        for task in tasks:
            task.cancel()

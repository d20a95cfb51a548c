"""The status writer schedules each target (a claim, a pod) on its own: one that the API refuses, that
waits for the API or that hits a bug never holds up another; a target's own writes never overlap."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest

from netclaim.agent import status as status_module
from netclaim.agent.status import (
    MAX_BUG_ATTEMPTS,
    MAX_PARALLEL_WRITES,
    NETWORK_STATUS,
    ClaimRef,
    PodRef,
    StatusWriter,
    network_status,
)
from netclaim.agent.store import Interface, Outcome, State, Store
from netclaim.core.objects import Claim, Pod
from netclaim.errors import ApiForbiddenError, ApiRejectedError, ApiUnavailableError
from netclaim.runtime.backoff import Backoff
from netclaim.runtime.metrics import REGISTRY
from netclaim.runtime.supervisor import Supervisor
from tests.unit.fakes import SAMPLE_DRIVER, FakeKubeApi, sample_claim, sample_device, sample_row

SAFETY_NET = 10.0  # seconds: not a measurement, a bound on a writer that gave up


@dataclass
class _PerClaimApi(FakeKubeApi):
    """Claim writes that fail (`failing`: raised at each write of that claim) or wait (`gates`) per claim,
    counted: tries, writes under way per claim and in all, and the most of each seen."""

    failing: dict[str, Exception] = field(default_factory=dict)
    gates: dict[str, asyncio.Event] = field(default_factory=dict)
    tries: Counter[str] = field(default_factory=Counter)
    under_way: Counter[str] = field(default_factory=Counter)
    most_of_one: int = 0
    most_in_all: int = 0

    async def write_claim_devices(
        self, claim: Claim, driver: str, entries: list[dict[str, Any]]
    ) -> str | None:
        self.tries[claim.name] += 1
        self.under_way[claim.name] += 1
        self.most_of_one = max(self.most_of_one, self.under_way[claim.name])
        self.most_in_all = max(self.most_in_all, sum(self.under_way.values()))
        try:
            if claim.name in self.gates:
                await self.gates[claim.name].wait()
            if claim.name in self.failing:
                raise self.failing[claim.name]
            return await super().write_claim_devices(claim, driver, entries)
        finally:
            self.under_way[claim.name] -= 1

    def written(self, name: str) -> bool:
        return any(e["driver"] == SAMPLE_DRIVER for e in self.claims[("team-a", name)].devices_status)


async def _claim(api: _PerClaimApi, store: Store, name: str) -> ClaimRef:
    """A claim with one prepared device: its entry is to be written."""
    api.add_claim(sample_claim((), (), name=name, uid=f"uid-{name}"))
    await store.put(sample_row(claim_uid=f"uid-{name}", claim_name=name))
    return ClaimRef("team-a", name, f"uid-{name}")


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    opened = Store(tmp_path / "state")
    yield opened
    opened.close()


@pytest.fixture
def api() -> _PerClaimApi:
    return _PerClaimApi()


def _writes(result: str) -> float:
    return (
        REGISTRY.get_sample_value("netclaim_status_writes_total", {"kind": "claim", "result": result}) or 0.0
    )


@contextlib.asynccontextmanager
async def _writing(writer: StatusWriter) -> AsyncIterator[None]:
    """The writer at work in the background while the block runs."""
    running = asyncio.create_task(writer.run())
    try:
        yield
    finally:
        running.cancel()
        with pytest.raises(asyncio.CancelledError):
            await running


async def _until(condition: Callable[[], bool]) -> None:
    async def reached() -> None:
        while not condition():  # noqa: ASYNC110 - a condition on the fakes' state: polled
            await asyncio.sleep(0.001)

    await asyncio.wait_for(reached(), SAFETY_NET)


def _quick() -> Backoff:
    return Backoff(first=0.001, cap=0.001)


async def test_a_write_the_api_refuses_holds_up_no_other_claim_and_is_not_retried(
    api: _PerClaimApi, store: Store
) -> None:
    """17 addresses once made the API refuse a claim's status for good; the node's one status worker
    retried it for ever and no other claim on the node got Ready or PrepareFailed."""
    writer = StatusWriter(api, SAMPLE_DRIVER, store, Supervisor(), pods=api, retry=_quick)
    refused, good = await _claim(api, store, "refused"), await _claim(api, store, "good")
    api.failing["refused"] = ApiRejectedError("status.devices[0].networkData.ips: Too many: 17")
    before = _writes("rejected")
    writer.enqueue(refused)
    writer.enqueue(good)
    async with _writing(writer):
        await _until(lambda: api.written("good"))
        await asyncio.sleep(0.05)  # many backoffs of a millisecond: a retry would have come by now
        assert api.tries["refused"] == 1 and _writes("rejected") == before + 1
        assert list(writer._queued) == []  # not retried until it is enqueued again
        writer.enqueue(refused)  # e.g. the claim was unprepared: a new state to write
        await _until(lambda: api.tries["refused"] == 2)


async def test_a_write_forbidden_by_rbac_is_retried_slowly_then_given_up(
    api: _PerClaimApi, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A restarted API server denies every role while its RBAC caches fill (seen in CI): the Ready status
    of a pod attached meanwhile was never written. A 403 is now tried again, a bounded number of times."""
    monkeypatch.setattr(status_module, "REFUSED_FIRST_RETRY", 0.001)
    writer = StatusWriter(api, SAMPLE_DRIVER, store, Supervisor(), pods=api, retry=_quick)
    denied = await _claim(api, store, "denied")
    api.failing["denied"] = ApiForbiddenError(
        'clusterrole.rbac.authorization.k8s.io "netclaim-agent" not found'
    )
    before = _writes("refused")
    writer.enqueue(denied)
    async with _writing(writer):
        await _until(lambda: api.tries["denied"] == 3)
        del api.failing["denied"]  # the caches are filled
        await _until(lambda: api.written("denied"))
    assert _writes("refused") == before + 3
    never = await _claim(api, store, "never")
    api.failing["never"] = ApiForbiddenError("forbidden for good")
    writer.enqueue(never)
    async with _writing(writer):
        await _until(lambda: not writer._queued)  # given up after its retries: nothing is retried for ever
    assert api.tries["never"] == 1 + status_module.MAX_REFUSED_RETRIES


async def test_a_claim_waiting_for_the_api_holds_up_no_other(api: _PerClaimApi, store: Store) -> None:
    writer = StatusWriter(
        api, SAMPLE_DRIVER, store, Supervisor(), pods=api, retry=lambda: Backoff(first=600, cap=600)
    )
    waiting, good = await _claim(api, store, "waiting"), await _claim(api, store, "good")
    api.failing["waiting"] = ApiUnavailableError("503")
    writer.enqueue(waiting)
    async with _writing(writer):
        await _until(lambda: api.tries["waiting"] == 1)
        writer.enqueue(good)
        await _until(lambda: api.written("good"))  # at once, not after the other's 10 minutes
    assert api.tries["waiting"] == 1
    assert not writer._queued[waiting].writing  # still queued, waiting out its own backoff


async def test_a_claim_failing_on_a_bug_is_retried_then_given_up_while_others_are_written(
    api: _PerClaimApi, store: Store
) -> None:
    writer = StatusWriter(api, SAMPLE_DRIVER, store, Supervisor(), pods=api, retry=_quick)
    buggy, good = await _claim(api, store, "buggy"), await _claim(api, store, "good")
    api.failing["buggy"] = KeyError("a bug")
    before = _writes("given_up")
    writer.enqueue(buggy)
    writer.enqueue(good)
    async with _writing(writer):
        await _until(lambda: buggy not in writer._queued)
    assert api.tries["buggy"] == MAX_BUG_ATTEMPTS and _writes("given_up") == before + 1
    assert api.written("good")


async def test_a_claims_writes_never_overlap_and_one_queued_meanwhile_writes_the_latest_state(
    api: _PerClaimApi, store: Store
) -> None:
    writer = StatusWriter(api, SAMPLE_DRIVER, store, Supervisor(), pods=api, retry=_quick)
    claim = await _claim(api, store, "c")
    api.gates["c"] = asyncio.Event()
    writer.enqueue(claim)
    async with _writing(writer):
        await _until(lambda: api.tries["c"] == 1)
        [row] = store.for_claim("uid-c")
        interface = Interface(name="net1", mac="02:00:0a:5a:00:0a", mtu=1500, addresses=("10.90.0.10/24",))
        await store.put(row.with_state(State.ATTACHED, outcome=Outcome(interface=interface)))
        writer.enqueue(claim)  # attached while its first write is under way
        await asyncio.sleep(0.01)
        assert api.under_way["c"] == 1
        api.gates["c"].set()
        await _until(lambda: claim not in writer._queued)
    assert api.most_of_one == 1 and api.tries["c"] == 2
    [entry] = [e for e in api.claims[("team-a", "c")].devices_status if e["driver"] == SAMPLE_DRIVER]
    assert entry["conditions"][0]["reason"] == "InterfaceAttached"  # the later state, written last


async def test_a_few_claims_are_written_at_once(api: _PerClaimApi, store: Store) -> None:
    writer = StatusWriter(api, SAMPLE_DRIVER, store, Supervisor(), pods=api, retry=_quick)
    names = [f"c{n}" for n in range(MAX_PARALLEL_WRITES + 2)]
    gate = asyncio.Event()
    for name in names:
        api.gates[name] = gate
        writer.enqueue(await _claim(api, store, name))
    async with _writing(writer):
        await _until(lambda: sum(api.under_way.values()) == MAX_PARALLEL_WRITES)
        await asyncio.sleep(0.01)
        gate.set()
        await _until(lambda: all(api.written(n) for n in names))
    assert api.most_in_all == MAX_PARALLEL_WRITES


# a tenant's own network-status annotation, of any JSON shape

DEEP = "[" * 5000 + "]" * 5000
MULTUS_ENTRY = {"name": "default/flannel", "interface": "eth0", "ips": ["10.244.1.5"], "default": True}
ATTACHED = sample_row(sample_device("enp1s0")).with_state(
    State.ATTACHED,
    sandbox_id="sandbox-1",
    outcome=Outcome(
        interface=Interface(name="net1", mac="02:00:0a:5a:00:0a", mtu=1500, addresses=("10.90.0.10/24",))
    ),
)


def _pod(annotation: str) -> dict[str, Any]:
    return {
        "metadata": {
            "namespace": "team-a",
            "name": "pod-1",
            "uid": "pod-uid-1",
            "resourceVersion": "7",
            "annotations": {NETWORK_STATUS: annotation},
        },
        "spec": {"resourceClaims": [{"name": "fast-net", "resourceClaimTemplateName": "t"}]},
        "status": {"resourceClaimStatuses": [{"name": "fast-net", "resourceClaimName": "claim-1"}]},
    }


def _read(annotation: str) -> Pod:
    return Pod.from_api(_pod(annotation))


@pytest.mark.parametrize(
    ("annotation", "kept"),
    [
        (json.dumps([[1], {"name": {"a": 1}}, "x", MULTUS_ENTRY]), [MULTUS_ENTRY]),
        ('[{"name": "deep", "x": ' + DEEP + "}, " + json.dumps(MULTUS_ENTRY) + "]", [MULTUS_ENTRY]),
        (DEEP, []),
        ('{"name": "not a list"}', []),
        ("not json", []),
    ],
    ids=["entries-of-other-shapes", "a-deep-entry", "deep", "an-object", "not-json"],
)
async def test_a_network_status_of_any_shape_is_read_without_raising_and_ours_written(
    store: Store, annotation: str, kept: list[dict[str, Any]]
) -> None:
    """A tenant may write its own pod's annotation: before, an entry that was a list, or a name that was an
    object, raised in every try at it, and the node's one annotation worker retried it for ever."""
    assert [e["interface"] for e in network_status(_read(annotation), [ATTACHED])] == [
        *(e["interface"] for e in kept),
        "net1",
    ]
    api = FakeKubeApi()
    api.pod_objects[("team-a", "pod-1")] = _pod(annotation)
    await store.put(ATTACHED)
    await StatusWriter(api, SAMPLE_DRIVER, store, Supervisor(), pods=api).write(
        PodRef("team-a", "pod-1", "pod-uid-1")
    )
    written = json.loads(api.pod_objects[("team-a", "pod-1")]["metadata"]["annotations"][NETWORK_STATUS])
    assert written[:-1] == kept and written[-1]["name"] == "team-a/fast-net"


async def test_a_claim_prepared_then_attached_costs_one_write_and_no_read(
    api: _PerClaimApi, store: Store
) -> None:
    """Prepare read the claim: the writer keeps it, and the attach's write carries every entry at once
    (the WaitingForPodSandbox one is written only if the sandbox is late)."""
    claim = await _claim(api, store, "c1")
    writer = StatusWriter(api, SAMPLE_DRIVER, store, Supervisor(), pods=api, retry=_quick)
    writer.prepared(api.claims[("team-a", "c1")])
    async with _writing(writer):
        await asyncio.sleep(0.05)  # well within INTERIM_AFTER: nothing written yet
        assert api.calls == []
        interface = Interface(name="net1", mac="02:00:00:00:00:01", mtu=1500, addresses=("10.0.0.2/24",))
        row = sample_row(claim_uid="uid-c1", claim_name="c1")
        await store.put(row.with_state(State.ATTACHED, sandbox_id="s", outcome=Outcome(interface=interface)))
        writer.enqueue(claim)
        await _until(lambda: api.written("c1"))
    assert api.calls == ["write_claim_devices"]
    [entry] = api.claims[("team-a", "c1")].devices_status
    assert entry["conditions"][0]["reason"] == "InterfaceAttached"


async def test_a_sandbox_that_is_late_gets_the_waiting_entry_after_interim_after(
    api: _PerClaimApi, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(status_module, "INTERIM_AFTER", 0.01)
    await _claim(api, store, "c1")
    writer = StatusWriter(api, SAMPLE_DRIVER, store, Supervisor(), pods=api, retry=_quick)
    writer.prepared(api.claims[("team-a", "c1")])
    async with _writing(writer):
        await _until(lambda: api.written("c1"))
    [entry] = api.claims[("team-a", "c1")].devices_status
    assert entry["conditions"][0]["reason"] == "WaitingForPodSandbox"
    assert api.calls == ["write_claim_devices"]


async def test_a_claim_changed_by_another_writer_is_read_again_then_written(
    api: _PerClaimApi, store: Store
) -> None:
    """The kept resourceVersion is stale once another driver wrote its entry: the guarded write fails, the
    writer reads the claim and writes again, the other driver's entry kept."""
    claim = await _claim(api, store, "c1")
    writer = StatusWriter(api, SAMPLE_DRIVER, store, Supervisor(), pods=api, retry=_quick)
    kept = api.claims[("team-a", "c1")]
    writer.prepared(kept)
    theirs = {"driver": "gpu.example.com", "pool": "node-1", "device": "gpu-0", "conditions": []}
    api.add_claim(replace(kept, resource_version="7", devices_status=(theirs,)))
    writer.enqueue(claim)
    async with _writing(writer):
        await _until(lambda: api.written("c1"))
    assert api.calls == ["write_claim_devices", "get_claim", "write_claim_devices"]
    assert api.claims[("team-a", "c1")].devices_status[0] == theirs


async def test_an_unprepared_claim_is_forgotten_once_its_entries_are_gone(
    api: _PerClaimApi, store: Store
) -> None:
    claim = await _claim(api, store, "c1")
    writer = StatusWriter(api, SAMPLE_DRIVER, store, Supervisor(), pods=api, retry=_quick)
    writer.prepared(api.claims[("team-a", "c1")])
    await writer.write(claim)
    await store.delete(*store.for_claim("uid-c1"))
    writer.forget(claim)
    await writer.write(claim)
    assert not api.written("c1")
    api.calls.clear()
    await writer.write(claim)  # nothing kept: read again
    assert api.calls == ["get_claim"]

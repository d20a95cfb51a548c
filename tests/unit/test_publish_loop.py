"""The publish step, kept running as the agent keeps it: what wakes a comparison, what one pass publishes,
the retry after a failure.

No test waits on the clock: the settle time and the backoff are 0, every wait is for an event the code
under test causes, and every task is cancelled at the end (they run forever).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import pytest

from netclaim.agent.publish import loop
from netclaim.agent.publish.health import LinkHealth
from netclaim.agent.publish.inventory import NodeInventory, Sysfs
from netclaim.agent.publish.loop import PolicyFile, publish_pass, watch_inventory, watch_slices
from netclaim.agent.publish.publisher import SlicePublisher
from netclaim.core.devices.catalog import Device, DeviceCatalog
from netclaim.core.devices.nic import NetworkInterface
from netclaim.core.node import LinkChange
from netclaim.errors import ApiUnavailableError, ConfigError
from netclaim.runtime import backoff, metrics
from netclaim.runtime.supervisor import Supervisor
from netclaim.runtime.trigger import Trigger, periodic
from tests.unit.fakes import FakeInventory, FakeKubeApi, FakeNetlink

NODE, DRIVER = "node-a", "netclaim.dev"
T = TypeVar("T")


@pytest.fixture(autouse=True)
def no_waiting(monkeypatch: pytest.MonkeyPatch) -> None:
    """No settle time and no backoff delay: passes and retries follow each other at once."""
    monkeypatch.setattr(loop, "SETTLE_SECONDS", 0)
    monkeypatch.setattr(loop, "PASS_INTERVAL_SECONDS", 0)
    monkeypatch.setattr(backoff.Backoff.__init__, "__defaults__", (0.0, 0.0))


async def within(awaitable: Awaitable[T]) -> T:
    """Await what the code under test must cause; the timeout only turns a hang into a failure."""
    async with asyncio.timeout(10):
        return await awaitable


@pytest.fixture
async def tasks() -> AsyncIterator[list[asyncio.Task[Any]]]:
    """Tasks started by a test, cancelled (and awaited) when it ends."""
    started: list[asyncio.Task[Any]] = []
    yield started
    for task in started:
        task.cancel()
    for task in started:
        with pytest.raises(asyncio.CancelledError):
            await task


@pytest.fixture
async def supervisor() -> AsyncIterator[Supervisor]:
    """The agent's supervisor for the tasks a test keeps running, stopped when it ends."""
    keeper = Supervisor()
    yield keeper
    await keeper.stop()


PHYSICAL_NICS_SHARED = Path(tempfile.mkdtemp(prefix="netclaim-policy-")) / "policy.yaml"
PHYSICAL_NICS_SHARED.write_text(
    "apiVersion: netclaim.dev/v1alpha1\nkind: PublishPolicy\n"
    "rules:\n- {match: {attributes: {virtual: false}}, mode: shared}\n"
)


def keep_publishing(
    supervisor: Supervisor,
    source: FakeInventory,
    api: FakeKubeApi,
    trigger: Trigger,
    published: Published,
    catalog: DeviceCatalog | None = None,
    held_devices: Callable[[set[str]], list[Device]] = lambda _: [],
    link_health: LinkHealth | None = None,
) -> None:
    """The publish pass kept running, as the agent keeps it."""
    publisher = SlicePublisher(api, NODE, DRIVER)
    catalog = catalog or DeviceCatalog()
    work = partial(
        publish_pass,
        source,
        PolicyFile(PHYSICAL_NICS_SHARED),
        publisher,
        trigger,
        catalog,
        held_devices,
        published,
        link_health or LinkHealth(),
    )
    supervisor.keep("publish", work, on_error=metrics.PUBLISH_ERRORS.inc)


def start(tasks: list[asyncio.Task[Any]], coroutine: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
    task = asyncio.create_task(coroutine)
    tasks.append(task)
    return task


class CountingTrigger(Trigger):
    """A Trigger that also counts its fire() calls and lets a test await the next one."""

    def __init__(self) -> None:
        super().__init__()
        self.fired = 0
        self.fires: asyncio.Queue[int] = asyncio.Queue()

    def fire(self, compare: bool = True) -> None:
        super().fire(compare)
        self.fired += 1
        self.fires.put_nowait(self.fired)


def nic(name: str, index: int, **facts: object) -> NetworkInterface:
    base: dict[str, object] = {
        "kind": "physical",
        "mac": f"02:00:00:00:00:{index:02x}",
        "mtu": 1500,
        "up": True,
        "virtual": False,
        "speed_bps": 10 * 2**30,
    }
    base.update(facts)
    return NetworkInterface(name=name, index=index, **base)  # type: ignore[arg-type]


def held(name: str) -> Device:
    return Device(name=name, if_name=name, shared=False, attributes={"netclaim.dev/ifName": name})


def published_names(api: FakeKubeApi) -> list[list[str]]:
    """Each slice's device names, in slice order."""
    return [[d["name"] for d in api.slices[name]["spec"]["devices"]] for name in sorted(api.slices)]


async def yield_to_loop(times: int = 20) -> None:
    """Let every ready task run a few steps (a zero sleep is a yield, not a wait on the clock)."""
    for _ in range(times):
        await asyncio.sleep(0)


# --- Trigger -------------------------------------------------------------------------------------------


async def test_many_fires_before_a_wait_make_one_pass(tasks: list[asyncio.Task[Any]]) -> None:
    trigger = Trigger()
    passes: asyncio.Queue[int] = asyncio.Queue()

    async def consumer() -> None:
        count = 0
        while True:
            await trigger.wait()
            count += 1
            passes.put_nowait(count)

    for _ in range(50):
        trigger.fire()
    start(tasks, consumer())
    assert await within(passes.get()) == 1
    await yield_to_loop()
    assert passes.empty(), "fires before the pass must not cause a second one"
    trigger.fire()
    assert await within(passes.get()) == 2
    await yield_to_loop()
    assert passes.empty()


async def test_passes_are_spaced_while_fires_keep_coming(
    tasks: list[asyncio.Task[Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pods starting fire a link event each: a scan per event would keep the agent busy rescanning."""
    trigger = Trigger(interval=0.2)
    passes: asyncio.Queue[float] = asyncio.Queue()

    async def consumer() -> None:
        while True:
            await trigger.wait()
            passes.put_nowait(asyncio.get_running_loop().time())

    start(tasks, consumer())
    times = []
    for _ in range(3):
        trigger.fire()
        times.append(await within(passes.get()))
    assert [round(b - a, 2) >= 0.2 for a, b in itertools.pairwise(times)] == [True, True]


async def test_a_fire_during_a_pass_makes_another_pass(tasks: list[asyncio.Task[Any]]) -> None:
    trigger = Trigger()
    seen: asyncio.Queue[str] = asyncio.Queue()
    state = ["old"]

    async def consumer() -> None:
        while True:
            await trigger.wait()
            seen.put_nowait(state[0])
            if state[0] == "old":  # a change lands while this pass works on the old state
                state[0] = "new"
                trigger.fire()

    trigger.fire()
    start(tasks, consumer())
    assert await within(seen.get()) == "old"
    assert await within(seen.get()) == "new"


# --- publish_pass --------------------------------------------------------------------------------------


class Published:
    """on_published for the loop: counts the passes that published, and lets a test await the next."""

    def __init__(self) -> None:
        self.count = 0
        self.events: asyncio.Queue[int] = asyncio.Queue()

    def __call__(self) -> None:
        self.count += 1
        self.events.put_nowait(self.count)


async def test_a_pass_publishes_the_scanned_and_held_devices(supervisor: Supervisor) -> None:
    source = FakeInventory([nic("enp1s0", 2), nic("enp2s0", 3), nic("veth9", 9, virtual=True)])
    api = FakeKubeApi()
    catalog = DeviceCatalog()
    trigger = Trigger()
    published = Published()
    asked: list[set[str]] = []

    def held_devices(present: set[str]) -> list[Device]:
        asked.append(set(present))
        return [held("enp7s0")]

    keep_publishing(supervisor, source, api, trigger, published, catalog, held_devices)
    trigger.fire()
    assert await within(published.events.get()) == 1
    assert asked == [{"enp1s0", "enp2s0"}], "held devices are asked with the names present (no virtual NIC)"
    # the held device (no capacity) has a slice of its own (netclaim.core.devices.slices: Kubernetes 1.34)
    assert published_names(api) == [["enp1s0", "enp2s0"], ["enp7s0"]]
    for name in ("enp1s0", "enp2s0", "enp7s0"):
        assert catalog.get(name) is not None
    assert catalog.get("veth9") is None
    enp1s0 = catalog.get("enp1s0")
    assert (
        enp1s0 is not None and enp1s0.shared and enp1s0.attributes["netclaim.dev/mac"] == "02:00:00:00:00:02"
    )

    source.interfaces = [nic("enp1s0", 2)]  # enp2s0 went away: the next pass drops it everywhere
    trigger.fire()
    assert await within(published.events.get()) == 2
    assert source.scans == 2
    assert published_names(api) == [["enp1s0"], ["enp7s0"]]
    assert {body["spec"]["pool"]["generation"] for body in api.slices.values()} == {2}
    assert catalog.get("enp2s0") is None


async def test_a_nic_whose_link_goes_down_is_tainted_and_untainted_once_it_settles(
    supervisor: Supervisor,
) -> None:
    source = FakeInventory([nic("enp1s0", 2), nic("enp2s0", 3)])
    api = FakeKubeApi()
    trigger = Trigger()
    published = Published()
    keep_publishing(supervisor, source, api, trigger, published, link_health=LinkHealth(settle_seconds=0.05))
    trigger.fire()
    await within(published.events.get())

    def taints() -> dict[str, list[tuple[str, str]]]:
        [body] = api.slices.values()
        return {
            d["name"]: [(t["key"], t["effect"]) for t in d.get("taints", [])] for d in body["spec"]["devices"]
        }

    source.interfaces = [nic("enp1s0", 2, carrier=False, carrier_changes=1), nic("enp2s0", 3)]
    trigger.fire(compare=False)
    await within(published.events.get())
    assert taints() == {"enp1s0": [("netclaim.dev/link-down", "NoSchedule")], "enp2s0": []}
    [body] = api.slices.values()
    [down] = [d for d in body["spec"]["devices"] if d["name"] == "enp1s0"]
    assert down["capacity"]["netclaim.dev/bandwidth"]["value"] == "10Gi", "its bandwidth is unchanged"
    source.interfaces = [nic("enp1s0", 2, carrier_changes=2), nic("enp2s0", 3)]
    trigger.fire(compare=False)  # back: the pass that sees it keeps the taint, and looks again later
    await within(published.events.get())
    assert taints()["enp1s0"] == [("netclaim.dev/link-down", "NoSchedule")]
    while taints()["enp1s0"]:
        await within(published.events.get())
    [body] = api.slices.values()
    assert body["spec"]["pool"]["generation"] == 3, "two writes: the taint on, and off"


async def test_a_failed_publish_is_retried_until_it_succeeds(
    supervisor: Supervisor, caplog: pytest.LogCaptureFixture
) -> None:
    source = FakeInventory([nic("enp1s0", 2)])
    api = FakeKubeApi(fail_next=[ApiUnavailableError("ResourceSlices of node node-a: 503 busy")])
    trigger = Trigger()
    published = Published()
    errors_before = metrics.REGISTRY.get_sample_value("netclaim_publish_errors_total") or 0.0
    with caplog.at_level(logging.WARNING, logger="netclaim.runtime.supervisor"):
        keep_publishing(supervisor, source, api, trigger, published)
        trigger.fire()  # the only fire: the retry must not need another one
        assert await within(published.events.get()) == 1
    # the slices and the Node's UID are read at once: the Node's is read again when the list failed
    assert api.calls == [
        "list_slices",
        "node_uid",
        "list_slices",
        "node_uid",
        "apply_slice",
        "set_node_condition",
    ]
    assert source.scans == 2
    assert list(api.slices) == [f"{NODE}-{DRIVER}-0"]
    assert metrics.REGISTRY.get_sample_value("netclaim_publish_errors_total") == errors_before + 1
    [warning] = [r for r in caplog.records if r.name == "netclaim.runtime.supervisor"]
    assert warning.levelno == logging.WARNING and warning.getMessage().startswith("publish failed")
    await yield_to_loop()
    assert published.count == 1 and source.scans == 2, "after the success the loop waits for a fire"


async def test_a_change_on_the_node_that_leaves_the_devices_as_published_reads_no_slice(
    supervisor: Supervisor,
) -> None:
    """Every pod's veth is a link event: the pass scans, finds the devices it published, and leaves the API
    alone. A change of the devices, the slice watch and the resync still compare with the slices."""
    source = FakeInventory([nic("enp1s0", 2)])
    api = FakeKubeApi()
    trigger = Trigger()
    published = Published()
    keep_publishing(supervisor, source, api, trigger, published)
    trigger.fire()
    assert await within(published.events.get()) == 1
    api.calls.clear()
    source.interfaces = [nic("enp1s0", 2), nic("veth1", 7, virtual=True)]  # a pod's veth: not published
    trigger.fire(compare=False)
    assert await within(published.events.get()) == 2
    assert source.scans == 2 and api.calls == []
    source.interfaces = [nic("enp1s0", 2), nic("enp2s0", 3)]  # a NIC added: the devices changed
    trigger.fire(compare=False)
    assert await within(published.events.get()) == 3
    assert "apply_slice" in api.calls
    api.calls.clear()
    trigger.fire()  # the slice watch, the resync: compared whatever the devices
    assert await within(published.events.get()) == 4
    assert api.calls == ["list_slices"]


@pytest.mark.parametrize(
    "error",
    [ConfigError("inventory.yaml: expected a list of interfaces"), RuntimeError("a bug")],
    ids=["netclaim error", "bug"],
)
async def test_a_failed_scan_is_retried(
    supervisor: Supervisor, caplog: pytest.LogCaptureFixture, error: Exception
) -> None:
    source = FakeInventory([nic("enp1s0", 2)], fail_next=[error])
    api = FakeKubeApi()
    trigger = Trigger()
    published = Published()
    with caplog.at_level(logging.WARNING, logger="netclaim.runtime.supervisor"):
        keep_publishing(supervisor, source, api, trigger, published)
        trigger.fire()
        await within(published.events.get())
    assert source.scans == 2 and len(api.slices) == 1
    [record] = [r for r in caplog.records if r.name == "netclaim.runtime.supervisor"]
    assert (record.exc_info is not None) is isinstance(error, RuntimeError), "a traceback only for a bug"


# --- what fires the trigger ----------------------------------------------------------------------------


async def test_the_slice_watch_fires_on_connect_and_on_each_event(supervisor: Supervisor) -> None:
    api = FakeKubeApi()
    trigger = CountingTrigger()
    supervisor.keep("slice-watch", partial(watch_slices, api, NODE, DRIVER, trigger))
    assert await within(trigger.fires.get()) == 1  # connected
    await yield_to_loop()
    assert api.calls == ["slice_changes"] and trigger.fires.empty()
    for event in ("DELETED", "ADDED", "MODIFIED"):
        api.slice_events.put_nowait(event)
    assert [await within(trigger.fires.get()) for _ in range(3)] == [2, 3, 4]


async def test_the_slice_watch_fires_again_when_it_reconnects(supervisor: Supervisor) -> None:
    api = FakeKubeApi(fail_next=[ApiUnavailableError("watch of node node-a's ResourceSlices: 503")])
    trigger = CountingTrigger()
    supervisor.keep("slice-watch", partial(watch_slices, api, NODE, DRIVER, trigger))
    assert [await within(trigger.fires.get()) for _ in range(2)] == [1, 2]
    await yield_to_loop()
    assert api.calls == ["slice_changes", "slice_changes"] and trigger.fired == 2


async def test_slices_deleted_by_kubelet_are_published_again(supervisor: Supervisor) -> None:
    source = FakeInventory([nic("enp1s0", 2)])
    api = FakeKubeApi()
    trigger = Trigger()
    published = Published()
    keep_publishing(supervisor, source, api, trigger, published)
    supervisor.keep("slice-watch", partial(watch_slices, api, NODE, DRIVER, trigger))
    assert await within(published.events.get()) == 1  # the watch's connect fired the first pass
    api.slices.clear()  # kubelet restarted and removed the node's slices
    api.slice_events.put_nowait("DELETED")
    assert await within(published.events.get()) == 2
    assert list(api.slices) == [f"{NODE}-{DRIVER}-0"]


async def test_the_inventory_watch_fires_once_per_change(supervisor: Supervisor) -> None:
    source = FakeInventory()
    trigger = CountingTrigger()
    supervisor.keep("inventory-watch", partial(watch_inventory, source, trigger))
    for _ in range(3):
        source.change_events.put_nowait(None)
    assert [await within(trigger.fires.get()) for _ in range(3)] == [1, 2, 3]
    await yield_to_loop()
    assert trigger.fired == 3


async def test_netlink_events_of_the_node_inventory_fire_the_trigger(
    supervisor: Supervisor, tmp_path: Path
) -> None:
    netlink = FakeNetlink()
    trigger = CountingTrigger()
    supervisor.keep(
        "inventory-watch", partial(watch_inventory, NodeInventory(netlink, sysfs=Sysfs(tmp_path)), trigger)
    )
    netlink.batches.put_nowait(
        [LinkChange("RTM_NEWLINK", 5, name="eth5"), LinkChange("RTM_NEWADDR", 5, scope=0)]
    )
    assert await within(trigger.fires.get()) == 1
    assert netlink.subscriptions == ["open"]


async def test_the_periodic_resync_keeps_firing(tasks: list[asyncio.Task[Any]]) -> None:
    trigger = CountingTrigger()
    start(tasks, periodic(trigger, seconds=0))
    assert [await within(trigger.fires.get()) for _ in range(3)] == [1, 2, 3]

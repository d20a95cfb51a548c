"""The CNI 1.1 lifecycle around attach (configure.lifecycle): STATUS gates an ADD and says which plugin is not
ready; GC gets exactly the attachments the store holds for its network, never overlaps the network's ADDs,
and forgets a network once nothing of it is left. The real plugins' side is in tests/programs/test_cni_1_1.py.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from netclaim.agent.pods.lifecycle import NetworkGate, network_key
from netclaim.agent.store import Attachment, State
from netclaim.errors import AttachError, CniNotReadyError, PodBusyError
from tests.unit.fakes import (
    ConfigureRig,
    configure_rig,
    sample_claim,
    sample_conflist,
    sample_device,
    sample_row,
)

BUDGET = 30.0
LIFECYCLE = {**sample_conflist(), "cniVersion": "1.1.0"}


def _at_1_1(row: Attachment, conflist: dict[str, Any]) -> Attachment:
    return dataclasses.replace(row, plan=msgspec.structs.replace(row.plan, conflist=conflist))


ROW = _at_1_1(sample_row(sample_device("enp1s0")), LIFECYCLE)
OTHER = _at_1_1(
    sample_row(sample_device("enp2s0"), request="net2", interface_name="net2"),
    {**sample_conflist("storage", "enp2s0"), "cniVersion": "1.1.0"},
)


@pytest.fixture
def rig(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ConfigureRig]:
    built = configure_rig(tmp_path)
    built.api.add_claim(sample_claim((), ()))
    yield built
    built.store.close()


def _commands(rig: ConfigureRig) -> list[str]:
    return [call.command for call in rig.cni.calls]


async def test_a_plugin_not_ready_fails_the_attach_with_its_words_and_nothing_is_made(
    rig: ConfigureRig,
) -> None:
    await rig.store.put(ROW)
    rig.cni.fail_status = [CniNotReadyError("macvlan", "STATUS", 50, "master enp1s0 is gone")]
    with pytest.raises(AttachError, match="CNI STATUS macvlan: code 50: master enp1s0 is gone"):
        await rig.hooks.run_pod_sandbox(rig.sandbox(), BUDGET)
    assert _commands(rig) == ["STATUS"]  # no ADD, so nothing to undo
    stored = rig.store.get(ROW.key)
    assert stored is not None
    assert (stored.state, stored.sandbox_id) == (State.PREPARED, "")
    assert "master enp1s0 is gone" in stored.error
    assert rig.health == {"cni/macvlan": False}
    assert rig.api.events == []  # a TransientError: kubelet retries, the user is not blamed

    await rig.hooks.run_pod_sandbox(rig.sandbox(), BUDGET)  # kubelet's retry, the plugin ready again
    assert _commands(rig) == ["STATUS", "STATUS", "ADD"]
    assert rig.health == {"cni/macvlan": True, "cni/host-local": True}


async def test_a_chain_below_1_1_is_never_asked_for_status_or_remembered_for_gc(rig: ConfigureRig) -> None:
    row = sample_row(sample_device("enp1s0"))  # cniVersion 1.0.0
    await rig.store.put(row)
    await rig.hooks.run_pod_sandbox(rig.sandbox(), BUDGET)
    assert _commands(rig) == ["ADD"]
    assert rig.store.networks() == {}
    assert await rig.collector.collect() == {}


async def test_gc_gets_the_attachments_the_store_holds_for_that_network_only(rig: ConfigureRig) -> None:
    await rig.store.put(ROW, OTHER)
    await rig.hooks.run_pod_sandbox(rig.sandbox(), BUDGET)
    stale = ("sandbox-gone", "net1")
    rig.cni.leases[stale] = "10.90.0.99/24"  # an attachment whose DEL never came
    rig.cni.lease_networks[stale] = "lan"
    rig.cni.calls.clear()
    await rig.collector.collect()
    gcs = {call.network: call.valid for call in rig.cni.calls if call.command == "GC"}
    assert gcs == {"lan": (("sandbox-1", "net1"),), "storage": (("sandbox-1", "net2"),)}
    assert stale not in rig.cni.leases
    assert set(rig.cni.leases) == {("sandbox-1", "net1"), ("sandbox-1", "net2")}


async def test_a_network_with_nothing_left_is_forgotten_and_remembered_at_its_next_attach(
    rig: ConfigureRig,
) -> None:
    await rig.store.put(ROW)
    await rig.hooks.run_pod_sandbox(rig.sandbox(), BUDGET)
    assert list(rig.store.networks()) == [network_key(LIFECYCLE)]
    await rig.collector.collect()
    assert list(rig.store.networks()) == [network_key(LIFECYCLE)]  # an attachment is still there

    await rig.hooks.stop_pod_sandbox(rig.sandbox(), BUDGET)
    await rig.collector.collect()
    assert rig.store.networks() == {}

    await rig.hooks.run_pod_sandbox(rig.sandbox("sandbox-2"), BUDGET)
    assert list(rig.store.networks()) == [network_key(LIFECYCLE)]


async def test_one_network_failing_its_gc_does_not_stop_the_round(rig: ConfigureRig) -> None:
    await rig.store.put(ROW, OTHER)
    await rig.hooks.run_pod_sandbox(rig.sandbox(), BUDGET)
    real_gc = rig.cni.gc

    async def gc(conflist: dict[str, object], valid: list[tuple[str, str]], deadline: float) -> None:
        if conflist["name"] == "lan":
            raise RuntimeError("a bug in one network's GC")
        await real_gc(conflist, valid, deadline)

    rig.cni.gc = gc  # type: ignore[method-assign]
    assert list(await rig.collector.collect()) == ["storage"]


async def test_gc_waits_for_the_networks_adds_in_flight_and_holds_back_new_ones() -> None:
    gate, order = NetworkGate(), []
    release_add = asyncio.Event()

    async def add(name: str, wait: asyncio.Event | None) -> None:
        async with gate.adding("lan", deadline=time.monotonic() + 30):
            order.append(f"{name} starts")
            if wait is not None:
                await wait.wait()
            order.append(f"{name} ends")

    async def collect() -> None:
        async with gate.collecting("lan"):
            order.append("gc")

    first = asyncio.create_task(add("add-1", release_add))
    await asyncio.sleep(0)
    gc = asyncio.create_task(collect())
    await asyncio.sleep(0)
    second = asyncio.create_task(add("add-2", None))
    await asyncio.sleep(0)
    assert order == ["add-1 starts"]  # the GC waits for add-1; add-2 waits for the GC
    release_add.set()
    await asyncio.gather(first, gc, second)
    assert order == ["add-1 starts", "add-1 ends", "gc", "add-2 starts", "add-2 ends"]


async def test_an_add_waits_for_a_gc_no_longer_than_its_deadline() -> None:
    gate, held = NetworkGate(), asyncio.Event()

    async def collect() -> None:
        async with gate.collecting("lan"):
            await held.wait()

    gc = asyncio.create_task(collect())
    await asyncio.sleep(0)
    with pytest.raises(PodBusyError, match="CNI GC"):
        async with gate.adding("lan", deadline=time.monotonic() + 0.05):
            pass
    async with gate.adding("other", deadline=time.monotonic() + 0.05):
        pass  # another network's ADDs are not held
    held.set()
    await gc


async def test_a_new_sandbox_whose_plugin_is_not_ready_leaves_the_old_attachment_as_it_is(
    rig: ConfigureRig,
) -> None:
    """kubelet replacing a pod's sandbox while the network's IPAM plugin is gone: nothing is DEL'ed (that
    would fail too) until STATUS says ready; then the old sandbox's attachment is undone and the new made."""
    await rig.store.put(ROW)
    await rig.hooks.run_pod_sandbox(rig.sandbox("sandbox-1"), BUDGET)
    rig.cni.fail_status = [CniNotReadyError("macvlan", "STATUS", 999, 'failed to find plugin "host-local"')]
    with pytest.raises(AttachError, match='failed to find plugin "host-local"'):
        await rig.hooks.run_pod_sandbox(rig.sandbox("sandbox-2"), BUDGET)
    assert _commands(rig) == ["STATUS", "ADD", "STATUS"]
    stored = rig.store.get(ROW.key)
    assert stored is not None and (stored.state, stored.sandbox_id) == (State.ATTACHED, "sandbox-1")
    await rig.hooks.run_pod_sandbox(rig.sandbox("sandbox-2"), BUDGET)
    assert _commands(rig) == ["STATUS", "ADD", "STATUS", "STATUS", "DEL", "ADD"]
    stored = rig.store.get(ROW.key)
    assert stored is not None and (stored.state, stored.sandbox_id) == (State.ATTACHED, "sandbox-2")

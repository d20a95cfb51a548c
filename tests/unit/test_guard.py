"""Port security's decisions (netclaim.agent.pods.guard, the plan's guarded children): which rows bind which
child, what the NIC's table holds, and when the table and hairpin are written (the kernel's side:
tests/test_port_guard_kernel.py)."""

from __future__ import annotations

import gc
from dataclasses import replace
from pathlib import Path
from typing import Any

import msgspec
import pytest

from netclaim.agent.pods.guard import (
    Binding,
    binding_of,
    elements,
    elements_of,
    guarded_nic,
    link_local,
    skeleton,
)
from netclaim.agent.store import Interface, Outcome, State, Store
from netclaim.core.devices.catalog import PORT_SECURITY
from netclaim.core.node import BROADCAST, CHILDREN
from netclaim.core.objects import AllocatedDevice
from netclaim.core.plan import child_mac, guarded_child
from netclaim.errors import KernelError
from tests.unit.fakes import Recorder, recorded_guard, sample_device, sample_row

MAC = "02:00:00:00:00:0a"


def test_a_guarded_child_is_vepa_with_a_mac_known_before_it_exists() -> None:
    allocated = AllocatedDevice("net", "netclaim.dev", "node-1", "dev-enp1s0", "share-1", {})
    mac = child_mac("claim-uid-1", allocated)
    assert mac == child_mac("claim-uid-1", allocated) != child_mac("claim-uid-2", allocated)  # stable
    assert int(mac[:2], 16) & 0x03 == 0x02  # locally administered, unicast
    plugin = {"type": "macvlan", "master": "enp1s0", "mode": "bridge"}
    assert guarded_child(plugin, mac) == {**plugin, "mode": "vepa", "mac": mac}
    assert guarded_child({**plugin, "mode": "private", "mac": MAC}, mac)["mode"] == "private"
    assert guarded_child({**plugin, "mac": MAC}, mac)["mac"] == MAC  # the config's own MAC is kept


def test_the_link_local_address_is_the_kernels_eui64() -> None:
    assert link_local("52:54:00:12:34:56") == "fe80::5054:ff:fe12:3456"


def _row(**plugin: Any) -> Any:
    device = sample_device("enp1s0")
    row = sample_row(device)
    macvlan = {**row.plan.conflist["plugins"][0], **plugin}
    plan = msgspec.structs.replace(row.plan, conflist={**row.plan.conflist, "plugins": [macvlan]})
    return replace(row, plan=plan)


def test_a_rows_child_is_bound_to_its_planned_mac_and_addresses_then_to_what_it_has() -> None:
    static = {"type": "static", "addresses": [{"address": "10.3.0.7/24"}, {"address": "fd03::7/64"}]}
    planned = _row(mac=MAC, ipam=static)
    assert guarded_nic(planned) == "enp1s0"
    assert binding_of(planned) == Binding(MAC, ("10.3.0.7", "fd03::7", "fe80::ff:fe00:a"))
    interface = Interface(
        name="net1", mac=MAC, mtu=1500, addresses=("10.90.0.9/24",)
    )  # a tenant's host-local: told by the ADD
    attached = planned.with_state(State.ATTACHED, outcome=Outcome(interface=interface))
    assert binding_of(attached) == Binding(MAC, ("10.3.0.7", "10.90.0.9", "fd03::7", "fe80::ff:fe00:a"))
    assert binding_of(_row()) is None  # planned before netclaim chose MACs: bound once attached


def test_an_exclusive_nic_and_a_nic_without_port_security_are_not_guarded() -> None:
    exclusive = sample_row(sample_device("enp2s0", shared=False))
    assert guarded_nic(exclusive) is None
    opted_out = sample_device("enp3s0")
    opted_out.attributes[PORT_SECURITY] = False
    assert guarded_nic(sample_row(opted_out)) is None


def test_the_table_is_ours_and_what_pods_bring_goes_in_as_data() -> None:
    """The table's text holds netclaim's constants and the NIC's checked name; MACs and addresses are JSON
    set elements, each typed as its set is."""
    text = skeleton("enp1s0")
    assert 'device "enp1s0"' in text and "02:" not in text and "10." not in text.replace("0.0.0.0", "")
    with pytest.raises(ValueError, match="not a usable interface name"):
        skeleton('enp1s0" ; flush ruleset')
    made = elements_of(Binding(MAC, ("10.3.0.7", "fd03::7")))
    assert made == {
        ("macs", MAC),
        ("pairs", (MAC, MAC)),
        ("v4", (MAC, "10.3.0.7")),
        ("v6", (MAC, "fd03::7")),
        ("nd", (MAC, "0xfd030000000000000000000000000007")),  # the advertisement target it may claim
    }
    batch = elements("enp1s0", "delete", made)["nftables"]
    assert [c["delete"]["element"]["name"] for c in batch] == ["macs", "nd", "pairs", "v4", "v6"]
    assert batch[3]["delete"]["element"]["elem"] == [{"concat": [MAC, "10.3.0.7"]}]


async def test_a_nics_table_is_made_once_then_only_what_changes_is_written(tmp_path: Path) -> None:
    store, recorder = Store(tmp_path), Recorder()
    guard = recorded_guard(store, recorder)
    first = _row(mac=MAC)
    await store.put(first)
    await guard.follow(["enp1s0"])  # prepare: the row stored, its child not made yet
    assert recorder.made == ["netclaim-enp1s0"] and recorder.macs("netclaim-enp1s0") == {MAC}
    assert ("host", "52:54:00:12:34:56") in recorder.sets["netclaim-enp1s0"]
    assert recorder.hairpins.macs("enp1s0") == {MAC} and BROADCAST in recorder.hairpins.filters["enp1s0"]
    writes = (recorder.batches, recorder.hairpins.batches)
    await guard.follow(["enp1s0"])
    assert (recorder.batches, recorder.hairpins.batches) == writes  # unchanged: nothing written
    assert guard.covers(first)

    second = _row(mac="02:00:00:00:00:0b")
    second = replace(second, claim_uid="claim-uid-2", pod_uid="pod-uid-2")
    await store.put(second)
    await guard.follow(["enp1s0"])
    assert recorder.made == ["netclaim-enp1s0"]  # not made again: one batch of elements, one of tc
    assert (recorder.batches, recorder.hairpins.batches) == (writes[0] + 1, writes[1] + 1)
    assert recorder.macs("netclaim-enp1s0") == recorder.hairpins.macs("enp1s0") == {MAC, "02:00:00:00:00:0b"}

    interface = Interface(name="net1", mac=MAC, mtu=1500, addresses=("10.90.0.9/24",))
    attached = first.with_state(State.ATTACHED, outcome=Outcome(interface=interface))
    assert not guard.covers(attached)  # its ADD told an address prepare could not know
    await store.put(attached)
    hairpin_batches = recorder.hairpins.batches
    await guard.follow(["enp1s0"])
    assert ("v4", (MAC, "10.90.0.9")) in recorder.sets["netclaim-enp1s0"] and guard.covers(attached)
    assert recorder.hairpins.batches == hairpin_batches  # a new address alone: no tc

    await store.delete(attached, second)
    await guard.follow(["enp1s0"])
    assert recorder.macs("netclaim-enp1s0") == set() and recorder.hairpins.filters["enp1s0"] == {}
    store.close()


async def test_after_a_restart_every_nic_is_made_again_and_an_old_table_of_a_gone_nic_goes(
    tmp_path: Path,
) -> None:
    store, recorder = Store(tmp_path), Recorder(old=["netclaim-enp9s0", "netclaim-gone0"])
    recorder.hairpins.filters["enp1s0"] = {BROADCAST: "*", CHILDREN[0]: "02:00:00:00:00:99"}  # left
    await store.put(_row(mac=MAC))
    await recorded_guard(store, recorder).start()
    assert sorted(recorder.made) == ["netclaim-enp1s0", "netclaim-enp9s0"]  # whatever an agent before wrote
    assert "netclaim-gone0" not in recorder.sets  # its NIC is gone: deleted
    assert recorder.macs("netclaim-enp1s0") == {MAC} and recorder.macs("netclaim-enp9s0") == set()
    assert recorder.hairpins.filters["enp1s0"] == {
        BROADCAST: "*",
        CHILDREN[1]: MAC,
    }  # made before break


def _static(mac: str, address: str, **row: str) -> Any:
    planned = _row(mac=mac, ipam={"type": "static", "addresses": [{"address": f"{address}/24"}]})
    return replace(planned, **row)


async def test_a_pods_children_on_one_nic_may_send_as_each_other_never_as_another_pod(tmp_path: Path) -> None:
    """Two interfaces of one pod in one subnet: the kernel answers ARP and replies from either (ARP flux);
    that is the pod's own business. Another pod's addresses stay another's."""
    store = Store(tmp_path)
    await store.put(
        _static("02:00:00:00:00:01", "10.3.0.1"),
        _static("02:00:00:00:00:02", "10.3.0.2", claim_uid="claim-uid-2"),
        _static("02:00:00:00:00:03", "10.3.0.3", claim_uid="claim-uid-3", pod_uid="pod-uid-3"),
    )
    bound = {b.mac: set(b.addresses) for b in recorded_guard(store, Recorder())._wanted("enp1s0")}
    first, second, other = (bound[f"02:00:00:00:00:0{i}"] for i in (1, 2, 3))
    assert first == second and {"10.3.0.1", "10.3.0.2"} <= first and "10.3.0.3" not in first
    assert "10.3.0.1" not in other
    store.close()


async def test_a_write_cut_short_leaves_the_next_follow_to_make_the_nic_whole_again(tmp_path: Path) -> None:
    """nft's transaction went in, tc's batch failed: what the kernel holds is not what the guard thought,
    so the next change does not diff against it (deleting elements already gone would fail forever)."""
    store, recorder = Store(tmp_path), Recorder()
    guard = recorded_guard(store, recorder)
    await store.put(_row(mac=MAC))
    await guard.follow(["enp1s0"])
    second = replace(_row(mac="02:00:00:00:00:0b"), claim_uid="claim-uid-2", pod_uid="pod-uid-2")
    await store.put(second)
    healthy = recorder.hairpins.change

    async def refused(*args: Any, **kwargs: Any) -> None:
        raise KernelError("tc -batch -: exit 2: RTNETLINK answers: No space left on device")

    recorder.hairpins.change = refused  # type: ignore[method-assign]
    with pytest.raises(KernelError):
        await guard.follow(["enp1s0"])
    assert not guard.covers(second)
    recorder.hairpins.change = healthy  # type: ignore[method-assign]
    await store.delete(second)
    await guard.follow(["enp1s0"])
    assert recorder.made == ["netclaim-enp1s0", "netclaim-enp1s0"]  # made again, whole
    assert recorder.macs("netclaim-enp1s0") == recorder.hairpins.macs("enp1s0") == {MAC}
    store.close()


async def test_what_the_guard_works_out_for_a_child_goes_with_the_child(tmp_path: Path) -> None:
    """Each pass over a NIC reuses the bindings and set elements of its children worked out before, and
    keeps none of the children gone: a node's pods come and go by the thousand (caches by value kept 4,096
    of each)."""
    store, recorder = Store(tmp_path), Recorder()
    guard = recorded_guard(store, recorder)

    async def a_round(number: int) -> None:
        rows = []
        for i in range(200):
            mac = f"02:5e:ed:{number:02x}:{i >> 8:02x}:{i & 0xFF:02x}"  # this test's own
            interface = Interface(
                name="net1", mac=mac, mtu=1500, addresses=(f"10.{number}.{i >> 8}.{i & 0xFF}/16",)
            )
            row = _row(mac=mac).with_state(State.ATTACHED, outcome=Outcome(interface=interface))
            rows.append(replace(row, claim_uid=f"claim-{number}-{i}", pod_uid=f"pod-{number}-{i}"))
        await store.put(*rows)
        await guard.follow(["enp1s0"])
        assert len(recorder.macs("netclaim-enp1s0")) == 200 and all(map(guard.covers, rows))
        await store.delete(*rows)
        await guard.follow(["enp1s0"])
        assert recorder.macs("netclaim-enp1s0") == set()

    await a_round(1)
    await a_round(2)
    store.close()
    gc.collect()  # what only a cycle still holds is gone too
    alive = [  # a Binding is tracked by gc; these children's only (other tests' may still be about)
        o for o in gc.get_objects() if isinstance(o, Binding) and o.mac.startswith("02:5e:ed:")
    ]
    assert alive == [], f"{len(alive)} children's bindings kept after they went"

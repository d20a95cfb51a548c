"""Carrying out a stored plan in a pod's namespace, rolling it back when it fails, and undoing it."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from netclaim.agent.pods import guard as guard_module
from netclaim.agent.pods.attach import PodLocks
from netclaim.agent.store import Attachment, Interface, Outcome, State
from netclaim.core.node import InterfaceState, Invocation, PodSandbox, cni_args
from netclaim.errors import AttachError, CniError, KernelError, PodBusyError
from tests.unit.fakes import ConfigureRig, Recorder, configure_rig, recorded_guard, sample_device, sample_row

EXCLUSIVE_NIC = sample_device("enp7s0", shared=False, mtu=9000, mac="52:54:00:00:07:00")


@pytest.fixture
def rig(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ConfigureRig]:
    built = configure_rig(tmp_path)
    yield built
    built.store.close()


def _later(seconds: float = 5.0) -> float:
    return time.monotonic() + seconds


async def _attached(rig: ConfigureRig, row: Attachment, sandbox: PodSandbox) -> Attachment:
    await rig.store.put(row)
    return await rig.attacher.attach(row, sandbox, _later())


async def test_attach_records_attaching_during_add_then_attached_with_what_add_did(rig: ConfigureRig) -> None:
    row = sample_row()
    await rig.store.put(row)
    sandbox = rig.sandbox()
    rig.cni.gate = asyncio.Event()
    attaching = asyncio.create_task(rig.attacher.attach(row, sandbox, _later()))
    await rig.cni.adding.wait()
    args = cni_args("team-a", "pod-1", "sandbox-1", "pod-uid-1")
    # a crash now must leave a row that says an ADD may be half done, and with which CNI_ARGS
    assert rig.store.get(row.key) == row.with_state(
        State.ATTACHING, sandbox_id="sandbox-1", netns=sandbox.netns, outcome=Outcome(cni_args=args)
    )
    rig.cni.gate.set()
    attached = await attaching
    assert rig.cni.calls[0].invocation == Invocation("sandbox-1", sandbox.netns, "net1", args)
    assert attached.state == State.ATTACHED
    assert attached.outcome == Outcome(
        cni_args=args,
        cni_result={
            "cniVersion": "1.0.0",
            "interfaces": [{"name": "net1", "mac": "02:00:0a:5a:00:0a", "sandbox": sandbox.netns}],
            "ips": [{"address": "10.90.0.10/24", "interface": 0}],
        },
        interface=Interface(name="net1", mac="02:00:0a:5a:00:0a", mtu=1500, addresses=("10.90.0.10/24",)),
    )
    assert rig.store.get(row.key) == attached


async def test_attach_into_the_same_sandbox_again_changes_nothing(rig: ConfigureRig) -> None:
    sandbox = rig.sandbox()
    attached = await _attached(rig, sample_row(), sandbox)
    assert await rig.attacher.attach(attached, sandbox, _later()) == attached
    assert [c.command for c in rig.cni.calls] == ["ADD"]


async def test_attach_into_a_new_sandbox_deletes_the_old_attachment_first(rig: ConfigureRig) -> None:
    old = rig.sandbox("sandbox-1")
    attached = await _attached(rig, sample_row(), old)
    new = rig.sandbox("sandbox-2")
    again = await rig.attacher.attach(attached, new, _later())
    assert rig.cni.commands() == [
        ("ADD", "sandbox-1", old.netns),
        ("DEL", "sandbox-1", old.netns),
        ("ADD", "sandbox-2", new.netns),
    ]
    assert rig.cni.calls[1].prev_result == attached.outcome.cni_result
    assert list(rig.cni.leases) == [("sandbox-2", "net1")]  # the old sandbox's address was released
    assert (again.state, again.sandbox_id) == (State.ATTACHED, "sandbox-2")


async def test_attach_redoes_an_attachment_whose_interface_is_gone(rig: ConfigureRig) -> None:
    sandbox = rig.sandbox()
    attached = await _attached(rig, sample_row(), sandbox)
    del rig.netlink.interfaces[(sandbox.netns, "net1")]
    await rig.attacher.attach(attached, sandbox, _later())
    assert [c.command for c in rig.cni.calls] == ["ADD", "DEL", "ADD"]
    assert (sandbox.netns, "net1") in rig.netlink.interfaces


@pytest.mark.parametrize("bandwidth_bps", [None, 300_000_000])
async def test_the_interface_is_shaped_only_when_the_plan_has_a_bandwidth(
    rig: ConfigureRig, bandwidth_bps: int | None
) -> None:
    sandbox = rig.sandbox()
    await _attached(rig, sample_row(bandwidth_bps=bandwidth_bps), sandbox)
    expected = [("net1", bandwidth_bps, sandbox.netns)] if bandwidth_bps else []
    assert rig.netlink.shaped == expected


@pytest.mark.parametrize(
    ("failure", "cause"),
    [
        (
            CniError("macvlan", "ADD", 7, "master enp1s0 is down"),
            "CNI ADD macvlan: code 7: master enp1s0 is down",
        ),
        (KernelError("no interface net1"), "no interface net1"),
        (RuntimeError("a bug in the plugin runner"), "a bug in the plugin runner"),
    ],
    ids=["cni", "kernel-on-shaping", "bug"],
)
async def test_a_failed_add_is_rolled_back_and_the_row_is_prepared_again_with_the_error(
    rig: ConfigureRig, failure: Exception, cause: str
) -> None:
    row = sample_row(bandwidth_bps=100_000_000)
    await rig.store.put(row)
    sandbox = rig.sandbox()
    if isinstance(failure, KernelError):
        rig.netlink.fail_shape.append(failure)  # after a successful ADD: shaping is part of attaching
    else:
        rig.cni.fail_add.append(failure)
    with pytest.raises(AttachError) as raised:
        await rig.attacher.attach(row, sandbox, _later())
    message = f"claim team-a/claim-1 device {row.device}: {cause}"
    assert str(raised.value) == message
    assert raised.value.__cause__ is failure
    add, rollback = rig.cni.calls
    assert rollback.command == "DEL"
    assert rollback.invocation == add.invocation  # same container ID, netns, ifName and CNI_ARGS
    assert rig.cni.leases == {}
    assert (sandbox.netns, "net1") not in rig.netlink.interfaces
    assert rig.store.get(row.key) == row.with_state(State.PREPARED, error=message)


async def test_an_add_that_leaves_no_interface_is_a_failure(rig: ConfigureRig) -> None:
    row = sample_row()
    await rig.store.put(row)
    rig.cni.create_interface = False
    with pytest.raises(AttachError, match="CNI ADD succeeded but net1 is not in the pod's namespace"):
        await rig.attacher.attach(row, rig.sandbox(), _later())
    assert [c.command for c in rig.cni.calls] == ["ADD", "DEL"]
    stored = rig.store.get(row.key)
    assert stored is not None and stored.state == State.PREPARED


async def test_a_rollback_out_of_time_leaves_attaching_and_is_finished_under_the_pods_lock(
    rig: ConfigureRig,
) -> None:
    row = sample_row()
    await rig.store.put(row)
    sandbox = rig.sandbox()
    rig.cni.fail_add.append(CniError.of("macvlan", "ADD", 11, "timed out"))
    rig.cni.fail_delete.append(CniError.of("macvlan", "DEL", 11, "no time left"))
    async with rig.locks(row.pod_uid):  # as RunPodSandbox holds it
        with pytest.raises(AttachError):
            await rig.attacher.attach(row, sandbox, _later())
        stored = rig.store.get(row.key)
        assert stored is not None
        assert (stored.state, stored.sandbox_id) == (State.ATTACHING, "sandbox-1")
        assert "timed out" in stored.error
        assert rig.cni.leases  # the address is still reserved: nothing has released it yet
    await rig.settle()
    assert [c.command for c in rig.cni.calls] == ["ADD", "DEL", "DEL"]
    assert rig.cni.leases == {}
    stored = rig.store.get(row.key)
    assert stored is not None and stored.state == State.DETACHED


async def test_an_undo_in_flight_when_the_agent_stops_is_finished_not_cut_short(rig: ConfigureRig) -> None:
    """Supervisor.stop cancelled every one-shot job at once: a DEL undoing an ADD out of time was cut
    short, and the row left `attaching` for the next agent to undo under a sandbox that may run by then.
    The agent now gives such jobs what is left of its settling time."""
    row = sample_row()
    await rig.store.put(row)
    rig.cni.fail_add.append(CniError.of("macvlan", "ADD", 11, "timed out"))
    rig.cni.fail_delete.append(CniError.of("macvlan", "DEL", 11, "no time left"))
    async with rig.locks(row.pod_uid):
        with pytest.raises(AttachError):
            await rig.attacher.attach(row, rig.sandbox(), _later())
        rig.cni.delete_gate, rig.cni.deleting = asyncio.Event(), asyncio.Event()  # a slow DEL, from now
    await rig.cni.deleting.wait()  # the undo is at work
    stopping = asyncio.create_task(rig.background.stop(grace=5.0))
    await asyncio.sleep(0.01)
    rig.cni.delete_gate.set()
    await stopping
    stored = rig.store.get(row.key)
    assert stored is not None and stored.state == State.DETACHED
    assert rig.cni.leases == {}


async def test_detach_deletes_with_the_add_result_removes_the_ifb_and_is_safe_to_repeat(
    rig: ConfigureRig,
) -> None:
    sandbox = rig.sandbox()
    attached = await _attached(rig, sample_row(bandwidth_bps=100_000_000), sandbox)
    detached = await rig.attacher.detach(attached, _later())
    delete = rig.cni.calls[-1]
    assert delete.command == "DEL"
    assert delete.invocation == rig.cni.calls[0].invocation
    assert delete.prev_result == attached.outcome.cni_result
    assert rig.netlink.removed_ifbs == [("net1", sandbox.netns)]
    assert rig.cni.leases == {}
    assert detached == attached.with_state(State.DETACHED, netns="", outcome=Outcome())
    assert rig.store.get(attached.key) == detached
    assert await rig.attacher.detach(detached, _later()) == detached
    assert await rig.attacher.detach(sample_row(), _later()) == sample_row()  # prepared: nothing added
    assert [c.command for c in rig.cni.calls] == ["ADD", "DEL"]


async def test_detach_after_the_sandbox_is_gone_still_releases_the_address(rig: ConfigureRig) -> None:
    sandbox = rig.sandbox()
    attached = await _attached(rig, sample_row(), sandbox)
    rig.netlink.remove_namespace(sandbox.netns)
    await rig.attacher.detach(attached, _later())
    assert rig.cni.commands()[-1] == ("DEL", "sandbox-1", "")
    assert rig.cni.calls[-1].invocation.args == attached.outcome.cni_args
    assert rig.netlink.removed_ifbs == []
    assert rig.cni.leases == {}


async def test_a_failed_detach_keeps_the_row_so_it_is_tried_again(rig: ConfigureRig) -> None:
    attached = await _attached(rig, sample_row(), rig.sandbox())
    rig.cni.fail_delete.append(CniError("macvlan", "DEL", 999, "plugin crashed"))
    with pytest.raises(CniError):
        await rig.attacher.detach(attached, _later())
    assert rig.store.get(attached.key) == attached
    await rig.attacher.detach(attached, _later())
    assert rig.cni.leases == {}


@pytest.mark.parametrize(
    ("on_node", "restored"),
    [
        (InterfaceState("enp7s0", 2, "02:11:22:33:44:55", 1500, ()), [("enp7s0", 9000, "52:54:00:00:07:00")]),
        (InterfaceState("enp7s0", 2, "52:54:00:00:07:00", 9000, ()), []),
        (
            InterfaceState("enp7s0", 2, "52:54:00:00:07:00", 9000, (), promisc=True),
            [("enp7s0", 9000, "52:54:00:00:07:00")],
        ),
        (None, []),
    ],
    ids=["changed", "as-published", "left-promiscuous", "not-back-yet"],
)
async def test_an_exclusive_nic_is_restored_to_its_published_mtu_and_mac(
    rig: ConfigureRig, on_node: InterfaceState | None, restored: list[tuple[str, int, str]]
) -> None:
    attached = await _attached(rig, sample_row(EXCLUSIVE_NIC), rig.sandbox())
    if on_node is not None:
        rig.netlink.interfaces[(None, "enp7s0")] = on_node
    await rig.attacher.detach(attached, _later())
    assert rig.netlink.links_set == restored
    assert rig.netlink.addresses_given[-1] == ()  # its MTU, MAC and flags: not the node's address dump
    if restored:
        back = rig.netlink.interfaces[(None, "enp7s0")]
        assert (back.mtu, back.promisc, back.allmulti) == (9000, False, False)


async def test_a_rolled_back_exclusive_nic_is_restored_too(rig: ConfigureRig) -> None:
    row = sample_row(EXCLUSIVE_NIC)
    await rig.store.put(row)
    rig.netlink.add_host_nic(EXCLUSIVE_NIC, mtu=1500, mac="02:11:22:33:44:55")
    rig.cni.fail_add.append(CniError("host-device", "ADD", 4, "failed"))
    with pytest.raises(AttachError):
        await rig.attacher.attach(row, rig.sandbox(), _later())
    assert rig.netlink.links_set == [("enp7s0", 9000, "52:54:00:00:07:00")]


async def test_a_shared_nic_is_never_reconfigured(rig: ConfigureRig) -> None:
    device = sample_device("enp1s0", mtu=9000)
    rig.netlink.add_host_nic(device, mtu=1500, mac="02:11:22:33:44:55")  # not ours to change
    attached = await _attached(rig, sample_row(device), rig.sandbox())
    await rig.attacher.detach(attached, _later())
    assert rig.netlink.links_set == []


async def test_release_detaches_and_forgets_every_row_of_the_claim(rig: ConfigureRig) -> None:
    sandbox = rig.sandbox()
    attached = await _attached(rig, sample_row(sample_device("enp1s0")), sandbox)
    prepared = sample_row(sample_device("enp2s0"), request="net2", interface_name="net2")
    await rig.store.put(prepared)
    await rig.attacher.release([attached, prepared], _later())
    assert [c.command for c in rig.cni.calls] == ["ADD", "DEL"]  # the prepared one had nothing to undo
    assert rig.store.all() == []
    assert len(rig.locks) == 0
    await rig.attacher.release([attached, prepared], _later())  # kubelet asks again: nothing left to do
    assert [c.command for c in rig.cni.calls] == ["ADD", "DEL"]


async def test_a_pods_lock_not_free_before_the_deadline_is_pod_busy() -> None:
    locks = PodLocks()
    async with locks("pod-a"):
        with pytest.raises(PodBusyError, match="nothing was changed"):
            async with locks("pod-a", time.monotonic()):
                pytest.fail("entered without the lock")
        assert locks.locked("pod-a")  # still the first holder's
    with pytest.raises(KernelError):
        async with locks("pod-a", _later()):
            assert locks.locked("pod-a")
            raise KernelError("inside")
    assert not locks.locked("pod-a")  # released on the way out, also after an error
    assert len(locks) == 0


async def test_a_pods_lock_is_dropped_only_when_no_one_holds_or_waits_for_it() -> None:
    """Before, whether anyone waited was read from asyncio's private Lock._waiters: a Python where it is
    named otherwise would drop a lock a woken waiter holds, and let the next caller in alongside it."""
    locks, inside, most = PodLocks(), 0, 0

    async def use(pod: str) -> None:
        nonlocal inside, most
        async with locks(pod):
            inside += 1
            most = max(most, inside)
            await asyncio.sleep(0)
            inside -= 1

    first = locks("pod-a")
    await first.__aenter__()
    waiting = asyncio.create_task(use("pod-a"))
    await asyncio.sleep(0)
    await use("pod-b")  # another pod's lock: held, then gone
    assert len(locks) == 1
    await first.__aexit__(None, None, None)  # the waiter is woken, and has not run yet
    assert len(locks) == 1
    late = asyncio.create_task(use("pod-a"))  # must wait for it, on the same lock
    await asyncio.gather(waiting, late)
    assert most == 1
    assert len(locks) == 0  # nothing kept for pods no one is working on


async def test_a_pods_lock_is_kept_while_a_caller_waits_for_it(rig: ConfigureRig) -> None:
    attached = await _attached(rig, sample_row(), rig.sandbox())
    rig.cni.delete_gate = asyncio.Event()
    unprepare = asyncio.create_task(rig.attacher.release([attached], _later()))
    await rig.cni.deleting.wait()  # NodeUnprepareResources holds the pod's lock
    queued, inside, leave = asyncio.Event(), asyncio.Event(), asyncio.Event()

    async def next_in_line() -> None:  # e.g. the repair of the pod's other claim after a restart
        queued.set()
        async with rig.locks(attached.pod_uid):
            inside.set()
            await leave.wait()

    waiting = asyncio.create_task(next_in_line())
    await queued.wait()
    rig.cni.delete_gate.set()
    await unprepare
    await inside.wait()
    try:
        # a third caller must wait for the one inside; a fresh lock would let both act on the pod at once
        assert rig.locks.locked(attached.pod_uid)
    finally:
        leave.set()
        await waiting


async def test_every_attached_interface_is_set_against_redirects_and_router_advertisements(
    rig: ConfigureRig,
) -> None:
    sandbox = rig.sandbox()
    await _attached(rig, sample_row(), sandbox)
    assert rig.netlink.sysctls[(sandbox.netns, "net1")] == {
        "ipv4/conf/net1/accept_redirects": "0",
        "ipv6/conf/net1/accept_redirects": "0",
        "ipv6/conf/net1/accept_ra": "0",  # the NIC's rule does not take the network's
    }


async def test_an_address_only_the_add_tells_is_bound_right_after_the_attach_and_tried_again(
    rig: ConfigureRig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tenant's own host-local address is not known at prepare: the NIC's table learns it right after
    the attach, off containerd's NRI lock (the strict table drops the pod's frames from it until then), and
    tries again when nft refuses for a moment."""
    recorder = Recorder()
    guard = recorded_guard(rig.store, recorder)
    rig.attacher.guard = guard
    monkeypatch.setattr(guard_module, "RETRY_PAUSES", (0.0, 0.0, 0.0))
    refusals = [KernelError("nft -j -f -: exit 1: Error: Could not process rule: Device or resource busy")]

    returned = asyncio.Event()
    record = recorder.apply

    async def busy_once(netns: str, made: dict[str, Any], *, check_only: bool = False) -> None:
        await returned.wait()  # the attach does not wait for it
        if refusals:
            raise refusals.pop()
        await record(netns, made)

    recorder.apply = busy_once  # type: ignore[method-assign,assignment]
    sandbox = rig.sandbox()
    attached = await _attached(rig, sample_row(), sandbox)  # sample_row: host-local 10.90.0.0/24
    assert recorder.sets == {}
    returned.set()
    await rig.background.settle()
    mac = attached.outcome.interface.mac  # type: ignore[union-attr]
    assert recorder.macs("netclaim-enp1s0") == {mac} and guard.covers(attached)
    assert ("v4", (mac, "10.90.0.10")) in recorder.sets["netclaim-enp1s0"]  # what the ADD told


def _guarded_row() -> Attachment:
    """A row as prepare makes it on a NIC with port security: its child's MAC chosen."""
    row = sample_row()
    macvlan = {**row.plan.conflist["plugins"][0], "mac": "02:00:00:00:00:0a"}
    conflist = {**row.plan.conflist, "plugins": [macvlan]}
    return dataclasses.replace(row, plan=msgspec.structs.replace(row.plan, conflist=conflist))


async def test_an_attach_binds_its_child_first_when_prepare_did_not(rig: ConfigureRig) -> None:
    """The write ahead failed, or prepare stopped before it: the attach writes the binding before the ADD,
    so the child's first frames pass."""
    recorder = Recorder()
    rig.attacher.guard = recorded_guard(rig.store, recorder, rig.background)
    attached = await _attached(rig, _guarded_row(), rig.sandbox())
    assert [c.command for c in rig.cni.calls] == ["ADD"]
    assert attached.outcome.interface is not None
    assert recorder.made == ["netclaim-enp1s0"] and len(recorder.macs("netclaim-enp1s0")) == 1


async def test_an_attach_whose_port_security_cannot_be_written_fails_and_adds_nothing(
    rig: ConfigureRig,
) -> None:
    """Fail closed: no child that the table would drop (nor one that nothing holds) is made."""
    recorder = Recorder()

    async def refused(netns: str, script: str, *, check_only: bool = False) -> None:
        raise KernelError("nft -f -: exit 1: Error: Could not process rule: No buffer space available")

    recorder.define = refused  # type: ignore[method-assign]
    rig.attacher.guard = recorded_guard(rig.store, recorder, rig.background)
    row = _guarded_row()
    await rig.store.put(row)
    with pytest.raises(AttachError, match=r"port security on enp1s0 not written .*No buffer space"):
        await rig.attacher.attach(row, rig.sandbox(), _later())
    assert rig.cni.calls == [] and rig.store.get(row.key) == row  # still prepared, for the runtime's retry


async def test_the_addresses_of_the_interface_are_the_add_results_and_read_only_when_it_does_not_say(
    rig: ConfigureRig,
) -> None:
    """Reading them back (an AsyncIPRoute on a socket of the pod's namespace) was a third of an attach's own
    CPU; the result names them. A result that does not tie its addresses to the interface: read."""
    sandbox = rig.sandbox()
    attached = await _attached(rig, sample_row(), sandbox)
    assert rig.netlink.addresses_given == [("10.90.0.10/24",)]
    assert attached.outcome.interface is not None
    assert attached.outcome.interface.addresses == ("10.90.0.10/24",)
    add = rig.cni.add

    async def untied(*args: Any, **kwargs: Any) -> dict[str, Any]:
        result = await add(*args, **kwargs)
        return result | {"ips": [{"address": ip["address"]} for ip in result["ips"]]}

    rig.cni.add = untied  # type: ignore[method-assign]
    again = await rig.attacher.attach(attached, rig.sandbox("sandbox-2"), _later())
    assert rig.netlink.addresses_given[-1] is None  # asked of the kernel
    assert again.outcome.interface is not None and again.outcome.interface.addresses == ("10.90.0.11/24",)


@pytest.mark.parametrize(
    ("list_level", "fsynced"),
    [
        ({"cniVersion": "1.0.0"}, True),  # no GC: only the row on disk makes a DEL after a power cut
        ({"cniVersion": "1.1.0"}, False),  # the network's GC frees what a lost row's ADD reserved
        ({"cniVersion": "1.1.0", "disableGC": True}, True),
    ],
)
async def test_the_record_of_an_add_under_way_waits_for_the_disk_only_when_no_gc_reaches_the_chain(
    rig: ConfigureRig, list_level: dict[str, Any], fsynced: bool
) -> None:
    """Seen while the ADD runs, on the store's writer connection: synchronous FULL (2) or NORMAL (1). The
    row is there either way (what kill -9 leaves: test_restarts' crash inside ADD)."""
    row = sample_row()
    plan = msgspec.structs.replace(row.plan, conflist={**row.plan.conflist, **list_level})
    row = dataclasses.replace(row, plan=plan)
    await rig.store.put(row)
    rig.cni.gate = asyncio.Event()
    attaching = asyncio.create_task(rig.attacher.attach(row, rig.sandbox(), _later()))
    await rig.cni.adding.wait()
    level = int(rig.store._db.execute("PRAGMA synchronous").fetchone()[0])
    stored = rig.store.get(row.key)
    rig.cni.gate.set()
    await attaching
    assert stored is not None and stored.state == State.ATTACHING
    assert level == (2 if fsynced else 1)

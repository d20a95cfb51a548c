"""NRI pod hooks: attach all of a pod's devices or none, never fail Stop/Remove, repair after restarts."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import msgspec
import pytest

from netclaim.adapters.cni import CniRunner
from netclaim.agent.pods.policy import PolicyEnforcer
from netclaim.agent.status import NETWORK_STATUS, ClaimRef
from netclaim.agent.store import Attachment, Outcome, State
from netclaim.core.node import PodSandbox, cni_args
from netclaim.errors import AttachError, CniError, HostNetworkPodError, PodBusyError
from tests.unit.fakes import ConfigureRig, configure_rig, sample_claim, sample_device, sample_row
from tests.unit.test_policy_enforcer import DELETE_ONLY, FakeRules, Recorder, _guard

CLAIM = ClaimRef("team-a", "claim-1", "claim-uid-1")
FIRST = sample_row(sample_device("enp1s0"))
SECOND = sample_row(sample_device("enp2s0"), request="net2", interface_name="net2")
BUDGET = 30.0


@pytest.fixture
def rig(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ConfigureRig]:
    built = configure_rig(tmp_path)
    built.api.add_claim(sample_claim((), ()))
    yield built
    built.store.close()


def _state(rig: ConfigureRig, row: Attachment) -> tuple[State, str]:
    stored = rig.store.get(row.key)
    assert stored is not None
    return stored.state, stored.sandbox_id


def _conditions(rig: ConfigureRig) -> list[tuple[str, str, str]]:
    """(device, Ready status, reason) of the claim's entries as the API server has them."""
    return [
        (e["device"], e["conditions"][0]["status"], e["conditions"][0]["reason"]) for e in rig.entries(CLAIM)
    ]


async def test_a_pod_without_claims_is_left_alone(rig: ConfigureRig) -> None:
    await rig.store.put(FIRST)
    await rig.hooks.run_pod_sandbox(rig.sandbox(uid="another-pod"), BUDGET)
    await rig.hooks.stop_pod_sandbox(rig.sandbox(uid="another-pod"), BUDGET)
    assert rig.cni.calls == []
    assert len(rig.locks) == 0


async def test_run_pod_sandbox_attaches_every_device_of_the_pod_and_reports_them(rig: ConfigureRig) -> None:
    await rig.store.put(FIRST, SECOND)
    sandbox = rig.sandbox()
    meta = {"namespace": "team-a", "name": "pod-1", "uid": "pod-uid-1", "resourceVersion": "1"}
    rig.api.pod_objects[("team-a", "pod-1")] = {"metadata": meta}
    await rig.hooks.run_pod_sandbox(sandbox, BUDGET)
    assert [_state(rig, r) for r in (FIRST, SECOND)] == [(State.ATTACHED, "sandbox-1")] * 2
    assert (
        rig.api.calls == []
    )  # the claim's status and the pod's annotation are written off the runtime's path
    await rig.settle()
    assert _conditions(rig) == [
        (FIRST.device, "True", "InterfaceAttached"),
        (SECOND.device, "True", "InterfaceAttached"),
    ]
    network_status = json.loads(
        rig.api.pod_objects[("team-a", "pod-1")]["metadata"]["annotations"][NETWORK_STATUS]
    )
    assert [(e["name"], e["interface"]) for e in network_status] == [
        ("team-a/claim-1", "net1"),
        ("team-a/claim-1", "net2"),
    ]


async def test_a_hook_logs_its_parts(rig: ConfigureRig, caplog: pytest.LogCaptureFixture) -> None:
    """The benchmark splits the hook as containerd times it (two stopwatch plugins) into the NRI round trip
    and these parts; only a pod with claims is logged."""
    await rig.store.put(FIRST, SECOND)
    caplog.set_level(logging.INFO, logger="netclaim.agent.pods.hooks")
    await rig.hooks.run_pod_sandbox(rig.sandbox(uid="another-pod"), BUDGET)
    await rig.hooks.run_pod_sandbox(rig.sandbox(), BUDGET)
    [line] = [r for r in caplog.records if r.message == "pod sandbox hooked"]
    parts = [line.__dict__[k] for k in ("lock_ms", "attach_ms", "policy_ms", "metadata_ms")]
    assert line.__dict__["pod"] == "team-a/pod-1"
    assert all(part >= 0 for part in parts) and sum(parts) <= line.__dict__["ms"] + 0.5
    assert line.__dict__["attach_ms"] > 0  # two CNI ADDs of the fake runner


async def test_a_pod_on_the_host_network_fails_with_a_warning_event_written_later(rig: ConfigureRig) -> None:
    await rig.store.put(FIRST)
    host_network = PodSandbox(id="sandbox-1", uid="pod-uid-1", name="pod-1", namespace="team-a", netns="")
    with pytest.raises(HostNetworkPodError, match="pod team-a/pod-1 uses the host network"):
        await rig.hooks.run_pod_sandbox(host_network, BUDGET)
    assert rig.api.calls == []
    await rig.settle()
    assert [(e.pod, e.reason) for e in rig.api.events] == [("pod-1", "NetclaimAttachFailed")]
    assert rig.cni.calls == []


async def test_when_one_device_fails_none_stays_attached_and_the_retry_starts_clean(
    rig: ConfigureRig,
) -> None:
    await rig.store.put(FIRST, SECOND)
    failure = CniError("macvlan", "ADD", 7, "master enp2s0 is down")
    rig.cni.fail_add += [None, failure]
    first_sandbox = rig.sandbox("sandbox-1")
    with pytest.raises(AttachError, match="master enp2s0 is down") as raised:
        await rig.hooks.run_pod_sandbox(first_sandbox, BUDGET)
    assert raised.value.__cause__ is failure
    assert rig.cni.commands() == [
        ("ADD", "sandbox-1", first_sandbox.netns),
        ("ADD", "sandbox-1", first_sandbox.netns),
        ("DEL", "sandbox-1", first_sandbox.netns),  # the rollback of the failed one
        ("DEL", "sandbox-1", first_sandbox.netns),  # all or nothing: the one that worked
    ]
    assert rig.cni.leases == {}
    assert _state(rig, FIRST)[0] == State.DETACHED
    assert _state(rig, SECOND)[0] == State.PREPARED
    assert rig.api.calls == []  # no API call inside the runtime's budget: the Event is queued
    await rig.settle()
    assert [(e.reason, e.message) for e in rig.api.events] == [
        ("NetclaimAttachFailed", f"claim team-a/claim-1 device {SECOND.device}: {failure}")
    ]
    assert _conditions(rig) == [
        (FIRST.device, "False", "Detached"),
        (SECOND.device, "False", "AttachFailed"),
    ]
    await rig.hooks.run_pod_sandbox(rig.sandbox("sandbox-2"), BUDGET)  # kubelet's retry
    assert [_state(rig, r) for r in (FIRST, SECOND)] == [(State.ATTACHED, "sandbox-2")] * 2


async def _adds_started(rig: ConfigureRig, count: int) -> None:
    while sum(c.command == "ADD" for c in rig.cni.calls) < count:  # noqa: ASYNC110 - calls are a list
        await asyncio.sleep(0)


async def test_a_pods_self_contained_chains_are_added_at_the_same_time(rig: ConfigureRig) -> None:
    """Two macvlan + host-local chains: the second ADD starts while the first still runs (a plugin held
    until both have started); the pod's hook ends with both attached."""
    await rig.store.put(FIRST, SECOND)
    rig.cni.gate = asyncio.Event()
    hook = asyncio.create_task(rig.hooks.run_pod_sandbox(rig.sandbox(), BUDGET))
    await asyncio.wait_for(_adds_started(rig, 2), 5)
    assert not hook.done()
    rig.cni.gate.set()
    await hook
    assert [_state(rig, r) for r in (FIRST, SECOND)] == [(State.ATTACHED, "sandbox-1")] * 2


async def test_a_chain_that_touches_what_its_siblings_share_is_added_alone(rig: ConfigureRig) -> None:
    shared = SECOND.plan.conflist | {"plugins": [*SECOND.plan.conflist["plugins"], {"type": "sbr"}]}
    alone = replace(SECOND, plan=msgspec.structs.replace(SECOND.plan, conflist=shared))
    await rig.store.put(FIRST, alone)
    rig.cni.gate = asyncio.Event()
    hook = asyncio.create_task(rig.hooks.run_pod_sandbox(rig.sandbox(), BUDGET))
    await asyncio.wait_for(_adds_started(rig, 1), 5)
    with contextlib.suppress(TimeoutError):  # time for the second to start, were it to (store writes)
        await asyncio.wait_for(_adds_started(rig, 2), 0.5)
    assert [c.invocation.if_name for c in rig.cni.calls if c.command == "ADD"] == ["net1"]
    rig.cni.gate.set()
    await hook
    assert [c.invocation.if_name for c in rig.cni.calls if c.command == "ADD"] == ["net1", "net2"]
    assert [_state(rig, r) for r in (FIRST, alone)] == [(State.ATTACHED, "sandbox-1")] * 2


async def test_a_failure_beside_an_add_in_flight_undoes_both_once_both_have_ended(rig: ConfigureRig) -> None:
    await rig.store.put(FIRST, SECOND)
    failure = CniError("macvlan", "ADD", 7, "master enp1s0 is down")
    rig.cni.fail_add += [failure, None]  # the first to end fails, the other attaches
    rig.cni.gate = asyncio.Event()
    hook = asyncio.create_task(rig.hooks.run_pod_sandbox(rig.sandbox(), BUDGET))
    await asyncio.wait_for(_adds_started(rig, 2), 5)
    rig.cni.gate.set()
    with pytest.raises(AttachError, match="master enp1s0 is down"):
        await hook
    assert sorted(c.command for c in rig.cni.calls) == ["ADD", "ADD", "DEL", "DEL"]
    assert rig.cni.leases == {}
    assert sorted(_state(rig, r)[0] for r in (FIRST, SECOND)) == sorted([State.PREPARED, State.DETACHED])


async def test_an_add_out_of_time_fails_the_sandbox_without_blaming_the_user(rig: ConfigureRig) -> None:
    """A plugin that answers "try again later" (code 11), or that netclaim stopped at its deadline: the
    sandbox fails and kubelet retries; the claim's condition says why, no Warning Event on the pod."""
    await rig.store.put(FIRST)
    rig.cni.fail_add.append(CniError.of("macvlan", "ADD", 11, "timed out after 1.50 s"))
    with pytest.raises(AttachError, match="timed out"):
        await rig.hooks.run_pod_sandbox(rig.sandbox(), BUDGET)
    await rig.settle()
    assert rig.api.events == []
    assert _conditions(rig) == [(FIRST.device, "False", "AttachFailed")]


async def test_a_busy_pod_is_pod_busy_and_nothing_changes(rig: ConfigureRig) -> None:
    await rig.store.put(FIRST)
    async with rig.locks(FIRST.pod_uid):  # an earlier operation on the pod still runs
        with pytest.raises(PodBusyError):
            await rig.hooks.run_pod_sandbox(rig.sandbox(), 0.0)
    assert rig.store.all() == [FIRST]
    assert rig.cni.calls == []
    await rig.settle()
    assert rig.api.calls == []  # transient: no Event, no condition


async def test_stop_detaches_and_remove_after_it_has_nothing_left_to_do(rig: ConfigureRig) -> None:
    await rig.store.put(FIRST, SECOND)
    sandbox = rig.sandbox()
    await rig.hooks.run_pod_sandbox(sandbox, BUDGET)
    await rig.hooks.stop_pod_sandbox(sandbox, BUDGET)
    assert [_state(rig, r)[0] for r in (FIRST, SECOND)] == [State.DETACHED] * 2
    assert rig.cni.leases == {}
    await rig.hooks.remove_pod_sandbox(sandbox, BUDGET)
    assert [c.command for c in rig.cni.calls] == ["ADD", "ADD", "DEL", "DEL"]
    await rig.settle()
    assert _conditions(rig) == [(FIRST.device, "False", "Detached"), (SECOND.device, "False", "Detached")]


@pytest.mark.parametrize(
    "failure",
    [CniError("macvlan", "DEL", 999, "plugin crashed"), RuntimeError("a bug")],
    ids=["cni", "bug"],
)
async def test_stop_never_fails_and_remove_tries_again(rig: ConfigureRig, failure: Exception) -> None:
    await rig.store.put(FIRST)
    sandbox = rig.sandbox()
    await rig.hooks.run_pod_sandbox(sandbox, BUDGET)
    rig.cni.fail_delete.append(failure)
    await rig.hooks.stop_pod_sandbox(sandbox, BUDGET)
    assert _state(rig, FIRST)[0] == State.ATTACHED
    await rig.hooks.remove_pod_sandbox(sandbox, BUDGET)
    assert _state(rig, FIRST)[0] == State.DETACHED
    assert rig.cni.leases == {}


async def test_stop_of_a_busy_pod_does_not_fail(rig: ConfigureRig, caplog: pytest.LogCaptureFixture) -> None:
    await rig.store.put(FIRST)
    sandbox = rig.sandbox()
    await rig.hooks.run_pod_sandbox(sandbox, BUDGET)
    async with rig.locks(FIRST.pod_uid):
        await rig.hooks.stop_pod_sandbox(sandbox, 0.0)
    assert _state(rig, FIRST)[0] == State.ATTACHED  # RemovePodSandbox or NodeUnprepareResources will
    # transient: a warning, not the traceback of a bug
    assert [(r.levelname, r.message, r.exc_info) for r in caplog.records if r.levelno >= logging.WARNING] == [
        ("WARNING", "detach postponed", None)
    ]


async def test_a_retried_sandbox_releases_the_address_of_the_run_before_it(rig: ConfigureRig) -> None:
    # RunPodSandbox of sandbox-1 outlives the runtime's patience: the runtime gives up on it and kubelet
    # makes sandbox-2, whose RunPodSandbox waits for the pod's lock while the first still runs
    await rig.store.put(FIRST)
    first, second = rig.sandbox("sandbox-1"), rig.sandbox("sandbox-2")
    rig.cni.gate = asyncio.Event()
    slow = asyncio.create_task(rig.hooks.run_pod_sandbox(first, BUDGET))
    await rig.cni.adding.wait()
    waiting = asyncio.Event()

    async def retry() -> None:
        waiting.set()
        await rig.hooks.run_pod_sandbox(second, BUDGET)

    retried = asyncio.create_task(retry())
    await waiting.wait()
    rig.cni.gate.set()
    await slow
    await retried
    # sandbox-1's address must be released before sandbox-2 gets one
    assert rig.cni.commands() == [
        ("ADD", "sandbox-1", first.netns),
        ("DEL", "sandbox-1", first.netns),
        ("ADD", "sandbox-2", second.netns),
    ]
    assert list(rig.cni.leases) == [("sandbox-2", "net1")]


def _attaching(row: Attachment, sandbox: PodSandbox) -> Attachment:
    """The row as a crash inside ADD left it."""
    args = cni_args(sandbox.namespace, sandbox.name, sandbox.id, sandbox.uid)
    return row.with_state(
        State.ATTACHING, sandbox_id=sandbox.id, netns=sandbox.netns, outcome=Outcome(cni_args=args)
    )


async def test_synchronize_undoes_a_half_done_add_then_attaches_into_the_running_sandbox(
    rig: ConfigureRig,
) -> None:
    sandbox = rig.sandbox()
    await rig.store.put(_attaching(FIRST, sandbox))
    rig.cni.leases[("sandbox-1", "net1")] = "10.90.0.99/24"  # what the interrupted ADD had reserved
    await rig.hooks.synchronize([sandbox])
    assert rig.cni.commands() == [("DEL", "sandbox-1", sandbox.netns), ("ADD", "sandbox-1", sandbox.netns)]
    assert rig.cni.calls[0].invocation.args == cni_args("team-a", "pod-1", "sandbox-1", "pod-uid-1")
    assert "10.90.0.99/24" not in rig.cni.leases.values()
    assert _state(rig, FIRST) == (State.ATTACHED, "sandbox-1")
    await rig.settle()
    assert _conditions(rig) == [(FIRST.device, "True", "InterfaceAttached")]


@pytest.mark.parametrize("still_listed", [False, True], ids=["sandbox-gone", "netns-gone"])
async def test_synchronize_releases_what_a_sandbox_gone_while_away_held(
    rig: ConfigureRig, still_listed: bool
) -> None:
    sandbox = rig.sandbox()
    await rig.store.put(FIRST, SECOND)
    await rig.hooks.run_pod_sandbox(sandbox, BUDGET)
    rig.netlink.remove_namespace(sandbox.netns)
    await rig.hooks.synchronize([sandbox] if still_listed else [])
    assert rig.cni.commands()[2:] == [("DEL", "sandbox-1", ""), ("DEL", "sandbox-1", "")]
    assert rig.cni.leases == {}
    assert [_state(rig, r)[0] for r in (FIRST, SECOND)] == [State.DETACHED] * 2


async def test_synchronize_moves_an_attachment_to_the_pods_new_sandbox(rig: ConfigureRig) -> None:
    old, new = rig.sandbox("sandbox-1"), rig.sandbox("sandbox-2")
    await rig.store.put(FIRST)
    await rig.hooks.run_pod_sandbox(old, BUDGET)
    await rig.hooks.synchronize([new])
    assert rig.cni.commands()[1:] == [("DEL", "sandbox-1", old.netns), ("ADD", "sandbox-2", new.netns)]
    assert _state(rig, FIRST) == (State.ATTACHED, "sandbox-2")


async def test_synchronize_attaches_into_a_sandbox_whose_run_was_missed(rig: ConfigureRig) -> None:
    await rig.store.put(FIRST)
    await rig.hooks.synchronize([rig.sandbox()])
    assert _state(rig, FIRST) == (State.ATTACHED, "sandbox-1")


async def test_synchronize_leaves_what_is_in_order_alone(rig: ConfigureRig) -> None:
    sandbox = rig.sandbox()
    unused = sample_row(sample_device("enp3s0"), claim_uid="claim-uid-2", pod_uid="gone-pod")
    await rig.store.put(FIRST, unused)
    await rig.hooks.run_pod_sandbox(sandbox, BUDGET)
    await rig.hooks.synchronize([sandbox])
    assert [c.command for c in rig.cni.calls] == ["ADD"]
    assert rig.store.get(unused.key) == unused


async def test_a_repair_that_fails_is_logged_and_the_others_go_on(rig: ConfigureRig) -> None:
    await rig.store.put(FIRST, SECOND)
    rig.cni.fail_add.append(CniError("macvlan", "ADD", 7, "master enp1s0 is down"))
    await rig.hooks.synchronize([rig.sandbox()])
    assert _state(rig, FIRST)[0] == State.PREPARED
    assert _state(rig, SECOND) == (State.ATTACHED, "sandbox-1")
    await rig.settle()
    assert _conditions(rig) == [
        (FIRST.device, "False", "AttachFailed"),
        (SECOND.device, "True", "InterfaceAttached"),
    ]


async def test_synchronize_skips_rows_deleted_meanwhile(rig: ConfigureRig) -> None:
    await rig.store.put(FIRST)
    started = asyncio.Event()

    async def synchronize() -> None:
        started.set()
        await rig.hooks.synchronize([rig.sandbox()])

    async with rig.locks(FIRST.pod_uid):  # NodeUnprepareResources of the claim runs
        syncing = asyncio.create_task(synchronize())
        await started.wait()
        await rig.store.delete(FIRST)
    await syncing
    assert rig.cni.calls == []


async def test_synchronize_leaves_alone_what_a_hook_attached_after_the_pod_list_was_taken(
    rig: ConfigureRig,
) -> None:
    """Seen under a 30-pod burst: containerd dropped the connection (a hook past its 2 s), the agent
    reconnected with the pod list of that moment, and its repair then DELeted an interface that the hook
    of a newer sandbox had just added, because that sandbox was not in the list. The pod never started."""
    await rig.store.put(FIRST)
    newer = rig.sandbox()
    started = asyncio.Event()

    async def synchronize() -> None:
        started.set()
        await rig.hooks.synchronize([])  # taken before `newer` existed

    async with rig.locks(FIRST.pod_uid):  # the hook of `newer` holds the pod
        syncing = asyncio.create_task(synchronize())
        await started.wait()
        await rig.hooks.attacher.attach(FIRST, newer, asyncio.get_running_loop().time() + BUDGET)
    await syncing
    assert rig.cni.commands() == [("ADD", "sandbox-1", newer.netns)]
    assert _state(rig, FIRST) == (State.ATTACHED, "sandbox-1")


async def test_removing_a_pods_old_sandbox_leaves_its_new_sandboxs_interface(rig: ConfigureRig) -> None:
    """kubelet removes a pod's old sandbox after its new one runs: that must not take the new one's net1."""
    old, new = rig.sandbox("sandbox-1"), rig.sandbox("sandbox-2")
    await rig.store.put(FIRST)
    await rig.hooks.run_pod_sandbox(old, BUDGET)
    await rig.hooks.run_pod_sandbox(new, BUDGET)  # the old one's interface is DELeted, the new one's added
    calls = len(rig.cni.calls)
    await rig.hooks.stop_pod_sandbox(old, BUDGET)
    await rig.hooks.remove_pod_sandbox(old, BUDGET)
    assert len(rig.cni.calls) == calls
    assert _state(rig, FIRST) == (State.ATTACHED, "sandbox-2")


async def test_synchronize_still_attaches_a_listed_sandbox_after_a_hook_detached_the_old_one(
    rig: ConfigureRig,
) -> None:
    """The pod list has the pod's new sandbox (its RunPodSandbox was missed); while the repair waits for
    the pod's lock, the old sandbox's StopPodSandbox detaches the row: the repair attaches the new one."""
    old, new = rig.sandbox("sandbox-1"), rig.sandbox("sandbox-2")
    await rig.store.put(FIRST)
    await rig.hooks.run_pod_sandbox(old, BUDGET)
    started = asyncio.Event()

    async def synchronize() -> None:
        started.set()
        await rig.hooks.synchronize([new])

    async with rig.locks(FIRST.pod_uid):
        syncing = asyncio.create_task(synchronize())
        await started.wait()
        current = rig.hooks.attacher.current(FIRST)
        assert current is not None
        await rig.hooks.attacher.detach(current, asyncio.get_running_loop().time() + BUDGET)
    await syncing
    assert _state(rig, FIRST) == (State.ATTACHED, "sandbox-2")


async def test_a_stopping_agent_waits_for_an_attach_in_flight_instead_of_cutting_it_short(
    rig: ConfigureRig,
) -> None:
    """settle() is what the agent awaits on SIGTERM: busy while an ADD runs, idle once it finished, and
    the attachment is then complete (not ATTACHING, which the next agent would undo under the pod)."""
    await rig.store.put(FIRST)
    assert await rig.hooks.settle(0.0)
    rig.cni.gate = asyncio.Event()  # a slow plugin
    attaching = asyncio.create_task(rig.hooks.run_pod_sandbox(rig.sandbox(), BUDGET))
    await rig.cni.adding.wait()
    assert not await rig.hooks.settle(0.05)
    assert _state(rig, FIRST)[0] == State.ATTACHING
    rig.cni.gate.set()
    assert await rig.hooks.settle(5.0)
    await attaching
    assert _state(rig, FIRST) == (State.ATTACHED, "sandbox-1")


# A real plugin: its ADD sleeps in a child of its own (the process group a plugin may start); its DEL
# writes down whether any process of that ADD is still there.
SLOW_PLUGIN = """#!/bin/sh
cat >/dev/null
alive() {{ state=$(sed -n 's/^State:[[:space:]]*\\(.\\).*/\\1/p' "/proc/$1/status" 2>/dev/null); \
[ -n "$state" ] && [ "$state" != Z ]; }}
case "$CNI_COMMAND" in
ADD) echo "ADD $$" >> {log}; sleep 60 & echo "$$ $!" > {pids}; wait ;;
DEL) for pid in $(cat {pids}); do alive "$pid" && echo "DEL while ADD process $pid runs" >> {log}; done
     echo "DEL" >> {log}; echo '{{}}' ;;
esac
"""


def _gone(pid: int) -> bool:
    """No such process, or only its exit status left for its parent to collect."""
    status = Path(f"/proc/{pid}/status")
    return not status.exists() or "\nState:\tZ" in status.read_text()


async def test_a_hook_cancelled_mid_add_kills_its_plugin_before_the_repair_deletes(
    rig: ConfigureRig, tmp_path: Path
) -> None:
    """containerd drops the NRI connection while a RunPodSandbox is inside ADD: the hook is cancelled and
    the next connection's Synchronize repairs the pod. Before, the plugin went on running; its ADD could
    finish after the repair's DEL and leave an interface and an address nobody would ever release."""
    bin_dir, log, pids = tmp_path / "bin", tmp_path / "plugin.log", tmp_path / "add.pids"
    bin_dir.mkdir()
    plugin = bin_dir / "macvlan"  # FIRST's chain
    plugin.write_text(SLOW_PLUGIN.format(log=log, pids=pids))
    plugin.chmod(0o755)
    rig.attacher.cni = CniRunner([bin_dir])
    await rig.store.put(FIRST)
    hook = asyncio.create_task(rig.hooks.run_pod_sandbox(rig.sandbox(), BUDGET))
    async with asyncio.timeout(10):  # not a measurement: a bound on a plugin that never started
        while not pids.exists() or len(pids.read_text().split()) != 2:  # noqa: ASYNC110 - a file appears
            await asyncio.sleep(0.01)
    hook.cancel()  # the connection went; the runtime dials again and repairs at once
    repair = asyncio.create_task(rig.hooks.synchronize([]))  # the sandbox failed: not listed
    with pytest.raises(asyncio.CancelledError):
        await hook
    await repair
    plugin_pid, sleeper_pid = (int(pid) for pid in pids.read_text().split())
    assert log.read_text().splitlines() == [f"ADD {plugin_pid}", "DEL"]  # nothing of the ADD left then
    assert _gone(plugin_pid) and _gone(sleeper_pid)
    assert _state(rig, FIRST)[0] == State.DETACHED


async def test_a_bug_after_the_adds_undoes_them_and_fails_the_sandbox(
    rig: ConfigureRig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not only an AttachError: whatever fails inside the hook (a tenant's policy once raised ValueError
    there) rolls the pod's interfaces back, and the sandbox fails with a message and an Event."""
    await rig.store.put(FIRST, SECOND)

    def broken(rows: list[Attachment]) -> None:
        raise ValueError("'10.1.2.3/16' has host bits set")

    monkeypatch.setattr(rig.hooks.metadata, "attached", broken)
    with pytest.raises(AttachError, match=r"internal error in the netclaim agent \(ValueError"):
        await rig.hooks.run_pod_sandbox(rig.sandbox(), BUDGET)
    assert [_state(rig, r)[0] for r in (FIRST, SECOND)] == [State.DETACHED, State.DETACHED]
    assert [c.command for c in rig.cni.calls] == ["ADD", "ADD", "DEL", "DEL"]
    await rig.settle()
    assert [e.reason for e in rig.api.events] == ["NetclaimAttachFailed"]


def _with_policies(rig: ConfigureRig, rules: FakeRules, nft: Recorder) -> PolicyEnforcer:
    enforcer = PolicyEnforcer(rules, rig.store, "node-1", nft)
    rig.hooks.policies = enforcer
    return enforcer


async def test_a_repair_attaches_a_missed_sandbox_only_once_the_rules_are_read(rig: ConfigureRig) -> None:
    """Synchronize after a restart can come before the rules are read: attaching then would let the gate
    see net1 and the containers start without the pod's table."""
    device = sample_device("enp1s0")
    device.attributes["netclaim.dev/network"] = "lan3"
    row = sample_row(device)
    await rig.store.put(row)
    enforcer = _with_policies(rig, FakeRules({"guards": _guard({})}), Recorder())
    repair = asyncio.create_task(rig.hooks.synchronize([rig.sandbox()]))
    await asyncio.sleep(0.05)
    assert rig.cni.calls == [] and not repair.done()  # waiting for the rules
    await enforcer.refresh()
    await repair
    assert _state(rig, row) == (State.ATTACHED, "sandbox-1")
    assert enforcer.applied["pod-uid-1"] != DELETE_ONLY  # the guard's isolation, before any container


async def test_a_repair_whose_table_nft_refuses_undoes_the_interface(rig: ConfigureRig) -> None:
    device = sample_device("enp1s0")
    device.attributes["netclaim.dev/network"] = "lan3"
    row = sample_row(device)
    await rig.store.put(row)
    sandbox = rig.sandbox()
    enforcer = _with_policies(rig, FakeRules({"guards": _guard({})}), Recorder(refuse={sandbox.netns}))
    await enforcer.refresh()
    await rig.hooks.synchronize([sandbox])
    assert [c.command for c in rig.cni.calls] == ["ADD", "DEL"]  # no table, no interface: the gate holds
    assert _state(rig, row)[0] == State.DETACHED

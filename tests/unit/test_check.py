"""CNI CHECK of attached rows and the repair by DEL and ADD (configure.check): same sandbox, same addresses,
said on the claim and the pod; a failed repair is a failed attach; rows not attached are never checked."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

from netclaim.agent.status import ClaimRef
from netclaim.agent.store import State
from netclaim.errors import CniError, CniTryAgainError
from tests.unit.fakes import ConfigureRig, configure_rig, sample_claim, sample_device, sample_row

BUDGET = 30.0
CLAIM = ClaimRef("team-a", "claim-1", "claim-uid-1")
ROW = sample_row(sample_device("enp1s0"))
BROKEN = CniError("macvlan", "CHECK", 999, "interface net1 is missing address 10.90.0.10/24")


@pytest.fixture
def rig(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ConfigureRig]:
    built = configure_rig(tmp_path)
    built.api.add_claim(sample_claim((), ()))
    yield built
    built.store.close()


async def _attached(rig: ConfigureRig) -> str:
    await rig.store.put(ROW)
    await rig.hooks.run_pod_sandbox(rig.sandbox(), BUDGET)
    await rig.settle()
    stored = rig.store.get(ROW.key)
    assert stored is not None and stored.outcome.interface is not None
    return stored.outcome.interface.addresses[0]


async def test_passing_checks_change_nothing_and_write_nothing(rig: ConfigureRig) -> None:
    await _attached(rig)
    rig.api.calls.clear()
    assert await rig.checker.check_all() == []
    assert [c.command for c in rig.cni.calls] == ["ADD", "CHECK"]
    added = rig.store.get(ROW.key)
    assert added is not None and rig.cni.calls[-1].prev_result == added.outcome.cni_result
    await rig.settle()
    assert rig.api.calls == []


async def test_a_failed_check_is_repaired_in_the_same_sandbox_with_the_same_address(
    rig: ConfigureRig,
) -> None:
    address = await _attached(rig)
    added = rig.store.get(ROW.key)
    assert added is not None
    rig.cni.fail_check = [BROKEN]
    repaired = await rig.checker.check_all()
    assert [c.command for c in rig.cni.calls] == ["ADD", "CHECK", "DEL", "ADD"]
    assert rig.cni.calls[1].prev_result == added.outcome.cni_result
    readd = rig.cni.calls[-1].invocation
    assert (readd.container_id, readd.netns) == ("sandbox-1", added.netns)
    assert readd.args.endswith(f";IP={address.split('/')[0]}")
    assert [r.state for r in repaired] == [State.ATTACHED]
    stored = rig.store.get(ROW.key)
    assert stored is not None and stored.outcome.interface is not None
    assert stored.outcome.interface.addresses == (address,)
    await rig.settle()
    conditions = {c["type"]: c for c in rig.entries(CLAIM)[0]["conditions"]}
    assert conditions["Ready"]["status"] == "True"
    assert conditions["CheckFailed"]["status"] == "True"
    assert "missing address 10.90.0.10/24" in conditions["CheckFailed"]["message"]
    assert "DEL and ADD restored it" in conditions["CheckFailed"]["message"]
    assert [(e.reason, e.warning) for e in rig.api.events] == [("NetclaimCheckFailed", True)]


async def test_a_repair_that_fails_is_a_failed_attach_said_on_the_claim(rig: ConfigureRig) -> None:
    await _attached(rig)
    rig.cni.fail_check = [BROKEN]
    rig.cni.fail_add = [CniError("macvlan", "ADD", 7, "master enp1s0 is gone")]
    await rig.checker.check_all()
    stored = rig.store.get(ROW.key)
    assert stored is not None
    assert stored.state == State.PREPARED
    assert "DEL and ADD did not restore it" in stored.error
    await rig.settle()
    ready = rig.entries(CLAIM)[0]["conditions"][0]
    assert (ready["status"], ready["reason"]) == ("False", "AttachFailed")


async def test_a_check_out_of_time_is_no_finding_and_rows_not_attached_are_not_checked(
    rig: ConfigureRig,
) -> None:
    await _attached(rig)
    rig.cni.fail_check = [CniTryAgainError("macvlan", "CHECK", 11, "timed out")]
    assert await rig.checker.check_all() == []
    assert [c.command for c in rig.cni.calls] == ["ADD", "CHECK"]
    await rig.hooks.stop_pod_sandbox(rig.sandbox(), BUDGET)
    rig.cni.calls.clear()
    assert await rig.checker.check_all() == []
    assert rig.cni.calls == []


async def test_a_check_failing_while_a_plugin_is_missing_repairs_nothing(rig: ConfigureRig) -> None:
    """CHECK fails when host-local is gone; so would DEL and ADD: the working interface is left alone."""
    await _attached(rig)
    rig.cni.fail_check = [CniError("macvlan", "CHECK", 999, 'failed to find plugin "host-local"')]
    rig.cni.missing = {"host-local"}
    assert await rig.checker.check_all() == []
    assert [c.command for c in rig.cni.calls] == ["ADD", "CHECK"]
    stored = rig.store.get(ROW.key)
    assert stored is not None and stored.state == State.ATTACHED and stored.outcome.check == ""


async def test_only_plain_addresses_of_the_add_result_reach_cni_args_on_a_repair(rig: ConfigureRig) -> None:
    """CNI_ARGS is `;`-separated: an address the result spells with more in it must not add a key."""
    await _attached(rig)
    stored = rig.store.get(ROW.key)
    assert stored is not None and stored.outcome.cni_result is not None
    odd = {
        **stored.outcome.cni_result,
        "ips": [
            {"address": "10.90.0.10/24;K8S_POD_NAME=other"},
            {"nothing": 1},
            "x",
            {"address": "fd00::5/64"},
        ],
    }
    await rig.store.transition(
        stored.with_state(State.ATTACHED, outcome=msgspec.structs.replace(stored.outcome, cni_result=odd)),
        durable=False,
    )
    rig.cni.fail_check = [BROKEN]
    await rig.checker.check_all()
    readd = rig.cni.calls[-1].invocation
    assert readd.args.endswith(";IP=fd00::5") and "other" not in readd.args

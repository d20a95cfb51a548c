"""Teardown never stops at one row, one claim or one unreadable object: NodeUnprepareResources raises only
what kubelet should retry (a TransientError), and reclaim goes round every claim."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from netclaim.agent.pods.attach import MAX_RELEASE_TRIES
from netclaim.agent.status import ClaimRef
from netclaim.core.objects import ConsumerRef, DeviceConfig, IPAllocation
from netclaim.errors import (
    ApiUnavailableError,
    CniTryAgainError,
    ConfigError,
    NetclaimError,
)
from netclaim.runtime.metrics import REGISTRY
from tests.corpus import VALID_CONFIG
from tests.unit.fakes import (
    SAMPLE_DRIVER,
    ConfigureRig,
    configure_rig,
    sample_allocation,
    sample_claim,
    sample_config,
    sample_device,
)

NIC = sample_device("enp1s0")
SECOND_NIC = sample_device("enp2s0")
CLAIM = sample_claim(
    (sample_allocation(NIC, "net"), sample_allocation(SECOND_NIC, "net2")),
    (
        sample_config(VALID_CONFIG, requests=("net",)),
        sample_config({**VALID_CONFIG, "interfaceName": "net2"}, requests=("net2",)),
    ),
)
REF = ClaimRef(CLAIM.namespace, CLAIM.name, CLAIM.uid)
TOO_DEEP = "status.allocation.devices.config[0].opaque.parameters: nested deeper than 32 levels"


@pytest.fixture
def rig(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ConfigureRig]:
    built = configure_rig(tmp_path)
    built.catalog.update([NIC, SECOND_NIC])
    built.api.add_claim(CLAIM)
    yield built
    built.store.close()


def _held_by(claim_uid: str, name: str = "lan-10-10-3-7") -> IPAllocation:
    return IPAllocation(name, f"uid-{name}", "lan", "10.10.3.7/24", "team-a", "claim-1", claim_uid, "node-1")


def _conditions(rig: ConfigureRig) -> list[tuple[str, str, str]]:
    return [
        (e["device"], e["conditions"][0]["reason"], e["conditions"][0]["message"]) for e in rig.entries(REF)
    ]


async def test_a_row_whose_del_raises_a_bug_is_cleaned_up_and_the_other_rows_are_still_released(
    rig: ConfigureRig,
) -> None:
    """Before, an exception other than netclaim's own escaped NodeUnprepareResources at the first row: the
    rows stayed, every retry failed the same way, and the pod stayed Terminating for ever."""
    await rig.preparer.prepare(CLAIM.namespace, CLAIM.name, CLAIM.uid)
    await rig.hooks.run_pod_sandbox(rig.sandbox(), 30.0)
    rig.cni.fail_delete = [ValueError("embedded null byte")]  # the first row's DEL only
    await rig.unpreparer.unprepare(CLAIM.namespace, CLAIM.name, CLAIM.uid)
    assert [c.command for c in rig.cni.calls] == ["ADD", "ADD", "DEL", "DEL"]
    assert rig.store.all() == []
    assert rig.cni.leases == {}  # the first row's by hand, the second's by its DEL
    await rig.settle()
    [(first, reason, message), (second, *_)] = _conditions(rig)
    assert (first, second, reason) == (NIC.name, SECOND_NIC.name, "TeardownIncomplete")
    assert message.startswith(
        f"device {NIC.name}: internal error in the netclaim agent (ValueError: embedded null byte)"
    )
    assert "released host-local addresses" in message


async def test_a_claim_whose_config_cannot_be_read_is_refused_and_still_torn_down(rig: ConfigureRig) -> None:
    """A claim nested ~1,500 deep: prepare refuses it, and unprepare completes without reading it; its
    pool address stays until the controller frees it (after its quarantine) once the claim is gone."""
    unreadable = DeviceConfig("FromClaim", (), SAMPLE_DRIVER, None, unreadable=TOO_DEEP)
    deep = replace(CLAIM, configs=(unreadable,), owned_by_pod=True)
    rig.api.add_claim(deep)
    with pytest.raises(ConfigError, match=re.escape(f"claim team-a/claim-1: {TOO_DEEP}")):
        await rig.preparer.prepare(CLAIM.namespace, CLAIM.name, CLAIM.uid)
    assert rig.store.all() == [] and rig.api.calls.count("create_ip_allocation") == 0
    rig.api.allocations["lan-10-10-3-7"] = _held_by(CLAIM.uid)  # held from before, say
    await rig.unpreparer.unprepare(CLAIM.namespace, CLAIM.name, CLAIM.uid)
    assert list(rig.api.allocations) == ["lan-10-10-3-7"]


async def test_another_drivers_config_that_cannot_be_read_is_not_this_drivers_concern(
    rig: ConfigureRig,
) -> None:
    theirs = DeviceConfig("FromClaim", (), "gpu.example.com", None, unreadable=TOO_DEEP)
    rig.api.add_claim(replace(CLAIM, configs=(*CLAIM.configs, theirs)))
    assert len(await rig.preparer.prepare(CLAIM.namespace, CLAIM.name, CLAIM.uid)) == 2


async def test_unprepare_asks_the_api_nothing_so_no_api_failure_keeps_a_pod_terminating(
    rig: ConfigureRig,
) -> None:
    rig.api.allocations["lan-10-10-3-7"] = _held_by(CLAIM.uid)
    rig.api.fail_next = [ApiUnavailableError("503")]
    await rig.unpreparer.unprepare(CLAIM.namespace, CLAIM.name, CLAIM.uid)
    assert rig.api.calls == [] and list(rig.api.allocations) == ["lan-10-10-3-7"]


def _reclaim_errors() -> float:
    return REGISTRY.get_sample_value("netclaim_reclaim_errors_total") or 0.0


async def test_one_claim_failing_in_reclaim_does_not_stop_the_round_for_the_others(rig: ConfigureRig) -> None:
    """Before, the first claim that raised ended the round: other tenants' leftovers on the node were
    never reclaimed while it stayed."""
    claims = [
        sample_claim(
            (sample_allocation(NIC),),
            (sample_config(VALID_CONFIG),),
            name=n,
            uid=f"uid-{n}",
            reserved_for=(ConsumerRef(f"pod-{n}", f"pod-uid-{n}"),),
        )
        for n in ("first", "second")
    ]
    for claim in claims:
        rig.api.add_claim(claim)
        await rig.preparer.prepare(claim.namespace, claim.name, claim.uid)  # their sandboxes never ran
        del rig.api.claims[(claim.namespace, claim.name)]  # and the claims went
    assert await rig.reclaimer.reclaim() == []  # idle for the first time: kubelet's turn
    failures: list[NetclaimError] = [KeyError("a bug")]  # type: ignore[list-item]
    rig.api.fail_next = failures  # the first claim looked up
    before = _reclaim_errors()
    [reclaimed] = await rig.reclaimer.reclaim()
    assert _reclaim_errors() == before + 1
    [left] = {row.claim_uid for row in rig.store.all()}
    assert {reclaimed.uid, left} == {"uid-first", "uid-second"}
    assert [c.uid for c in await rig.reclaimer.reclaim()] == [left]  # the next round retries it
    assert rig.store.all() == []


async def test_a_del_that_keeps_timing_out_is_retried_then_given_up_as_final(rig: ConfigureRig) -> None:
    """A plugin out of time is transient: kubelet calls again. One that never answers keeps no pod
    Terminating for ever: at the MAX_RELEASE_TRIES-th call the row is cleaned up by hand and said on the
    claim, and the claim goes."""
    await rig.preparer.prepare(CLAIM.namespace, CLAIM.name, CLAIM.uid)
    await rig.hooks.run_pod_sandbox(rig.sandbox(), 30.0)
    timeout = CniTryAgainError("macvlan", "DEL", 11, "timed out after 10.00 s")
    rig.cni.fail_delete = [timeout] * MAX_RELEASE_TRIES
    for _ in range(MAX_RELEASE_TRIES - 1):
        with pytest.raises(CniTryAgainError):
            await rig.unpreparer.unprepare(CLAIM.namespace, CLAIM.name, CLAIM.uid)
        assert len(rig.store.all()) == 2  # kept for kubelet's next call
    await rig.unpreparer.unprepare(CLAIM.namespace, CLAIM.name, CLAIM.uid)
    assert rig.store.all() == []
    await rig.settle()
    [(first, reason, message), _] = _conditions(rig)
    assert (first, reason) == (NIC.name, "TeardownIncomplete")
    assert f"timed out after 10.00 s ({MAX_RELEASE_TRIES} tries)" in message

"""The DRAPlugin service: per-claim answers, and each error class mapped as netclaim.errors' table says."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from netclaim._proto import dra_v1_pb2, dra_v1beta1_pb2
from netclaim.adapters.kubeletplugin import PreparedDevice, _DraService
from netclaim.configure.status import ClaimRef
from netclaim.errors import (
    ApiRejectedError,
    ApiUnavailableError,
    CniError,
    CniTryAgainError,
    ConfigError,
    ConflictError,
    GoneError,
    PodBusyError,
    StateStoreError,
)
from tests.corpus import VALID_CONFIG
from tests.unit.fakes import (
    ConfigureRig,
    configure_rig,
    sample_allocation,
    sample_claim,
    sample_config,
    sample_device,
)

DEVICES = [
    PreparedDevice("net", "node-1", "dev-a", "share-1"),
    PreparedDevice("net2", "node-1", "dev-b", None),
]


@dataclass
class FakePreparer:
    """A ClaimPreparer that answers DEVICES, or raises what `failures` holds for a claim's name."""

    failures: dict[str, Exception] = field(default_factory=dict)
    report_fails_with: Exception | None = None
    prepared: list[str] = field(default_factory=list)
    reported: list[tuple[str, str]] = field(default_factory=list)  # (claim, message)
    unprepared: list[str] = field(default_factory=list)

    async def prepare(self, namespace: str, name: str, uid: str) -> list[PreparedDevice]:
        self.prepared.append(name)
        if name in self.failures:
            raise self.failures[name]
        return DEVICES

    async def report_failure(self, namespace: str, name: str, uid: str, message: str) -> None:
        self.reported.append((name, message))
        if self.report_fails_with is not None:
            raise self.report_fails_with

    async def unprepare(self, namespace: str, name: str, uid: str) -> None:
        self.unprepared.append(name)
        if name in self.failures:
            raise self.failures[name]


def _claims(pb: Any, *names: str) -> list[Any]:
    return [pb.Claim(namespace="team-a", name=name, uid=f"uid-{name}") for name in names]


async def _prepare(preparer: Any, *names: str, pb: Any = dra_v1_pb2) -> Any:
    request = pb.NodePrepareResourcesRequest(claims=_claims(pb, *names))
    return await _DraService(preparer, preparer, pb).prepare(request)


async def _unprepare(preparer: Any, *names: str) -> Any:
    request = dra_v1_pb2.NodeUnprepareResourcesRequest(claims=_claims(dra_v1_pb2, *names))
    return await _DraService(preparer, preparer, dra_v1_pb2).unprepare(request)


async def test_prepared_devices_are_answered_per_claim_with_their_share_id() -> None:
    response = await _prepare(FakePreparer(), "a", "b")
    assert sorted(response.claims) == ["uid-a", "uid-b"]
    answer = response.claims["uid-a"]
    assert answer.error == ""
    assert [(list(d.request_names), d.pool_name, d.device_name, d.share_id) for d in answer.devices] == [
        (["net"], "node-1", "dev-a", "share-1"),
        (["net2"], "node-1", "dev-b", ""),
    ]


async def test_v1beta1_answers_without_share_ids() -> None:
    response = await _prepare(FakePreparer(), "a", pb=dra_v1beta1_pb2)
    assert isinstance(response, dra_v1beta1_pb2.NodePrepareResourcesResponse)
    assert [d.device_name for d in response.claims["uid-a"].devices] == ["dev-a", "dev-b"]


@pytest.mark.parametrize(
    "error",
    [
        ConfigError("config.plugins[0].master: 'eth0' is not the allocated device"),
        CniError("macvlan", "VERSION", 1, "x"),
    ],
    ids=["config", "cni"],
)
async def test_a_claim_that_cannot_work_is_its_error_and_is_reported(error: Exception) -> None:
    preparer = FakePreparer(failures={"bad": error})
    response = await _prepare(preparer, "bad", "good")
    assert response.claims["uid-bad"].error == str(error)
    assert list(response.claims["uid-bad"].devices) == []
    assert preparer.reported == [("bad", str(error))]
    assert response.claims["uid-good"].error == ""  # one claim's failure is that claim's only
    assert len(response.claims["uid-good"].devices) == 2


@pytest.mark.parametrize(
    "error",
    [
        GoneError("claim team-a/bad: not found"),
        ApiUnavailableError("503"),
        ConflictError("409"),
        PodBusyError("busy"),
        StateStoreError("database is locked"),
        CniTryAgainError("macvlan", "VERSION", 11, "timed out after 10.00 s"),
        ApiRejectedError("403 (check the agent's RBAC)"),
    ],
    ids=lambda e: type(e).__name__,
)
async def test_a_claim_that_may_work_later_is_its_error_only(error: Exception) -> None:
    preparer = FakePreparer(failures={"bad": error})
    response = await _prepare(preparer, "bad")
    assert response.claims["uid-bad"].error == str(error)
    assert preparer.reported == []  # the user is not blamed: no condition, no Event


async def test_a_bug_is_an_internal_error_and_the_call_still_answers() -> None:
    preparer = FakePreparer(failures={"bad": KeyError("plan")})
    response = await _prepare(preparer, "bad", "good")
    assert response.claims["uid-bad"].error == "internal error in the netclaim agent (KeyError); see its log"
    assert preparer.reported == []
    assert len(response.claims["uid-good"].devices) == 2


async def test_a_failure_that_cannot_be_reported_is_still_the_claims_error() -> None:
    preparer = FakePreparer(
        failures={"bad": ConfigError("bad config")}, report_fails_with=ApiUnavailableError("503")
    )
    response = await _prepare(preparer, "bad")
    assert response.claims["uid-bad"].error == "bad config"


async def test_unprepare_answers_per_claim_and_reports_nothing() -> None:
    preparer = FakePreparer(failures={"bad": ConfigError("x"), "buggy": RuntimeError("y")})
    response = await _unprepare(preparer, "good", "bad", "buggy")
    assert preparer.unprepared == ["good", "bad", "buggy"]
    assert response.claims["uid-good"].error == ""
    assert response.claims["uid-bad"].error == "x"
    assert response.claims["uid-buggy"].error.startswith("internal error")
    assert preparer.reported == []  # a failed unprepare is retried by kubelet, not blamed on the config


# The table end to end: the real Preparer and StatusWriter behind the service, the API server faked.

NIC = sample_device("enp1s0")


@pytest.fixture
def rig(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ConfigureRig]:
    built = configure_rig(tmp_path, monkeypatch)
    built.catalog.update([NIC])
    yield built
    built.store.close()


def _ready_conditions(rig: ConfigureRig, name: str) -> list[tuple[str, str]]:
    return [
        (e["conditions"][0]["status"], e["conditions"][0]["reason"])
        for e in rig.entries(ClaimRef("team-a", name, ""))
    ]


async def test_a_bad_config_gets_prepare_failed_on_its_device_and_a_warning_on_its_pod(
    rig: ConfigureRig,
) -> None:
    master_eth0 = {
        **VALID_CONFIG,
        "config": {**VALID_CONFIG["config"], "plugins": [{"type": "macvlan", "master": "eth0"}]},
    }
    rig.api.add_claim(
        sample_claim((sample_allocation(NIC),), (sample_config(master_eth0),), name="bad", uid="uid-bad")
    )
    response = await _prepare(rig.preparer, "bad")
    assert "config.plugins[0].master: 'eth0' is not the allocated device" in response.claims["uid-bad"].error
    assert [(e.pod, e.reason) for e in rig.api.events] == [("pod-1", "NetclaimPrepareFailed")]
    await rig.settle()
    assert _ready_conditions(rig, "bad") == [("False", "PrepareFailed")]


async def test_an_unavailable_api_gets_no_condition_and_no_event(rig: ConfigureRig) -> None:
    rig.api.add_claim(
        sample_claim((sample_allocation(NIC),), (sample_config(VALID_CONFIG),), name="ok", uid="uid-ok")
    )
    rig.api.fail_next = [ApiUnavailableError("503")]
    response = await _prepare(rig.preparer, "ok")
    assert response.claims["uid-ok"].error == "503"
    await rig.settle()
    assert rig.api.events == []
    assert rig.entries(ClaimRef("team-a", "ok", "")) == []
    retried = await _prepare(rig.preparer, "ok")  # kubelet retries
    assert retried.claims["uid-ok"].error == ""
    await rig.settle()
    assert _ready_conditions(rig, "ok") == [("False", "WaitingForPodSandbox")]

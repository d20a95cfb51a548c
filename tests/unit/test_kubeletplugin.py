"""The DRAPlugin service: per-claim answers, and each error class mapped as netclaim.errors' table says."""

from __future__ import annotations

import asyncio
import datetime
import stat
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from grpclib.client import Channel
from grpclib.const import Status
from grpclib.exceptions import GRPCError

from netclaim._proto import (
    dra_health_v1_grpc,
    dra_health_v1_pb2,
    dra_v1_grpc,
    dra_v1_pb2,
    pluginregistration_grpc,
    pluginregistration_pb2,
)
from netclaim.adapters.kubeletplugin import (
    SUPPORTED_VERSIONS,
    KubeletPlugin,
    _DraService,
    serve,
    socket_paths,
)
from netclaim.agent.status import ClaimRef
from netclaim.core.devices.catalog import LINK_DOWN, Device, DeviceCatalog, Taint
from netclaim.core.node import PreparedDevice
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
from netclaim.runtime.metrics import REGISTRY
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
    hold: asyncio.Event | None = None  # prepare waits for it

    async def prepare(self, namespace: str, name: str, uid: str) -> list[PreparedDevice]:
        self.prepared.append(name)
        if self.hold is not None:
            await self.hold.wait()
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
    built = configure_rig(tmp_path)
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


# Over the sockets, as kubelet calls: a grpclib client on the unix sockets serve() opens.

DRIVER = "net.example.com"


@dataclass
class Served:
    plugin: KubeletPlugin
    preparer: FakePreparer
    registration_socket: Path
    dra_socket: Path
    registered: list[bool]
    catalog: DeviceCatalog


def _nic(name: str, *taints: Taint) -> Device:
    return Device(name=name, if_name=name, shared=True, taints=taints)


@pytest.fixture
async def served() -> AsyncIterator[Served]:
    # not tmp_path: a worker's is long enough to take a unix socket's path past its 108 bytes, as
    # kubelet's own plugin directories never do
    with tempfile.TemporaryDirectory(prefix="nc-kp-") as name:
        directory = Path(name)
        registration_socket, dra_socket = socket_paths(directory, DRIVER)
        for stale in (registration_socket, dra_socket):  # a previous run's, or anything: replaced
            stale.parent.mkdir(parents=True, exist_ok=True)
            stale.write_text("stale")
        preparer = FakePreparer(failures={"bad": ConfigError("config.plugins[0]: no such plugin")})
        registered: list[bool] = []
        catalog = DeviceCatalog()
        catalog.update([_nic("enp1s0"), _nic("enp2s0")])
        plugin = await serve(preparer, preparer, catalog, directory, DRIVER, "node-1", registered.append)
        yield Served(plugin, preparer, registration_socket, dra_socket, registered, catalog)
        await plugin.stop()


async def _until(condition: Callable[[], bool]) -> None:
    async def reached() -> None:
        while not condition():  # noqa: ASYNC110 - a condition on the fakes' state and the files: polled
            await asyncio.sleep(0.005)

    await asyncio.wait_for(reached(), 5)


def _calls(call: str, outcome: str) -> float:
    return (
        REGISTRY.get_sample_value("netclaim_kubelet_calls_total", {"call": call, "outcome": outcome}) or 0.0
    )


async def test_kubelet_registers_the_plugin_over_its_socket(served: Served) -> None:
    for socket in (served.registration_socket, served.dra_socket):
        mode = socket.stat().st_mode
        assert stat.S_ISSOCK(mode)
        assert stat.S_IMODE(mode) == 0o600
    channel = Channel(path=str(served.registration_socket))
    try:
        registration = pluginregistration_grpc.RegistrationStub(channel)
        info = await registration.GetInfo(pluginregistration_pb2.InfoRequest())
        assert (info.type, info.name, info.endpoint) == ("DRAPlugin", DRIVER, str(served.dra_socket))
        assert list(info.supported_versions) == SUPPORTED_VERSIONS
        await registration.NotifyRegistrationStatus(
            pluginregistration_pb2.RegistrationStatus(plugin_registered=True)
        )
        await registration.NotifyRegistrationStatus(
            pluginregistration_pb2.RegistrationStatus(plugin_registered=False, error="version")
        )
    finally:
        channel.close()
    assert served.registered == [True, False]


async def test_kubelet_prepares_and_unprepares_over_the_dra_socket(served: Served) -> None:
    ok_before, error_before = _calls("prepare", "ok"), _calls("prepare", "error")
    channel = Channel(path=str(served.dra_socket))
    try:
        v1 = dra_v1_grpc.DRAPluginStub(channel)
        answer = await v1.NodePrepareResources(
            dra_v1_pb2.NodePrepareResourcesRequest(claims=_claims(dra_v1_pb2, "a", "bad"))
        )
        assert sorted(answer.claims) == ["uid-a", "uid-bad"]
        devices = answer.claims["uid-a"].devices
        assert [(list(d.request_names), d.pool_name, d.device_name, d.share_id) for d in devices] == [
            (["net"], "node-1", "dev-a", "share-1"),
            (["net2"], "node-1", "dev-b", ""),
        ]
        assert answer.claims["uid-a"].error == ""
        assert answer.claims["uid-bad"].error == "config.plugins[0]: no such plugin"
        assert list(answer.claims["uid-bad"].devices) == []
        assert served.preparer.reported == [("bad", "config.plugins[0]: no such plugin")]

        gone = await v1.NodeUnprepareResources(
            dra_v1_pb2.NodeUnprepareResourcesRequest(claims=_claims(dra_v1_pb2, "a", "bad"))
        )
        assert {uid: c.error for uid, c in gone.claims.items()} == {
            "uid-a": "",
            "uid-bad": "config.plugins[0]: no such plugin",
        }
    finally:
        channel.close()
    assert served.preparer.unprepared == ["a", "bad"]
    assert (_calls("prepare", "ok") - ok_before, _calls("prepare", "error") - error_before) == (1, 1)


async def test_stop_lets_a_call_under_way_finish_refuses_new_ones_and_removes_the_sockets(
    served: Served,
) -> None:
    served.preparer.hold = asyncio.Event()
    channel = Channel(path=str(served.dra_socket))
    try:
        v1 = dra_v1_grpc.DRAPluginStub(channel)
        under_way = asyncio.create_task(
            v1.NodePrepareResources(dra_v1_pb2.NodePrepareResourcesRequest(claims=_claims(dra_v1_pb2, "a")))
        )
        await _until(lambda: served.preparer.prepared == ["a"])
        stopping = asyncio.create_task(served.plugin.stop())
        await _until(lambda: not served.dra_socket.exists())
        assert not served.registration_socket.exists()  # kubelet drops the plugin first
        with pytest.raises(GRPCError) as refused:
            await v1.NodeUnprepareResources(
                dra_v1_pb2.NodeUnprepareResourcesRequest(claims=_claims(dra_v1_pb2, "a"))
            )
        assert refused.value.status == Status.UNAVAILABLE
        served.preparer.hold.set()
        async with asyncio.timeout(5):  # grpclib's close() would cancel it: no answer then, ever
            answer = await under_way
            await stopping
        assert len(answer.claims["uid-a"].devices) == 2
    finally:
        channel.close()
    assert served.preparer.unprepared == []


async def test_kubelet_is_sent_every_devices_health_at_once_and_at_each_change(served: Served) -> None:
    """What kubelet 1.37 shows in each pod's allocatedResourcesStatus: the stream it opens on the DRA
    socket, since the registration names v1.DRAResourceHealth."""
    assert "v1.DRAResourceHealth" in SUPPORTED_VERSIONS
    before = REGISTRY.get_sample_value("netclaim_health_reports_total") or 0.0
    channel = Channel(path=str(served.dra_socket))
    try:
        health = dra_health_v1_grpc.DRAResourceHealthStub(channel)
        async with health.NodeWatchResources.open() as stream:
            await stream.send_message(dra_health_v1_pb2.NodeWatchResourcesRequest(), end=True)

            async def report() -> dict[tuple[str, str], tuple[int, str, int]]:
                response = await asyncio.wait_for(stream.recv_message(), 5)
                assert response is not None
                return {
                    (d.device.pool_name, d.device.device_name): (
                        d.health,
                        d.message,
                        d.health_check_timeout_seconds,
                    )
                    for d in response.devices
                }

            healthy = (dra_health_v1_pb2.HEALTHY, "", 30)
            assert await report() == {("node-1", "enp1s0"): healthy, ("node-1", "enp2s0"): healthy}
            loss = datetime.datetime(2026, 12, 2, 22, 0, tzinfo=datetime.UTC)
            served.catalog.update([_nic("enp1s0"), _nic("enp2s0", Taint(LINK_DOWN, "NoSchedule", loss))])
            assert await report() == {
                ("node-1", "enp1s0"): healthy,
                ("node-1", "enp2s0"): (
                    dra_health_v1_pb2.UNHEALTHY,
                    "enp2s0: link down (no carrier) since 2026-12-02T22:00:00Z",
                    30,
                ),
            }
            await stream.cancel()
    finally:
        channel.close()
    assert (REGISTRY.get_sample_value("netclaim_health_reports_total") or 0.0) == before + 2

"""ResourceClaim.status.devices entries for each state, the patch written, and the writer's retries."""

from __future__ import annotations

import ast
import asyncio
import copy
import datetime
import json
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import msgspec
import pytest

from netclaim.agent import status as status_module
from netclaim.agent.status import (
    MAX_CONFLICT_RETRIES,
    NETWORK_STATUS,
    ClaimRef,
    Failure,
    PodRef,
    StatusWriter,
    device_entry,
    follow_links,
    network_status,
)
from netclaim.agent.store import Interface, Outcome, State, Store
from netclaim.core.devices.catalog import LINK_DOWN, DeviceCatalog, Taint
from netclaim.core.events import EventReason
from netclaim.core.objects import Claim, Pod
from netclaim.core.plan import NicRecord
from netclaim.errors import ApiRejectedError, ApiUnavailableError, GoneError
from netclaim.runtime.backoff import Backoff
from netclaim.runtime.supervisor import Supervisor
from tests.unit.fakes import SAMPLE_DRIVER, FakeKubeApi, sample_claim, sample_device, sample_row

CLAIM = ClaimRef("team-a", "claim-1", "claim-uid-1")
ROW = sample_row(sample_device("enp1s0"), share_id="share-1")
CNI_RESULT = {"cniVersion": "1.0.0", "ips": [{"address": "10.90.0.10/24"}]}
ATTACHED = ROW.with_state(
    State.ATTACHED,
    sandbox_id="sandbox-1",
    outcome=Outcome(
        cni_args="IgnoreUnknown=1",
        cni_result=CNI_RESULT,
        interface=Interface(
            name="net1",
            mac="02:00:0a:5a:00:0a",
            mtu=1500,
            addresses=("fd00:0:0:0::a/64", "10.90.0.10/24", "10.90.0.10/24"),
        ),
    ),
)
OTHER_DRIVERS_ENTRY = {
    "driver": "gpu.example.com",
    "pool": "node-1",
    "device": "gpu-0",
    "conditions": [
        {"type": "Ready", "status": "True", "reason": "Up", "lastTransitionTime": "2026-01-01T00:00:00Z"}
    ],
    "data": {"kept": ["as", "written"]},
}


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    opened = Store(tmp_path / "state")
    yield opened
    opened.close()


@pytest.fixture
def api() -> FakeKubeApi:
    found = FakeKubeApi()
    found.add_claim(sample_claim((), (), devices_status=(OTHER_DRIVERS_ENTRY,)))
    return found


@pytest.fixture
def writer(api: FakeKubeApi, store: Store) -> StatusWriter:
    return StatusWriter(api, SAMPLE_DRIVER, store, Supervisor(), pods=api)


def _ready(entry: dict[str, Any]) -> tuple[str, str, str]:
    [condition] = entry["conditions"]
    assert condition["type"] == "Ready"
    assert condition["lastTransitionTime"].endswith("Z")
    return condition["status"], condition["reason"], condition["message"]


def test_an_attached_device_is_ready_with_its_network_data_and_cni_result() -> None:
    entry = device_entry(SAMPLE_DRIVER, ATTACHED)
    assert _ready(entry) == ("True", "InterfaceAttached", "net1 is configured in the pod")
    assert entry["networkData"] == {
        "interfaceName": "net1",
        "ips": ["10.90.0.10/24", "fd00::a/64"],  # canonical, once each, sorted
        "hardwareAddress": "02:00:0a:5a:00:0a",
    }
    assert entry["data"] == CNI_RESULT
    assert (entry["driver"], entry["pool"], entry["device"], entry["shareID"]) == (
        SAMPLE_DRIVER,
        "node-1",
        ROW.device,
        "share-1",
    )


def test_an_attached_device_on_a_network_says_which_in_data_beside_the_cni_result() -> None:
    nic = ATTACHED.plan.nic
    on_lan3 = msgspec.structs.replace(nic, attributes={**nic.attributes, "netclaim.dev/network": "lan3"})
    row = replace(ATTACHED, plan=msgspec.structs.replace(ATTACHED.plan, nic=on_lan3))
    assert device_entry(SAMPLE_DRIVER, row)["data"] == {**CNI_RESULT, "netclaim.dev/network": "lan3"}
    without_result = replace(row, outcome=msgspec.structs.replace(row.outcome, cni_result=None))
    assert device_entry(SAMPLE_DRIVER, without_result)["data"] == {"netclaim.dev/network": "lan3"}


def test_an_attached_device_without_a_cni_result_has_no_data() -> None:
    row = replace(ATTACHED, outcome=msgspec.structs.replace(ATTACHED.outcome, cni_result=None))
    assert "data" not in device_entry(SAMPLE_DRIVER, row)


@pytest.mark.parametrize(
    ("state", "reason"),
    [
        (State.PREPARED, "WaitingForPodSandbox"),
        (State.ATTACHING, "Attaching"),
        (State.DETACHED, "Detached"),
        (State.ATTACHED, "Attaching"),  # no interface read back yet: not ready
    ],
)
def test_a_device_not_attached_is_not_ready_with_its_states_reason(state: State, reason: str) -> None:
    entry = device_entry(SAMPLE_DRIVER, sample_row().with_state(state))
    assert _ready(entry)[:2] == ("False", reason)
    assert "networkData" not in entry
    assert "shareID" not in entry  # only for a share of a shared device


def test_a_failed_attach_is_not_ready_with_its_error() -> None:
    row = ROW.with_state(State.PREPARED, error="claim team-a/claim-1 device d: CNI ADD macvlan: code 7: down")
    assert _ready(device_entry(SAMPLE_DRIVER, row)) == (
        "False",
        "AttachFailed",
        "claim team-a/claim-1 device d: CNI ADD macvlan: code 7: down",
    )


async def test_the_patch_replaces_our_entries_and_keeps_other_drivers_verbatim(
    api: FakeKubeApi, store: Store, writer: StatusWriter
) -> None:
    stale_ours = {"driver": SAMPLE_DRIVER, "pool": "node-1", "device": "gone-device", "conditions": []}
    claim = api.claims[("team-a", "claim-1")]
    api.add_claim(replace(claim, devices_status=(OTHER_DRIVERS_ENTRY, stale_ours)))
    await store.put(ATTACHED)
    await writer.write(CLAIM)
    written = api.claims[("team-a", "claim-1")].devices_status
    assert written[0] == OTHER_DRIVERS_ENTRY
    assert [e["device"] for e in written] == ["gpu-0", ROW.device]
    assert written[1] == {**device_entry(SAMPLE_DRIVER, ATTACHED), "conditions": written[1]["conditions"]}
    assert api.calls == ["get_claim", "write_claim_devices"]


async def test_nothing_is_written_when_the_entries_did_not_change(
    api: FakeKubeApi, store: Store, writer: StatusWriter
) -> None:
    await store.put(ATTACHED)
    await writer.write(CLAIM)
    api.calls.clear()
    await writer.write(CLAIM)  # the timestamps differ, the entries do not
    assert api.calls == []  # the claim as last written is known: not even read
    await store.put(ATTACHED.with_state(State.DETACHED, outcome=Outcome()))
    await writer.write(CLAIM)
    assert "write_claim_devices" in api.calls


async def test_a_claim_replaced_by_another_of_the_same_name_is_not_written(
    api: FakeKubeApi, store: Store, writer: StatusWriter
) -> None:
    await store.put(ATTACHED)
    api.add_claim(sample_claim((), (), uid="another-uid"))
    await writer.write(CLAIM)
    assert api.calls == ["get_claim"]


async def test_a_claim_that_failed_to_prepare_reports_each_of_its_devices_until_forgotten(
    api: FakeKubeApi, store: Store, writer: StatusWriter
) -> None:
    failure = Failure(
        (("node-1", "dev-a", ""), ("node-1", "dev-b", "share-9")), "PrepareFailed", "bad config"
    )
    writer.fail(CLAIM, failure)
    await writer.write(CLAIM)
    ours = [e for e in api.claims[("team-a", "claim-1")].devices_status if e["driver"] == SAMPLE_DRIVER]
    assert [(e["device"], e.get("shareID"), _ready(e)) for e in ours] == [
        ("dev-a", None, ("False", "PrepareFailed", "bad config")),
        ("dev-b", "share-9", ("False", "PrepareFailed", "bad config")),
    ]
    await store.put(ROW)  # prepared after all (kubelet retried): the rows speak, not the old failure
    assert [_ready(e)[1] for e in writer.desired(CLAIM)] == ["WaitingForPodSandbox"]
    await store.delete(ROW)
    writer.forget(CLAIM)  # unprepared
    await writer.write(CLAIM)
    assert api.claims[("team-a", "claim-1")].devices_status == (OTHER_DRIVERS_ENTRY,)


def test_a_claim_queued_twice_is_written_once(writer: StatusWriter) -> None:
    writer.enqueue(CLAIM)
    writer.enqueue(CLAIM)
    writer.forget(CLAIM)
    assert list(writer._queued) == [CLAIM]


class _Backoff(Backoff):
    """Each target's backoff in the tests: a millisecond, counted."""

    waits = 0

    def __init__(self) -> None:
        super().__init__(first=0.001, cap=0.001)

    def next(self) -> float:
        type(self).waits += 1
        return super().next()


class _RacingApi(FakeKubeApi):
    """Another writer changes the claim between our read and our write, `races` times; `on_read` runs
    before each read of a claim."""

    races = 1
    written = asyncio.Event()
    on_read: Callable[[], None] | None = None

    async def get_claim(self, namespace: str, name: str) -> Claim:
        if self.on_read is not None:
            self.on_read()
        return await super().get_claim(namespace, name)

    async def write_claim_devices(
        self, claim: Claim, driver: str, entries: list[dict[str, Any]]
    ) -> str | None:
        if self.races:
            self.races -= 1
            current = self.claims[(claim.namespace, claim.name)]
            theirs = {**copy.deepcopy(OTHER_DRIVERS_ENTRY), "device": f"gpu-{len(current.devices_status)}"}
            raced = str(int(current.resource_version) + 1)
            self.add_claim(
                replace(current, resource_version=raced, devices_status=(*current.devices_status, theirs))
            )
        version = await super().write_claim_devices(claim, driver, entries)
        self.written.set()
        return version


@pytest.fixture
def backoff() -> type[_Backoff]:
    _Backoff.waits = 0
    return _Backoff


async def _run_until_written(writer: StatusWriter, api: _RacingApi) -> None:
    api.written = asyncio.Event()
    running = asyncio.create_task(writer.run())
    try:
        # a safety net, not a measurement: a writer that gave up would otherwise hang the test run
        await asyncio.wait_for(api.written.wait(), timeout=30)
    finally:
        running.cancel()
        with pytest.raises(asyncio.CancelledError):
            await running


@pytest.mark.parametrize(
    ("races", "waits"), [(1, 0), (MAX_CONFLICT_RETRIES, 0), (MAX_CONFLICT_RETRIES + 1, 1)]
)
async def test_a_conflicting_write_is_retried_on_the_claim_as_it_is_now(
    store: Store, backoff: type[_Backoff], races: int, waits: int
) -> None:
    api = _RacingApi()
    api.races = races
    api.add_claim(sample_claim((), (), devices_status=(OTHER_DRIVERS_ENTRY,)))
    writer = StatusWriter(api, SAMPLE_DRIVER, store, Supervisor(), pods=api, retry=backoff)
    await store.put(ATTACHED)
    writer.enqueue(CLAIM)
    await _run_until_written(writer, api)
    written = api.claims[("team-a", "claim-1")].devices_status
    theirs = [f"gpu-{n}" for n in range(races + 1)]
    assert [e["device"] for e in written] == [*theirs, ROW.device]  # every other writer's entry kept
    assert backoff.waits == waits  # re-read at once a few times, then back off


async def test_a_gone_claim_is_dropped_and_an_unavailable_api_retried(
    store: Store, backoff: type[_Backoff]
) -> None:
    api = _RacingApi()
    api.races = 0
    api.add_claim(sample_claim((), ()))
    writer = StatusWriter(api, SAMPLE_DRIVER, store, Supervisor(), pods=api, retry=backoff)
    await store.put(ATTACHED)
    writer.enqueue(ClaimRef("team-a", "deleted-claim", "uid-x"))
    writer.enqueue(CLAIM)
    api.fail_next = [GoneError("deleted"), ApiUnavailableError("503"), ApiUnavailableError("503")]
    await _run_until_written(writer, api)
    assert backoff.waits == 2  # for the unavailable API only: nothing is retried for a deleted claim
    assert [e["device"] for e in api.claims[("team-a", "claim-1")].devices_status] == [ROW.device]


async def test_a_write_failing_on_a_bug_is_retried(store: Store, backoff: type[_Backoff]) -> None:
    api = _RacingApi()
    api.races = 0
    api.add_claim(sample_claim((), ()))
    writer = StatusWriter(api, SAMPLE_DRIVER, store, Supervisor(), pods=api, retry=backoff)
    await store.put(ATTACHED)
    writer.enqueue(CLAIM)
    api.fail_next = [KeyError("bug")]  # type: ignore[list-item]
    await _run_until_written(writer, api)
    assert backoff.waits == 1


async def test_a_claim_queued_again_while_retrying_is_written_from_the_new_request(
    store: Store, backoff: type[_Backoff]
) -> None:
    api = _RacingApi()
    api.races = 0
    api.add_claim(sample_claim((), ()))
    writer = StatusWriter(api, SAMPLE_DRIVER, store, Supervisor(), pods=api, retry=backoff)
    writer.enqueue(CLAIM)

    def a_hook_asks_again() -> None:  # while the first write is failing
        writer.enqueue(CLAIM)
        api.on_read = None

    api.on_read = a_hook_asks_again
    api.fail_next = [ApiUnavailableError("503")]
    await store.put(ATTACHED)
    await _run_until_written(writer, api)
    assert backoff.waits == 0  # no wait: the newer request goes straight on


async def test_a_warning_event_failing_to_be_written_is_not_an_error(
    writer: StatusWriter, api: FakeKubeApi
) -> None:
    api.fail_next = [ApiUnavailableError("503")]
    await writer.warn("team-a", "pod-1", "pod-uid-1", EventReason.PREPARE_FAILED, "bad config")
    assert api.events == []
    await writer.warn("team-a", "pod-1", "pod-uid-1", EventReason.PREPARE_FAILED, "bad config")
    assert [(e.pod_uid, e.reason, e.message) for e in api.events] == [
        ("pod-uid-1", "NetclaimPrepareFailed", "bad config")
    ]


# the pod's k8s.v1.cni.cncf.io/network-status annotation (Multus's schema)

MULTUS_ENTRY = {"name": "default/flannel", "interface": "eth0", "ips": ["10.244.1.5"], "default": True}


def _pod(annotation: str | None = None, uid: str = "pod-uid-1") -> dict[str, Any]:
    annotations = {NETWORK_STATUS: annotation} if annotation is not None else {}
    return {
        "metadata": {
            "namespace": "team-a",
            "name": "pod-1",
            "uid": uid,
            "resourceVersion": "7",
            "annotations": annotations,
        },
        "spec": {"resourceClaims": [{"name": "fast-net", "resourceClaimTemplateName": "t"}]},
        "status": {"resourceClaimStatuses": [{"name": "fast-net", "resourceClaimName": "claim-1"}]},
    }


def _read(annotation: str | None = None) -> Pod:
    """The pod as the status writer reads it."""
    return Pod.from_api(_pod(annotation))


def test_network_status_names_each_attached_interface_by_the_pods_claim_and_keeps_other_writers() -> None:
    stale = {"name": "team-a/fast-net", "interface": "net9", "ips": ["10.0.0.9"]}
    prepared = sample_row(sample_device("enp2s0"), interface_name="net2")
    assert network_status(_read(json.dumps([MULTUS_ENTRY, stale])), [ATTACHED, prepared]) == [
        MULTUS_ENTRY,
        {
            "name": "team-a/fast-net",
            "interface": "net1",
            "ips": ["10.90.0.10", "fd00::a"],
            "mac": "02:00:0a:5a:00:0a",
            "mtu": 1500,
            "default": False,
            "dns": {},
        },
    ]


def test_network_status_gives_a_whole_pci_nic_its_device_info() -> None:
    device = sample_device("enp1s0", shared=False)
    device = replace(device, attributes={**device.attributes, "netclaim.dev/pciAddress": "0000:03:00.0"})
    row = replace(ATTACHED, plan=msgspec.structs.replace(ATTACHED.plan, nic=NicRecord.of(device)))
    [entry] = network_status(_read(), [row])
    assert entry["device-info"] == {"type": "pci", "version": "1.1.0", "pci": {"pci-address": "0000:03:00.0"}}
    [shared] = network_status(_read(), [ATTACHED])  # a NIC shared through macvlan: the pod has no PCI device
    assert "device-info" not in shared


def test_an_unreadable_network_status_is_replaced_by_ours() -> None:
    assert [e["interface"] for e in network_status(_read("{not json"), [ATTACHED])] == ["net1"]
    assert [e["interface"] for e in network_status(_read('{"a": 1}'), [ATTACHED])] == ["net1"]


async def test_the_annotation_is_written_once_on_the_pod_as_read(
    writer: StatusWriter, api: FakeKubeApi, store: Store
) -> None:
    await store.put(ATTACHED)
    api.pod_objects[("team-a", "pod-1")] = _pod(json.dumps([MULTUS_ENTRY]))
    pod = PodRef("team-a", "pod-1", "pod-uid-1")
    await writer.write(pod)
    await writer.write(pod)  # unchanged: not written again
    assert api.calls == ["get_pod", "write_pod_annotation", "get_pod"]
    written = json.loads(api.pod_objects[("team-a", "pod-1")]["metadata"]["annotations"][NETWORK_STATUS])
    assert written == network_status(_read(json.dumps([MULTUS_ENTRY])), [ATTACHED])


async def test_the_annotation_is_not_written_for_a_new_pod_of_the_same_name_nor_when_opted_out(
    api: FakeKubeApi, store: Store
) -> None:
    await store.put(ATTACHED)
    api.pod_objects[("team-a", "pod-1")] = _pod(uid="another-pod")
    pod = PodRef("team-a", "pod-1", "pod-uid-1")
    await StatusWriter(api, SAMPLE_DRIVER, store, Supervisor(), pods=api).write(pod)
    assert api.calls == ["get_pod"]
    opted_out = StatusWriter(api, SAMPLE_DRIVER, store, Supervisor())
    opted_out.enqueue(pod)
    assert opted_out._queued == {}


async def test_a_pod_whose_interfaces_are_not_attached_is_not_annotated(
    writer: StatusWriter, api: FakeKubeApi, store: Store
) -> None:
    await store.put(ROW)
    api.pod_objects[("team-a", "pod-1")] = _pod()
    await writer.write(PodRef("team-a", "pod-1", "pod-uid-1"))
    assert api.calls == []


class _RacingPodApi(FakeKubeApi):
    """Multus writes its own entry between our read of the pod and our write, once."""

    written = asyncio.Event()
    raced = False

    async def write_pod_annotation(self, pod: Pod, key: str, value: str) -> None:
        if not self.raced:
            self.raced = True
            current = self.pod_objects[("team-a", "pod-1")]["metadata"]
            current["annotations"][key] = json.dumps([MULTUS_ENTRY])
            current["resourceVersion"] = "8"
        await super().write_pod_annotation(pod, key, value)
        self.written.set()


async def test_a_conflicting_annotation_write_is_retried_keeping_what_the_other_writer_wrote(
    store: Store, backoff: type[_Backoff]
) -> None:
    api = _RacingPodApi()
    api.pod_objects[("team-a", "pod-1")] = _pod()
    writer = StatusWriter(api, SAMPLE_DRIVER, store, Supervisor(), pods=api, retry=backoff)
    await store.put(ATTACHED)
    writer.enqueue(PodRef("team-a", "pod-1", "pod-uid-1"))
    api.written = asyncio.Event()
    running = asyncio.create_task(writer.run())
    try:
        await asyncio.wait_for(api.written.wait(), timeout=30)  # a safety net, as above
    finally:
        running.cancel()
        with pytest.raises(asyncio.CancelledError):
            await running
    written = json.loads(api.pod_objects[("team-a", "pod-1")]["metadata"]["annotations"][NETWORK_STATUS])
    assert [e["interface"] for e in written] == ["eth0", "net1"]
    assert api.calls.count("write_pod_annotation") == 2 and backoff.waits == 0


class _RefusingPodApi(_RacingApi):
    """Another admission webhook refuses every pod patch; claim writes go through."""

    races = 0

    async def write_pod_annotation(self, pod: Pod, key: str, value: str) -> None:
        self._call("write_pod_annotation")
        raise ApiRejectedError("pod team-a/pod-1: admission webhook denied the request")


async def test_a_pod_write_refused_for_good_is_dropped_and_never_holds_up_the_claims(
    store: Store, backoff: type[_Backoff]
) -> None:
    api = _RefusingPodApi()
    api.add_claim(sample_claim((), ()))
    api.pod_objects[("team-a", "pod-1")] = _pod()
    writer = StatusWriter(api, SAMPLE_DRIVER, store, Supervisor(), pods=api, retry=backoff)
    await store.put(ATTACHED)
    writer.enqueue(PodRef("team-a", "pod-1", "pod-uid-1"))
    writer.enqueue(CLAIM)
    await _run_until_written(writer, api)
    assert api.calls.count("write_pod_annotation") == 1  # not retried
    assert [e["device"] for e in api.claims[("team-a", "claim-1")].devices_status] == [ATTACHED.device]


def test_the_status_writer_imports_no_adapter() -> None:
    """It imported the NRI adapter's PodSandbox only for a pod's namespace, name and UID, which a PodRef
    says: the core's status writer depends on no protocol's adapter (an import contract says it too)."""
    tree = ast.parse(Path(status_module.__file__).read_text())
    imported = {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    imported |= {
        alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names
    }
    assert not {name for name in imported if name.startswith("netclaim.adapters")}


# --- the NIC's link: LinkDown on the attached devices, Events on their pods ----------------------------

LOSS = datetime.datetime(2026, 12, 2, 22, 0, tzinfo=datetime.UTC)


def _catalog(down: bool) -> DeviceCatalog:
    catalog = DeviceCatalog()
    device = sample_device("enp1s0")
    taints = (Taint(LINK_DOWN, "NoSchedule", LOSS),) if down else ()
    catalog.update(
        [replace(device, taints=taints), sample_device("enp9s0", shared=False)], inside_pods={"dev-enp9s0"}
    )
    return catalog


def _link(entry: dict[str, Any]) -> tuple[str, str, str, str] | None:
    found = [c for c in entry["conditions"] if c["type"] == "LinkDown"]
    if not found:
        return None
    [condition] = found
    return condition["status"], condition["reason"], condition["message"], condition["lastTransitionTime"]


def test_an_attached_device_says_whether_its_nic_has_its_link() -> None:
    up = _link(device_entry(SAMPLE_DRIVER, ATTACHED, _catalog(down=False)))
    assert up is not None and up[:3] == ("False", "CarrierUp", "enp1s0 has its link")
    down = _link(device_entry(SAMPLE_DRIVER, ATTACHED, _catalog(down=True)))
    assert down == (
        "True",
        "NoCarrier",
        "enp1s0 lost its link (no carrier): the pod's net1 carries nothing",
        "2026-12-02T22:00:00Z",
    )
    assert device_entry(SAMPLE_DRIVER, ATTACHED, _catalog(down=True))["conditions"][0]["type"] == "Ready"
    inside = replace(ATTACHED, device="dev-enp9s0")
    assert _link(device_entry(SAMPLE_DRIVER, inside, _catalog(down=True))) is None, (
        "a link the node cannot see"
    )
    assert _link(device_entry(SAMPLE_DRIVER, ROW, _catalog(down=True))) is None, "not attached yet"


async def _until(condition: Callable[[], bool]) -> None:
    async def reached() -> None:
        while not condition():  # noqa: ASYNC110 - the fakes' state, polled
            await asyncio.sleep(0.005)

    await asyncio.wait_for(reached(), 5)


def _written_link(api: FakeKubeApi) -> str | None:
    claim = api.claims[("team-a", "claim-1")]
    ours = [e for e in claim.devices_status if e["driver"] == SAMPLE_DRIVER]
    found = _link(ours[0]) if ours else None
    return found[0] if found else None


async def test_a_link_going_down_and_back_rewrites_its_claims_and_tells_their_pods(
    api: FakeKubeApi, store: Store
) -> None:
    catalog = _catalog(down=False)
    supervisor = Supervisor()
    writer = StatusWriter(api, SAMPLE_DRIVER, store, supervisor, links=catalog)
    await store.put(ATTACHED, replace(ATTACHED, claim_uid="claim-uid-2", device="dev-enp2s0", share_id=""))
    tasks = [asyncio.create_task(follow_links(catalog, store, writer)), asyncio.create_task(writer.run())]
    try:
        await asyncio.sleep(0)
        catalog.update([replace(sample_device("enp1s0"), taints=(Taint(LINK_DOWN, "NoSchedule", LOSS),))])
        await _until(lambda: len(api.events) == 1 and _written_link(api) == "True")
        [event] = api.events
        assert (event.pod, event.reason, event.warning) == ("pod-1", "NetclaimLinkDown", True)
        assert event.message == "enp1s0: link down (no carrier) since 2026-12-02T22:00:00Z"
        catalog.update([sample_device("enp1s0")])
        await _until(lambda: len(api.events) == 2 and _written_link(api) == "False")
        assert (api.events[1].reason, api.events[1].warning) == ("NetclaimLinkUp", False)
        assert api.events[1].message == "enp1s0 has its link again: net1 carries traffic"
        assert [e.pod_uid for e in api.events] == ["pod-uid-1"] * 2, "the other device's claim is left alone"
    finally:
        for task in tasks:
            task.cancel()
        await supervisor.stop()

"""Device metadata inside the pod (KEP-5304): prepare writes each request's file and the CDI spec that
mounts it, the sandbox hook adds the interfaces, unprepare removes both."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from netclaim.agent.claims.metadata import API_VERSIONS, MAX_ATTRIBUTES, DeviceMetadataFiles
from netclaim.agent.status import ClaimRef
from netclaim.agent.store import Interface, Outcome, State
from netclaim.core.names import NETWORK
from netclaim.core.objects import Claim, ConsumerRef
from tests.corpus import VALID_CONFIG
from tests.unit.fakes import (
    ConfigureRig,
    configure_rig,
    sample_allocation,
    sample_claim,
    sample_config,
    sample_device,
    sample_row,
)

NIC = sample_device("enp1s0")
CLAIM = sample_claim((sample_allocation(NIC, "net", share_id="share-1"),), (sample_config(VALID_CONFIG),))
FROM_TEMPLATE = replace(CLAIM, pod_claim_name="fabric")


@pytest.fixture
def rig(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ConfigureRig]:
    built = configure_rig(tmp_path)
    built.catalog.update([NIC])
    yield built
    built.store.close()


def _stream(path: Path) -> list[dict[str, Any]]:
    """The file's objects, as a reader decodes a JSON stream."""
    text, decoder, found, at = path.read_text(), json.JSONDecoder(), [], 0
    while text[at:].strip():
        value, end = decoder.raw_decode(text, at)
        found.append(value)
        at = end + (len(text[end:]) - len(text[end:].lstrip()))
    return found


def _host_file(rig: ConfigureRig, claim: Claim = CLAIM, request: str = "net") -> Path:
    return (
        rig.root
        / "kubelet-plugin"
        / "dra-device-metadata"
        / f"team-a_{claim.name}"
        / request
        / "metadata.json"
    )


def _spec(rig: ConfigureRig, claim: Claim = CLAIM) -> dict[str, Any]:
    found: dict[str, Any] = json.loads((rig.root / "cdi" / "netclaim.dev_metadata.json").read_text())
    return found


def _attributes(rig: ConfigureRig) -> dict[str, Any]:
    [device] = _stream(_host_file(rig))[0]["requests"][0]["devices"]
    found: dict[str, Any] = device["attributes"]
    return found


async def _prepare(rig: ConfigureRig, claim: Claim = CLAIM) -> list[str]:
    rig.api.add_claim(claim)
    prepared = await rig.preparer.prepare(claim.namespace, claim.name, claim.uid)
    return [i for d in prepared for i in d.cdi_device_ids]


async def test_prepare_writes_the_requests_file_and_the_spec_that_mounts_it(rig: ConfigureRig) -> None:
    assert await _prepare(rig) == [f"netclaim.dev/metadata={CLAIM.uid}_net"]
    objects = _stream(_host_file(rig))
    assert [o["apiVersion"] for o in objects] == list(API_VERSIONS)  # newest first
    first = objects[0]
    assert first["kind"] == "DeviceMetadata" and "podClaimName" not in first
    assert first["metadata"] == {"name": CLAIM.name, "namespace": "team-a", "uid": CLAIM.uid, "generation": 1}
    [request] = first["requests"]
    [device] = request["devices"]
    assert (request["name"], device["driver"], device["pool"], device["name"]) == (
        "net",
        "netclaim.dev",
        "node-1",
        NIC.name,
    )
    assert device["attributes"]["netclaim.dev/ifName"] == {"string": "enp1s0"}
    assert "networkData" not in device  # deferred: the interface is not in the pod yet
    [mount] = _spec(rig)["devices"][0]["containerEdits"]["mounts"]
    assert mount == {
        "hostPath": str(_host_file(rig)),
        "containerPath": "/var/run/kubernetes.io/dra-device-attributes/resourceclaims/claim-1/net/"
        "netclaim.dev-metadata.json",
        "options": ["ro", "bind"],
    }
    assert _spec(rig)["kind"] == "netclaim.dev/metadata"
    # a device name that starts with a digit (most UIDs) is refused by the runtime below CDI 0.5.0
    assert tuple(int(p) for p in _spec(rig)["cdiVersion"].split(".")) >= (0, 5, 0)


async def test_a_claim_from_a_template_is_found_under_the_pods_name_for_it(rig: ConfigureRig) -> None:
    await _prepare(rig, FROM_TEMPLATE)
    assert _stream(_host_file(rig))[0]["podClaimName"] == "fabric"
    [mount] = _spec(rig)["devices"][0]["containerEdits"]["mounts"]
    assert mount["containerPath"] == (
        "/var/run/kubernetes.io/dra-device-attributes/resourceclaimtemplates/fabric/net/netclaim.dev-metadata.json"
    )


async def test_the_sandbox_hook_adds_the_interface_as_the_claim_status_shows_it(rig: ConfigureRig) -> None:
    await _prepare(rig)
    await rig.hooks.run_pod_sandbox(rig.sandbox(), 30.0)
    await rig.settle()
    objects = _stream(_host_file(rig))
    assert {o["metadata"]["generation"] for o in objects} == {2}
    [entry] = rig.entries(ClaimRef(CLAIM.namespace, CLAIM.name, CLAIM.uid))
    assert objects[0]["requests"][0]["devices"][0]["networkData"] == entry["networkData"]
    assert entry["networkData"]["interfaceName"] == "net1" and entry["networkData"]["ips"]


def _generations(rig: ConfigureRig) -> set[tuple[int, str]]:
    return {(o["metadata"]["generation"], o["podClaimName"]) for o in _stream(_host_file(rig))}


async def test_the_attach_writes_the_next_generation_without_reading_the_file_back(
    rig: ConfigureRig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What prepare wrote is kept in memory: the hook's write reads nothing. An agent started since reads
    the file once (its generation and the pod's name for the claim) and goes on from it."""
    await _prepare(rig, FROM_TEMPLATE)
    monkeypatch.setattr(Path, "read_text", lambda *_: pytest.fail("the hook read a file back"))
    await rig.hooks.run_pod_sandbox(rig.sandbox(), 30.0)
    monkeypatch.undo()
    assert {(o["metadata"]["generation"], o["podClaimName"]) for o in _stream(_host_file(rig))} == {
        (2, "fabric")
    }
    restarted = DeviceMetadataFiles(rig.metadata.root.parent, rig.metadata.spec_dir, rig.metadata.driver)
    restarted.attached(rig.store.for_claim(CLAIM.uid))
    assert {(o["metadata"]["generation"], o["podClaimName"]) for o in _stream(_host_file(rig))} == {
        (3, "fabric")
    }
    await restarted.remove(CLAIM.namespace, CLAIM.name, CLAIM.uid)
    assert not _host_file(rig).exists() and not restarted._written


async def test_kubelet_asking_again_keeps_the_file_and_a_lost_spec_is_written_again(
    rig: ConfigureRig,
) -> None:
    await _prepare(rig, FROM_TEMPLATE)
    await rig.hooks.run_pod_sandbox(rig.sandbox(), 30.0)
    spec = rig.root / "cdi" / "netclaim.dev_metadata.json"
    written = spec.read_text()
    spec.unlink()  # /var/run is a tmpfs: a node's reboot loses it, kubelet prepares again
    again = await rig.preparer.prepare(CLAIM.namespace, CLAIM.name, CLAIM.uid)
    assert [i for d in again for i in d.cdi_device_ids] == [f"netclaim.dev/metadata={CLAIM.uid}_net"]
    assert spec.read_text() == written  # the pod's name for the claim, read back from the file
    assert _stream(_host_file(rig))[0]["metadata"]["generation"] == 2


async def test_claims_share_one_spec_so_the_runtime_rereads_one_file_per_change(rig: ConfigureRig) -> None:
    """containerd rereads every spec file of its CDI directories at each change: one file for the node's
    metadata devices, whatever the number of claims; a claim's unprepare takes only its own device out."""
    other = replace(
        CLAIM,
        name="claim-2",
        uid="5e0c2a41-0000-4000-8000-000000000002",
        reserved_for=(ConsumerRef("pod-2", "pod-uid-2"),),
    )
    await _prepare(rig)
    await _prepare(rig, other)
    metadata_specs = [p.name for p in (rig.root / "cdi").iterdir() if "metadata" in p.name]
    assert metadata_specs == ["netclaim.dev_metadata.json"]
    assert [d["name"] for d in _spec(rig)["devices"]] == sorted([f"{CLAIM.uid}_net", f"{other.uid}_net"])
    await rig.unpreparer.unprepare(CLAIM.namespace, CLAIM.name, CLAIM.uid)
    assert [d["name"] for d in _spec(rig)["devices"]] == [f"{other.uid}_net"]
    assert _host_file(rig, other).exists()


def test_the_per_claim_specs_of_an_earlier_netclaim_are_folded_into_the_nodes(tmp_path: Path) -> None:
    """An upgraded agent: the running pods' containers still find their devices when they restart."""
    spec_dir = tmp_path / "cdi"
    spec_dir.mkdir()
    device = {
        "name": f"{CLAIM.uid}_net",
        "containerEdits": {"mounts": [{"hostPath": "/x", "containerPath": "/y"}]},
    }
    legacy = spec_dir / f"netclaim.dev_metadata_{CLAIM.uid}_net.json"
    legacy.write_text(
        json.dumps({"cdiVersion": "0.6.0", "kind": "netclaim.dev/metadata", "devices": [device]})
    )
    DeviceMetadataFiles(tmp_path / "plugin", spec_dir, "netclaim.dev")
    assert [p.name for p in spec_dir.iterdir()] == ["netclaim.dev_metadata.json"]
    assert json.loads((spec_dir / "netclaim.dev_metadata.json").read_text())["devices"] == [device]


async def test_unprepare_removes_the_file_and_the_spec(rig: ConfigureRig) -> None:
    await _prepare(rig)
    await rig.unpreparer.unprepare(CLAIM.namespace, CLAIM.name, CLAIM.uid)
    assert not _host_file(rig).parent.parent.exists()
    assert list((rig.root / "cdi").iterdir()) == []


async def test_metadata_that_cannot_be_written_does_not_fail_the_claim(
    rig: ConfigureRig, caplog: pytest.LogCaptureFixture
) -> None:
    (rig.root / "kubelet-plugin").write_text("not a directory")
    assert await _prepare(rig) == []  # the claim is prepared, its containers go without the file
    assert rig.store.for_claim(CLAIM.uid)
    assert "device metadata not written" in caplog.text


def test_the_pods_name_for_a_claim_is_read_from_its_annotation() -> None:
    meta = {"namespace": "team-a", "name": "pod-1-fabric-x7", "uid": "u", "resourceVersion": "1"}
    annotated = {"metadata": {**meta, "annotations": {"resource.kubernetes.io/pod-claim-name": "fabric"}}}
    assert Claim.from_api(annotated).pod_claim_name == "fabric"
    assert Claim.from_api({"metadata": meta}).pod_claim_name == ""
    for hostile in ("../../../etc", "a/b", "x\x00y", "A" * 64, 7):  # a tenant may write the annotation
        written = {"metadata": {**meta, "annotations": {"resource.kubernetes.io/pod-claim-name": hostile}}}
        assert Claim.from_api(written).pod_claim_name == ""


async def test_what_an_earlier_claim_of_the_same_name_left_is_replaced(rig: ConfigureRig) -> None:
    """Its unprepare never came (the node was down): the new claim must not show the old one's interfaces."""
    stale = _host_file(rig)
    stale.parent.mkdir(parents=True)
    stale.write_text(json.dumps({"kind": "DeviceMetadata", "metadata": {"uid": "old", "generation": 7}}))
    await _prepare(rig)
    assert _stream(stale)[0]["metadata"] == {
        "name": CLAIM.name,
        "namespace": "team-a",
        "uid": CLAIM.uid,
        "generation": 1,
    }


async def test_a_late_unprepare_of_an_earlier_claim_leaves_the_newer_claims_file(rig: ConfigureRig) -> None:
    """The old claim's unprepare comes after a new claim of the same name was prepared (kubelet after a
    restart, or reclaim): the new pod's containers mount the new file on each restart."""
    await _prepare(rig)
    await rig.metadata.remove(CLAIM.namespace, CLAIM.name, "uid-of-the-earlier-claim")
    assert _stream(_host_file(rig))[0]["metadata"]["uid"] == CLAIM.uid
    assert _spec(rig)["devices"][0]["name"] == f"{CLAIM.uid}_net"  # its spec is its UID's: untouched


async def test_an_attach_the_repair_loop_makes_updates_the_file_too(rig: ConfigureRig) -> None:
    """The agent was down at RunPodSandbox: the sandbox started without the hook, the gate holds the
    containers back, and the repair on reconnect attaches; the containers created then read the interface."""
    await _prepare(rig)
    await rig.hooks.synchronize([rig.sandbox()])
    [device] = _stream(_host_file(rig))[0]["requests"][0]["devices"]
    assert device["networkData"]["interfaceName"] == "net1"


# A bridge-like chain's result: the host side's address and gateway are not the pod interface's.
CNI_RESULT = {
    "cniVersion": "1.0.0",
    "interfaces": [
        {"name": "br-lan", "mac": "02:00:00:00:00:01"},
        {"name": "net1", "mac": "02:00:0a:5a:00:0a", "sandbox": "/var/run/netns/pod-1"},
    ],
    "ips": [
        {"address": "10.90.0.10/24", "gateway": "10.90.0.1", "interface": 1},
        {"address": "fd00:90::a/64", "gateway": "fd00:90:0:0::1", "interface": 1},
        {"address": "10.90.0.254/24", "gateway": "10.90.0.254", "interface": 0},
    ],
    "routes": [
        {"dst": "0.0.0.0/0", "gw": "10.90.0.1"},
        {"dst": "10.99.0.0/16"},  # no gw: CNI's "the interface's gateway", kept as the result says it
        {"dst": "fd00:99::/48", "gw": "not an address"},
        {"dst": "2001:db8:aaaa:bbbb:cccc:dddd:eeee:0/112", "gw": "2001:db8:aaaa:bbbb:cccc:dddd:eeee:ffff"},
    ],
}


async def test_an_interface_carries_its_network_gateways_and_routes_beside_the_standard_network_data(
    rig: ConfigureRig,
) -> None:
    """networkData is the KEP's (name, addresses, MAC); the rest a container needs of its interface is in
    the NIC's attributes: the network's names, then, once the ADD ran, the result's gateways and routes."""
    nic = sample_device("ipn0")
    row = sample_row(replace(nic, attributes={**nic.attributes, NETWORK: "lan3"}))
    await rig.metadata.prepared([row], "")
    before = _attributes(rig)
    assert before["netclaim.dev/cniNetwork"] == {"string": "lan"}  # the CNI config's name
    assert before[NETWORK] == {"string": "lan3"}  # the admin's, as published
    assert "netclaim.dev/gateways" not in before and "netclaim.dev/routes" not in before

    interface = Interface(
        name="net1", mac="02:00:0a:5a:00:0a", mtu=1500, addresses=("10.90.0.10/24", "fd00:90::a/64")
    )
    rig.metadata.attached(
        [row.with_state(State.ATTACHED, outcome=Outcome(cni_result=CNI_RESULT, interface=interface))]
    )
    [device] = _stream(_host_file(rig))[0]["requests"][0]["devices"]
    assert device["networkData"] == {
        "interfaceName": "net1",
        "ips": ["10.90.0.10/24", "fd00:90::a/64"],
        "hardwareAddress": "02:00:0a:5a:00:0a",
    }
    assert device["attributes"]["netclaim.dev/gateways"] == {"strings": ["10.90.0.1", "fd00:90::1"]}
    # a route whose gateway is no address is left out, and so is one longer than an attribute's 64
    assert device["attributes"]["netclaim.dev/routes"] == {
        "strings": ["0.0.0.0/0 via 10.90.0.1", "10.99.0.0/16"]
    }
    assert device["attributes"][NETWORK] == {"string": "lan3"}


async def test_a_nic_with_too_many_attributes_keeps_the_interfaces_and_the_standard_ones(
    rig: ConfigureRig,
) -> None:
    nic = sample_device()
    many: dict[str, bool | int | str] = {f"netclaim.dev/extra{i:02d}": i for i in range(MAX_ATTRIBUTES)}
    standard: dict[str, bool | int | str] = {
        "resource.kubernetes.io/pcieRoot": "pci0000:5d",
        "resource.kubernetes.io/numaNode": 0,
    }
    await rig.metadata.prepared([sample_row(replace(nic, attributes={**many, **standard}))], "")
    attributes = _attributes(rig)
    assert len(attributes) == MAX_ATTRIBUTES
    assert "netclaim.dev/cniNetwork" in attributes
    assert attributes["resource.kubernetes.io/pcieRoot"] == {"string": "pci0000:5d"}
    assert attributes["resource.kubernetes.io/numaNode"] == {"int": 0}


async def test_prepares_and_unprepares_write_on_their_own_thread_in_the_order_asked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Claims prepared and removed at once: their files are written by one thread that is not the event
    loop's, and the node's spec ends with exactly the devices of the claims still prepared (each spec
    write saw the ones before it). The hook's write (attached) is the caller's, at once."""
    import netclaim.agent.claims.metadata as metadata_module

    writers: list[str] = []
    real_write = metadata_module._write

    def write(path: Path, text: str) -> None:
        writers.append(threading.current_thread().name)
        real_write(path, text)

    monkeypatch.setattr(metadata_module, "_write", write)
    files = DeviceMetadataFiles(tmp_path / "plugin", tmp_path / "cdi", "netclaim.dev")
    rows = [sample_row(claim_uid=f"uid-{i}", claim_name=f"claim-{i}", pod_uid=f"pod-{i}") for i in range(12)]
    answers = await asyncio.gather(*(files.prepared([row], "") for row in rows))
    assert answers == [{"net": f"netclaim.dev/metadata=uid-{i}_net"} for i in range(12)]
    await asyncio.gather(
        *(files.remove(row.claim_namespace, row.claim_name, row.claim_uid) for row in rows[6:])
    )
    [thread] = set(writers)
    assert thread != threading.current_thread().name
    spec = json.loads((tmp_path / "cdi" / "netclaim.dev_metadata.json").read_text())
    assert [d["name"] for d in spec["devices"]] == [f"uid-{i}_net" for i in range(6)]
    assert {p.parent.parent.name for p in (tmp_path / "plugin").glob("*/*/*/metadata.json")} == {
        f"team-a_claim-{i}" for i in range(6)
    }
    writers.clear()
    files.attached([row.with_state(State.ATTACHED) for row in rows[:1]])
    assert writers == [threading.current_thread().name]

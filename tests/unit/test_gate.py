"""The fail-closed gate: each claim's CDI spec, and its hook run as runc would run it (real sh, sed, grep
against this machine's /proc)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from netclaim.agent.claims.gate import CDI_KIND, CdiGate, device_name, spec
from netclaim.core.objects import Claim
from netclaim.errors import ApiUnavailableError
from tests.corpus import VALID_CONFIG
from tests.unit import fakes
from tests.unit.fakes import configure_rig, sample_allocation, sample_claim, sample_config, sample_device


def _run_hook(claim_spec: dict[str, Any], pid: int) -> subprocess.CompletedProcess[str]:
    [device] = claim_spec["devices"]
    [hook] = device["containerEdits"]["hooks"]
    state = json.dumps({"ociVersion": "1.2.0", "id": "c1", "status": "creating", "pid": pid, "bundle": "/b"})
    return subprocess.run(
        [hook["path"], *hook["args"][1:]], input=state, capture_output=True, text=True, check=False
    )


def test_the_spec_gives_every_container_of_the_claim_a_create_runtime_hook() -> None:
    found = spec(["net1"])
    assert found["kind"] == CDI_KIND == "netclaim.dev/net"
    [device] = found["devices"]
    assert device["name"] == device_name(["net1"]) and device["name"].startswith("net1-")
    assert device_name(["net1", "net2"]) != device_name(["net1"]) != device_name(["net2"])
    [hook] = device["containerEdits"]["hooks"]
    assert hook["hookName"] == "createRuntime" and hook["path"] == "/bin/sh"


def test_the_hook_passes_when_every_interface_is_in_the_containers_namespace() -> None:
    assert _run_hook(spec(["lo"]), os.getpid()).returncode == 0


def test_the_hook_fails_naming_the_interfaces_while_an_interface_is_missing() -> None:
    result = _run_hook(spec(["lo", "net1x9"]), os.getpid())
    assert result.returncode == 1
    assert "interfaces lo net1x9 of the pod's claim are not attached yet" in result.stderr


def test_a_name_is_compared_whole_and_literally() -> None:
    """`l.` would match `lo` as a regex, `l` as a prefix: neither may pass."""
    for name in ("l.", "l", "lo'; exit 0; '"):
        assert _run_hook(spec([name]), os.getpid()).returncode == 1, name


def test_the_hook_runs_no_program_but_the_shell() -> None:
    """One process per container start: with no PATH at all, the checks still pass and still fail."""
    for names, expected in ((["lo"], 0), (["lo", "nope9"], 1)):
        [device] = spec(names)["devices"]
        [hook] = device["containerEdits"]["hooks"]
        state = json.dumps({"ociVersion": "1.2.0", "id": "c1", "pid": os.getpid(), "bundle": "/b"})
        result = subprocess.run(
            [hook["path"], *hook["args"][1:]],
            input=state,
            env={"PATH": "/nonexistent"},
            capture_output=True,
            text=True,
            check=False,
        )
        assert result.returncode == expected, (names, result.stderr)
        assert "not found" not in result.stderr


def test_every_interface_must_be_there_and_the_header_lines_are_no_names(tmp_path: Path) -> None:
    names = Path(f"/proc/{os.getpid()}/net/dev").read_text().splitlines()[2:]
    present = [line.split(":")[0].strip() for line in names]
    assert _run_hook(spec(present), os.getpid()).returncode == 0
    # words of /proc/net/dev's two header lines
    for word in ("Inter-|", "Receive", "face", "|bytes", "compressed", "multicast|bytes", "carrier"):
        assert _run_hook(spec([word]), os.getpid()).returncode == 1, word


def test_without_a_pid_in_the_state_the_hook_fails() -> None:
    [device] = spec(["lo"])["devices"]
    [hook] = device["containerEdits"]["hooks"]
    # no pid, or none usable: digits elsewhere in the state (here a live pid in the bundle) never count
    for state in ("{}", f'{{"pid":null,"bundle":"/b/{os.getpid()}"}}'):
        result = subprocess.run(
            [hook["path"], *hook["args"][1:]], input=state, capture_output=True, text=True
        )
        assert result.returncode == 1, state


def test_claims_asking_the_same_interfaces_share_one_spec_removed_with_the_last(tmp_path: Path) -> None:
    """Before, a file per claim: containerd rescans every spec at each change of the directory, so a node
    fill of 110 pods wrote 110 files, each a rescan of all: 6,105 file reads. Now the fill writes one."""
    directory = tmp_path / "cdi"
    gate = CdiGate(directory)
    net1 = f"netclaim.dev-{device_name(['net1'])}.json"
    ids = [gate.write(f"uid-{n}", ["net1"]) for n in range(110)]
    assert {tuple(i) for i in ids} == {(f"netclaim.dev/net={device_name(['net1'])}",)}
    assert [p.name for p in directory.iterdir()] == [net1]
    assert json.loads((directory / net1).read_text()) == spec(["net1"])
    two = gate.write("uid-two", ["net1", "net2"])
    assert (
        two == [f"netclaim.dev/net={device_name(['net1', 'net2'])}"] and len(list(directory.iterdir())) == 2
    )
    for n in range(109):
        gate.remove(f"uid-{n}")
    assert net1 in [p.name for p in directory.iterdir()]  # uid-109 still uses it
    gate.remove("uid-109")
    gate.remove("uid-109")  # twice is fine (kubelet retries unprepare)
    gate.remove("uid-two")
    assert list(directory.iterdir()) == []


def test_after_a_restart_the_stored_claims_keep_their_spec_and_an_unknown_one_stays(tmp_path: Path) -> None:
    directory = tmp_path / "cdi"
    before = CdiGate(directory)
    before.write("uid-a", ["net1"])
    before.write("uid-lost", ["lost1"])  # its row went with a lost state directory: its pod may still run
    (directory / "netclaim.dev-uid-old.json").write_text("{}")  # as earlier netclaims wrote specs
    after = CdiGate(directory, [("uid-a", "net1")])
    after.write("uid-b", ["net1"])
    after.remove("uid-b")
    assert (directory / f"netclaim.dev-{device_name(['net1'])}.json").exists()  # uid-a, prepared before
    after.write("uid-c", ["lost1"])
    after.remove("uid-c")
    after.remove("uid-a")
    after.remove("uid-old")
    assert [p.name for p in directory.iterdir()] == [f"netclaim.dev-{device_name(['lost1'])}.json"]


def _rig_with_gate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[fakes.ConfigureRig, Claim]:
    """configure/ with the gate writing to tmp_path/cdi, and one claim of one NIC."""
    nic = sample_device("enp1s0")
    claim = sample_claim((sample_allocation(nic, "net"),), (sample_config(VALID_CONFIG, requests=("net",)),))
    rig = configure_rig(tmp_path)
    rig.catalog.update([nic])
    rig.api.add_claim(claim)
    rig.preparer.gate = rig.unpreparer.gate = CdiGate(tmp_path / "cdi")
    return rig, claim


async def test_prepare_returns_the_claims_cdi_device_and_unprepare_removes_its_spec(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rig, claim = _rig_with_gate(tmp_path, monkeypatch)
    prepared = await rig.preparer.prepare(claim.namespace, claim.name, claim.uid)
    assert [d.cdi_device_ids for d in prepared] == [
        (f"netclaim.dev/net={device_name(['net1'])}", f"netclaim.dev/metadata={claim.uid}_net")
    ]
    written = json.loads((tmp_path / "cdi" / f"netclaim.dev-{device_name(['net1'])}.json").read_text())
    assert '[ "$name" = net1 ]' in written["devices"][0]["containerEdits"]["hooks"][0]["args"][2]
    again = await rig.preparer.prepare(claim.namespace, claim.name, claim.uid)  # kubelet asking again
    assert again == prepared
    await rig.unpreparer.unprepare(claim.namespace, claim.name, claim.uid)
    assert list((tmp_path / "cdi").iterdir()) == []
    rig.store.close()


async def test_a_claims_spec_goes_with_its_rows_whatever_the_api_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rows are how reclaim finds a claim: once they are gone, nothing would come back for the spec.
    Unprepare asks the API nothing, so an API that fails cannot leave a spec behind."""
    rig, claim = _rig_with_gate(tmp_path, monkeypatch)
    await rig.preparer.prepare(claim.namespace, claim.name, claim.uid)
    rig.api.fail_next.append(ApiUnavailableError("the API server did not answer"))
    await rig.unpreparer.unprepare(claim.namespace, claim.name, claim.uid)
    assert rig.store.all() == []
    assert list((tmp_path / "cdi").iterdir()) == []
    rig.store.close()

"""The fail-closed gate: each claim's CDI spec, and its hook run as runc would run it (real sh, sed, grep
against this machine's /proc)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from netclaim.configure.gate import CDI_KIND, CdiGate, device_id, spec
from netclaim.errors import ApiUnavailableError
from netclaim.objects import Claim
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
    found = spec("ns/c", "0b1c-uid", ["net1"])
    assert found["kind"] == CDI_KIND == "netclaim.dev/net"
    [device] = found["devices"]
    assert device["name"] == "0b1c-uid" and device_id("0b1c-uid") == "netclaim.dev/net=0b1c-uid"
    [hook] = device["containerEdits"]["hooks"]
    assert hook["hookName"] == "createRuntime" and hook["path"] == "/bin/sh"


def test_the_hook_passes_when_every_interface_is_in_the_containers_namespace() -> None:
    assert _run_hook(spec("ns/c", "u", ["lo"]), os.getpid()).returncode == 0


def test_the_hook_fails_naming_the_claim_while_an_interface_is_missing() -> None:
    result = _run_hook(spec("ns/c", "u", ["lo", "net1x9"]), os.getpid())
    assert result.returncode == 1
    assert "interfaces lo net1x9 of claim ns/c are not attached yet" in result.stderr


def test_a_name_is_compared_whole_and_literally() -> None:
    """`l.` would match `lo` as a regex, `l` as a prefix: neither may pass."""
    for name in ("l.", "l", "lo'; exit 0; '"):
        assert _run_hook(spec("ns/c", "u", [name]), os.getpid()).returncode == 1, name


def test_the_hook_runs_no_program_but_the_shell() -> None:
    """One process per container start: with no PATH at all, the checks still pass and still fail."""
    for names, expected in ((["lo"], 0), (["lo", "nope9"], 1)):
        [device] = spec("ns/c", "u", names)["devices"]
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
    assert _run_hook(spec("ns/c", "u", present), os.getpid()).returncode == 0
    # words of /proc/net/dev's two header lines
    for word in ("Inter-|", "Receive", "face", "|bytes", "compressed", "multicast|bytes", "carrier"):
        assert _run_hook(spec("ns/c", "u", [word]), os.getpid()).returncode == 1, word


def test_without_a_pid_in_the_state_the_hook_fails() -> None:
    [device] = spec("ns/c", "u", ["lo"])["devices"]
    [hook] = device["containerEdits"]["hooks"]
    # no pid, or none usable: digits elsewhere in the state (here a live pid in the bundle) never count
    for state in ("{}", f'{{"pid":null,"bundle":"/b/{os.getpid()}"}}'):
        result = subprocess.run(
            [hook["path"], *hook["args"][1:]], input=state, capture_output=True, text=True
        )
        assert result.returncode == 1, state


def test_specs_are_written_atomically_and_removed(tmp_path: Path) -> None:
    gate = CdiGate(tmp_path / "cdi")
    assert gate.write("ns/c", "uid-1", ["net1"]) == ["netclaim.dev/net=uid-1"]
    written = json.loads((tmp_path / "cdi" / "netclaim.dev-uid-1.json").read_text())
    assert written == spec("ns/c", "uid-1", ["net1"])
    assert [p.name for p in (tmp_path / "cdi").iterdir()] == ["netclaim.dev-uid-1.json"]
    gate.remove("uid-1")
    gate.remove("uid-1")  # twice is fine (kubelet retries unprepare)
    assert list((tmp_path / "cdi").iterdir()) == []


def _rig_with_gate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[fakes.ConfigureRig, Claim]:
    """configure/ with the gate writing to tmp_path/cdi, and one claim of one NIC."""
    nic = sample_device("enp1s0")
    claim = sample_claim((sample_allocation(nic, "net"),), (sample_config(VALID_CONFIG, requests=("net",)),))
    rig = configure_rig(tmp_path, monkeypatch)
    rig.catalog.update([nic])
    rig.api.add_claim(claim)
    rig.preparer.gate = rig.unpreparer.gate = CdiGate(tmp_path / "cdi")
    return rig, claim


async def test_prepare_returns_the_claims_cdi_device_and_unprepare_removes_its_spec(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rig, claim = _rig_with_gate(tmp_path, monkeypatch)
    prepared = await rig.preparer.prepare(claim.namespace, claim.name, claim.uid)
    assert [d.cdi_device_ids for d in prepared] == [(f"netclaim.dev/net={claim.uid}",)]
    written = json.loads((tmp_path / "cdi" / f"netclaim.dev-{claim.uid}.json").read_text())
    assert '[ "$name" = net1 ]' in written["devices"][0]["containerEdits"]["hooks"][0]["args"][2]
    again = await rig.preparer.prepare(claim.namespace, claim.name, claim.uid)  # kubelet asking again
    assert again == prepared
    await rig.unpreparer.unprepare(claim.namespace, claim.name, claim.uid)
    assert list((tmp_path / "cdi").iterdir()) == []
    rig.store.close()


async def test_a_reclaimed_claim_loses_its_spec_even_when_the_api_fails_after_the_rows_went(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rows are how reclaim finds a claim: once they are gone, nothing would come back for the spec."""
    rig, claim = _rig_with_gate(tmp_path, monkeypatch)
    await rig.preparer.prepare(claim.namespace, claim.name, claim.uid)
    rig.api.fail_next.append(ApiUnavailableError("the API server did not answer"))
    with pytest.raises(ApiUnavailableError):
        await rig.unpreparer.unprepare(claim.namespace, claim.name, claim.uid)
    assert rig.store.all() == []
    assert list((tmp_path / "cdi").iterdir()) == []
    rig.store.close()

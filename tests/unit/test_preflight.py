"""`netclaim preflight`'s verdicts (a real node and API server: tests/cluster/test_preflight.py)."""

from __future__ import annotations

import copy
import errno
import os
from pathlib import Path
from typing import Any

import pytest

from netclaim.cli.preflight import (
    DEFAULT_PLUGINS,
    NodePaths,
    api_findings,
    gate_findings,
    node_findings,
    probe_slice,
    render,
)
from netclaim.errors import ApiRejectedError, KernelError


def _installed(directory: Path, names: tuple[str, ...]) -> None:
    for name in names:
        (directory / name).write_text("#!/bin/sh\n")
        (directory / name).chmod(0o755)


async def _answers(_: str) -> None:
    return None


async def _shapes() -> None:
    return None


async def test_a_node_with_everything_passes(tmp_path: Path) -> None:
    _installed(tmp_path, DEFAULT_PLUGINS)
    paths = NodePaths(tmp_path / "nri.sock", tmp_path, (tmp_path,))
    findings = await node_findings(paths, _answers, _shapes, _shapes)
    assert [(f.check, f.severity) for f in findings] == [
        ("NRI", "ok"),
        ("CDI", "ok"),
        ("CNI plugins", "ok"),
        ("bandwidth caps", "ok"),
        ("port security", "ok"),
    ]
    assert render(findings).endswith("preflight: every check passed\n")


async def test_each_missing_piece_is_named_with_its_fix(tmp_path: Path) -> None:
    _installed(tmp_path, ("macvlan",))
    (tmp_path / "static").write_text("not executable")

    async def no_socket(path: str) -> None:
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), path)

    async def no_ifb() -> None:
        raise KernelError(
            "a new network namespace (preflight): an ifb device (module ifb): (95, 'Not supported')"
        )

    async def old_kernel() -> None:
        raise KernelError("nft -c -j -f -: exit 1: Error: Could not process rule: Operation not supported")

    paths = NodePaths(tmp_path / "nri.sock", tmp_path / "cdi", (tmp_path,))
    findings = await node_findings(paths, no_socket, no_ifb, old_kernel)
    text = render(findings)
    assert [f.severity for f in findings] == ["fail"] * 5
    assert f"FAIL  NRI: no socket at {tmp_path}/nri.sock: the runtime's NRI is off or elsewhere" in text
    assert "disable = false" in text
    assert f"FAIL  CDI: no directory {tmp_path}/cdi" in text
    assert f"FAIL  CNI plugins: plugin type 'host-device': no such plugin in {tmp_path}; plugin type" in text
    assert "an ifb device (module ifb)" in text and "modprobe ifb" in text
    assert "FAIL  port security: a NIC's table or its hairpin cannot be made" in text and "5.16" in text
    assert text.endswith("preflight: 5 of 5 checks failed\n")


async def test_a_socket_nobody_listens_on_is_not_nri(tmp_path: Path) -> None:
    async def refused(path: str) -> None:
        raise ConnectionRefusedError(errno.ECONNREFUSED, os.strerror(errno.ECONNREFUSED))

    _installed(tmp_path, DEFAULT_PLUGINS)
    paths = NodePaths(tmp_path / "nri.sock", tmp_path, (tmp_path,))
    [nri, *_] = await node_findings(paths, refused, _shapes, _shapes)
    assert (nri.severity, nri.detail) == (
        "fail",
        f"{tmp_path}/nri.sock: nothing answers (Connection refused)",
    )


class FakePreflightApi:
    def __init__(self, extra: dict[str, list[str]], keeps: set[str] | None = None, refuse: bool = False):
        self.extra = extra
        self.keeps = keeps if keeps is not None else {"allowMultipleAllocations", "requestPolicy", "taints"}
        self.refuse = refuse
        self.sent: list[dict[str, Any]] = []

    async def identity(self) -> tuple[str, dict[str, list[str]]]:
        return "system:serviceaccount:net:netclaim-agent", self.extra

    async def dry_run_slice(self, body: dict[str, Any]) -> dict[str, Any]:
        """The slice as an API server with some gates off keeps it: their fields dropped."""
        self.sent.append(body)
        if self.refuse:
            raise ApiRejectedError("ValidatingAdmissionPolicy 'netclaim-slices-own-node' denied request")
        kept = copy.deepcopy(body)
        for device in kept["spec"]["devices"]:
            for field in ("allowMultipleAllocations", "taints"):
                if field not in self.keeps:
                    device.pop(field, None)
            if "requestPolicy" not in self.keeps:
                for capacity in device["capacity"].values():
                    capacity.pop("requestPolicy", None)
        return kept


NODE = {"authentication.kubernetes.io/node-name": ["node-1"]}


async def test_the_cluster_checks_pass_with_a_node_bound_token_and_the_gates_on() -> None:
    api = FakePreflightApi(NODE)
    findings = await api_findings(api, "node-1", "netclaim.dev")
    assert [(f.check, f.severity) for f in findings] == [
        ("node-bound token", "ok"),
        ("DRAConsumableCapacity", "ok"),
        ("DRADeviceTaints", "ok"),
        ("pool addresses", "ok"),
    ]
    assert "the controller can reserve them before the pod binds" in findings[-1].detail
    [sent] = api.sent
    assert sent == probe_slice("node-1", "netclaim.dev")
    assert (
        sent["spec"]["pool"]["name"] == sent["spec"]["nodeName"] == "node-1"
    )  # what admission lets it write


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        ({}, "bound to node (none), not node-1"),
        ({"authentication.kubernetes.io/node-name": ["node-2"]}, "node-2"),
    ],
)
async def test_a_token_not_bound_to_this_node_fails(extra: dict[str, list[str]], said: str) -> None:
    [token, *_] = await api_findings(FakePreflightApi(extra), "node-1", "netclaim.dev")
    assert token.severity == "fail" and said in token.detail and "projected ServiceAccount token" in token.fix


async def test_a_gate_that_is_off_is_found_by_what_the_server_dropped() -> None:
    findings = await api_findings(FakePreflightApi(NODE, keeps={"taints"}), "node-1", "netclaim.dev")
    consumable = next(f for f in findings if f.check == "DRAConsumableCapacity")
    assert consumable.severity == "fail"
    assert "dropped allowMultipleAllocations and requestPolicy" in consumable.detail
    assert "kube-apiserver, kube-scheduler, kube-controller-manager and kubelet" in consumable.fix
    taints = gate_findings(probe_slice("n", "netclaim.dev"))[1]
    assert taints.severity == "ok"
    dropped = probe_slice("n", "netclaim.dev")
    del dropped["spec"]["devices"][0]["taints"]
    assert gate_findings(dropped)[1].severity == "warn"  # not fatal: health without taints
    del dropped["spec"]["devices"][0]["bindingConditions"]  # 1.35, or the gate off: the path before
    pools = gate_findings(dropped)[2]
    assert pools.severity == "ok" and "taken at kubelet's prepare" in pools.detail


async def test_a_refused_dry_run_says_so_and_checks_no_gate() -> None:
    findings = await api_findings(FakePreflightApi(NODE, refuse=True), "node-1", "netclaim.dev")
    assert [(f.check, f.severity) for f in findings] == [
        ("node-bound token", "ok"),
        ("ResourceSlice", "fail"),
    ]
    assert "netclaim-slices-own-node" in findings[1].detail

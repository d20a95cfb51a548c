"""The CNI adapter against the real plugins: the reference set (containernetworking/plugins as pinned in
tools/k8s/cni-plugins, CNI 1.1) and Debian's 1.0-level build, each ADDing a macvlan with host-local IPAM
into a namespace made with `ip netns` (root, iproute2). CHECK finds an address removed by hand with both
sets; with the reference set STATUS says when the IPAM plugin is gone, and GC removes a planted stale
reservation and keeps the live one."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from netclaim.adapters.cni import CniRunner
from netclaim.core.node import Invocation, cni_args
from netclaim.errors import CniError, CniNotReadyError
from netclaim_lab import binaries
from netclaim_lab.node import DEBIAN_CNI_DIR

pytestmark = pytest.mark.programs

SETS = {"reference": "1.1.0", "debian": "1.0.0"}  # the highest version each speaks


def _plugins(kind: str) -> Path:
    return binaries.built_reference_cni_dir() if kind == "reference" else DEBIAN_CNI_DIR


@pytest.fixture
def master() -> Iterator[str]:
    """A NIC of this machine's own namespace for macvlan to stand on (a veth whose peer nothing uses)."""
    name, peer = f"ncm{os.getpid() % 100000}", f"ncp{os.getpid() % 100000}"
    subprocess.run(["ip", "link", "add", name, "type", "veth", "peer", "name", peer], check=True)
    subprocess.run(["ip", "link", "set", name, "up"], check=True)
    yield name
    subprocess.run(["ip", "link", "delete", name], check=True)


@pytest.fixture
def pod() -> Iterator[str]:
    name = f"ncpod{os.getpid()}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    yield name
    subprocess.run(["ip", "netns", "delete", name], check=True)


def _conflist(version: str, master: str, data_dir: Path) -> dict[str, Any]:
    ipam = {"type": "host-local", "ranges": [[{"subnet": "10.77.0.0/24"}]], "dataDir": str(data_dir)}
    return {
        "cniVersion": version,
        "name": "check-net",
        "plugins": [{"type": "macvlan", "master": master, "mode": "bridge", "ipam": ipam}],
    }


def _invocation(pod: str, container: str = "sandbox-1") -> Invocation:
    return Invocation(container, f"/run/netns/{pod}", "net1", cni_args("ns", "pod", container, "uid-1"))


def _deadline() -> float:
    return time.monotonic() + 10


@pytest.mark.parametrize("kind", sorted(SETS))
def test_check_finds_an_address_removed_by_hand(kind: str, master: str, pod: str, tmp_path: Path) -> None:
    runner = CniRunner([_plugins(kind)])
    conflist = _conflist(SETS[kind], master, tmp_path / "ipam")
    result = asyncio.run(runner.add(conflist, _invocation(pod), _deadline()))
    address = result["ips"][0]["address"]
    asyncio.run(runner.check(conflist, _invocation(pod), result, _deadline()))  # as added: passes
    subprocess.run(["ip", "-n", pod, "addr", "del", address, "dev", "net1"], check=True)
    with pytest.raises(CniError, match=address.split("/")[0]) as found:
        asyncio.run(runner.check(conflist, _invocation(pod), result, _deadline()))
    assert (found.value.plugin, found.value.command) == ("macvlan", "CHECK")
    asyncio.run(runner.delete(conflist, _invocation(pod), result, _deadline()))
    assert runner.host_local_reservations(conflist) == set()


def test_status_says_when_the_ipam_plugin_is_gone_and_1_0_chains_are_not_asked(
    master: str, tmp_path: Path
) -> None:
    plugins = tmp_path / "bin"
    shutil.copytree(_plugins("reference"), plugins)
    runner = CniRunner([plugins])
    conflist = _conflist("1.1.0", master, tmp_path / "ipam")
    asyncio.run(runner.status(conflist, _deadline()))
    (plugins / "host-local").unlink()
    runner = CniRunner([plugins])  # no ready answer remembered
    with pytest.raises(CniNotReadyError, match="host-local") as found:
        asyncio.run(runner.status(conflist, _deadline()))
    assert (found.value.plugin, found.value.command) == ("macvlan", "STATUS")
    asyncio.run(runner.status({**conflist, "cniVersion": "1.0.0"}, _deadline()))  # no STATUS below 1.1


def test_gc_removes_a_stale_reservation_and_keeps_the_live_one(master: str, pod: str, tmp_path: Path) -> None:
    runner = CniRunner([_plugins("reference")])
    conflist = _conflist("1.1.0", master, tmp_path / "ipam")
    result = asyncio.run(runner.add(conflist, _invocation(pod), _deadline()))
    live = result["ips"][0]["address"].split("/")[0]
    stale = tmp_path / "ipam" / "check-net" / "10.77.0.50"
    stale.write_text("sandbox-gone\r\nnet1")  # as host-local writes one, for a sandbox whose DEL never came
    assert runner.host_local_reservations(conflist) == {live, "10.77.0.50"}
    asyncio.run(runner.gc(conflist, [("sandbox-1", "net1")], _deadline()))
    assert runner.host_local_reservations(conflist) == {live}
    asyncio.run(runner.delete(conflist, _invocation(pod), result, _deadline()))

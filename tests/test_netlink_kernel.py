"""The netlink adapter against the real kernel, in a namespace made with `ip netns` (root, iproute2)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from netclaim.adapters import netlink


def _open_fds() -> int:
    return len(list(Path("/proc/self/fd").iterdir()))


@pytest.fixture
def netns() -> Iterator[str]:
    name = f"ncnl{os.getpid()}"
    for command in (
        ["ip", "netns", "add", name],
        ["ip", "-n", name, "link", "add", "v1", "type", "veth", "peer", "name", "v2"],
        ["ip", "-n", name, "addr", "add", "10.9.0.2/24", "dev", "v1"],
    ):
        subprocess.run(command, check=True)
    yield f"/run/netns/{name}"
    subprocess.run(["ip", "netns", "delete", name], check=True)


async def test_an_interface_is_read_back_and_a_missing_one_leaves_no_socket_open(netns: str) -> None:
    state = await netlink.interface("v1", netns)
    assert state is not None
    assert (state.name, state.mtu, state.addresses, len(state.mac)) == ("v1", 1500, ("10.9.0.2/24",), 17)
    before = _open_fds()
    for _ in range(20):
        assert await netlink.interface("nope", netns) is None
        assert await netlink.interface("v1", netns) is not None
    assert _open_fds() == before


def _ip(netns: str, *args: str) -> str:
    return subprocess.run(
        ["ip", "-n", Path(netns).name, *args], capture_output=True, text=True, check=True
    ).stdout


async def test_promisc_and_allmulti_are_read_and_turned_off(netns: str) -> None:
    """What a pod's tuning may leave on an exclusive NIC; the NIC is given back without them."""
    _ip(netns, "link", "set", "v1", "promisc", "on", "allmulticast", "on")
    state = await netlink.interface("v1", netns)
    assert state is not None and (state.promisc, state.allmulti) == (True, True)
    await netlink.set_link("v1", listening=False, netns=netns)
    state = await netlink.interface("v1", netns)
    assert state is not None and (state.promisc, state.allmulti) == (False, False)
    shown = _ip(netns, "link", "show", "v1")
    assert "PROMISC" not in shown and "ALLMULTI" not in shown, shown

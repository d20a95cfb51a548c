"""The netlink adapter against the real kernel, in a namespace made with `ip netns` (root, iproute2)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from netclaim.adapters import netlink
from netclaim.core.node import Link, LinkChange
from netclaim.errors import KernelError


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
        assert await netlink.interface("nope", netns, addresses=("10.9.0.3/24",)) is None
    assert _open_fds() == before
    given = await netlink.interface("v1", netns, addresses=("10.9.0.3/24",))  # a CNI result's: not read
    assert given is not None and (given.addresses, given.mac) == (("10.9.0.3/24",), state.mac)


def test_a_nodes_link_has_its_hardware_address_read_and_a_missing_one_none() -> None:
    """What the port guard reads of a NIC at each pass: its MAC only, not its addresses (a dump)."""
    name = f"ncmac{os.getpid() % 10000}"
    subprocess.run(["ip", "link", "add", name, "type", "veth", "peer", "name", f"{name}p"], check=True)
    try:
        assert netlink.hardware_address(name) == Path(f"/sys/class/net/{name}/address").read_text().strip()
    finally:
        subprocess.run(["ip", "link", "delete", name], check=True)
    assert netlink.hardware_address(name) is None


async def test_the_sysctls_asked_are_set_in_the_interfaces_namespace_in_the_same_trip(netns: str) -> None:
    sysctls = {"ipv6/conf/v1/accept_ra": "0", "ipv4/conf/v1/accept_redirects": "0", "ipv9/conf/v1/x": "1"}
    assert await netlink.interface("v1", netns, sysctls) is not None  # one path that is not there: skipped
    assert _sysctls(netns, "net.ipv6.conf.v1.accept_ra", "net.ipv4.conf.v1.accept_redirects") == ["0", "0"]
    assert not _on_the_node("/proc/sys/net/ipv6/conf/v1")  # in the pod's namespace, not the node's


def _sysctls(netns: str, *names: str) -> list[str]:
    inside = ["ip", "netns", "exec", Path(netns).name, "sysctl", "-n", *names]
    return subprocess.run(inside, capture_output=True, text=True, check=True).stdout.split()


def _on_the_node(path: str) -> bool:
    return Path(path).exists()


def _netns(*args: str) -> None:
    subprocess.run(["ip", "netns", *args], check=True)


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


def _sysctl(netns: str, key: str) -> str:
    return subprocess.run(
        ["ip", "netns", "exec", Path(netns).name, "sysctl", "-n", key],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


async def test_an_interface_made_without_dad_has_its_ipv6_address_at_once_and_the_others_keep_dad(
    netns: str,
) -> None:
    """The interface made inside the block: accept_dad 0, its address never tentative; the namespace's
    default and the interfaces made before or after it keep DAD on."""
    assert _sysctl(netns, "net.ipv6.conf.default.accept_dad") == "1"
    async with netlink.without_dad(netns):
        _ip(netns, "link", "add", "nodad", "type", "veth", "peer", "name", "nodad-peer")
    _ip(netns, "link", "add", "later", "type", "veth", "peer", "name", "later-peer")
    assert _sysctl(netns, "net.ipv6.conf.default.accept_dad") == "1"
    assert _sysctl(netns, "net.ipv6.conf.nodad.accept_dad") == "0"
    assert _sysctl(netns, "net.ipv6.conf.v1.accept_dad") == "1"
    assert _sysctl(netns, "net.ipv6.conf.later.accept_dad") == "1"
    for name, peer, address in (
        ("nodad", "nodad-peer", "fd00:9::1/64"),
        ("later", "later-peer", "fd00:8::1/64"),
    ):
        _ip(netns, "link", "set", peer, "up")
        _ip(netns, "addr", "add", address, "dev", name)
        _ip(netns, "link", "set", name, "up")
    assert "tentative" not in _ip(netns, "-6", "addr", "show", "dev", "nodad")
    assert "tentative" in _ip(netns, "-6", "addr", "show", "dev", "later")  # DAD lasts at least 1 s


async def _changes_of(events: netlink.LinkEvents, index: int) -> list[LinkChange]:
    """The link events for `index` in the batches that arrive within half a second."""
    found: list[LinkChange] = []
    with contextlib.suppress(TimeoutError):
        while True:
            batch = await asyncio.wait_for(events.next_batch(), 0.5)
            found += [c for c in batch if c.index == index and c.link is not None]
    return found


async def test_a_macvlan_made_on_a_nic_and_moved_away_sends_the_nic_events_that_change_nothing(
    netns: str,
) -> None:
    """What the inventory's filter relies on: the NIC's own RTM_NEWLINK for a macvlan made on it (the
    CNI plugin's attach) and moved into another namespace describe the NIC as it was; an MTU change does
    not."""
    pod = f"{Path(netns).name}-pod"
    _netns("add", pod)
    try:
        _ip(netns, "link", "set", "v1", "up")
        _ip(netns, "link", "set", "v2", "up")
        async with netlink.LinkEvents(netns) as events:
            await _changes_of(events, 0)  # what setting them up sent
            [before] = [link for link in await netlink.links(netns) if link.name == "v1"]
            _ip(netns, "link", "add", "mv0", "link", "v1", "type", "macvlan", "mode", "bridge")
            _ip(netns, "link", "set", "mv0", "netns", pod)
            seen = await _changes_of(events, before.index)
            assert len(seen) >= 1, "the kernel sent the NIC nothing: the filter is not exercised"
            assert {change.link for change in seen} == {before}, seen
            _ip(netns, "link", "set", "v1", "mtu", "1400")
            [changed] = await _changes_of(events, before.index)
            assert changed.link is not None and changed.link.mtu == 1400 and changed.link != before
    finally:
        _netns("delete", pod)


async def test_a_nic_whose_peer_goes_down_loses_its_carrier_and_the_kernel_counts_it(netns: str) -> None:
    """What link health is read from: the node's side of the veth keeps its admin state up, its carrier
    goes with the peer, and IFLA_CARRIER_CHANGES counts every loss and return (a flap between two reads
    still shows)."""
    _ip(netns, "link", "set", "v1", "up")
    _ip(netns, "link", "set", "v2", "up")

    async def v1() -> Link:
        [found] = [link for link in await netlink.links(netns) if link.name == "v1"]
        return found

    up = await v1()
    assert (up.up, up.carrier) == (True, True)
    async with netlink.LinkEvents(netns) as events:
        await _changes_of(events, 0)
        _ip(netns, "link", "set", "v2", "down")
        lost = [change.link for change in await _changes_of(events, up.index)]
    down = await v1()
    assert (down.up, down.carrier, down.operstate) == (True, False, "LOWERLAYERDOWN")
    assert down.carrier_changes == up.carrier_changes + 1
    assert lost and lost[-1] == down, "the event describes the link as a read does"
    _ip(netns, "link", "set", "v2", "up")
    _ip(netns, "link", "set", "v2", "down")
    _ip(netns, "link", "set", "v2", "up")
    back = await v1()
    assert back.carrier and back.carrier_changes == down.carrier_changes + 3


async def test_a_quiet_links_new_link_events_are_dropped_and_its_deletion_is_not(netns: str) -> None:
    """What the inventory's drop of the primary network's veths relies on: the kernel's link and address
    events of a quiet link never reach the caller, another link's do, and the quiet link's RTM_DELLINK
    does."""
    [v1, v2] = sorted(
        (link for link in await netlink.links(netns) if link.name in ("v1", "v2")), key=lambda link: link.name
    )
    async with netlink.LinkEvents(netns, quiet={v1.index}.__contains__) as events:
        _ip(netns, "link", "set", "v1", "mtu", "1400")
        _ip(netns, "link", "set", "v2", "mtu", "1300")
        _ip(netns, "link", "set", "v1", "up")
        _ip(netns, "addr", "add", "10.9.1.2/24", "dev", "v1")
        _ip(netns, "addr", "add", "10.9.2.2/24", "dev", "v2")
        seen: list[LinkChange] = []
        with contextlib.suppress(TimeoutError):
            while True:
                seen += await asyncio.wait_for(events.next_batch(), 0.5)
        assert {(c.event, c.index) for c in seen} == {("RTM_NEWLINK", v2.index), ("RTM_NEWADDR", v2.index)}
        assert any(c.link is not None and c.link.mtu == 1300 for c in seen), "v2's change, decoded"
        _ip(netns, "link", "del", "v1")  # and its peer v2
        gone: list[LinkChange] = []
        with contextlib.suppress(TimeoutError):
            while True:
                gone += await asyncio.wait_for(events.next_batch(), 0.5)
    assert {(c.event, c.index) for c in gone} >= {("RTM_DELLINK", v1.index), ("RTM_DELLINK", v2.index)}


def _tc(netns: str, *args: str) -> str:
    return subprocess.run(
        ["ip", "netns", "exec", Path(netns).name, "tc", *args], capture_output=True, text=True, check=True
    ).stdout


async def test_an_interface_is_shaped_both_ways_once_however_often_asked_and_its_ifb_removed(
    netns: str,
) -> None:
    index = int(_ip(netns, "-o", "link", "show", "v1").split(":")[0])
    opened = _open_fds()
    for _ in range(2):  # an attach tried again shapes again
        await netlink.shape("v1", 200_000_000, netns)
    assert _open_fds() == opened, "every socket and event loop of the namespace thread closed"
    qdiscs = _tc(netns, "qdisc", "show")
    assert "qdisc tbf 1: dev v1 root" in qdiscs and "rate 200Mbit" in qdiscs
    assert f"qdisc tbf 1: dev ifb{index} root" in qdiscs and "qdisc ingress ffff: dev v1" in qdiscs
    assert ",UP," in _ip(netns, "link", "show", f"ifb{index}"), "the ifb is up"
    filters = _tc(netns, "filter", "show", "dev", "v1", "ingress")
    assert filters.count(f"Egress Redirect to device ifb{index}") == 1, filters
    await netlink.remove_ifb("v1", netns)
    assert f"ifb{index}" not in _ip(netns, "link", "show")
    await netlink.remove_ifb("v1", netns)  # nothing left to remove: no error
    await netlink.delete_link("v1", netns)
    assert "v1" not in _ip(netns, "-br", "link", "show")


async def test_shaping_names_what_is_missing_and_every_kernel_piece_is_probed(netns: str) -> None:
    with pytest.raises(KernelError, match="no interface gone0 in network namespace"):
        await netlink.shape("gone0", 1_000_000, netns)
    with pytest.raises(KernelError, match="/run/netns/none-such"):
        await netlink.shape("v1", 1_000_000, "/run/netns/none-such")
    await netlink.probe_shaping()  # this kernel has ifb, tbf, ingress, u32 and mirred

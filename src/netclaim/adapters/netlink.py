"""The one module that speaks netlink (pyroute2). Everything else sees plain dataclasses.

Functions take an optional `netns` path: None is the agent's own (the node's) network namespace. The
kernel's refusals (pyroute2's NetlinkError, OSError) come out as netclaim's KernelError.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import ctypes
import errno
import fcntl
import functools
import ipaddress
import os
import socket
import struct
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from typing import Any, TypeVar

from pyroute2 import AsyncIPRoute, IPRoute
from pyroute2.netlink.exceptions import NetlinkError
from pyroute2.netlink.rtnl import RTM_DELADDR, RTM_NEWADDR, RTM_NEWLINK
from pyroute2.netlink.rtnl.marshal import MarshalRtnl

from netclaim.core.node import InterfaceState, Link, LinkChange
from netclaim.errors import KernelError

IFF_UP = 0x1
IFF_LOOPBACK = 0x8
_RTMGRP_LINK = 0x1
_RTMGRP_IPV4_IFADDR = 0x10
_RTMGRP_IPV6_IFADDR = 0x100
# the link's index in a link or address message: struct ifinfomsg's ifi_index (after the 16-byte nlmsghdr,
# family, pad and type) and struct ifaddrmsg's ifa_index (after family, prefix length, flags and scope)
_INDEX_AT = 20
_QUIETED = (RTM_NEWLINK, RTM_NEWADDR, RTM_DELADDR)
_ETH_P_ALL = 0x0003
_NETLINK_ROUTE = 0
_SIOCGIFMTU = 0x8921
_SIOCGIFHWADDR = 0x8927
_SIOCGIFFLAGS = 0x8913
IFF_PROMISC = 0x100
IFF_ALLMULTI = 0x200
T = TypeVar("T")


_libc = ctypes.CDLL(None, use_errno=True)
_CLONE_NEWNET = 0x40000000
# setns() moves only the calling thread: a namespace thread enters a pod's namespace, opens a netlink
# socket there (a socket stays in the namespace it was made in) or does its work there, and comes back.
# pyroute2's own netns support forks the agent instead, and a forked child that gets a signal wakes the
# parent's event loop. Several: a device's deletion waits there for the device's last users.
_NETNS_THREAD = concurrent.futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="netns")


def _setns(fd: int) -> None:
    if _libc.setns(fd, _CLONE_NEWNET) != 0:
        error = ctypes.get_errno()
        raise OSError(error, os.strerror(error))


def _in_namespace(path: str, work: Callable[[], T]) -> T:
    """`work()` with the calling thread in the network namespace at `path` (and back afterwards)."""
    home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        target = os.open(path, os.O_RDONLY)  # never created: a gone namespace is an error
        try:
            _setns(target)
            try:
                return work()
            finally:
                _setns(home)
        finally:
            os.close(target)
    finally:
        os.close(home)


def _netlink_socket() -> int:
    return socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, _NETLINK_ROUTE).detach()


async def _in(netns: str | None, work: Callable[[], T], release: Callable[[T], None]) -> T:
    """`work()` in `netns` (on the namespace thread), or here in the node's own namespace. `release`
    frees what it made if the caller is cancelled meanwhile (containerd dropping the connection cancels
    every hook in flight): the thread finishes its work all the same."""
    if not netns:
        return work()
    future = asyncio.get_running_loop().run_in_executor(_NETNS_THREAD, _in_namespace, netns, work)
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:

        def release_when_done(done: asyncio.Future[T]) -> None:
            if not done.cancelled() and done.exception() is None:
                release(done.result())

        future.add_done_callback(release_when_done)
        raise


def _where(netns: str | None) -> str:
    return f"network namespace {netns}" if netns else "the node's network namespace"


@contextlib.asynccontextmanager
async def _ipr(netns: str | None = None, fileno: int | None = None) -> AsyncIterator[AsyncIPRoute]:
    """A netlink socket in `netns` (`fileno`: one already opened there); every kernel refusal inside the
    block becomes a KernelError."""
    try:
        if fileno is None and netns:
            fileno = await _in(netns, _netlink_socket, os.close)
        ipr = AsyncIPRoute() if fileno is None else AsyncIPRoute(fileno=fileno)
    except OSError as err:
        raise KernelError(f"{_where(netns)}: {err.strerror or err}") from err
    try:
        yield ipr
    except (NetlinkError, OSError) as err:
        raise KernelError(f"{_where(netns)}: {err}") from err
    finally:
        ipr.close()


def _link(message: Any) -> Link:
    flags = int(message["flags"])
    master = message.get("master")
    return Link(
        index=int(message["index"]),
        name=str(message.get("ifname")),
        kind=str(message.get_nested("IFLA_LINKINFO", "IFLA_INFO_KIND") or ""),
        mac=str(message.get("address") or "").lower(),
        mtu=int(message.get("mtu") or 0),
        up=bool(flags & IFF_UP),
        loopback=bool(flags & IFF_LOOPBACK),
        master=int(master) if master else None,
        operstate=str(message.get("operstate") or "UNKNOWN"),
        vf_count=int(message.get("num_vf") or 0),
        carrier=bool(message.get("carrier", 1)),
        carrier_changes=int(message.get("carrier_changes") or 0),
    )


async def links(netns: str | None = None) -> list[Link]:
    async with _ipr(netns) as ipr:
        return [_link(m) async for m in await ipr.get_links()]


async def addresses(
    netns: str | None = None,
) -> dict[int, list[ipaddress.IPv4Interface | ipaddress.IPv6Interface]]:
    """Global-scope addresses per interface index, in canonical CIDR form."""
    found: dict[int, list[ipaddress.IPv4Interface | ipaddress.IPv6Interface]] = {}
    async with _ipr(netns) as ipr:
        async for message in await ipr.get_addr():
            if message.get("scope", 0) != 0:
                continue
            address = ipaddress.ip_interface(f"{message.get('address')}/{message['prefixlen']}")
            found.setdefault(int(message["index"]), []).append(address)
    return found


async def default_route_interfaces(netns: str | None = None) -> set[int]:
    async with _ipr(netns) as ipr:
        return {int(r.get("oif")) async for r in await ipr.get_default_routes() if r.get("oif")}


def _change(message: Any) -> LinkChange:
    event, index = str(message.get("event")), int(message.get("index") or 0)
    if event.endswith("LINK"):
        return LinkChange(event, index, name=str(message.get("ifname") or ""), link=_link(message))
    return LinkChange(event, index, scope=int(message.get("scope") or 0))


class _QuietLinks(MarshalRtnl):  # type: ignore[misc] # pyroute2 is untyped
    """pyroute2's parser, that drops the link and address events of a link `quiet` names before decoding
    them. pyroute2 makes an object of each of a link message's 40-odd attributes: in a burst of pods,
    decoding the events of the primary network's veths was a tenth of the agent's CPU. RTM_DELLINK always
    passes."""

    def __init__(self, quiet: Callable[[int], bool]) -> None:
        super().__init__()
        self._quiet = quiet

    def parse_one_message(
        self, key: int, flags: int, sequence_number: int, data: bytes, offset: int, length: int
    ) -> Any:
        if key in _QUIETED and length >= _INDEX_AT + 4:
            [index] = struct.unpack_from("i", data, offset + _INDEX_AT)
            if self._quiet(index):
                return None  # pyroute2's parse skips it
        return super().parse_one_message(key, flags, sequence_number, data, offset, length)


class LinkEvents:
    """Notifications of link and address changes in `netns` (None: the node's namespace). `quiet`: the
    links whose changes are not wanted, by index (asked for each one as it arrives), but their deletion."""

    def __init__(self, netns: str | None = None, quiet: Callable[[int], bool] | None = None) -> None:
        self._netns = netns
        self._quiet = quiet
        self._ipr: AsyncIPRoute | None = None

    async def __aenter__(self) -> LinkEvents:
        try:
            fileno: int | None = None
            if self._netns:
                fileno = await _in(self._netns, _netlink_socket, os.close)
            self._ipr = AsyncIPRoute() if fileno is None else AsyncIPRoute(fileno=fileno)
            if self._quiet is not None:
                self._ipr.set_marshal(_QuietLinks(self._quiet))
            await self._ipr.bind(groups=_RTMGRP_LINK | _RTMGRP_IPV4_IFADDR | _RTMGRP_IPV6_IFADDR)
        except (NetlinkError, OSError) as err:
            if self._ipr is not None:
                self._ipr.close()
            raise KernelError(f"{_where(self._netns)}: {err}") from err
        return self

    async def __aexit__(self, *_: object) -> None:
        if self._ipr is not None:
            self._ipr.close()

    async def next_batch(self) -> list[LinkChange]:
        """Wait for the next burst of events."""
        assert self._ipr is not None, "use as an async context manager"
        return [_change(m) async for m in self._ipr.get()]


def link_events(quiet: Callable[[int], bool] | None = None) -> LinkEvents:
    """The node's own LinkEvents (what the inventory follows)."""
    return LinkEvents(quiet=quiet)


def _link_facts(name: str) -> tuple[int, str, int, int] | None:
    """(index, MAC, MTU, flags) of link `name` in the calling thread's namespace, or None. By ioctl:
    decoding a netlink link message (all its attributes and statistics) was most of an attach's own CPU
    time."""
    try:
        index = socket.if_nametoindex(name)
    except OSError:
        return None
    request = struct.pack("16s16x", name.encode())
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        hardware = fcntl.ioctl(probe, _SIOCGIFHWADDR, request)[18:24]
        [mtu] = struct.unpack_from("i", fcntl.ioctl(probe, _SIOCGIFMTU, request), 16)
        [flags] = struct.unpack_from("H", fcntl.ioctl(probe, _SIOCGIFFLAGS, request), 16)
    return index, ":".join(f"{byte:02x}" for byte in hardware), mtu, flags


def hardware_address(name: str) -> str | None:
    """The MAC of link `name` in the node's own namespace, or None. By ioctl, not `interface`: that reads
    its addresses too, from a dump of every address of the namespace, decoded one by one (a pod's host
    veth has one, so with 110 pods on the node 12 ms on the event loop, for a MAC)."""
    try:
        facts = _link_facts(name)
    except OSError as err:  # gone between its index and its address, or a kernel refusal
        raise KernelError(f"{_where(None)}: {name}: {err.strerror or err}") from err
    return facts[1] if facts is not None else None


async def interface(
    name: str,
    netns: str | None = None,
    sysctls: Mapping[str, str] | None = None,
    addresses: tuple[str, ...] | None = None,
) -> InterfaceState | None:
    """The interface as it is; with `sysctls` (paths under /proc/sys/net → value), those set first, in
    the same trip to its namespace (one missing, as IPv6's where the namespace has none, is skipped). Its
    global addresses are read by netlink unless given (a CNI result's): that read, an AsyncIPRoute on a
    socket of the namespace, was a third of an attach's own CPU time."""

    def look() -> tuple[tuple[int, str, int, int] | None, int]:
        facts = _link_facts(name)
        if facts is not None:
            _write_sysctls(sysctls or {})
        return facts, _netlink_socket() if addresses is None else -1

    def closed(found: tuple[object, int]) -> None:
        if found[1] >= 0:
            os.close(found[1])

    try:
        facts, fileno = await _in(netns, look, closed)  # one trip for both
    except OSError as err:
        raise KernelError(f"{_where(netns)}: {err.strerror or err}") from err
    if facts is None:
        closed((facts, fileno))  # an AsyncIPRoute never used does not close the socket it was given
        return None
    index, mac, mtu, flags = facts
    if addresses is None:
        async with _ipr(netns, fileno) as ipr:
            addresses = tuple(
                [
                    str(ipaddress.ip_interface(f"{m.get('address')}/{m['prefixlen']}"))
                    async for m in await ipr.get_addr(index=index)
                    if m.get("scope", 0) == 0
                ]
            )
    return InterfaceState(
        name, index, mac, mtu, addresses, bool(flags & IFF_PROMISC), bool(flags & IFF_ALLMULTI)
    )


async def set_link(
    name: str,
    *,
    mtu: int | None = None,
    mac: str | None = None,
    listening: bool | None = None,
    netns: str | None = None,
) -> None:
    """Set an interface's MTU and/or MAC, turn promisc and allmulti on or off (`listening`), and bring it
    up."""
    async with _ipr(netns) as ipr:
        index = await _index(ipr, name)
        if index is None:
            raise KernelError(f"no interface {name}")
        changes: dict[str, Any] = {}
        if mtu:
            changes["mtu"] = mtu
        if mac:
            changes["address"] = mac
        if listening is not None:
            mask = IFF_PROMISC | IFF_ALLMULTI
            changes |= {"flags": mask if listening else 0, "change": mask}
        if changes:
            await ipr.link("set", index=index, **changes)
        await ipr.link("set", index=index, state="up")


async def _one_link(ipr: AsyncIPRoute, name: str) -> Any:
    """The kernel's message for link `name`, or None. One message, not a dump filtered here: decoding a
    link message is pyroute2's costliest step, and an agent attaching pods made one dump per lookup."""
    try:
        [message] = await ipr.link("get", ifname=name)
    except NetlinkError as err:
        if err.code == errno.ENODEV:
            return None
        raise
    return message


async def _index(ipr: AsyncIPRoute, name: str) -> int | None:
    message = await _one_link(ipr, name)
    return None if message is None else int(message["index"])


def ifb_name(index: int) -> str:
    """The ifb device that carries the ingress shaping of the interface with this index."""
    return f"ifb{index}"


async def shape(name: str, bits_per_second: int, netns: str) -> None:
    """Cap the interface at `bits_per_second` both ways with token buckets: on its egress, and on the egress
    of an ifb device its ingress is redirected to (this kernel has no policer; htb/tbf, u32 and mirred).

    On the namespace thread, not the event loop: the kernel serves each request under its one lock of the
    network stack (rtnl), which a node starting and stopping pods holds often, and every other hook,
    prepare and status write of the node waited with it."""
    await _in_pod(netns, functools.partial(_shape_here, name, bits_per_second, _where(netns)))


def _shape_here(name: str, bits_per_second: int, where: str) -> None:
    """`shape` in the calling thread's namespace: six requests (an ifb made up at once, indexes read by
    ioctl, the ingress qdisc looked for before it and its filter are added)."""
    rate = max(bits_per_second // 8, 1)  # bytes/s, as tc counts
    burst = max(rate // 100, 64 * 1024)  # 10 ms at rate, at least 64 KiB (GSO super-packets and timer slack)
    try:
        index = socket.if_nametoindex(name)
    except OSError:
        raise KernelError(f"no interface {name} in {where}") from None
    with _kernel_piece("a netlink socket", where), IPRoute() as ipr:
        with _kernel_piece("an ifb device (module ifb)", where):
            try:
                ipr.link("add", ifname=ifb_name(index), kind="ifb", state="up")
            except NetlinkError as err:
                if err.code != errno.EEXIST:  # an attach tried again: the ifb of the first try stays
                    raise
                ipr.link("set", index=socket.if_nametoindex(ifb_name(index)), state="up")
            ifb = socket.if_nametoindex(ifb_name(index))
        with _kernel_piece("the tbf qdisc (module sch_tbf)", where):
            for device in (index, ifb):
                ipr.tc("replace", "tbf", index=device, handle="1:", rate=rate, burst=burst, latency=50_000)
        if "ingress" in [str(m.get("kind")) for m in ipr.get_qdiscs(index=index)]:
            return
        with _kernel_piece("the ingress qdisc (module sch_ingress)", where):
            ipr.tc("add", "ingress", index=index, handle="ffff:")
        with _kernel_piece("the u32 classifier and mirred action (modules cls_u32, act_mirred)", where):
            ipr.tc(
                "add-filter",
                "u32",
                index=index,
                parent=0xFFFF0000,
                prio=1,
                protocol=_ETH_P_ALL,
                keys=["0x0/0x0+0"],
                target=0x10001,
                action={"kind": "mirred", "direction": "egress", "action": "redirect", "ifindex": ifb},
            )


@contextlib.contextmanager
def _kernel_piece(what: str, where: str) -> Iterator[None]:
    """A refusal inside the block names the kernel piece that refused (what an admin must load)."""
    try:
        yield
    except (NetlinkError, OSError) as err:
        raise KernelError(f"{where}: {what}: {err}") from err


async def _in_pod(netns: str, work: Callable[[], None]) -> None:
    """`work()` on the namespace thread in `netns`; a namespace that is gone is a KernelError."""
    try:
        await _in(netns, work, lambda _: None)
    except OSError as err:
        raise KernelError(f"{_where(netns)}: {err.strerror or err}") from err


def _unshare_network() -> None:
    if _libc.unshare(_CLONE_NEWNET) != 0:
        error = ctypes.get_errno()
        raise OSError(error, os.strerror(error))


def _in_a_new_namespace(work: Callable[[], None]) -> None:
    """`work()` in a new, empty network namespace, by a thread of its own that then ends (unshare moves
    only the calling thread): the namespace goes with the thread and the sockets `work` closed."""
    failed: list[BaseException] = []

    def unshare_and_work() -> None:
        try:
            _unshare_network()
            work()
        except BaseException as err:  # noqa: BLE001 - handed to the caller's thread
            failed.append(err)

    thread = threading.Thread(target=unshare_and_work, name="netns-probe")
    thread.start()
    thread.join()
    if failed:
        raise failed[0]


async def probe_shaping() -> None:
    """Cap a veth in a new, empty network namespace exactly as `shape` caps a pod's interface: every kernel
    piece bandwidth caps need, tried for real (a module the kernel would load on demand counts as there).
    Nothing outlives the call."""
    where = "a new network namespace (preflight)"

    def veth_shaped() -> None:
        with _kernel_piece("a veth pair (module veth)", where), IPRoute() as ipr:
            ipr.link("add", ifname="probe0", kind="veth", peer="probe1")
        _shape_here("probe0", 1_000_000_000, where)

    try:
        await asyncio.to_thread(_in_a_new_namespace, veth_shaped)
    except OSError as err:
        raise KernelError(f"{where}: cannot make one: {err.strerror or err}") from err


async def delete_link(name: str, netns: str) -> None:
    """Delete an interface in a pod's namespace (the ifb of its ingress shaping goes with it)."""
    if os.path.exists(netns):  # noqa: PTH110, ASYNC240 - one stat: the namespace went, so did the link
        await _in_pod(netns, functools.partial(_delete_here, name, _where(netns), interface_too=True))


async def remove_ifb(name: str, netns: str) -> None:
    """Delete the ingress-shaping ifb of an interface, if the namespace and the device still exist."""
    if os.path.exists(netns):  # noqa: PTH110, ASYNC240 - one stat: the namespace went, so did its ifb
        await _in_pod(netns, functools.partial(_delete_here, name, _where(netns), interface_too=False))


def _delete_here(name: str, where: str, *, interface_too: bool) -> None:
    """Delete the ifb of interface `name` in the calling thread's namespace, and (`interface_too`) the
    interface. On the namespace thread: the kernel's deletion of a device waits for its last users (11-23
    ms measured), and the event loop waited with it."""
    try:
        index = socket.if_nametoindex(name)
    except OSError:
        return
    doomed = [index] if interface_too else []
    with contextlib.suppress(OSError):
        doomed.insert(0, socket.if_nametoindex(ifb_name(index)))
    if doomed:
        with _kernel_piece(f"deleting {name}", where), IPRoute() as ipr:
            for device in doomed:
                ipr.link("del", index=device)


def _write_sysctls(values: Mapping[str, str]) -> None:
    """In the calling thread's namespace: each /proc/sys/net/<path> set (a path that is not there skipped)."""
    for path, value in values.items():
        try:
            with open(f"/proc/sys/net/{path}", "w") as sysctl:  # noqa: PTH123 - on the namespace thread
                sysctl.write(value)
        except FileNotFoundError:
            continue


_DEFAULT_ACCEPT_DAD = "/proc/sys/net/ipv6/conf/default/accept_dad"  # read in the namespace that opens it


def _swap_default_accept_dad(value: str) -> str | None:
    """Set the calling thread's namespace's default `accept_dad`; the value before, None without IPv6."""
    try:
        with open(_DEFAULT_ACCEPT_DAD) as current:  # noqa: PTH123 - a sysctl, on the namespace thread
            before = current.read().strip()
        if before != value:
            with open(_DEFAULT_ACCEPT_DAD, "w") as sysctl:  # noqa: PTH123
                sysctl.write(value)
    except FileNotFoundError:
        return None
    return before


@contextlib.asynccontextmanager
async def without_dad(netns: str) -> AsyncIterator[None]:
    """Interfaces made in `netns` inside the block skip IPv6 duplicate address detection; the namespace's
    default is put back afterwards, so interfaces the pod had, or gets later from others, keep theirs."""
    try:
        before = await _in(netns, lambda: _swap_default_accept_dad("0"), lambda _: None)
    except OSError as err:
        raise KernelError(f"{_where(netns)}: ipv6 accept_dad: {err.strerror or err}") from err
    try:
        yield
    finally:
        if before is not None and before != "0":
            restore = before
            try:
                await _in(netns, lambda: _swap_default_accept_dad(restore), lambda _: None)
            except OSError as err:
                raise KernelError(f"{_where(netns)}: ipv6 accept_dad: {err.strerror or err}") from err

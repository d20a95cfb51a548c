"""Port security on a real kernel (root, iproute2, nftables): a node namespace whose NIC (a veth to a "wire"
namespace) carries three macvlan children in VEPA mode, each in a pod namespace, with the NIC's table and
hairpin as netclaim.agent.pods.guard writes them. Each attack is made first without the guard, where it
must work (so the checks can fail), then with it, where it must not: a pod's forged source address (what
NET_ADMIN allows), a forged ARP and neighbour advertisement, a router advertisement (what NET_RAW allows),
and a MAC of its own choosing. The neighbours still reach each other and the wire."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from netclaim.adapters import nftables as nft
from netclaim.adapters import tc
from netclaim.agent.pods.guard import Binding, elements, elements_of, link_local, skeleton
from netclaim.core.node import BROADCAST, CHILDREN
from tests.conftest import require_root_prerequisites

NIC = "nic0"
WIRE = ("10.9.0.100", "fd09::100")

# Frames a pod with NET_RAW can write (AF_PACKET and raw ICMPv6 sockets), each argument a field of it.
FORGE = r"""
import socket, struct, sys
kind, ifname = sys.argv[1], sys.argv[2]
def mac(text): return bytes.fromhex(text.replace(":", ""))
if kind == "arp":  # an ARP reply (gratuitous when the target is the sender): "sip is at sha"
    sha, sip, dst = sys.argv[3], sys.argv[4], sys.argv[5]
    frame = mac(dst) + mac(sha) + b"\x08\x06" + struct.pack("!HHBBH", 1, 0x0800, 6, 4, 2)
    frame += mac(sha) + socket.inet_aton(sip) + mac(dst) + socket.inet_aton(sip)
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW); s.bind((ifname, 0))
    try:
        s.send(frame)
    except OSError:  # dropped on its way out (the node's check): the sender may learn it
        pass
else:  # ICMPv6 from the interface's link-local address, hop limit 255 as neighbour discovery needs
    s = socket.socket(socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_ICMPV6)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, ifname.encode())
    s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_MULTICAST_HOPS, 255)
    s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_UNICAST_HOPS, 255)
    if kind == "na":  # "target is at tlla", overriding
        target, tlla = sys.argv[3], sys.argv[4]
        body = struct.pack("!BBHI", 136, 0, 0, 0x20000000) + socket.inet_pton(socket.AF_INET6, target)
        body += b"\x02\x01" + mac(tlla)
    else:  # a router advertisement with an autonomous prefix fd77::/64, default router for 1800 s
        body = struct.pack("!BBHBBHII", 134, 0, 0, 64, 0, 1800, 0, 0)
        body += struct.pack("!BBBBIII", 3, 4, 64, 0xC0, 86400, 14400, 0)
        body += socket.inet_pton(socket.AF_INET6, "fd77::")
    try:
        s.sendto(body, ("ff02::1", 0, 0, socket.if_nametoindex(ifname)))
    except OSError:
        pass
"""
LISTEN = r"""
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(("0.0.0.0", 9999)); s.settimeout(3)
print("up", flush=True)
try:
    while True:
        print(s.recvfrom(100)[1][0], flush=True)
except TimeoutError:
    pass
"""
SEND = r"""
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind((sys.argv[1], 0))
for _ in range(3): s.sendto(b"x", (sys.argv[2], 9999))
"""


def _run(*command: str, check: bool = True) -> str:
    done = subprocess.run(command, capture_output=True, text=True)
    assert done.returncode == 0 or not check, f"{command[:6]}...: {done.stderr}"
    return done.stdout


@dataclass(frozen=True)
class Pod:
    netns: str
    interface: str
    mac: str
    v4: str
    v6: str

    def run(self, *command: str, check: bool = True) -> str:
        return _run("ip", "netns", "exec", self.netns, *command, check=check)

    @property
    def binding(self) -> Binding:
        return Binding(self.mac, tuple(sorted((self.v4, self.v6, link_local(self.mac)))))

    def neighbour(self, address: str) -> str:
        """The MAC this pod's neighbour table holds for `address` ("" when none)."""
        line = self.run("ip", "neigh", "show", address).split()
        return line[line.index("lladdr") + 1] if "lladdr" in line else ""

    def pings(self, address: str) -> bool:
        flag = "-6" if ":" in address else "-4"
        done = subprocess.run(
            ["ip", "netns", "exec", self.netns, "busybox", "ping", flag, "-c", "1", "-W", "1", address],
            capture_output=True,
        )
        return done.returncode == 0


@dataclass(frozen=True)
class Segment:
    node: str  # the node's namespace (its path under /run/netns)
    attacker: Pod
    victim: Pod
    client: Pod  # the pod the victim trusts

    async def guard(self) -> None:
        """The NIC's table made and its children bound, as netclaim.agent.pods.guard writes them."""
        host = _run("ip", "netns", "exec", _named(self.node), "cat", f"/sys/class/net/{NIC}/address").strip()
        pods = (self.attacker, self.victim, self.client)
        await nft.define(self.node, skeleton(NIC))
        bound = {("host", host), *(e for p in pods for e in elements_of(p.binding))}
        await nft.apply(self.node, elements(NIC, "add", bound))
        await self.hairpin(pods)

    async def hairpin(self, pods: tuple[Pod, ...]) -> None:
        live = await tc.ours(NIC, self.node)  # made anew beside what is there, as the guard does
        free = [priority for priority in CHILDREN if priority not in live]
        children = dict(zip(free, (p.mac for p in pods), strict=False))
        await tc.change(
            NIC,
            children,
            live - {BROADCAST},
            broadcast=True if BROADCAST not in live else None,
            netns=self.node,
        )

    async def unguard(self) -> None:
        table = {"family": "netdev", "name": f"netclaim-{NIC}"}
        await nft.apply(self.node, {"nftables": [{"add": {"table": table}}, {"delete": {"table": table}}]})
        live = await tc.ours(NIC, self.node)
        await tc.change(
            NIC, {}, live - {BROADCAST}, broadcast=False if BROADCAST in live else None, netns=self.node
        )


def _named(netns: str) -> str:
    """The name `ip netns` knows a namespace by."""
    return Path(netns).name


@pytest.fixture
def segment() -> Iterator[Segment]:
    require_root_prerequisites()
    suffix = os.getpid()
    node, wire = f"gn{suffix}", f"gw{suffix}"
    names = {"attacker": ("ga", "02:00:00:00:00:0a", 1), "victim": ("gv", "02:00:00:00:00:0b", 2)}
    names["client"] = ("gc", "02:00:00:00:00:0c", 3)
    spaces = [node, wire, *(f"{short}{suffix}" for short, _, _ in names.values())]
    commands = [f"ip netns add {n}" for n in spaces] + [
        f"ip -n {node} link add {NIC} type veth peer name wire netns {wire}",
        f"ip -n {node} link set {NIC} up",
        f"ip -n {wire} link set wire up",
        f"ip -n {wire} addr add {WIRE[0]}/24 dev wire",
        f"ip -n {wire} addr add {WIRE[1]}/64 dev wire nodad",
    ]
    pods = {}
    for role, (short, mac, index) in names.items():
        netns = f"{short}{suffix}"
        commands += [
            f"ip -n {node} link add {short}0 link {NIC} address {mac} type macvlan mode vepa",
            f"ip -n {node} link set {short}0 netns {netns}",
            f"ip netns exec {netns} sysctl -qw net.ipv6.conf.{short}0.accept_dad=0",
            f"ip -n {netns} addr add 10.9.0.{index}/24 dev {short}0",
            f"ip -n {netns} addr add fd09::{index}/64 dev {short}0 nodad",
            f"ip -n {netns} link set {short}0 up",
        ]
        pods[role] = Pod(netns, f"{short}0", mac, f"10.9.0.{index}", f"fd09::{index}")
    try:
        for command in commands:
            subprocess.run(command.split(), check=True)
        yield Segment(f"/run/netns/{node}", **pods)
    finally:
        for name in spaces:
            subprocess.run(["ip", "netns", "delete", name], check=False)


def _received(victim: Pod, sender: Pod, source: str) -> list[str]:
    """The sources the victim's UDP port 9999 saw while `sender` sent three datagrams from `source`."""
    listener = subprocess.Popen(
        ["ip", "netns", "exec", victim.netns, sys.executable, "-c", LISTEN], stdout=subprocess.PIPE, text=True
    )
    assert listener.stdout is not None and listener.stdout.readline().strip() == "up"
    sender.run(sys.executable, "-c", SEND, source, victim.v4)
    output, _ = listener.communicate(timeout=10)
    return output.split()


def _attacks(segment: Segment) -> dict[str, bool]:
    """Each attack of the attacker on the victim, and whether it had an effect."""
    a, v, c = segment.attacker, segment.victim, segment.client
    assert v.pings(c.v4) and v.pings(c.v6)  # the victim knows the client's MAC
    a.run("ip", "addr", "add", f"{c.v4}/32", "dev", a.interface)  # NET_ADMIN: the client's address
    effects = {"forged source": c.v4 in _received(v, a, c.v4)}
    a.run("ip", "addr", "del", f"{c.v4}/32", "dev", a.interface)
    a.run(sys.executable, "-c", FORGE, "arp", a.interface, a.mac, c.v4, "ff:ff:ff:ff:ff:ff")
    a.run(sys.executable, "-c", FORGE, "arp", a.interface, a.mac, c.v4, v.mac)
    a.run(sys.executable, "-c", FORGE, "na", a.interface, c.v6, a.mac)
    v.run("sysctl", "-qw", f"net.ipv6.conf.{v.interface}.accept_ra=2")  # as an unguarded pod would
    a.run(sys.executable, "-c", FORGE, "ra", a.interface)
    time.sleep(1.0)
    effects["forged ARP"] = v.neighbour(c.v4) == a.mac
    effects["forged neighbour advertisement"] = v.neighbour(c.v6) == a.mac
    routes = v.run("ip", "-6", "route", "show")
    effects["router advertisement"] = "default" in routes or "fd77::" in v.run("ip", "-6", "addr", "show")
    return effects


def _reset(victim: Pod) -> None:
    victim.run("ip", "neigh", "flush", "dev", victim.interface)
    victim.run("ip", "-6", "route", "flush", "proto", "ra", check=False)
    victim.run("sh", "-c", f"ip -6 addr flush dev {victim.interface} to fd77::/64 || true")


def test_a_pod_sends_only_as_itself_once_the_nic_is_guarded(segment: Segment) -> None:
    a, v, c = segment.attacker, segment.victim, segment.client
    asyncio.run(segment.hairpin((a, v, c)))  # VEPA children reach each other through the node, unchecked
    assert a.pings(v.v4) and v.pings(c.v6) and a.pings(WIRE[0])
    unguarded = _attacks(segment)
    assert unguarded == dict.fromkeys(unguarded, True), unguarded  # each attack works on an open NIC
    _reset(v)

    asyncio.run(segment.guard())
    assert a.pings(v.v4) and v.pings(c.v4) and c.pings(v.v6) and a.pings(WIRE[0]) and v.pings(WIRE[1])
    guarded = _attacks(segment)
    assert guarded == dict.fromkeys(guarded, False), guarded
    assert v.neighbour(c.v4) == c.mac and v.neighbour(c.v6) == c.mac
    assert a.v4 in _received(v, a, a.v4)  # as itself it still gets through

    a.run("ip", "link", "set", a.interface, "address", "02:00:00:00:00:ee")  # a MAC the node never gave
    assert not a.pings(v.v4) and not a.pings(WIRE[0])


def test_a_childs_filter_comes_and_goes_alone_and_the_last_child_takes_the_mirror(segment: Segment) -> None:
    a, v, c = segment.attacker, segment.victim, segment.client
    asyncio.run(segment.guard())
    assert asyncio.run(tc.ours(NIC, segment.node)) == {BROADCAST, *CHILDREN[:3]}
    assert a.pings(v.v4)
    asyncio.run(tc.change(NIC, {}, [CHILDREN[1]], netns=segment.node))  # the victim's filter alone
    assert asyncio.run(tc.ours(NIC, segment.node)) == {BROADCAST, CHILDREN[0], CHILDREN[2]}
    assert not a.pings(v.v4) and a.pings(c.v4)  # VEPA without its hairpin filter: the wire reflects nothing
    asyncio.run(segment.unguard())
    assert asyncio.run(tc.ours(NIC, segment.node)) == set()
    assert "netclaim" not in _run("ip", "netns", "exec", _named(segment.node), "nft", "list", "tables")

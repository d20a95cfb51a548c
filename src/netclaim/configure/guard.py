"""Port security on the NICs pods share: a pod sends on the interface netclaim attached only from its own
MAC and addresses, whatever it does inside its namespace (docs/security.md).

Inside a pod nothing holds: with NET_ADMIN a pod adds another pod's address to its interface or deletes
any table there, and with NET_RAW (containerd's default set) it writes any frame, gratuitous ARP and router
advertisements included. So the check is on the node, on the NIC, where no pod reaches: a table
`netdev netclaim-<NIC>` whose chain on the NIC's egress admits a frame only if

- its source MAC is the NIC's own (the node's traffic), or a child's that netclaim made, and then
- it is IPv4, ARP or IPv6 (no VLAN tag, no other protocol: nothing else is checked), and
- its IPv4 source, ARP sender (MAC and address), IPv6 source and neighbour advertisement target are that
  child's: its pool or IPAM addresses and its link-local address (0.0.0.0 and :: for DHCP and DAD), and
- it is no router advertisement, redirect (ICMPv6 or ICMP) of a pod.

Every frame of a child reaches that chain because the child is in VEPA mode (netclaim.configure.plan:
`guarded_child`): the kernel sends a VEPA child's frames for its neighbours out through the NIC too, and
the NIC's hairpin (netclaim.adapters.tc) hands them back after the check. In the default bridge mode the
kernel passes them between children directly, and a neighbour's broadcast (a forged ARP) would never
meet a check.

A child's binding (its MAC, chosen at prepare, and the addresses known then) is in place before its ADD,
so its first frames, the plugin's own gratuitous ARP among them, pass; addresses only the ADD tells (a
tenant's own IPAM) are added right after the hook answers, off containerd's NRI lock (frames from them
are dropped until then: the table is strict). The table and the hairpin are rewritten whole
for the NIC at each change (one nft transaction, one tc batch): idempotent, and after a restart made
again from the stored rows. A row binds its child from prepare to unprepare.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from netclaim.adapters import netlink, tc
from netclaim.adapters import nftables as nft
from netclaim.configure.store import Attachment, Store
from netclaim.errors import KernelError, PrerequisiteError
from netclaim.names import check_interface_name
from netclaim.publish.devices import ACCEPT_RA

log = logging.getLogger(__name__)
FAMILY = "netdev"
RETRY_PAUSES = (0.2, 1.0, 5.0)  # follow_soon's, between tries
TABLE_PREFIX = "netclaim-"
Apply = Callable[[str, nft.Ruleset], Awaitable[None]]
Hairpin = Callable[[str, Sequence[str]], Awaitable[None]]
Tables = Callable[[], Awaitable[list[str]]]
HostMac = Callable[[str], Awaitable[str | None]]


@dataclass(frozen=True, order=True)
class Binding:
    """A child's identity on its NIC: its MAC and every address it may send from."""

    mac: str
    addresses: tuple[str, ...]  # sorted, plain (no prefix length)


def link_local(mac: str) -> str:
    """The IPv6 link-local address the kernel gives an interface with this MAC (EUI-64)."""
    octets = [int(part, 16) for part in mac.split(":")]
    eui = [octets[0] ^ 0x02, *octets[1:3], 0xFF, 0xFE, *octets[3:]]
    return str(ipaddress.IPv6Address(bytes([0xFE, 0x80, *[0] * 6, *eui])))


def guarded_nic(row: Attachment) -> str | None:
    """The NIC whose table binds the row's child, or None (an exclusive NIC, ipvlan, port security off)."""
    return row.plan.nic.if_name if row.plan.nic.published().guarded else None


def binding_of(row: Attachment) -> Binding | None:
    """What the row's child may send as: the MAC its plan chose (or the one it has), the static addresses
    its plan gives it, the addresses it has, and its link-local address."""
    interface = row.outcome.interface
    plugins: list[dict[str, Any]] = row.plan.conflist["plugins"]
    macvlan = next((p for p in plugins if p.get("type") == "macvlan"), {})
    mac = interface.mac if interface is not None else macvlan.get("mac")
    if not isinstance(mac, str):
        return None  # planned before netclaim chose MACs: bound once its ADD tells it
    addresses = {link_local(mac)}
    ipam = macvlan.get("ipam")
    if isinstance(ipam, dict) and ipam.get("type") == "static":
        for entry in ipam.get("addresses") or []:
            if isinstance(entry, dict) and isinstance(entry.get("address"), str):
                addresses.add(str(ipaddress.ip_interface(entry["address"]).ip))
    if interface is not None:
        addresses |= {str(ipaddress.ip_interface(a).ip) for a in interface.addresses}
    return Binding(mac.lower(), tuple(sorted(addresses, key=_address_order)))


def _address_order(address: str) -> tuple[int, int]:
    parsed = ipaddress.ip_address(address)
    return parsed.version, int(parsed)


def table_name(nic: str) -> str:
    return f"{TABLE_PREFIX}{check_interface_name(nic)}"


def _payload(protocol: str, field: str) -> dict[str, Any]:
    return {"payload": {"protocol": protocol, "field": field}}


def _match(left: dict[str, Any], right: Any, op: str = "==") -> dict[str, Any]:
    return {"match": {"op": op, "left": left, "right": right}}


DROP, ACCEPT = {"drop": None}, {"accept": None}
ROUTERS_ONLY = ("nd-router-advert", "nd-redirect")  # what no pod sends: a router's words


def ruleset(nic: str, host_macs: Sequence[str], bindings: Sequence[Binding]) -> nft.Ruleset:
    """The NIC's table: replaced whole in one transaction (none when no child is bound: deleted)."""
    table = {"family": FAMILY, "name": table_name(nic)}
    commands: list[dict[str, Any]] = [{"add": {"table": table}}, {"delete": {"table": table}}]
    if not bindings:
        return {"nftables": commands}
    commands.append({"add": {"table": table}})

    def rule(chain: str, *expressions: dict[str, Any]) -> dict[str, Any]:
        return {"add": {"rule": {**_of(table), "chain": chain, "expr": list(expressions)}}}

    jumps = []
    for index, binding in enumerate(sorted(set(bindings))):
        chain = f"child_{index}"
        v4 = [a for a in binding.addresses if ":" not in a]
        unspecified = ipaddress.IPv4Address(0).compressed  # DHCP's and ARP probes' source
        v6 = [a for a in binding.addresses if ":" in a]
        targets = [f"0x{int(ipaddress.IPv6Address(a)):032x}" for a in v6]
        commands += [
            {"add": {"chain": {**_of(table), "name": chain}}},
            rule(chain, _match({"meta": {"key": "protocol"}}, {"set": ["ip", "arp", "ip6"]}, "!="), DROP),
            rule(chain, _match(_payload("ip", "saddr"), {"set": [unspecified, *v4]}, "!="), DROP),
            rule(chain, _match(_payload("arp", "saddr ip"), {"set": [unspecified, *v4]}, "!="), DROP),
            rule(chain, _match(_payload("arp", "saddr ether"), binding.mac, "!="), DROP),
            rule(chain, _match(_payload("ip6", "saddr"), {"set": ["::", *v6]}, "!="), DROP),
            rule(  # an advertisement's target must be its own address (none: it advertises none)
                chain,
                _match(_payload("icmpv6", "type"), "nd-neighbor-advert"),
                *(
                    [_match({"payload": {"base": "th", "offset": 64, "len": 128}}, {"set": targets}, "!=")]
                    if targets
                    else []
                ),
                DROP,
            ),
            rule(chain, _match(_payload("icmpv6", "type"), {"set": list(ROUTERS_ONLY)}), DROP),
            rule(chain, _match(_payload("icmp", "type"), "redirect"), DROP),
            rule(chain, ACCEPT),  # its own: a jump back would meet the base chain's drop
        ]
        jumps.append([binding.mac, {"jump": {"target": chain}}])
    base = {**_of(table), "name": "egress", "type": "filter", "hook": "egress", "dev": nic, "prio": 0}
    commands.append({"add": {"chain": {**base, "policy": "accept"}}})
    if host_macs:  # the node's own frames
        commands.append(
            rule("egress", _match(_payload("ether", "saddr"), {"set": sorted(set(host_macs))}), ACCEPT)
        )
    commands += [
        rule("egress", {"vmap": {"key": _payload("ether", "saddr"), "data": {"set": jumps}}}),
        rule("egress", DROP),  # a source MAC netclaim did not give out, nor the node's
    ]
    return {"nftables": commands}


def _of(table: dict[str, str]) -> dict[str, str]:
    return {"family": table["family"], "table": table["name"]}


async def _host_mac(nic: str) -> str | None:
    state = await netlink.interface(nic)
    return state.mac if state is not None else None


async def _our_tables() -> list[str]:
    return [
        name for family, name in await nft.tables("") if family == FAMILY and name.startswith(TABLE_PREFIX)
    ]


class PortGuard:
    """Keeps each NIC's table and hairpin what the store's rows bind, one NIC at a time."""

    def __init__(
        self,
        store: Store,
        apply: Apply = nft.apply,
        hairpin: Hairpin = tc.hairpin,
        host_mac: HostMac = _host_mac,
        tables: Tables = _our_tables,
    ) -> None:
        self.store = store
        self.apply = apply
        self.hairpin = hairpin
        self.host_mac = host_mac
        self.tables = tables
        self._bound: dict[str, frozenset[Binding]] = {}  # NIC → what its table holds
        self._hairpinned: dict[str, list[str]] = {}  # NIC → the MACs its hairpin hands back
        self._locks: dict[str, asyncio.Lock] = {}

    def _wanted(self, nic: str, extra: Iterable[Attachment]) -> frozenset[Binding]:
        rows = {r.key: r for r in self.store.all()} | {r.key: r for r in extra}
        macs: dict[str, set[str]] = {}  # pod UID → its children's MACs on the NIC
        addresses: dict[str, set[str]] = {}  # pod UID → their addresses
        for row in rows.values():
            binding = binding_of(row) if guarded_nic(row) == nic else None
            if binding is not None:
                macs.setdefault(row.pod_uid, set()).add(binding.mac)
                addresses.setdefault(row.pod_uid, set()).update(binding.addresses)
        # a pod's children on one NIC may send as each other: with two in one subnet the kernel answers
        # and replies from either (its own business), never as another pod
        return frozenset(
            Binding(mac, tuple(sorted(addresses[pod], key=_address_order)))
            for pod, owned in macs.items()
            for mac in owned
        )

    def covers(self, row: Attachment) -> bool:
        """Whether the row's child is bound as it is now (its ADD may have told new addresses)."""
        nic, binding = guarded_nic(row), binding_of(row)
        return nic is None or binding is None or binding in self._bound.get(nic, frozenset())

    async def follow(self, nics: Iterable[str], extra: Iterable[Attachment] = ()) -> None:
        """Each NIC's table and hairpin made what the rows (and `extra`, about to be stored) bind."""
        pending = list(extra)
        for nic in sorted(set(nics)):
            async with self._locks.setdefault(nic, asyncio.Lock()):
                wanted = self._wanted(nic, pending)
                if self._bound.get(nic) == wanted:
                    continue
                host = await self.host_mac(nic)
                if host is None:  # the NIC went, and its children with it: only a table of ours may be left
                    wanted = frozenset()
                await self.apply("", ruleset(nic, [host] if host else [], sorted(wanted)))
                macs = sorted({b.mac for b in wanted})
                if host is not None and self._hairpinned.get(nic) != macs:  # new addresses only: no tc
                    await self.hairpin(nic, macs)
                    self._hairpinned[nic] = macs
                self._bound[nic] = wanted
                log.info("port security follows", extra={"nic": nic, "children": len(wanted)})

    async def follow_soon(self, nic: str, row: Attachment) -> None:
        """`follow` for an attached child whose ADD told addresses its prepare could not (a tenant's own
        IPAM), off the pod's start: its frames from them are dropped until then (the table is strict), so
        nothing passes unchecked meanwhile. Tried again a few times; a failure after them is logged, and
        the next change of the NIC, or a restart, writes its table again."""
        for pause in (*RETRY_PAUSES, None):
            try:
                await self.follow([nic], extra=[row])
            except (KernelError, PrerequisiteError) as err:
                if pause is None:
                    log.warning(
                        "port security not updated: the pod's new addresses stay blocked",
                        extra={"nic": nic, "pod_uid": row.pod_uid, "error": str(err)},
                    )
                    return
                await asyncio.sleep(pause)
            else:
                return

    async def start(self) -> None:
        """After a start: every NIC that has rows, or a table of an agent before, made what the rows say."""
        rows = self.store.all()
        nics = {nic for nic in map(guarded_nic, rows) if nic is not None}
        nics |= {name.removeprefix(TABLE_PREFIX) for name in await self.tables()}
        self._bound.clear()
        self._hairpinned.clear()
        for nic in sorted(nics):
            self._bound[nic] = frozenset({Binding("", ())})  # unknown: written whatever it holds
        await self.follow(nics)


def interface_sysctls(row: Attachment) -> dict[str, str]:
    """What the pod's interface is set to, whoever made it: no ICMP redirects, and no IPv6 router
    advertisements unless the NIC's rule takes the network's (a pod's own never pass a guarded NIC).
    Paths under /proc/sys/net, in the pod's namespace."""
    name = row.plan.interface_name
    accept_ra = "1" if row.plan.nic.attributes.get(ACCEPT_RA) is True else "0"
    return {
        f"ipv4/conf/{name}/accept_redirects": "0",
        f"ipv6/conf/{name}/accept_redirects": "0",
        f"ipv6/conf/{name}/accept_ra": accept_ra,
    }


async def probe() -> None:
    """What port security needs of the node, tried without changing it: the kernel takes a NIC's table
    (nftables' netdev egress hook: Linux 5.16 or later), checked on the loopback device and committed
    nowhere, and tc is installed (its mirred action is probed with bandwidth caps)."""
    await nft.apply(
        "", ruleset("lo", [], [Binding("02:00:00:00:00:01", ("10.0.0.1", "fe80::1"))]), check_only=True
    )
    await tc.version()

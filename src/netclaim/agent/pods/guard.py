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

Every frame of a child reaches that chain because the child is in VEPA mode (netclaim.core.plan:
`guarded_child`): the kernel sends a VEPA child's frames for its neighbours out through the NIC too, and
the NIC's hairpin (netclaim.adapters.tc) hands them back after the check. In the default bridge mode the
kernel passes them between children directly, and a neighbour's broadcast (a forged ARP) would never
meet a check.

A child's binding (its MAC, chosen at prepare, and the addresses known then) is written as soon as its
claim is prepared, in the background (`bind_soon`): containerd makes the pod's sandbox meanwhile, and
the attach waits for the write only if it is not done yet (`bind`), before the ADD, so the child's first
frames, the plugin's own gratuitous ARP among them, pass. A write that fails fails the attach (the pod
never runs with a child the table drops). Addresses only the ADD tells (a tenant's own IPAM) are added
right after the hook answers, off containerd's NRI lock (frames from them are dropped until then: the
table is strict). A NIC's table is made whole once (at the agent's start, or
its first child); after that a change writes only the set elements and hairpin filters that differ (one
nft transaction, one tc batch, whatever the number of children). A row binds its child from prepare to
unprepare.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from netclaim.agent.store import Attachment, Store
from netclaim.core.devices.catalog import ACCEPT_RA
from netclaim.core.names import check_interface_name
from netclaim.core.node import BROADCAST, CHILDREN, Hairpin, HardwareAddresses, Nft, Ruleset
from netclaim.errors import KernelError, PrerequisiteError
from netclaim.runtime.supervisor import Supervisor

log = logging.getLogger(__name__)
FAMILY = "netdev"
RETRY_PAUSES = (0.2, 1.0, 5.0)  # follow_soon's, between tries
TABLE_PREFIX = "netclaim-"


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
    return row.plan.nic.if_name if row.plan.nic.guarded else None


BindingKey = tuple[str, tuple[str, ...]]  # what a binding is made from: a MAC, its addresses (with prefix)


def binding_of(row: Attachment) -> Binding | None:
    """What the row's child may send as: the MAC its plan chose (or the one it has), the static addresses
    its plan gives it, the addresses it has, and its link-local address."""
    made_from = binding_source(row)
    return None if made_from is None else _binding(*made_from)


def binding_source(row: Attachment) -> BindingKey | None:
    """What the row's binding is made from; None while its MAC is unknown."""
    interface = row.outcome.interface
    plugins: list[dict[str, Any]] = row.plan.conflist["plugins"]
    macvlan = next((p for p in plugins if p.get("type") == "macvlan"), {})
    mac = interface.mac if interface is not None else macvlan.get("mac")
    if not isinstance(mac, str):
        return None  # planned before netclaim chose MACs: bound once its ADD tells it
    static: list[str] = []
    ipam = macvlan.get("ipam")
    if isinstance(ipam, dict) and ipam.get("type") == "static":
        for entry in ipam.get("addresses") or []:
            if isinstance(entry, dict) and isinstance(entry.get("address"), str):
                static.append(entry["address"])
    return mac, (*static, *(interface.addresses if interface is not None else ()))


def _binding(mac: str, addresses: tuple[str, ...]) -> Binding:
    plain = {link_local(mac), *(str(ipaddress.ip_interface(a).ip) for a in addresses)}
    return Binding(mac.lower(), tuple(sorted(plain, key=_address_order)))


def _address_order(address: str) -> tuple[int, int]:
    parsed = ipaddress.ip_address(address)
    return parsed.version, int(parsed)


def table_name(nic: str) -> str:
    return f"{TABLE_PREFIX}{check_interface_name(nic)}"


def skeleton(nic: str) -> str:
    """The NIC's table as nft's own language: its sets and its rules, netclaim's constants only (the NIC's
    name is checked; nothing a pod or a tenant brings). What the pods bring, MACs and addresses, goes into
    the sets as JSON elements (`elements`). Text because one set's key (ether saddr . @th,64,128: an
    advertisement's target) has a type nft's JSON cannot declare."""
    return f"""table {FAMILY} {table_name(nic)}
delete table {FAMILY} {table_name(nic)}
table {FAMILY} {table_name(nic)} {{
  set host {{ type ether_addr; }}
  set macs {{ type ether_addr; }}
  set pairs {{ type ether_addr . ether_addr; }}
  set v4 {{ type ether_addr . ipv4_addr; }}
  set v6 {{ type ether_addr . ipv6_addr; }}
  set nd {{ typeof ether saddr . @th,64,128; }}
  chain egress {{
    type filter hook egress device "{check_interface_name(nic)}" priority 0; policy accept;
    ether saddr @host accept
    ether saddr != @macs drop
    meta protocol != {{ ip, arp, ip6 }} drop
    ip saddr != 0.0.0.0 ether saddr . ip saddr != @v4 drop
    ether saddr . arp saddr ether != @pairs drop
    arp saddr ip != 0.0.0.0 ether saddr . arp saddr ip != @v4 drop
    ip6 saddr != :: ether saddr . ip6 saddr != @v6 drop
    icmpv6 type nd-neighbor-advert ether saddr . @th,64,128 != @nd drop
    icmpv6 type {{ nd-router-advert, nd-redirect }} drop
    icmp type redirect drop
  }}
}}
"""


Element = tuple[str, Any]  # (set, element as nft's JSON writes it)


def elements_of(binding: Binding) -> frozenset[Element]:
    """The set elements that admit one child: its MAC, its MAC as its ARP sender, each address with it."""
    found: set[Element] = {("macs", binding.mac), ("pairs", (binding.mac, binding.mac))}
    for address in binding.addresses:
        if ":" in address:
            found.add(("v6", (binding.mac, address)))
            found.add(("nd", (binding.mac, f"0x{int(ipaddress.IPv6Address(address)):032x}")))
        else:
            found.add(("v4", (binding.mac, address)))
    return frozenset(found)


def elements(nic: str, verb: str, chosen: Iterable[Element]) -> Ruleset:
    """One batch that adds (`verb` "add") or deletes ("delete") the elements of the NIC's sets."""
    by_set: dict[str, list[Any]] = {}
    for name, value in sorted(chosen, key=repr):
        by_set.setdefault(name, []).append({"concat": list(value)} if isinstance(value, tuple) else value)
    commands = [
        {verb: {"element": {"family": FAMILY, "table": table_name(nic), "name": name, "elem": values}}}
        for name, values in sorted(by_set.items())
    ]
    return {"nftables": commands}


class PortGuard:
    """Keeps each NIC's table and hairpin what the store's rows bind: the table made once per NIC (at
    the agent's start, or its first child), then only the elements and hairpin filters that change. Each
    call reads what to bind from the store when it gets the NIC: calls queued behind a write find their
    rows written by it, and return at once (a burst of prepares on a NIC costs a few writes, not one each)."""

    def __init__(
        self, store: Store, nft: Nft, hairpin: Hairpin, links: HardwareAddresses, background: Supervisor
    ) -> None:
        self.store = store
        self.background = background
        self.nft = nft
        self.hairpin = hairpin
        self.links = links
        self._bound: dict[str, frozenset[Binding]] = {}  # NIC → what its table holds (made: in it)
        self._held: dict[str, frozenset[Element]] = {}  # NIC → its table's set elements, as _bound says
        self._hairpins: dict[str, dict[str, int]] = {}  # NIC → its children's MACs → their filters
        self._locks: dict[str, asyncio.Lock] = {}
        # worked out at a NIC's last pass, for its next (each pass goes over every child of the NIC): the
        # children's bindings by what they are made from, and each wanted binding's set elements; only
        # the NIC's children now, none of those gone
        self._bindings: dict[str, dict[BindingKey, Binding]] = {}
        self._elements: dict[str, dict[Binding, frozenset[Element]]] = {}

    def _wanted(self, nic: str) -> frozenset[Binding]:
        children: dict[str, list[Binding]] = {}  # pod UID → its children's bindings on the NIC
        known = self._bindings.get(nic, {})
        seen: dict[BindingKey, Binding] = {}
        for row in self.store.all():
            made_from = binding_source(row) if guarded_nic(row) == nic else None
            if made_from is None:
                continue
            binding = known.get(made_from)
            seen[made_from] = binding = _binding(*made_from) if binding is None else binding
            children.setdefault(row.pod_uid, []).append(binding)
        self._bindings[nic] = seen
        wanted = set()
        for bindings in children.values():
            if len(bindings) == 1:  # most pods: one child on a NIC
                wanted.add(bindings[0])
                continue
            # a pod's children on one NIC may send as each other: with two in one subnet the kernel
            # answers and replies from either (its own business), never as another pod
            addresses = tuple(sorted({a for b in bindings for a in b.addresses}, key=_address_order))
            wanted.update(Binding(mac, addresses) for mac in {b.mac for b in bindings})
        return frozenset(wanted)

    def covers(self, row: Attachment) -> bool:
        """Whether the row's child is bound as it is now (its ADD may have told new addresses)."""
        nic, binding = guarded_nic(row), binding_of(row)
        if nic is None or binding is None:
            return True
        return elements_of(binding) <= self._held.get(nic, frozenset())

    def bind_soon(self, rows: Iterable[Attachment]) -> None:
        """Start writing what the rows' children need, off the caller's path (prepare's): a write that
        fails is logged, and `bind` tries again before the child is made."""
        for nic in sorted({n for n in map(guarded_nic, rows) if n is not None}):
            if not all(self.covers(row) for row in rows if guarded_nic(row) == nic):
                self.background.spawn("port-security", self._bind_ahead(nic))

    async def _bind_ahead(self, nic: str) -> None:
        try:
            await self.follow([nic])
        except (KernelError, PrerequisiteError) as err:
            log.warning(
                "port security not written ahead: the attach tries again",
                extra={"nic": nic, "error": str(err)},
            )

    async def bind(self, row: Attachment) -> None:
        """The row's child bound on its NIC, before the ADD makes it: at once when `bind_soon`'s write is
        done, else after it (or a write of its own)."""
        nic = guarded_nic(row)
        if nic is not None and not self.covers(row):
            await self.follow([nic])

    async def follow(self, nics: Iterable[str]) -> None:
        """Each NIC's table and hairpin made what the stored rows bind."""
        for nic in sorted(set(nics)):
            async with self._locks.setdefault(nic, asyncio.Lock()):
                try:
                    await self._follow(nic)
                except BaseException:  # what the kernel holds is unknown now: the next call makes it whole
                    self._forget(nic)
                    raise

    async def _follow(self, nic: str) -> None:
        wanted = self._wanted(nic)
        bound = self._bound.get(nic)
        if bound == wanted:
            return
        host = self.links.hardware_address(nic)
        if host is None:  # the NIC went, and its children with it: only a table of ours may be left
            gone = [{"add": {"table": _table(nic)}}, {"delete": {"table": _table(nic)}}]
            await self.nft.apply("", {"nftables": gone})
            self._forget(nic)
            return
        before = self._held.get(nic, frozenset())
        known = self._elements.get(nic, {})
        chosen = {b: known[b] if b in known else elements_of(b) for b in wanted}
        after = {e for found in chosen.values() for e in found}
        if bound is None:  # made now, whole
            await self.nft.define("", skeleton(nic))
            await self.nft.apply("", elements(nic, "add", {("host", host), *after}))
        else:
            batch = elements(nic, "delete", before - after)["nftables"]
            batch += elements(nic, "add", after - before)["nftables"]
            if batch:
                await self.nft.apply("", {"nftables": batch})
        await self._hand_back(nic, {b.mac for b in wanted}, made=bound is None)
        self._bound[nic] = wanted
        self._held[nic] = frozenset(after)
        self._elements[nic] = chosen
        log.info("port security follows", extra={"nic": nic, "children": len(wanted)})

    def _forget(self, nic: str) -> None:
        for known in (self._bound, self._held, self._hairpins, self._bindings, self._elements):
            known.pop(nic, None)

    async def _hand_back(self, nic: str, macs: set[str], *, made: bool) -> None:
        """The NIC's hairpin for `macs`: when the table is `made`, written anew beside what an agent before
        left (its filters deleted once the new ones are in); else only the MACs that came or went."""
        held = {} if made else self._hairpins.get(nic, {})
        live = await self.hairpin.ours(nic) if made else set(held.values()) | ({BROADCAST} if held else set())
        if not made and set(held) == macs:
            return  # new addresses only: no tc
        kept = {mac: priority for mac, priority in held.items() if mac in macs}
        free = (p for p in CHILDREN if p not in live and p not in kept.values())
        added = {next(free): mac for mac in sorted(macs - set(kept))}
        stale = {p for p in live if p != BROADCAST} - set(kept.values())
        mirrored = BROADCAST in live
        broadcast = True if macs and not mirrored else (False if not macs and mirrored else None)
        await self.hairpin.change(nic, added, stale, broadcast=broadcast)
        self._hairpins[nic] = {**kept, **{mac: priority for priority, mac in added.items()}}

    async def follow_soon(self, nic: str, row: Attachment) -> None:
        """`follow` for an attached child whose ADD told addresses its prepare could not (a tenant's own
        IPAM), off the pod's start: its frames from them are dropped until then (the table is strict), so
        nothing passes unchecked meanwhile. Tried again a few times; a failure after them is logged, and
        the next change of the NIC, or a restart, writes its table again."""
        for pause in (*RETRY_PAUSES, None):
            try:
                await self.follow([nic])
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
        """After a start: every NIC that has rows, or a table of an agent before, made again whole from what
        the rows say (an older agent's elements never stay)."""
        nics = {nic for nic in map(guarded_nic, self.store.all()) if nic is not None}
        nics |= {
            name.removeprefix(TABLE_PREFIX)
            for family, name in await self.nft.tables("")
            if family == FAMILY and name.startswith(TABLE_PREFIX)
        }
        for nic in [*self._bound, *self._held, *self._hairpins, *self._bindings, *self._elements]:
            self._forget(nic)
        await self.follow(nics)


def _table(nic: str) -> dict[str, str]:
    return {"family": FAMILY, "name": table_name(nic)}


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

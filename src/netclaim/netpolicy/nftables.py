"""A pod's rules as one nftables script for its network namespace (pure: the netlink adapter runs it).

One table, `inet netclaim`, replaced whole in one transaction (nft applies a script atomically): the
namespace is never without its rules in between. Only the interfaces netclaim attached are matched
(`iifname`/`oifname`); the primary interface and everything else pass untouched. In an isolated
direction: replies to allowed traffic pass (conntrack), IPv6 neighbour discovery always passes (without it
no address on the link is reachable at all), the allowed traffic passes, the rest is dropped.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping

from netclaim.netpolicy.rules import Allow, Direction, NetworkRules, PortMatch

TABLE = "inet netclaim"
# neighbour discovery, and the router's advertisements an IPv6 interface configures itself from
NEIGHBOUR_DISCOVERY = "nd-neighbor-solicit, nd-neighbor-advert, nd-router-solicit, nd-router-advert"
PROTOCOLS = {"TCP": "tcp", "UDP": "udp", "SCTP": "sctp"}


def script(interfaces: Mapping[str, NetworkRules]) -> str:
    """The script that makes the namespace's table what `interfaces` (name → rules) says; with no isolated
    interface, one that deletes the table (or does nothing when there is none)."""
    lines = [f"table {TABLE}", f"delete table {TABLE}"]  # the first makes it if absent: the delete holds
    isolated = {name: rules for name, rules in sorted(interfaces.items()) if rules.ingress or rules.egress}
    if not isolated:
        return "\n".join(lines) + "\n"
    lines.append(f"table {TABLE} {{")
    hooks = {"input": "iifname", "output": "oifname"}
    chains: list[str] = []
    jumps: dict[str, list[str]] = {"input": [], "output": []}
    for index, (name, rules) in enumerate(isolated.items()):
        for hook, direction in (("input", rules.ingress), ("output", rules.egress)):
            if direction is None:
                continue
            chain = f"{'in' if hook == 'input' else 'out'}_{index}"
            jumps[hook].append(f'{hooks[hook]} "{name}" jump {chain}')
            chains += _chain(chain, direction, "saddr" if hook == "input" else "daddr")
    for hook in ("input", "output"):
        lines += [
            f"  chain {hook} {{",
            f"    type filter hook {hook} priority filter; policy accept;",
            *(f"    {jump}" for jump in jumps[hook]),
            "  }",
        ]
    lines += chains
    lines.append("}")
    return "\n".join(lines) + "\n"


def counted(interfaces: Mapping[str, NetworkRules]) -> tuple[int, int]:
    """(allow rules, isolated directions) the script of `interfaces` programs: what the metrics show."""
    rules = isolated = 0
    for network_rules in interfaces.values():
        for direction, side in ((network_rules.ingress, "saddr"), (network_rules.egress, "daddr")):
            if direction is not None:
                isolated += 1
                rules += sum(len(_matches(allow, side)) for allow in direction.allows)
    return rules, isolated


def _chain(chain: str, direction: Direction, side: str) -> list[str]:
    lines = [
        f"  chain {chain} {{",
        "    ct state established,related accept",
        f"    icmpv6 type {{ {NEIGHBOUR_DISCOVERY} }} accept",
    ]
    for allow in direction.allows:
        lines += [f"    {rule} accept" for rule in _matches(allow, side)]
    lines += ["    drop", "  }"]
    return lines


def _matches(allow: Allow, side: str) -> list[str]:
    """The match expressions of one Allow: one rule per address family and protocol."""
    found = []
    for version, family in ((4, "ip"), (6, "ip6")):
        cidrs = _collapsed(allow.cidrs, version)
        if not cidrs:
            continue
        where = f"{family} {side} {{ {', '.join(cidrs)} }}"
        excepts = _collapsed(allow.excepts, version)
        if excepts:
            where += f" {family} {side} != {{ {', '.join(excepts)} }}"
        if not allow.ports:
            found.append(where)
            continue
        for protocol in sorted({p.protocol for p in allow.ports}):
            found.append(f"{where} {_ports(protocol, [p for p in allow.ports if p.protocol == protocol])}")
    return found


def _collapsed(cidrs: tuple[str, ...], version: int) -> list[str]:
    """One family's networks without overlaps: nft refuses an interval set whose elements overlap."""
    if version == 4:
        return [
            str(n)
            for n in ipaddress.collapse_addresses(ipaddress.IPv4Network(c) for c in cidrs if ":" not in c)
        ]
    return [str(n) for n in ipaddress.collapse_addresses(ipaddress.IPv6Network(c) for c in cidrs if ":" in c)]


def _ports(protocol: str, ports: list[PortMatch]) -> str:
    name = PROTOCOLS[protocol]
    ranges = sorted((p.first, p.last or p.first) for p in ports if p.first is not None)
    if len(ranges) < len(ports):  # the protocol's every port
        return f"meta l4proto {name}"
    merged: list[tuple[int, int]] = []
    for first, last in ranges:  # nft refuses overlapping intervals here too
        if merged and first <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(merged[-1][1], last))
        else:
            merged.append((first, last))
    shown = [f"{first}" if first == last else f"{first}-{last}" for first, last in merged]
    return f"{name} dport {{ {', '.join(shown)} }}"

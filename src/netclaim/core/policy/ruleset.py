"""A pod's rules as nftables commands for its network namespace, built as data: nft's JSON schema
(libnftables-json(5)), applied with `nft -j -f -` by the nftables adapter. Nothing a tenant wrote is ever
formatted into nft's language: addresses, ports and interface names are values of typed JSON fields, so no
policy can add a command, a chain, an `include` or a table of its own (tests/unit/test_nft_ruleset.py
holds the property over every policy the API accepts).

One table, `inet netclaim`, replaced whole in one transaction (nft applies a batch atomically): the
namespace is never without its rules in between. Only the interfaces netclaim attached are matched
(`iifname`/`oifname`); the primary interface and everything else pass untouched. In an isolated
direction: replies to allowed traffic pass (conntrack), IPv6 neighbour solicitations and advertisements
pass (without them no address on the link is reachable at all), the allowed traffic passes, the rest is
dropped. Router advertisements are not neighbour discovery's: they pass only where the network's admin
accepts them (docs/security.md), and pods never send them past the node (netclaim.netguard).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from typing import Any

from netclaim.core.names import check_interface_name
from netclaim.core.policy.rules import Allow, Direction, NetworkRules, PortMatch

FAMILY, NAME = "inet", "netclaim"
TABLE = {"family": FAMILY, "name": NAME}
NEIGHBOUR_DISCOVERY = ("nd-neighbor-solicit", "nd-neighbor-advert")
PROTOCOLS = {"TCP": "tcp", "UDP": "udp", "SCTP": "sctp"}
HOOKS = {"input": ("iifname", "saddr", "in"), "output": ("oifname", "daddr", "out")}
Command = dict[str, Any]
Expression = dict[str, Any]


def ruleset(interfaces: Mapping[str, NetworkRules]) -> dict[str, Any]:
    """The batch that makes the namespace's table what `interfaces` (name → rules) says; with no isolated
    interface, one that deletes the table (and does nothing when there is none)."""
    commands: list[Command] = [{"add": {"table": TABLE}}, {"delete": {"table": TABLE}}]
    isolated = {name: rules for name, rules in sorted(interfaces.items()) if rules.ingress or rules.egress}
    if isolated:
        commands.append({"add": {"table": TABLE}})
        chains: list[Command] = []
        jumps: dict[str, list[Command]] = {"input": [], "output": []}
        for index, (name, rules) in enumerate(isolated.items()):
            for hook, direction in (("input", rules.ingress), ("output", rules.egress)):
                if direction is None:
                    continue
                interface_key, side, prefix = HOOKS[hook]
                chain = f"{prefix}_{index}"
                jump = [_match(_meta(interface_key), check_interface_name(name)), {"jump": {"target": chain}}]
                jumps[hook].append(_rule(hook, jump))
                chains += _chain(chain, direction, side)
        commands += chains  # before the jumps to them: nft takes a batch's commands in order
        for hook in ("input", "output"):
            base = {**_chain_of(hook), "type": "filter", "hook": hook, "prio": 0, "policy": "accept"}
            commands += [{"add": {"chain": base}}, *jumps[hook]]
    return {"nftables": commands}


def counted(interfaces: Mapping[str, NetworkRules]) -> tuple[int, int]:
    """(allow rules, isolated directions) the ruleset of `interfaces` programs: what the metrics show."""
    rules = isolated = 0
    for network_rules in interfaces.values():
        for direction, side in ((network_rules.ingress, "saddr"), (network_rules.egress, "daddr")):
            if direction is not None:
                isolated += 1
                rules += sum(len(_matches(allow, side)) for allow in direction.allows)
    return rules, isolated


def _chain_of(name: str) -> dict[str, Any]:
    return {"family": FAMILY, "table": NAME, "name": name}


def _rule(chain: str, expressions: list[Expression]) -> Command:
    return {"add": {"rule": {"family": FAMILY, "table": NAME, "chain": chain, "expr": expressions}}}


def _meta(key: str) -> Expression:
    return {"meta": {"key": key}}


def _payload(protocol: str, field: str) -> Expression:
    return {"payload": {"protocol": protocol, "field": field}}


def _match(left: Expression, right: Any, op: str = "==") -> Expression:
    return {"match": {"op": op, "left": left, "right": right}}


ACCEPT: Expression = {"accept": None}


def _chain(chain: str, direction: Direction, side: str) -> list[Command]:
    made: list[Command] = [
        {"add": {"chain": _chain_of(chain)}},
        _rule(chain, [_match({"ct": {"key": "state"}}, ["established", "related"], "in"), ACCEPT]),
        _rule(chain, [_match(_payload("icmpv6", "type"), {"set": list(NEIGHBOUR_DISCOVERY)}), ACCEPT]),
    ]
    for allow in direction.allows:
        made += [_rule(chain, [*matches, ACCEPT]) for matches in _matches(allow, side)]
    made.append(_rule(chain, [{"drop": None}]))
    return made


def _matches(allow: Allow, side: str) -> list[list[Expression]]:
    """The match expressions of one Allow: one rule per address family and protocol."""
    found = []
    for version, family in ((4, "ip"), (6, "ip6")):
        cidrs = _collapsed(allow.cidrs, version)
        if not cidrs:
            continue
        where = [_match(_payload(family, side), {"set": cidrs})]
        excepts = _collapsed(allow.excepts, version)
        if excepts:
            where.append(_match(_payload(family, side), {"set": excepts}, "!="))
        if not allow.ports:
            found.append(where)
            continue
        for protocol in sorted({p.protocol for p in allow.ports}):
            found.append([*where, _ports(protocol, [p for p in allow.ports if p.protocol == protocol])])
    return found


def _collapsed(cidrs: tuple[str, ...], version: int) -> list[Any]:
    """One family's networks without overlaps (nft refuses an interval set whose elements overlap), each a
    JSON address or prefix. The networks were normalized by the controller (netclaim.core.policy.spec);
    one that is not a network of this family is a bug, and raises here rather than reach nft."""
    networks = [ipaddress.ip_network(c) for c in cidrs]
    family = [n for n in networks if n.version == version]
    collapsed = ipaddress.collapse_addresses(family)  # type: ignore[type-var]
    return [
        str(n.network_address)
        if n.prefixlen == n.max_prefixlen
        else {"prefix": {"addr": str(n.network_address), "len": n.prefixlen}}
        for n in collapsed
    ]


def _ports(protocol: str, ports: list[PortMatch]) -> Expression:
    name = PROTOCOLS[protocol]
    ranges = sorted((p.first, p.last or p.first) for p in ports if p.first is not None)
    if len(ranges) < len(ports):  # the protocol's every port
        return _match(_meta("l4proto"), name)
    merged: list[tuple[int, int]] = []
    for first, last in ranges:  # nft refuses overlapping intervals here too
        if merged and first <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(merged[-1][1], last))
        else:
            merged.append((first, last))
    shown: list[Any] = [first if first == last else {"range": [first, last]} for first, last in merged]
    return _match(_payload(name, "dport"), {"set": shown})

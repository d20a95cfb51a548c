"""A tenant's MultiNetworkPolicy from the API to nft's JSON (netclaim.core.policy.spec,
netclaim.netpolicy): what is normalized or refused, and the property that whatever policy is accepted, the
batch handed to nft holds only our table, our chains and typed values, never a command of the tenant's."""

from __future__ import annotations

import ipaddress
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from netclaim.core.policy import ruleset as rulesets
from netclaim.core.policy.rules import (
    Allow,
    Direction,
    NetworkRules,
    PodFacts,
    PolicyObject,
    PortMatch,
    pod_rules,
)
from netclaim.core.policy.spec import read_policy_spec
from netclaim.errors import ConfigError

WHERE = "MultiNetworkPolicy team-a/p"


def _block(cidr: str, *excepts: str) -> dict[str, Any]:
    block: dict[str, Any] = {"cidr": cidr}
    if excepts:
        block["except"] = list(excepts)
    return {"podSelector": {}, "ingress": [{"from": [{"ipBlock": block}]}]}


def _read(spec: dict[str, Any]) -> Any:
    return read_policy_spec(spec, WHERE)


@pytest.mark.parametrize(
    ("cidr", "excepts", "read_as"),
    [
        ("10.1.2.3/16", ("10.1.2.3/24",), ("10.1.0.0/16", ("10.1.2.0/24",))),  # host bits cleared
        ("fd00::1/64", ("fd00::1:0/112",), ("fd00::/64", ("fd00::1:0/112",))),
        ("0.0.0.0/0", (), ("0.0.0.0/0", ())),
        ("10.1.0.0/16", ("10.1.0.0/16",), ("10.1.0.0/16", ("10.1.0.0/16",))),  # an except may be all of it
    ],
)
def test_cidrs_are_normalized_as_networkpolicy_reads_them(
    cidr: str, excepts: tuple[str, ...], read_as: tuple[str, tuple[str, ...]]
) -> None:
    [rule] = _read(_block(cidr, *excepts)).ingress
    block = rule.peers[0].ip_block
    assert (block.cidr, block.except_) == read_as


@pytest.mark.parametrize(
    ("spec", "problem"),
    [
        (_block("fe80::%x }\n } chain evil {"), "is not a CIDR"),  # a zone with nft's language after it
        (_block("fe80::/64%eth0"), "is not a CIDR"),
        (_block("10.0.0.1"), "is not a CIDR"),  # no prefix length
        (_block(" 10.0.0.0/8"), "is not a CIDR"),
        (_block("010.0.0.0/8"), "is not a CIDR"),  # leading zeros: Go reads them otherwise
        (_block("::ffff:10.0.0.0/104"), "IPv4 network written as IPv6"),
        (_block("10.0.0.0/33"), "is not a CIDR"),
        (_block("10.0.0.0/8", "10.0.0.0/7"), "not inside cidr"),
        (_block("10.0.0.0/8", "fd00::/64"), "not inside cidr"),
        (_block("10.0.0.0/8", "10.1.0.0/16\n"), "is not a CIDR"),
        (
            _block("10.0.0.0/8", *(f"10.{i}.0.0/16" for i in range(101))),
            "ipBlock.except: Expected `array` of length <= 100",
        ),
        (
            {"podSelector": {}, "ingress": [{"from": [{"ipBlock": {"cidr": 167772160}}]}]},
            "cidr: Expected `str`",
        ),
        ({"podSelector": {}, "ingress": [{"ports": [{"port": "80"}]}]}, "neither a number nor"),
        ({"podSelector": {}, "ingress": [{"ports": [{"port": "http-"}]}]}, "neither a number nor"),
        ({"podSelector": {}, "ingress": [{"ports": [{"port": "a--b"}]}]}, "neither a number nor"),
        ({"podSelector": {}, "ingress": [{"ports": [{"port": "sixteen-letters"}]}]}, ""),  # 15: fine
        ({"podSelector": {}, "ingress": [{"ports": [{"port": "seventeen-letters"}]}]}, "neither a number"),
        ({"podSelector": {}, "ingress": [{"ports": [{"port": 'x" ; include "/etc'}]}]}, "neither a number"),
        ({"podSelector": {}, "ingress": [{"ports": [{"port": True}]}]}, "spec.ingress[0].ports[0].port"),
        ({"podSelector": {}, "ingress": [{"ports": [{"port": 80, "endPort": 79}]}]}, "not between port"),
        ({"podSelector": {}, "ingress": [{"ports": [{"port": 80, "endPort": 1.5}]}]}, "endPort"),
        ({"podSelector": {"matchLabels": {"app\n": "db"}}}, "is not a label key"),
        ({"podSelector": {"matchLabels": {"app": "d b"}}}, "is not a label value"),
        ({"podSelector": {"matchLabels": {"/app": "db"}}}, "is not a label key"),
        ({"podSelector": {"matchLabels": {"Example.com/app": "db"}}}, "is not a label key"),
        ({"podSelector": {"matchLabels": {"a" * 64: "db"}}}, "is not a label key"),
        (
            {"podSelector": {"matchLabels": {f"k{i}": "v" for i in range(33)}}},
            "spec.podSelector.matchLabels: Expected `object` of length <= 32",
        ),
        (
            {"podSelector": {"matchExpressions": [{"key": "a", "operator": "In", "values": ["x\u0000"]}]}},
            "is not a label value",
        ),
        (
            {
                "podSelector": {
                    "matchExpressions": [
                        {"key": "a", "operator": "In", "values": [str(i) for i in range(65)]}
                    ]
                }
            },
            "matchExpressions[0].values: Expected `array` of length <= 64",
        ),
        ({"podSelector": {}, "PolicyTypes": ["Ingress"]}, "spec.PolicyTypes: unknown field"),
    ],
)
def test_what_no_networkpolicy_could_mean_is_refused_naming_the_field(
    spec: dict[str, Any], problem: str
) -> None:
    if not problem:
        _read(spec)
        return
    with pytest.raises(ConfigError, match=f"{WHERE}: ") as raised:
        _read(spec)
    assert problem in str(raised.value)


def _rules(ruleset: dict[str, Any], chain: str) -> list[list[dict[str, Any]]]:
    return [
        c["add"]["rule"]["expr"]
        for c in ruleset["nftables"]
        if "rule" in c.get("add", {}) and c["add"]["rule"]["chain"] == chain
    ]


def _set(*items: Any) -> dict[str, Any]:
    return {"set": list(items)}


def _source(family: str, *items: Any, op: str = "==") -> dict[str, Any]:
    return {
        "match": {
            "op": op,
            "left": {"payload": {"protocol": family, "field": "saddr"}},
            "right": _set(*items),
        }
    }


def test_the_ruleset_matches_only_our_interfaces_and_ends_each_isolated_direction_with_a_drop() -> None:
    allows = (
        Allow(
            ("10.3.0.0/24", "10.3.0.20/32", "fd03::/64"),
            ("10.3.0.128/25",),
            (PortMatch("TCP", 80, 90), PortMatch("TCP", 85, 100), PortMatch("UDP")),
        ),
    )
    ruleset = rulesets.ruleset(
        {"net1": NetworkRules(ingress=Direction(allows, ("team-a/p",))), "net2": NetworkRules()}
    )
    table = {"family": "inet", "name": "netclaim"}
    assert ruleset["nftables"][:3] == [
        {"add": {"table": table}},
        {"delete": {"table": table}},
        {"add": {"table": table}},
    ]
    assert _rules(ruleset, "input") == [
        [
            {"match": {"op": "==", "left": {"meta": {"key": "iifname"}}, "right": "net1"}},
            {"jump": {"target": "in_0"}},
        ]
    ]
    assert _rules(ruleset, "output") == [] and "net2" not in json.dumps(ruleset)
    net = {"prefix": {"addr": "10.3.0.0", "len": 24}}
    out = _source("ip", {"prefix": {"addr": "10.3.0.128", "len": 25}}, op="!=")
    tcp = {
        "match": {
            "op": "==",
            "left": {"payload": {"protocol": "tcp", "field": "dport"}},
            "right": _set({"range": [80, 100]}),
        }
    }
    udp = {"match": {"op": "==", "left": {"meta": {"key": "l4proto"}}, "right": "udp"}}
    accept = {"accept": None}
    chain = _rules(ruleset, "in_0")
    assert chain[0][0]["match"]["left"] == {"ct": {"key": "state"}}
    assert chain[1][0]["match"]["right"] == _set("nd-neighbor-solicit", "nd-neighbor-advert")  # no RA
    assert chain[2:] == [
        [_source("ip", net), out, tcp, accept],
        [_source("ip", net), out, udp, accept],
        [_source("ip6", {"prefix": {"addr": "fd03::", "len": 64}}), tcp, accept],
        [_source("ip6", {"prefix": {"addr": "fd03::", "len": 64}}), udp, accept],
        [{"drop": None}],
    ]
    assert rulesets.ruleset({"net1": NetworkRules()}) == {
        "nftables": [{"add": {"table": table}}, {"delete": {"table": table}}]
    }


# -- the property: any policy the API accepts renders to our table and chains only ---------------------

HOSTILE = st.sampled_from(
    [
        'x" ; include "/etc/passwd',
        "} chain evil { type filter hook input priority -500; policy drop; }",
        "fe80::1%eth0",
        "\n\ttable ip evil",
        "$var",
        "@set",
        "10.0.0.0/8 }",
        "*",
        "\u0000",
    ]
)
LABEL = st.one_of(st.from_regex(r"[a-z][a-z0-9]{0,5}", fullmatch=True), HOSTILE)
CIDR = st.one_of(
    st.builds(lambda a, n: f"{ipaddress.IPv4Address(a)}/{n}", st.integers(0, 2**32 - 1), st.integers(0, 32)),
    st.builds(
        lambda a, n: f"{ipaddress.IPv6Address(a)}/{n}", st.integers(0, 2**128 - 1), st.integers(0, 128)
    ),
    HOSTILE,
)
SELECTOR = st.fixed_dictionaries(
    {},
    optional={
        "matchLabels": st.dictionaries(LABEL, LABEL, max_size=3),
        "matchExpressions": st.lists(
            st.fixed_dictionaries(
                {"key": LABEL, "operator": st.sampled_from(["In", "NotIn", "Exists", "DoesNotExist"])},
                optional={"values": st.lists(LABEL, max_size=3)},
            ),
            max_size=2,
        ),
    },
)
PEER = st.one_of(
    st.fixed_dictionaries(
        {"ipBlock": st.fixed_dictionaries({"cidr": CIDR}, optional={"except": st.lists(CIDR, max_size=3)})}
    ),
    st.fixed_dictionaries({}, optional={"podSelector": SELECTOR, "namespaceSelector": SELECTOR}),
)
PORT = st.fixed_dictionaries(
    {},
    optional={
        "protocol": st.sampled_from(["TCP", "UDP", "SCTP", "ICMP", "tcp"]),
        "port": st.one_of(st.integers(-1, 70000), st.sampled_from(["pg", "http", "80"]), HOSTILE),
        "endPort": st.integers(0, 70000),
    },
)
RULE = st.fixed_dictionaries(
    {}, optional={"ports": st.lists(PORT, max_size=3), "peers": st.lists(PEER, max_size=3)}
)
SPEC = st.fixed_dictionaries(
    {"podSelector": SELECTOR},
    optional={
        "policyTypes": st.lists(st.sampled_from(["Ingress", "Egress"]), max_size=2, unique=True),
        "ingress": st.lists(
            RULE.map(lambda r: {("from" if k == "peers" else k): v for k, v in r.items()}), max_size=3
        ),
        "egress": st.lists(
            RULE.map(lambda r: {("to" if k == "peers" else k): v for k, v in r.items()}), max_size=3
        ),
    },
)
PODS = [
    PodFacts(
        "team-a", "db", "db-uid", "n1", {"a": "b"}, {"pg": ("TCP", 5432)}, {"lan3": ("10.3.0.10", "fd03::10")}
    ),
    PodFacts("team-a", "c", "c-uid", "n1", {}, {"http": ("TCP", 80)}, {"lan3": ("10.3.0.20",)}),
    PodFacts("team-b", "x", "x-uid", "n2", {"a": "b"}, {}, {"lan3": ("fd03::30",)}),
]
LEFTS = [
    {"meta": {"key": "iifname"}},
    {"meta": {"key": "oifname"}},
    {"meta": {"key": "l4proto"}},
    {"ct": {"key": "state"}},
    *({"payload": {"protocol": f, "field": d}} for f in ("ip", "ip6") for d in ("saddr", "daddr")),
    *({"payload": {"protocol": p, "field": "dport"}} for p in ("tcp", "udp", "sctp")),
    {"payload": {"protocol": "icmpv6", "field": "type"}},
]


def _a_value(value: Any) -> bool:
    """An address, a prefix, a port, a range, or one of our own words: nothing else may reach nft."""
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return 0 < value < 65536
    if isinstance(value, dict) and set(value) == {"prefix"}:
        return _a_value(value["prefix"]["addr"]) and isinstance(value["prefix"]["len"], int)
    if isinstance(value, dict) and set(value) == {"range"}:
        return all(_a_value(v) for v in value["range"])
    if isinstance(value, dict) and set(value) == {"set"}:
        return all(_a_value(v) for v in value["set"])
    if isinstance(value, list):
        return value == ["established", "related"]
    if value in ("tcp", "udp", "sctp", "net1", "net2", "nd-neighbor-solicit", "nd-neighbor-advert"):
        return True
    try:
        ipaddress.ip_address(value)
    except ValueError:
        return False
    return "%" not in value


def _only_ours(ruleset: dict[str, Any]) -> None:
    assert set(ruleset) == {"nftables"}
    ours = {"family": "inet", "name": "netclaim"}
    chains: set[str] = set()  # declared before use: nft takes a batch in order
    for command in ruleset["nftables"]:
        [(verb, body)] = command.items()
        [(kind, thing)] = body.items()
        assert verb in ("add", "delete") and kind in ("table", "chain", "rule"), command
        if kind == "table":
            assert thing == ours
            continue
        assert (thing["family"], thing["table"]) == ("inet", "netclaim"), command
        if kind == "chain":
            assert thing["name"] in ("input", "output") or thing["name"].split("_")[0] in ("in", "out")
            assert set(thing) <= {"family", "table", "name", "type", "hook", "prio", "policy"}
            chains.add(thing["name"])
            continue
        assert thing["chain"] in chains and set(thing) == {"family", "table", "chain", "expr"}
        for expression in thing["expr"]:
            [(what, detail)] = expression.items()
            assert what in ("match", "accept", "drop", "jump"), expression
            if what == "jump":
                assert detail["target"] in chains
            if what == "match":
                assert detail["op"] in ("==", "!=", "in") and detail["left"] in LEFTS, expression
                assert _a_value(detail["right"]), expression


def test_any_policy_the_api_accepts_renders_to_our_table_and_chains_only() -> None:
    seen = {"refused": 0, "rendered": 0, "allow rules": 0}

    @settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(
        spec=SPEC, networks=st.lists(st.sampled_from(["lan3", "lan4"]), min_size=1, max_size=2, unique=True)
    )
    def renders_ours(spec: dict[str, Any], networks: list[str]) -> None:
        try:
            policy = PolicyObject("team-a", "p", tuple(networks), _read(spec))
        except ConfigError:
            seen["refused"] += 1  # it isolates its namespace: the rule tests above
            return
        for rules in pod_rules([policy], PODS, {"team-a": {}, "team-b": {"a": "b"}}).values():
            interfaces = {f"net{i}": r for i, r in enumerate(rules.values(), 1)}
            ruleset = rulesets.ruleset(interfaces)
            _only_ours(ruleset)
            json.dumps(ruleset)  # plain JSON: what nft -j reads
            seen["rendered"] += 1
            seen["allow rules"] += rulesets.counted(interfaces)[0]

    renders_ours()
    # it sampled both sides: hostile values refused, and accepted policies with rules rendered
    assert seen["refused"] > 40 and seen["rendered"] > 40 and seen["allow rules"] > 40, seen

"""MultiNetworkPolicies read as a tenant may write them, made into each pod's rules with NetworkPolicy's
meaning, and those rules as an nftables script (netclaim.core.policy.spec, netclaim.netpolicy)."""

from __future__ import annotations

from typing import Any

import pytest

from netclaim.core.ipam.published import PublishedAddresses
from netclaim.core.policy import ruleset as rulesets
from netclaim.core.policy.distribution import RulesMap, digest
from netclaim.core.policy.rules import (
    Allow,
    Direction,
    NetworkRules,
    PodFacts,
    PolicyObject,
    PolicySource,
    PortMatch,
    pod_rules,
)
from netclaim.core.policy.spec import netclaim_networks, read_policy_spec
from netclaim.errors import ApiRejectedError, ApiUnavailableError, ConfigError
from netclaim.runtime.trigger import KeyBackoff


def _pod(
    name: str,
    namespace: str = "team-a",
    labels: dict[str, str] | None = None,
    addresses: dict[str, tuple[str, ...]] | None = None,
    ports: dict[str, tuple[str, int]] | None = None,
) -> PodFacts:
    return PodFacts(
        namespace=namespace,
        name=name,
        uid=f"{name}-uid",
        node="node-1",
        labels=labels or {},
        named_ports=ports or {},
        addresses={"lan3": ("10.3.0.1",)} if addresses is None else addresses,
    )


def _policy(spec: dict[str, Any], name: str = "p", networks: tuple[str, ...] = ("lan3",)) -> PolicyObject:
    return PolicyObject("team-a", name, networks, read_policy_spec(spec, f"MultiNetworkPolicy team-a/{name}"))


DB = _pod(
    "db", labels={"app": "db"}, addresses={"lan3": ("10.3.0.10", "fd03::10")}, ports={"pg": ("TCP", 5432)}
)
CLIENT = _pod("client", labels={"role": "client"}, addresses={"lan3": ("10.3.0.20",)})
OTHER_NS = _pod("client", namespace="team-b", labels={"role": "client"}, addresses={"lan3": ("10.3.0.30",)})
OFF_NETWORK = _pod("web", labels={"role": "client"}, addresses={"lan1": ("10.1.0.5",)})
PODS = [DB, CLIENT, OTHER_NS, OFF_NETWORK]
NAMESPACES = {"team-a": {"kubernetes.io/metadata.name": "team-a"}, "team-b": {"tier": "trusted"}}
DENY_INGRESS = {"podSelector": {"matchLabels": {"app": "db"}}}


def test_the_policy_for_annotation_names_netclaim_networks_and_leaves_multus_names_alone() -> None:
    annotation = {
        "k8s.v1.cni.cncf.io/policy-for": "netclaim.dev/lan3, macvlan-net1,default/x , netclaim.dev/lan1"
    }
    assert netclaim_networks(annotation) == ("lan1", "lan3")
    assert netclaim_networks({}) == ()


@pytest.mark.parametrize(
    ("spec", "problem"),
    [
        ({}, "spec.podSelector: Field required"),
        ({"podSelector": {}, "ingres": []}, "spec.ingres: unknown field"),
        (
            {"podSelector": {"matchExpressions": [{"key": "a", "operator": "In"}]}},
            "spec.podSelector.matchExpressions[0].values: operator In needs values",
        ),
        (
            {"podSelector": {}, "ingress": [{"ports": [{"port": 70000}]}]},
            "ports[0].port: 70000 is not 1-65535",
        ),
        (
            {"podSelector": {}, "ingress": [{"ports": [{"port": "http", "endPort": 90}]}]},
            "spec.ingress[0].ports[0].endPort: needs a numeric port",
        ),
        (
            {
                "podSelector": {},
                "ingress": [{"from": [{"ipBlock": {"cidr": "10.0.0.0/8", "except": ["11.0.0.0/8"]}}]}],
            },
            "spec.ingress[0].from[0].ipBlock.except[0]: '11.0.0.0/8' is not inside cidr 10.0.0.0/8",
        ),
        ({"podSelector": {}, "ingress": [{"from": [{}]}]}, "spec.ingress[0].from[0]: a peer needs"),
        (
            {"podSelector": {}, "ingress": [{"ports": [{"protocol": "ICMP"}]}]},
            "spec.ingress[0].ports[0].protocol",
        ),
        (
            {"podSelector": {}, "egress": [{"to": [{"ipBlock": {"cidr": "10.0.0.0/8"}}]}] * 101},
            "spec.egress: Expected `array` of length <= 100",
        ),
    ],
)
def test_a_policy_that_cannot_be_read_names_the_field(spec: dict[str, Any], problem: str) -> None:
    with pytest.raises(ConfigError, match="MultiNetworkPolicy team-a/p: ") as raised:
        read_policy_spec(spec, "MultiNetworkPolicy team-a/p")
    assert problem in str(raised.value)


def test_a_selected_pod_is_isolated_on_the_policys_network_only_and_others_not_at_all() -> None:
    rules = pod_rules([_policy(DENY_INGRESS)], PODS, NAMESPACES)
    assert rules == {
        "db-uid": {"lan3": NetworkRules(ingress=Direction((), ("team-a/p",)))}
    }  # Ingress implied
    assert pod_rules([_policy(DENY_INGRESS, networks=("lan1",))], PODS, NAMESPACES) == {}  # db is not on lan1


def test_peers_are_resolved_to_their_addresses_on_the_same_network_within_the_policys_namespace() -> None:
    spec = {**DENY_INGRESS, "ingress": [{"from": [{"podSelector": {"matchLabels": {"role": "client"}}}]}]}
    [allow] = pod_rules([_policy(spec)], PODS, NAMESPACES)["db-uid"]["lan3"].ingress.allows  # type: ignore[union-attr]
    assert allow == Allow(("10.3.0.20/32",))  # not team-b's client, not the one off the network
    both = {
        "namespaceSelector": {"matchLabels": {"tier": "trusted"}},
        "podSelector": {"matchLabels": {"role": "client"}},
    }
    spec = {**DENY_INGRESS, "ingress": [{"from": [both]}]}
    [allow] = pod_rules([_policy(spec)], PODS, NAMESPACES)["db-uid"]["lan3"].ingress.allows  # type: ignore[union-attr]
    assert allow == Allow(("10.3.0.30/32",))


def test_the_peers_of_one_port_list_are_one_allow_however_many_pods_they_are() -> None:
    """A rule per peer pod grew each pod's table with its namespace; one set per port list does not."""
    clients = [
        _pod(f"c{i}", labels={"role": "client"}, addresses={"lan3": (f"10.3.1.{i}", f"fd03::1:{i}")})
        for i in range(20)
    ]
    spec = {
        **DENY_INGRESS,
        "ingress": [
            {"from": [{"podSelector": {"matchLabels": {"role": "client"}}}], "ports": [{"port": 80}]},
            {
                "from": [{"ipBlock": {"cidr": "10.9.0.0/16", "except": ["10.9.1.0/24"]}}],
                "ports": [{"port": 80}],
            },
        ],
    }
    direction = pod_rules([_policy(spec)], [DB, *clients], NAMESPACES)["db-uid"]["lan3"].ingress
    assert direction is not None
    port = (PortMatch("TCP", 80, 80),)
    by_peer, block = sorted(direction.allows, key=lambda a: a.excepts)
    assert block == Allow(("10.9.0.0/16",), ("10.9.1.0/24",), port)  # its except kept to it
    assert by_peer.ports == port and len(by_peer.cidrs) == 40  # both families of the 20 clients
    assert rulesets.counted({"net1": NetworkRules(ingress=direction)}) == (3, 1)  # IPv4 set, IPv6 set, block


def test_named_ports_are_the_selected_pods_for_ingress_and_each_peers_for_egress() -> None:
    ingress = {
        **DENY_INGRESS,
        "ingress": [{"ports": [{"port": "pg"}, {"port": "nope"}, {"port": 80, "endPort": 90}]}],
    }
    [allow] = pod_rules([_policy(ingress)], PODS, NAMESPACES)["db-uid"]["lan3"].ingress.allows  # type: ignore[union-attr]
    assert allow == Allow(("0.0.0.0/0", "::/0"), (), (PortMatch("TCP", 80, 90), PortMatch("TCP", 5432, 5432)))
    egress = {
        "podSelector": {"matchLabels": {"role": "client"}},
        "policyTypes": ["Egress"],
        "egress": [
            {
                "to": [{"podSelector": {"matchLabels": {"app": "db"}}}, {"ipBlock": {"cidr": "10.9.0.0/16"}}],
                "ports": [{"port": "pg"}],
            }
        ],
    }
    rules = pod_rules([_policy(egress)], PODS, NAMESPACES)["client-uid"]["lan3"]
    assert rules.ingress is None  # policyTypes says Egress only
    assert rules.egress is not None
    assert rules.egress.allows == (
        Allow(("10.3.0.10/32", "fd03::10/128"), (), (PortMatch("TCP", 5432, 5432),)),
    )


def test_an_unreadable_policy_isolates_every_pod_of_its_namespace_on_its_networks_both_ways() -> None:
    broken = PolicyObject("team-a", "broken", ("lan3",), None, "spec.podSelector: Field required")
    rules = pod_rules([broken], PODS, NAMESPACES)
    assert set(rules) == {"db-uid", "client-uid"}
    nothing = Direction((), ("team-a/broken",))
    assert rules["client-uid"]["lan3"] == NetworkRules(nothing, nothing)


def test_policies_add_up_and_an_empty_from_allows_everyone() -> None:
    everyone = {**DENY_INGRESS, "ingress": [{}]}
    rules = pod_rules([_policy(DENY_INGRESS, "deny"), _policy(everyone, "open")], PODS, NAMESPACES)
    assert rules["db-uid"]["lan3"].ingress == Direction(
        (Allow(("0.0.0.0/0", "::/0")),), ("team-a/deny", "team-a/open")
    )


def test_each_node_gets_its_selected_pods_rules_and_every_node_the_guards() -> None:
    from netclaim.core.objects import ConsumerRef, Pod
    from netclaim.core.policy.distribution import (
        config_maps,
        node_label,
        pod_facts,
        read_guards,
        read_rules,
    )
    from tests.unit.fakes import SAMPLE_DRIVER, sample_claim

    def pod(name: str, node: str, labels: dict[str, str]) -> Pod:
        return Pod.from_api(
            {
                "metadata": {"namespace": "team-a", "name": name, "uid": f"{name}-uid", "labels": labels},
                "spec": {
                    "nodeName": node,
                    "resourceClaims": [{"name": "net", "resourceClaimName": f"{name}-net"}],
                    "containers": [{"name": "c", "ports": [{"name": "pg", "containerPort": 5432}]}],
                },
            }
        )

    def claim(name: str, address: str) -> Any:
        entry = {
            "driver": SAMPLE_DRIVER,
            "conditions": [{"type": "Ready", "status": "True"}],
            "networkData": {"interfaceName": "net1", "ips": [f"{address}/24"]},
            "data": {"netclaim.dev/network": "lan3"},
        }
        return sample_claim(
            (),
            (),
            name=f"{name}-net",
            reserved_for=(ConsumerRef(name, f"{name}-uid"),),
            devices_status=(entry,),
        )

    pods = [pod("db", "node-1", {"app": "db"}), pod("client", "node-2", {"role": "client"})]
    claims = [claim("db", "10.3.0.10"), claim("client", "10.3.0.20")]
    facts = pod_facts(pods, claims, PublishedAddresses.of_claims(claims, (), (), SAMPLE_DRIVER))
    assert facts[0].named_ports == {"pg": ("TCP", 5432)} and facts[0].addresses == {"lan3": ("10.3.0.10",)}
    spec = {
        **DENY_INGRESS,
        "ingress": [
            {"from": [{"podSelector": {"matchLabels": {"role": "client"}}}], "ports": [{"port": "pg"}]}
        ],
    }
    made = config_maps([_policy(spec)], facts, NAMESPACES)
    assert {name: label for name, (label, _) in made.items()} == {
        "netclaim-policy-guards": "guards",
        "netclaim-policy-node-1": "node-1",
        "netclaim-policy-node-2": "node-2",  # the client, selected by none: listed with no rules
    }
    [guard] = read_guards([made["netclaim-policy-guards"][1]["rules.json"]])
    assert guard.selects("team-a", {"app": "db"}) and not guard.selects("team-a", {"app": "web"})
    assert (guard.networks, guard.ingress, guard.egress) == (("lan3",), True, False)
    rules = read_rules([made["netclaim-policy-node-1"][1]["rules.json"]])
    assert rules == {
        "db-uid": {
            "lan3": NetworkRules(
                ingress=Direction(
                    (Allow(("10.3.0.20/32",), (), (PortMatch("TCP", 5432, 5432),)),), ("team-a/p",)
                )
            )
        }
    }
    assert read_rules([made["netclaim-policy-node-2"][1]["rules.json"]]) == {"client-uid": {}}
    assert node_label("x" * 64).startswith("node-") and len(node_label("x" * 64)) == 45
    assert node_label("guards") != "guards"


def test_the_rules_maps_keep_the_json_agents_of_every_version_read_and_write() -> None:
    """During a rolling upgrade agents read what a controller of another version writes: the JSON stays
    as it was, byte for byte, a guard's selector under its Python names."""
    from netclaim.core.policy.distribution import config_maps, read_guards, read_rules

    spec = {
        "podSelector": {
            "matchLabels": {"app": "db"},
            "matchExpressions": [{"key": "canary", "operator": "DoesNotExist"}],
        },
        "ingress": [
            {"from": [{"podSelector": {"matchLabels": {"role": "client"}}}], "ports": [{"port": 5432}]}
        ],
    }
    guards = (
        '[{"egress":false,"ingress":true,"namespace":"team-a","networks":["lan3"],"policy":"p","selector":'
        '{"match_expressions":[{"key":"canary","operator":"DoesNotExist","values":[]}],'
        '"match_labels":{"app":"db"}}}]'
    )
    rules = (
        '{"client-uid":{},"db-uid":{"lan3":{"egress":null,"ingress":{"allows":[{"cidrs":["10.3.0.20/32"],'
        '"excepts":[],"ports":[{"first":5432,"last":5432,"protocol":"TCP"}]}],"policies":["team-a/p"]}}}}'
    )
    assert config_maps([_policy(spec)], [DB, CLIENT], NAMESPACES) == {
        "netclaim-policy-guards": ("guards", {"rules.json": guards}),
        "netclaim-policy-node-1": ("node-1", {"rules.json": rules}),
    }
    [guard] = read_guards([guards])
    assert guard.selects("team-a", {"app": "db"}) and not guard.selects("team-a", {"app": "db", "canary": ""})
    assert read_rules([rules])["db-uid"]["lan3"].ingress == Direction(
        (Allow(("10.3.0.20/32",), (), (PortMatch("TCP", 5432, 5432),)),), ("team-a/p",)
    )


class FakePolicies:
    """The controller's NetworkPoliciesApi in memory, and what its informers would keep."""

    def __init__(self, policies: list[dict[str, Any]], networks: set[str]) -> None:
        self.policies, self.networks = policies, networks
        self.maps: dict[str, dict[str, str]] = {}
        self.labels: dict[str, str] = {}
        self.events: list[tuple[str, str, str]] = []

    async def sources(self) -> list[PolicySource]:
        return [PolicySource.from_api(found) for found in self.policies]

    async def list_policies(self, namespace: str) -> list[PolicySource]:
        return [s for s in await self.sources() if s.namespace == namespace]

    def present(self) -> dict[str, RulesMap]:
        return {name: RulesMap(name, self.labels[name], digest(data)) for name, data in self.maps.items()}

    async def apply_rules_map(self, name: str, label: str, data: dict[str, str]) -> None:
        self.maps[name] = data
        self.labels[name] = label

    async def delete_rules_map(self, name: str) -> None:
        self.maps.pop(name, None)

    async def list_networks(self, driver: str) -> set[str]:
        return self.networks

    async def create_policy_event(
        self, namespace: str, name: str, uid: str, reason: str, message: str
    ) -> None:
        self.events.append((name, reason, message))


async def no_claims() -> list[Any]:
    return []


def _reconciler(api: Any) -> Any:
    """The policy pass over `api` (a FakePolicies: no watches), no claims, no pods, namespace team-a."""
    from netclaim.controller.policy import PolicyReconciler

    return PolicyReconciler(
        api,
        no_claims,
        list,
        lambda: {"team-a": {}},
        api.sources,
        api.present,
        "netclaim.dev",
        nothing_published,
    )


async def nothing_published() -> PublishedAddresses:
    return PublishedAddresses.of_claims((), (), (), "netclaim.dev")


def _object(name: str, spec: Any, policy_for: str = "netclaim.dev/lan3") -> dict[str, Any]:
    return {
        "metadata": {
            "namespace": "team-a",
            "name": name,
            "uid": f"{name}-uid",
            "annotations": {"k8s.v1.cni.cncf.io/policy-for": policy_for},
        },
        "spec": spec,
    }


async def test_a_policy_that_cannot_be_read_or_names_no_network_there_is_is_told_once_on_itself() -> None:
    api = FakePolicies(
        [
            _object("typo", {"podSelector": {}, "ingres": []}),
            _object("elsewhere", DENY_INGRESS, "netclaim.dev/lan4, netclaim.dev/lan3"),
            _object("fine", DENY_INGRESS),
        ],
        {"lan3"},
    )

    reconciler = _reconciler(api)
    await reconciler.once()
    await reconciler.once()
    assert [(name, reason) for name, reason, _ in api.events] == [
        ("typo", "NetworkPolicyInvalid"),
        ("elsewhere", "NetworkPolicyUnknownNetwork"),
    ]
    assert "spec.ingres: unknown field" in api.events[0][2] and "isolated" in api.events[0][2]
    assert "netclaim.dev/lan4: no netclaim NIC" in api.events[1][2]
    assert "netclaim-policy-guards" in api.maps


def test_a_policy_whose_compile_fails_isolates_its_pods_and_the_others_compile(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from netclaim.core.policy import rules as rules_module

    real = rules_module._directions

    def failing(policy: PolicyObject, *args: Any) -> Any:
        if policy.name == "broken" and policy.spec is not None:
            raise ValueError("a bug in one policy's compile")
        return real(policy, *args)

    monkeypatch.setattr(rules_module, "_directions", failing)
    everyone = {**DENY_INGRESS, "ingress": [{}]}
    rules = pod_rules([_policy(everyone, "broken"), _policy(everyone, "open")], PODS, NAMESPACES)
    ingress = rules["db-uid"]["lan3"].ingress
    assert ingress is not None and ingress.policies == ("team-a/broken", "team-a/open")
    assert rules["client-uid"]["lan3"].ingress == Direction((), ("team-a/broken",))  # isolated by it alone


def _excepts_policy(rules: int, blocks: int, excepts: int) -> dict[str, Any]:
    """`rules` ingress rules of `blocks` ipBlocks with `excepts` excepts each: the largest rules per pod a
    policy within the spec's bounds makes."""
    return {
        **DENY_INGRESS,
        "ingress": [
            {
                "from": [
                    {
                        "ipBlock": {
                            "cidr": f"10.{r}.{b}.0/24",
                            "except": [f"10.{r}.{b}.{e * 16}/28" for e in range(excepts)],
                        }
                    }
                    for b in range(blocks)
                ]
            }
            for r in range(rules)
        ],
    }


def test_a_nodes_rules_past_an_objects_bound_are_split_and_read_back_whole() -> None:
    """25 rules x 100 ipBlocks x 10 excepts for 3 pods on one node: ≈ 1.3 MB as one object, which the API
    refuses (1 MiB), so that node's rules, every tenant's, were never written again."""
    from netclaim.core.policy.distribution import MAX_OBJECT_BYTES, config_maps, read_rules

    selected = [
        _pod(f"db{i}", labels={"app": "db"}, addresses={"lan3": (f"10.3.0.{10 + i}",)}) for i in range(3)
    ]
    policy = _policy(_excepts_policy(25, 100, 10))
    whole = pod_rules([policy], [*selected, CLIENT], NAMESPACES)
    made = config_maps([policy], [*selected, CLIENT], NAMESPACES)
    parts = [data["rules.json"] for name, (label, data) in sorted(made.items()) if label == "node-1"]
    sizes = [len(text) for text in parts]
    assert len(parts) > 3 and max(sizes) <= MAX_OBJECT_BYTES, sizes
    assert sum(sizes) > 1 << 20  # what one object would have held
    assert read_rules(parts) == {
        **whole,
        "client-uid": {},
    }  # every pod's allows, unioned back from every part
    names = [name for name, (label, _) in made.items() if label == "node-1"]
    assert len(set(names)) == len(names) and "netclaim-policy-node-1" in names


def test_a_namespace_past_its_budget_is_read_as_unreadable_without_touching_another() -> None:
    from netclaim.core.policy.rules import NAMESPACE_BUDGET, over_budget

    def raw(namespace: str, name: str, spec: dict[str, Any]) -> dict[str, Any]:
        meta = {
            "namespace": namespace,
            "name": name,
            "annotations": {"k8s.v1.cni.cncf.io/policy-for": "netclaim.dev/lan3"},
        }
        return {"metadata": meta, "spec": spec}

    wide = {**DENY_INGRESS, "ingress": [{"from": [{"podSelector": {}}] * 100}] * 100}
    hostile = [raw("team-a", f"wide-{i}", wide) for i in range(8)]
    friendly = raw("team-b", "one", {**DENY_INGRESS, "ingress": [{"from": [{"podSelector": {}}]}]})

    def counted(*policies: dict[str, Any]) -> dict[str, str]:
        return over_budget([PolicySource.from_api(found) for found in policies])

    found = counted(*hostile, friendly)
    assert list(found) == ["team-a"]
    assert found["team-a"].endswith(f"budget of {NAMESPACE_BUDGET['peers']:,} peers and 1,048,576 bytes")
    assert counted(hostile[0], friendly) == {}  # one such policy is within its namespace's budget
    deep: dict[str, Any] = {}
    for _ in range(5_000):  # past the JSON encoder's recursion: measured as past the budget, not a crash
        deep = {"x": deep}
    assert list(counted(raw("team-c", "deep", {**DENY_INGRESS, "x": deep}), friendly)) == ["team-c"]
    read = PolicyObject.from_api(hostile[0], found["team-a"])
    assert read.spec is None and "budget" in read.problem and read.networks == ("lan3",)
    isolated = pod_rules([read], PODS, NAMESPACES)
    assert isolated["db-uid"]["lan3"] == NetworkRules(
        Direction((), ("team-a/wide-0",)), Direction((), ("team-a/wide-0",))
    )


def test_peers_many_rules_name_are_resolved_once_and_select_as_before() -> None:
    """100 rules x 100 `namespaceSelector: {}` peers: every pod of every namespace on the network, once."""
    spec = {**DENY_INGRESS, "ingress": [{"from": [{"namespaceSelector": {}}] * 100}] * 100}
    beside = _pod("beside", namespace="team-b", addresses={"lan3": ("10.3.0.30",)})
    rules = pod_rules([_policy(spec)], [DB, CLIENT, beside, OFF_NETWORK], NAMESPACES)
    ingress = rules["db-uid"]["lan3"].ingress
    assert ingress is not None
    assert ingress.allows == (Allow(("10.3.0.10/32", "10.3.0.20/32", "10.3.0.30/32", "fd03::10/128")),)


async def test_a_namespace_over_its_budget_is_told_and_no_policy_is_parsed_twice(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    wide = {**DENY_INGRESS, "ingress": [{"from": [{"podSelector": {}}] * 100}] * 100}
    multus = {**_object("multus", wide, "default/macvlan-net"), "spec": wide}
    api = FakePolicies([*(_object(f"wide-{i}", wide) for i in range(8)), multus], {"lan3"})
    parsed: list[str] = []
    read = PolicySource.read

    def counted(source: PolicySource, over: str = "") -> PolicyObject:
        parsed.append(source.name)
        return read(source, over)

    monkeypatch.setattr(PolicySource, "read", counted)
    reconciler = _reconciler(api)
    await reconciler.once()
    await reconciler.once()
    assert sorted(parsed) == [f"wide-{i}" for i in range(8)]  # once each; Multus's never
    assert [(name, reason) for name, reason, _ in api.events] == [
        (f"wide-{i}", "NetworkPolicyInvalid") for i in range(8)
    ]
    assert all("budget of 10,000 peers" in m and "isolated" in m for _, _, m in api.events)


@pytest.mark.parametrize(
    ("text", "selects", "skips"),
    [
        ("app=db", {"app": "db"}, {"app": "web"}),
        ("app==db,tier!=front", {"app": "db", "tier": "back"}, {"app": "db", "tier": "front"}),
        ("tier in (a, b),!canary", {"tier": "b"}, {"tier": "b", "canary": ""}),
        (
            "tier notin (a),example.com/role",
            {"example.com/role": "x"},
            {"tier": "a", "example.com/role": "x"},
        ),
        ("", {"any": "thing"}, None),
    ],
)
def test_a_services_selector_text_selects_as_the_api_server_would(
    text: str, selects: dict[str, str], skips: dict[str, str] | None
) -> None:
    from netclaim.core.policy.spec import parse_selector

    selector = parse_selector(text)
    assert selector.matches(selects)
    assert skips is None or not selector.matches(skips)


@pytest.mark.parametrize(
    "text",
    [
        "app in (db",
        "app=db tier=x",
        "!app=db",
        "-bad=x",
        "app=" + "v" * 64,
        ",".join(f"k{i}=v" for i in range(65)),
        "k=v," * 60_000 + "x y",
    ],
)
def test_a_selector_text_the_api_server_refuses_is_refused_naming_it(text: str) -> None:
    from netclaim.core.policy.spec import parse_selector

    with pytest.raises(ValueError, match="selector") as refused:
        parse_selector(text)
    assert len(str(refused.value)) < 400  # a tenant's 240 kB annotation is not echoed into Events


async def test_a_rules_map_unwritten_or_changed_by_another_is_made_again_alone() -> None:
    """No list per pass: what is written is the informer's digests and the pass's own writes; a map that
    failed is written again once its backoff is over, one that someone else deleted at the next pass,
    with no other change."""
    api = FakePolicies([_object("fine", DENY_INGRESS)], {"lan3"})
    writes: list[str] = []
    failing = {"netclaim-policy-guards"}
    apply = api.apply_rules_map

    async def counted(name: str, label: str, data: dict[str, str]) -> None:
        writes.append(name)
        if name in failing:
            raise ApiRejectedError(f"ConfigMap {name}: refused")
        await apply(name, label, data)

    api.apply_rules_map = counted  # type: ignore[method-assign]
    reconciler = _reconciler(api)
    now = [0.0]
    reconciler.backoff = KeyBackoff(clock=lambda: now[0])
    await reconciler.once()
    assert writes == ["netclaim-policy-guards"] and api.maps == {}
    failing.clear()
    await reconciler.once()  # its backoff (0.5 s) is not over
    assert writes == ["netclaim-policy-guards"] and reconciler.again == {"guards"}
    now[0] += KeyBackoff.BASE
    await reconciler.once()  # nothing changed but the write that failed
    assert writes == ["netclaim-policy-guards"] * 2 and list(api.maps) == ["netclaim-policy-guards"]
    await reconciler.once()
    assert len(writes) == 2  # written and unchanged: not written again
    gone = api.present()["netclaim-policy-guards"]
    del api.maps["netclaim-policy-guards"]
    assert reconciler.changed_by_another(gone, None)
    assert not reconciler.changed_by_another(None, gone)  # what this term wrote, told back: not another's
    await reconciler.once()
    assert len(writes) == 3 and list(api.maps) == ["netclaim-policy-guards"]


async def test_a_pass_the_api_fails_leaves_the_next_to_compile_compare_and_tell_everything() -> None:
    """A pass ended by an API that cannot serve wrote part of what it compiled: the next pass is a full
    one that compares with what is there (not with what this term meant to write)."""
    api = FakePolicies([_object("fine", DENY_INGRESS)], {"lan3"})
    apply = api.apply_rules_map
    down = [True]

    async def unavailable(name: str, label: str, data: dict[str, str]) -> None:
        if down[0]:
            raise ApiUnavailableError("the API server did not answer")
        await apply(name, label, data)

    api.apply_rules_map = unavailable  # type: ignore[method-assign]
    reconciler = _reconciler(api)
    with pytest.raises(ApiUnavailableError):
        await reconciler.once()
    assert api.maps == {} and reconciler.written == {} and reconciler.parsed == {}
    down[0] = False
    await reconciler.once()
    assert list(api.maps) == ["netclaim-policy-guards"]


def test_a_spec_nested_thousands_deep_is_a_config_error_not_a_crash() -> None:
    deep: list[object] = []
    innermost = deep
    for _ in range(100_000):
        innermost.append([])
        innermost = innermost[0]  # type: ignore[assignment]
    with pytest.raises(
        ConfigError, match=r"MultiNetworkPolicy a/b: spec\.x\[0\]\[0\].*: nested deeper than 32 levels"
    ):
        read_policy_spec({"podSelector": {}, "x": deep}, "MultiNetworkPolicy a/b")

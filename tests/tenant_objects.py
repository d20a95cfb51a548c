"""The attack corpus of a tenant's MultiNetworkPolicies, Services and EndpointSlices: what a tenant writes in
its own namespace to reach another tenant's pods, a node (nft, the agent) or the controller.

Each case is one object the tenant writes; the API may refuse it, else it must have no effect beyond the
tenant's own namespace (tests/cluster/test_attacks.py checks the other tenant's traffic, tables and slices,
the agents and the controller). The classes of docs/security.md's tenant-objects table: CIDR forms, text
for nft's parser, sizes and depth, selectors reaching for other namespaces, forged and stolen slices,
named-port tricks, typos, and Services that are not what a network Service must be.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tests.attacks import NESTED

POLICY_FOR = "k8s.v1.cni.cncf.io/policy-for"
NFT_TEXT = (
    'fe80::%x }\n } chain evil { type filter hook input priority -500; policy drop; }\n include "/etc/shadow'
)


@dataclass(frozen=True)
class TenantObject:
    name: str  # what the case tries
    kind: str  # "policy", "service", "slice"
    body: dict[str, Any]


def _policy(name: str, spec: Any, policy_for: str = "netclaim.dev/lan3") -> TenantObject:
    body = {
        "apiVersion": "k8s.cni.cncf.io/v1beta1",
        "kind": "MultiNetworkPolicy",
        "metadata": {"name": name, "annotations": {POLICY_FOR: policy_for}},
        "spec": spec,
    }
    return TenantObject(name, "policy", body)


def _ingress(*peers: dict[str, Any], ports: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    rule: dict[str, Any] = {"from": list(peers)}
    if ports is not None:
        rule["ports"] = ports
    return {"podSelector": {"matchLabels": {"app": "db"}}, "ingress": [rule]}


def _block(cidr: Any, *excepts: Any) -> dict[str, Any]:
    block: dict[str, Any] = {"cidr": cidr}
    if excepts:
        block["except"] = list(excepts)
    return {"ipBlock": block}


def _selector(**labels: Any) -> dict[str, Any]:
    return {"podSelector": {"matchLabels": labels}}


def _port(port: Any, **more: Any) -> list[dict[str, Any]]:
    return [{"protocol": "TCP", "port": port, **more}]


def _policies(victim_namespace: str, victim_address: str) -> list[TenantObject]:
    everyone: dict[str, Any] = {"podSelector": {}, "namespaceSelector": {}}
    victim_ns = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": victim_namespace}}}
    big_rule = {"from": [{"ipBlock": {"cidr": f"10.{i}.0.0/16"}} for i in range(100)], "ports": _port(8080)}
    return [
        # CIDR forms
        _policy("except-host-bits", _ingress(_block("10.64.0.0/16", "10.64.11.3/16"))),
        _policy("cidr-host-bits", _ingress(_block("10.64.11.9/24"))),
        _policy("zone-id-nft-text", _ingress(_block(NFT_TEXT))),
        _policy("except-nft-text", _ingress(_block("10.64.0.0/16", NFT_TEXT))),
        _policy("include-in-cidr", _ingress(_block('include "/etc/shadow"'))),
        _policy("ipv4-mapped", _ingress(_block("::ffff:10.64.11.0/120"))),
        _policy("except-outside", _ingress(_block("10.64.11.0/24", "10.65.0.0/16"))),
        _policy("except-other-family", _ingress(_block("10.64.11.0/24", "fd00::/64"))),
        _policy("no-prefix", _ingress(_block(victim_address))),
        _policy("leading-zeros", _ingress(_block("010.064.011.000/24"))),
        _policy("prefix-33", _ingress(_block("10.64.11.0/33"))),
        _policy("empty-cidr", _ingress(_block(""))),
        _policy("cidr-number", _ingress(_block(167772160))),
        _policy("all-but-the-victim", _ingress(_block("0.0.0.0/0", f"{victim_address}/32"))),
        # ports
        _policy("port-0", _ingress(_selector(app="a"), ports=_port(0))),
        _policy("port-70000", _ingress(_selector(app="a"), ports=_port(70000))),
        _policy("port-digits-as-name", _ingress(_selector(app="a"), ports=_port("8080"))),
        _policy("port-name-nft-text", _ingress(_selector(app="a"), ports=_port('http" accept; chain x {'))),
        _policy("port-name-upper", _ingress(_selector(app="a"), ports=_port("HTTP"))),
        _policy("port-name-16", _ingress(_selector(app="a"), ports=_port("abcdefghijklmnop"))),
        _policy("end-before-port", _ingress(_selector(app="a"), ports=_port(9000, endPort=8000))),
        _policy("end-with-name", _ingress(_selector(app="a"), ports=_port("http", endPort=9000))),
        _policy("protocol-icmp", _ingress(_selector(app="a"), ports=[{"protocol": "ICMP"}])),
        _policy("protocol-lower", _ingress(_selector(app="a"), ports=[{"protocol": "tcp", "port": 80}])),
        # labels and selectors
        _policy("label-key-newline", _ingress(_selector(**{"app\n": "a"}))),
        _policy("label-value-nul", _ingress(_selector(app="a\u0000b"))),
        _policy(
            "exists-with-values",
            _ingress(
                {"podSelector": {"matchExpressions": [{"key": "a", "operator": "Exists", "values": ["x"]}]}}
            ),
        ),
        _policy(
            "in-without-values",
            _ingress({"podSelector": {"matchExpressions": [{"key": "a", "operator": "In"}]}}),
        ),
        _policy("33-labels", _ingress({"podSelector": {"matchLabels": {f"k{i}": "v" for i in range(33)}}})),
        _policy(
            "65-values",
            _ingress(
                {
                    "podSelector": {
                        "matchExpressions": [
                            {"key": "a", "operator": "In", "values": [str(i) for i in range(65)]}
                        ]
                    }
                }
            ),
        ),
        # sizes and depth
        _policy("101-rules", {"podSelector": {}, "ingress": [{"from": [_selector(app="a")]}] * 101}),
        _policy("101-peers", _ingress(*[_selector(app=str(i)) for i in range(101)])),
        _policy("101-ports", _ingress(_selector(app="a"), ports=[{"port": p} for p in range(1, 102)])),
        _policy("101-excepts", _ingress(_block("10.0.0.0/8", *[f"10.{i}.0.0/16" for i in range(101)]))),
        _policy("nested-1500-deep", {"podSelector": {"matchLabels": {"app": NESTED}}}),
        _policy("100-rules-of-100-blocks", {"podSelector": {}, "ingress": [big_rule] * 100}),
        # reaching for other namespaces
        _policy("every-namespace-every-pod", _ingress(everyone)),
        _policy("the-victims-namespace-as-peer", _ingress(victim_ns)),
        _policy(
            "selects-the-victims-labels",
            {"podSelector": {"matchLabels": {"app": "db"}}, "policyTypes": ["Ingress", "Egress"]},
        ),
        _policy(
            "egress-to-the-victim",
            {"podSelector": {}, "policyTypes": ["Egress"], "egress": [{"to": [victim_ns]}]},
        ),
        # policy-for and typos
        _policy("unknown-network", _ingress(_selector(app="a")), "netclaim.dev/nonexistent"),
        _policy("malformed-network", _ingress(_selector(app="a")), "netclaim.dev/lan3\n,netclaim.dev/$x"),
        _policy("multus-name", _ingress(_selector(app="a")), f"{victim_namespace}/lan3"),
        _policy("typo-ingres", {"podSelector": {}, "ingres": [{}]}),
        _policy("typo-podselector", {"PodSelector": {}}),
        _policy("typo-policytypes", {"podSelector": {}, "policyTypes": ["ingress"]}),
        _policy("spec-a-string", "podSelector: {}"),
    ]


def _service(name: str, **changes: Any) -> TenantObject:
    body: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": name,
            "labels": {"netclaim.dev/network": "lan3"},
            "annotations": {"netclaim.dev/selector": "app=db"},
        },
        "spec": {"clusterIP": "None", "ports": [{"name": "http", "port": 8080}]},
    }
    for path, value in changes.items():
        target = body
        *parents, leaf = path.split("__")
        for parent in parents:
            target = target[parent]
        target[leaf] = value
    return TenantObject(name, "service", body)


def _services() -> list[TenantObject]:
    return [
        _service("not-headless", spec__clusterIP=""),
        _service("with-selector", spec__selector={"app": "db"}),
        _service("selector-unparsable", metadata__annotations={"netclaim.dev/selector": "app in ("}),
        _service("selector-everything", metadata__annotations={"netclaim.dev/selector": "!nothing"}),
        _service("no-selector", metadata__annotations={}),
        _service("named-target-port", spec__ports=[{"name": "http", "port": 8080, "targetPort": "web"}]),
        _service("unknown-network", metadata__labels={"netclaim.dev/network": "nonexistent"}),
        _service("db"),  # the victim's Service's name, in the tenant's own namespace
    ]


def _slice(name: str, service: str, address: str, manager: str) -> TenantObject:
    body = {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": name,
            "labels": {
                "kubernetes.io/service-name": service,
                "endpointslice.kubernetes.io/managed-by": manager,
                "netclaim.dev/network": "lan3",
            },
        },
        "addressType": "IPv4",
        "endpoints": [{"addresses": [address], "conditions": {"ready": True}}],
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
    }
    return TenantObject(name, "slice", body)


def _slices(victim_address: str) -> list[TenantObject]:
    return [
        _slice("db-netclaim-ipv4-9", "db", victim_address, "netclaim.dev"),  # one of "ours", forged
        _slice("db-by-hand", "db", victim_address, "endpointslice-controller.k8s.io"),
        _slice("not-headless-netclaim-ipv4", "not-headless", victim_address, "netclaim.dev"),
    ]


def tenant_objects(victim_namespace: str, victim_address: str) -> list[TenantObject]:
    """The corpus, against a victim whose pod has `victim_address` on lan3 in `victim_namespace`."""
    return [*_policies(victim_namespace, victim_address), *_services(), *_slices(victim_address)]

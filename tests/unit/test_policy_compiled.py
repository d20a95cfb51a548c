"""The controller's incremental policy pass (netclaim.core.policy.compiled): whatever sequence of states
the cluster goes through, the ConfigMaps its passes leave equal those one full compile of the last state
makes, and a change touches only the nodes it concerns."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from netclaim.core.policy.compiled import Compiled, CompiledRules
from netclaim.core.policy.distribution import config_maps
from netclaim.core.policy.rules import PodFacts, PolicyObject
from netclaim.core.policy.spec import read_policy_spec

NAMESPACES = ("a", "b")
NODES = ("n1", "n2", "n3")
SPECS: list[dict[str, Any]] = [
    {"podSelector": {"matchLabels": {"app": "x"}}},
    {"podSelector": {}, "ingress": [{"from": [{"podSelector": {"matchLabels": {"role": "p"}}}]}]},
    {
        "podSelector": {"matchLabels": {"app": "y"}},
        "ingress": [
            {"from": [{"namespaceSelector": {"matchLabels": {"tier": "t"}}}], "ports": [{"port": 80}]}
        ],
    },
    {
        "podSelector": {"matchLabels": {"app": "x"}},
        "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "y"}}}], "ports": [{"port": "web"}]}],
    },
    {
        "podSelector": {},
        "policyTypes": ["Egress"],
        "egress": [{"ports": [{"port": "web"}]}, {"to": [{"ipBlock": {"cidr": "10.9.0.0/16"}}]}],
    },
    {
        "podSelector": {"matchLabels": {"role": "q"}},
        "policyTypes": ["Egress"],
        "egress": [{"to": [{"namespaceSelector": {}, "podSelector": {"matchLabels": {"app": "x"}}}]}],
    },
]

pods = st.builds(
    lambda namespace, node, app, role, on, web, number: PodFacts(
        namespace=namespace,
        name=f"p{number}",
        uid=f"uid-{number}",
        node=node,
        labels={"app": app, "role": role},
        named_ports={"web": ("TCP", 8000 + number)} if web else {},
        addresses={"lan3": (f"10.3.0.{number}",)} if on else {},
    ),
    st.sampled_from(NAMESPACES),
    st.sampled_from(NODES),
    st.sampled_from(("x", "y")),
    st.sampled_from(("p", "q")),
    st.booleans(),
    st.booleans(),
    st.integers(1, 8),
)
policies = st.tuples(st.sampled_from(NAMESPACES), st.integers(0, len(SPECS)), st.integers(0, 2))
states = st.tuples(
    st.lists(pods, max_size=8, unique_by=lambda p: p.uid),
    st.lists(policies, max_size=4, unique_by=lambda p: (p[0], p[2])),
    st.sampled_from(({}, {"tier": "t"})),
    st.booleans(),  # the pods of the step before kept
    st.booleans(),  # its policies kept
)


def _policy(namespace: str, which: int, name: int) -> PolicyObject:
    """Policy `name` of `namespace` with spec `which` (one past SPECS: one that cannot be read)."""
    if which == len(SPECS):
        return PolicyObject(namespace, f"pol{name}", ("lan3",), None, "cannot be read")
    spec = read_policy_spec(SPECS[which], f"MultiNetworkPolicy {namespace}/pol{name}")
    return PolicyObject(namespace, f"pol{name}", ("lan3",), spec)


def _applied(current: dict[str, tuple[str, dict[str, str]]], compiled: Compiled) -> None:
    """What the controller does with a pass: every part of each label made, no other part of it kept."""
    for name in [n for n, (label, _) in current.items() if compiled.full or label in compiled.labels]:
        del current[name]
    current.update(compiled.maps)


@settings(max_examples=300, deadline=None)
@given(st.lists(states, min_size=1, max_size=6), st.lists(st.booleans(), min_size=6, max_size=6))
def test_passes_over_any_sequence_of_states_leave_what_a_full_compile_makes(
    sequence: list[Any], fulls: list[bool]
) -> None:
    compiled = CompiledRules()
    current: dict[str, tuple[str, dict[str, str]]] = {}
    facts: list[PodFacts] = []
    made: list[PolicyObject] = []
    for (drawn, chosen, b_labels, same_pods, same_policies), full in zip(sequence, fulls, strict=False):
        facts = facts if same_pods else drawn
        made = made if same_policies else [_policy(*choice) for choice in chosen]
        namespaces = {"a": {"kubernetes.io/metadata.name": "a"}, "b": b_labels}
        _applied(current, compiled.advance(made, facts, namespaces, full))
        assert current == (config_maps(made, facts, namespaces) if made else {})


def test_a_relabelled_pod_recompiles_its_peers_pods_only_and_their_nodes() -> None:
    """10 pods over 3 nodes; the policy on app=x lets in role=p: a pod of app=y moving to role=p makes
    again the rules of app=x's pods and its own, nothing on a node with neither."""

    def pod(number: int, node: str, app: str, role: str) -> PodFacts:
        return PodFacts(
            "a",
            f"p{number}",
            f"uid-{number}",
            node,
            {"app": app, "role": role},
            {},
            {"lan3": (f"10.3.0.{number}",)},
        )

    compiled = CompiledRules()
    selected = [pod(i, "n1", "x", "q") for i in range(3)]
    others = [pod(i, "n2", "y", "q") for i in range(3, 9)] + [pod(9, "n3", "y", "q")]
    spec = {
        "podSelector": {"matchLabels": {"app": "x"}},
        "ingress": [{"from": [{"podSelector": {"matchLabels": {"role": "p"}}}]}],
    }
    policy = [PolicyObject("a", "pol", ("lan3",), read_policy_spec(spec, "MultiNetworkPolicy a/pol"))]
    namespaces: dict[str, dict[str, str]] = {"a": {}}
    first = compiled.advance(policy, [*selected, *others], namespaces)
    assert first.full and first.pods == 10
    moved = pod(4, "n2", "y", "p")
    second = compiled.advance(
        policy, [*selected, *[moved if o.uid == "uid-4" else o for o in others]], namespaces
    )
    assert not second.full and second.labels == {"n1", "n2"}
    assert second.pods < 10
    third = compiled.advance(policy, [*selected, *others], namespaces)
    assert third.labels == {"n1", "n2"} and "n3" not in third.labels
    unchanged = compiled.advance(policy, [*selected, *others], namespaces)
    assert unchanged.labels == frozenset() and unchanged.maps == {} and unchanged.pods == 0

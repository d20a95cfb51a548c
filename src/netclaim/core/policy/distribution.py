"""What the controller hands each node's agent: the rules of the node's selected pods, and the guards every
node needs for a pod the rules do not know yet (docs/design/issue27-plan.md).

Two kinds of ConfigMap in the controller's namespace, labelled POLICY_RULES_LABEL:
- `netclaim-policy-guards` (label value `guards`): per policy, its namespace, pod selector (none when the
  policy cannot be read: every pod), networks and directions. An agent starting a pod that a guard
  selects but whose rules it has not received isolates it, allowing nothing, until they come.
- `netclaim-policy-<node>` (label value: the node's name, or its hash when too long): pod UID → network →
  the rules (netclaim.core.policy.rules) of the node's pods on a netclaim network in a namespace with
  policies (none for a pod no policy selects).

Agents read only these two (a label selector `in (guards, <node>)`), so no agent watches the cluster's
pods, namespaces or claims: the flat agent of docs/scale.md.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import TypeAdapter

from netclaim.core.ipam.published import PublishedAddresses
from netclaim.core.names import POLICY_RULES_KEY
from netclaim.core.objects import Claim, Pod
from netclaim.core.policy.rules import NetworkRules, PodFacts, PolicyObject, pod_rules
from netclaim.core.policy.spec import LabelSelector

GUARDS = "guards"


MAX_LABEL_VALUE = 63


@dataclass(frozen=True)
class Guard:
    namespace: str
    policy: str
    selector: LabelSelector | None  # None: the policy cannot be read, every pod of its namespace
    networks: tuple[str, ...]
    ingress: bool
    egress: bool

    def selects(self, namespace: str, labels: Mapping[str, str]) -> bool:
        return namespace == self.namespace and (self.selector is None or self.selector.matches(labels))


GUARDS_JSON = TypeAdapter(list[Guard])


RULES_JSON = TypeAdapter(dict[str, dict[str, NetworkRules]])


def node_label(node: str) -> str:
    """The node's label value (and ConfigMap name suffix): its name when it fits a label value."""
    if len(node) <= MAX_LABEL_VALUE and node != GUARDS:
        return node
    return "node-" + hashlib.sha256(node.encode()).hexdigest()[:40]


def config_name(label: str) -> str:
    return f"netclaim-policy-{label}"


def guards(policies: Iterable[PolicyObject]) -> list[Guard]:
    return [
        Guard(
            namespace=p.namespace,
            policy=p.name,
            selector=p.spec.pod_selector if p.spec is not None else None,
            networks=p.networks,
            ingress=p.spec is None or p.spec.isolates_ingress,
            egress=p.spec is None or p.spec.isolates_egress,
        )
        for p in sorted(policies, key=lambda p: (p.namespace, p.name))
    ]


def pod_facts(pods: Iterable[Pod], claims: Iterable[Claim], published: PublishedAddresses) -> list[PodFacts]:
    """The pods on a node, with their addresses on each network from the claims reserved for them: those
    the controller may publish (netclaim.core.ipam.published), so no tenant makes another's address its
    peer."""
    by_name = {(c.namespace, c.name): c for c in claims}
    found = []
    for pod in pods:
        if not pod.node:
            continue
        addresses: dict[str, list[str]] = {}
        for name in pod.claim_names():
            claim = by_name.get((pod.namespace, name))
            if claim is None or not any(ref.uid == pod.uid for ref in claim.reserved_for):
                continue
            for network, held in published.of(claim).items():
                addresses.setdefault(network, []).extend(held)
        found.append(
            PodFacts(
                namespace=pod.namespace,
                name=pod.name,
                uid=pod.uid,
                node=pod.node,
                labels=pod.labels,
                named_ports=pod.named_ports,
                addresses={network: tuple(held) for network, held in addresses.items()},
            )
        )
    return found


def config_maps(
    policies: list[PolicyObject], facts: list[PodFacts], namespaces: Mapping[str, Mapping[str, str]]
) -> dict[str, tuple[str, dict[str, str]]]:
    """ConfigMap name → (POLICY_RULES_LABEL value, data): the guards, and one per node with pods selected."""
    rules = pod_rules(policies, facts, namespaces)
    policed = {p.namespace for p in policies}
    nodes: dict[str, dict[str, dict[str, NetworkRules]]] = {}
    for pod in facts:
        # a pod of a policed namespace that no policy selects is listed too, with no rules: the agent's
        # guards judge a pod by the labels it started with, and a relabelled pod must not stay isolated
        if pod.uid in rules or (pod.namespace in policed and pod.addresses):
            nodes.setdefault(pod.node, {})[pod.uid] = rules.get(pod.uid, {})
    made = {
        config_name(GUARDS): (GUARDS, {POLICY_RULES_KEY: _dumped(GUARDS_JSON.dump_python(guards(policies)))})
    }
    for node, selected in nodes.items():
        label = node_label(node)
        made[config_name(label)] = (label, {POLICY_RULES_KEY: _dumped(RULES_JSON.dump_python(selected))})
    return made


def _dumped(data: Any) -> str:
    return json.dumps(data, sort_keys=True, separators=(",", ":"))


def read_guards(text: str) -> list[Guard]:
    return GUARDS_JSON.validate_json(text)


def read_rules(text: str) -> dict[str, dict[str, NetworkRules]]:
    return RULES_JSON.validate_json(text)

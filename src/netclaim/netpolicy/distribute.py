"""What the controller hands each node's agent: the rules of the node's selected pods, and the guards every
node needs for a pod the rules do not know yet (docs/design/issue27-plan.md).

Two kinds of ConfigMap in the controller's namespace, labelled POLICY_RULES_LABEL:
- `netclaim-policy-guards` (label value `guards`): per policy, its namespace, pod selector (none when the
  policy cannot be read: every pod), networks and directions. An agent starting a pod that a guard
  selects but whose rules it has not received isolates it, allowing nothing, until they come.
- `netclaim-policy-<node>` (label value: the node's name, or its hash when too long): pod UID → network →
  the rules (netclaim.netpolicy.rules) of the node's pods on a netclaim network in a namespace with
  policies (none for a pod no policy selects).

Agents read only these two (a label selector `in (guards, <node>)`), so no agent watches the cluster's
pods, namespaces or claims: the flat agent of docs/scale.md.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import TypeAdapter

from netclaim import metrics
from netclaim.api.networkpolicy import LabelSelector, malformed_networks
from netclaim.errors import per_object
from netclaim.kubeapi import ClusterClaimsApi, NetworkPoliciesApi
from netclaim.names import POLICY_RULES_KEY
from netclaim.netpolicy.rules import NetworkRules, PodFacts, PolicyObject, pod_rules
from netclaim.objects import Claim, Pod
from netclaim.published import PublishedAddresses

log = logging.getLogger(__name__)
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
    the controller may publish (netclaim.published), so no tenant makes another's address its peer."""
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


@dataclass
class PolicyReconciler:
    """One pass makes the rules ConfigMaps what the MultiNetworkPolicies say of the pods now. A policy that
    cannot be read isolates its namespace's pods on its networks (netclaim.netpolicy.rules); that, and a
    policy-for naming no netclaim network there is, are told once per problem: a Warning Event on the
    policy, in its namespace. A ConfigMap that cannot be written is tried again next pass."""

    api: NetworkPoliciesApi
    claims: ClusterClaimsApi
    driver: str
    published: Callable[[], Awaitable[PublishedAddresses]]  # what may be published, as of now
    warned: set[tuple[str, str]] = field(default_factory=set)  # (policy UID, problem) told
    namespaces_with_policies: set[str] = field(default_factory=set)

    async def reconcile(self) -> None:
        await metrics.counted_pass(metrics.POLICY_PASSES, self.once, metrics.POLICY_PASS_SECONDS)

    async def once(self) -> None:
        objects = await self.api.list_network_policies()
        policies = [p for p in (PolicyObject.from_api(o) for o in objects) if p.networks]
        self.namespaces_with_policies = {p.namespace for p in policies}
        present = await self.api.list_rules_maps()
        wanted: dict[str, tuple[str, dict[str, str]]] = {}
        if policies:
            await self._tell(policies, await self.api.list_networks(self.driver))
            namespaces = await self.api.list_namespace_labels()
            published = await self.published()
            facts = pod_facts(await self.api.list_pods(), await self.claims.list_claims(), published)
            wanted = config_maps(policies, facts, namespaces)
        for name, (label, data) in wanted.items():
            if present.get(name) != data:
                await per_object(f"ConfigMap {name}", self.api.apply_rules_map(name, label, data))
        for name in sorted(set(present) - set(wanted)):
            await per_object(f"ConfigMap {name}", self.api.delete_rules_map(name))
        uids = {p.uid for p in policies}
        self.warned = {(uid, problem) for uid, problem in self.warned if uid in uids}

    async def _tell(self, policies: list[PolicyObject], networks: set[str]) -> None:
        for policy in policies:
            problems = [policy.problem] if policy.problem else []
            unknown = [n for n in policy.networks if n not in networks]
            if unknown:
                malformed = set(malformed_networks(tuple(unknown)))
                problems.append(
                    "policy-for names "
                    + ", ".join(f"netclaim.dev/{n}" for n in unknown)
                    + ": no netclaim NIC of the cluster is on "
                    + ("that network" if len(unknown) == 1 else "those networks")
                    + (" (not a network name)" if malformed else "")
                    + "; it selects nothing there"
                )
            for problem in problems:
                if (policy.uid, problem) in self.warned:
                    continue
                self.warned.add((policy.uid, problem))
                where = f"{policy.namespace}/{policy.name}"
                isolating = problem == policy.problem
                log.warning(
                    "MultiNetworkPolicy cannot be read: it isolates its namespace's pods on its networks"
                    if isolating
                    else "MultiNetworkPolicy names an unknown netclaim network",
                    extra={"policy": where, "problem": problem},
                )
                reason = "NetworkPolicyInvalid" if isolating else "NetworkPolicyUnknownNetwork"
                message = (
                    f"{problem} (until it can be read, every pod of its namespace on its networks is "
                    "isolated, allowing nothing)"
                    if isolating
                    else problem
                )
                event = self.api.create_policy_event(
                    policy.namespace, policy.name, policy.uid, reason, message
                )
                await per_object(f"event on MultiNetworkPolicy {where}", event)

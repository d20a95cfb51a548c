"""What the controller hands each node's agent: the rules of the node's selected pods, and the guards every
node needs for a pod the rules do not know yet (docs/design/multinetworkpolicy-plan.md).

Two kinds of ConfigMap in the controller's namespace, labelled POLICY_RULES_LABEL:
- `netclaim-policy-guards` (label value `guards`): per policy, its namespace, pod selector (none when the
  policy cannot be read: every pod), networks and directions. An agent starting a pod that a guard
  selects but whose rules it has not received isolates it, allowing nothing, until they come.
- `netclaim-policy-<node>` (label value: the node's name, or its hash when too long): pod UID → network →
  the rules (netclaim.core.policy.rules) of the node's pods on a netclaim network in a namespace with
  policies (none for a pod no policy selects).

Agents read only these two (a label selector `in (guards, <node>)`), so no agent watches the cluster's
pods, namespaces or claims: the flat agent of docs/scale.md.

No object grows with the cluster: what does not fit MAX_OBJECT_BYTES is split over more ConfigMaps of the
same label (`netclaim-policy-<label>`, then `netclaim-policy-<label>.<hash>-<i>`), a pod's rules on one
network over several when they alone exceed it (their allows are a union: any part may hold any of
them), and an agent unions every part it reads (`merged_rules`). The API's own limit is 1 MiB: one
object past it was refused, and that node's rules (every tenant's) were never written again.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Annotated, Any, TypeVar

import msgspec

from netclaim.core.ipam.published import PublishedAddresses
from netclaim.core.names import POLICY_RULES_KEY, POLICY_RULES_LABEL
from netclaim.core.objects import Claim, Pod, as_object
from netclaim.core.policy.rules import Direction, NetworkRules, PodFacts, PolicyObject, pod_rules
from netclaim.core.policy.spec import MAX_LABELS, LabelSelector, Requirement, check_labels, terms_match

GUARDS = "guards"
MAX_LABEL_VALUE = 63
MAX_OBJECT_BYTES = 256 * 1024  # a ConfigMap's rules, as JSON


class GuardSelector(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A guard's pod selector as the guards ConfigMap holds it: the policy's LabelSelector under its Python
    names, as every controller has written it (agents of the version before and after read it)."""

    match_labels: Annotated[dict[str, str], msgspec.Meta(max_length=MAX_LABELS)] = msgspec.field(
        default_factory=dict
    )
    match_expressions: Annotated[tuple[Requirement, ...], msgspec.Meta(max_length=MAX_LABELS)] = ()

    def __post_init__(self) -> None:
        check_labels("match_labels", self.match_labels)

    @classmethod
    def of(cls, selector: LabelSelector) -> GuardSelector:
        return cls(selector.match_labels, selector.match_expressions)

    def matches(self, labels: Mapping[str, str]) -> bool:
        return terms_match(self.match_labels, self.match_expressions, labels)


@dataclass(frozen=True)
class Guard:
    namespace: str
    policy: str
    selector: GuardSelector | None  # None: the policy cannot be read, every pod of its namespace
    networks: tuple[str, ...]
    ingress: bool
    egress: bool

    def selects(self, namespace: str, labels: Mapping[str, str]) -> bool:
        return namespace == self.namespace and (self.selector is None or self.selector.matches(labels))


GUARDS_JSON = msgspec.json.Decoder(list[Guard])


RULES_JSON = msgspec.json.Decoder(dict[str, dict[str, NetworkRules]])


@dataclass(frozen=True)
class RulesMap:
    """A rules ConfigMap as the controller's informer keeps it: its label and the digest of its data."""

    name: str
    label: str
    digest: str

    @classmethod
    def from_api(cls, found: Mapping[str, Any]) -> RulesMap:
        meta = as_object(found.get("metadata"))
        data = as_object(found.get("data"))
        return cls(
            str(meta.get("name") or ""),
            str(as_object(meta.get("labels")).get(POLICY_RULES_LABEL) or ""),
            digest({str(k): str(v) for k, v in data.items()}),
        )


def digest(data: Mapping[str, str]) -> str:
    return hashlib.sha256(_dumped(dict(data)).encode()).hexdigest()


def node_label(node: str) -> str:
    """The node's label value (and ConfigMap name suffix): its name when it fits a label value."""
    if len(node) <= MAX_LABEL_VALUE and node != GUARDS:
        return node
    return "node-" + hashlib.sha256(node.encode()).hexdigest()[:40]


def config_name(label: str, part: int = 0) -> str:
    """The name of part `part` of a label's rules: names no other label's part can take (a node may be
    named like another's part, never like a hash of another's name)."""
    if part == 0:
        return f"netclaim-policy-{label}"
    return f"netclaim-policy-part-{part}-{hashlib.sha256(label.encode()).hexdigest()[:40]}"


def guards(policies: Iterable[PolicyObject]) -> list[Guard]:
    return [
        Guard(
            namespace=p.namespace,
            policy=p.name,
            selector=GuardSelector.of(p.spec.pod_selector) if p.spec is not None else None,
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
        if listed(pod, rules, policed):
            nodes.setdefault(pod.node, {})[pod.uid] = rules.get(pod.uid, {})
    made = guard_maps(policies)
    for node, selected in nodes.items():
        made |= node_maps(node, selected)
    return made


def listed(pod: PodFacts, rules: Mapping[str, object], policed: Collection[str]) -> bool:
    """Whether the pod is in its node's rules: some policy selects it, or it is on a netclaim network in a
    namespace with policies (with no rules: the agent's guards judge a pod by the labels it started with,
    and a relabelled pod must not stay isolated)."""
    return pod.uid in rules or (pod.namespace in policed and bool(pod.addresses))


def guard_maps(policies: Iterable[PolicyObject]) -> dict[str, tuple[str, dict[str, str]]]:
    """The guards' ConfigMaps: every part, so a part no longer needed is one not named here."""
    items = [(g, len(_dumped(g))) for g in msgspec.to_builtins(guards(policies))]
    return {
        config_name(GUARDS, part): (GUARDS, {POLICY_RULES_KEY: _dumped(entries)})
        for part, entries in enumerate(_packed(items) or [[]])
    }


def node_maps(
    node: str, selected: Mapping[str, Mapping[str, NetworkRules]]
) -> dict[str, tuple[str, dict[str, str]]]:
    """A node's ConfigMaps, every part, from its listed pods' rules (pod UID → network → rules); none for
    a node with none."""
    label = node_label(node)
    pieces: list[tuple[tuple[str, str, NetworkRules | None], int]] = [
        ((uid, "", None), len(uid)) for uid, interfaces in sorted(selected.items()) if not interfaces
    ]
    pieces += [
        ((uid, network, piece), len(uid) + len(network) + _size(piece))
        for uid, interfaces in sorted(selected.items())
        for network, rules in sorted(interfaces.items())
        for piece in _split(rules)
    ]
    made: dict[str, tuple[str, dict[str, str]]] = {}
    for part, entries in enumerate(_packed(pieces)):
        held: dict[str, dict[str, NetworkRules]] = {}
        for uid, network, piece in entries:
            interfaces = held.setdefault(uid, {})
            if piece is not None:
                before = interfaces.get(network)
                interfaces[network] = piece if before is None else _union(before, piece)
        made[config_name(label, part)] = (label, {POLICY_RULES_KEY: _dumped(msgspec.to_builtins(held))})
    return made


def _size(rules: NetworkRules) -> int:
    return len(_dumped(msgspec.to_builtins(rules)))


def _split(rules: NetworkRules) -> list[NetworkRules]:
    """The rules as parts of at most MAX_OBJECT_BYTES each (halving their allows), one when they fit."""
    if _size(rules) <= MAX_OBJECT_BYTES // 2:
        return [rules]
    halves = []
    for take in (slice(None, None, 2), slice(1, None, 2)):
        halves.append(
            NetworkRules(
                *(
                    replace(d, allows=d.allows[take]) if d is not None else None
                    for d in (rules.ingress, rules.egress)
                )
            )
        )
    if halves[0] == rules:  # nothing left to halve: one allow larger than an object (spec bounds forbid it)
        return [rules]
    return [piece for half in halves for piece in _split(half)]


T = TypeVar("T")
ENTRY_OVERHEAD = 16  # the quotes, colons, braces and commas around one entry


def _packed(items: list[tuple[T, int]]) -> list[list[T]]:
    """Items (each with its size as JSON) in order, into as few objects as hold them under
    MAX_OBJECT_BYTES."""
    parts: list[list[T]] = []
    size = MAX_OBJECT_BYTES
    for item, length in items:
        if size + length + ENTRY_OVERHEAD > MAX_OBJECT_BYTES:
            parts.append([])
            size = 2
        parts[-1].append(item)
        size += length + ENTRY_OVERHEAD
    return parts


def _dumped(data: Any) -> str:
    return json.dumps(data, sort_keys=True, separators=(",", ":"))


def read_guards(texts: Iterable[str]) -> list[Guard]:
    """The guards of every part."""
    return [guard for text in texts for guard in GUARDS_JSON.decode(text)]


def read_rules(texts: Iterable[str]) -> dict[str, dict[str, NetworkRules]]:
    """Pod UID → network → its rules, every part's unioned: a direction isolated in any part is isolated,
    with the allows and the policies of all."""
    merged: dict[str, dict[str, NetworkRules]] = {}
    for text in texts:
        for uid, interfaces in RULES_JSON.decode(text).items():
            held = merged.setdefault(uid, {})
            for network, rules in interfaces.items():
                before = held.get(network)
                held[network] = rules if before is None else _union(before, rules)
    return merged


def _union(a: NetworkRules, b: NetworkRules) -> NetworkRules:
    def both(x: Direction | None, y: Direction | None) -> Direction | None:
        if x is None or y is None:
            return x or y
        return Direction(
            tuple(sorted(set(x.allows) | set(y.allows))), tuple(sorted(set(x.policies) | set(y.policies)))
        )

    return NetworkRules(both(a.ingress, b.ingress), both(a.egress, b.egress))

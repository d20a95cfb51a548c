"""The rules the controller last handed the nodes, kept so that the next pass compiles only what a change
touches (Antrea's incremental AppliedToGroups, in this project's terms): a policy's change recompiles the
pods it selected and selects; a pod's change (labels, addresses, node, named ports) recompiles that pod and
the pods selected by every policy that names it as a peer, before or after; a namespace's labels, the pods
of policies with a namespaceSelector peer. Only the nodes of recompiled pods get their ConfigMaps made
again, and the guards only when a policy changed.

A pass is a full compile instead (every pod, every node: what `config_maps` makes) the first time, when
asked (the controller's periodic resync), and when finding what a change touches would cost more than a
full compile does (FULL_COMPILE_AT peer checks): so a pass never costs more than a full one, and what
any number of passes makes equals what one full compile of the same state makes (tests/unit's property).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from netclaim.core.policy.distribution import GUARDS, guard_maps, listed, node_label, node_maps
from netclaim.core.policy.rules import (
    NetworkRules,
    PodFacts,
    PolicyObject,
    names_as_peer,
    names_other_namespaces,
    peer_count,
    pod_rules,
    selects,
)

# peer checks (a changed pod against one peer; 100 for a changed policy) past which a full compile is
# the cheaper pass
FULL_COMPILE_AT = 200_000
Maps = dict[str, tuple[str, dict[str, str]]]  # ConfigMap name → (POLICY_RULES_LABEL value, data)


@dataclass(frozen=True)
class Compiled:
    """A pass's outcome: every part of each label (`labels`) that it made again; a label made with no
    part has none left. `full`: every label was made, so one not among them has no part at all."""

    maps: Maps
    labels: frozenset[str]
    full: bool
    pods: int  # pods whose rules were compiled


@dataclass
class CompiledRules:
    policies: dict[str, PolicyObject] = field(default_factory=dict)  # namespace/name → as compiled
    facts: dict[str, PodFacts] = field(default_factory=dict)  # pod UID → as compiled
    namespaces: dict[str, Mapping[str, str]] = field(default_factory=dict)
    entries: dict[str, dict[str, NetworkRules]] = field(default_factory=dict)  # pods listed on their nodes
    on_node: dict[str, set[str]] = field(default_factory=dict)  # node → UIDs of its listed pods
    selected: dict[str, set[str]] = field(default_factory=dict)  # policy → UIDs of the pods it selects
    compiled: bool = False

    def advance(
        self,
        policies: Iterable[PolicyObject],
        facts: Iterable[PodFacts],
        namespaces: Mapping[str, Mapping[str, str]],
        full: bool = False,
    ) -> Compiled:
        """The ConfigMaps of the labels that the change from the last pass's state to this one touches."""
        policies_now = {f"{p.namespace}/{p.name}": p for p in policies}
        facts_now = {f.uid: f for f in facts}
        namespaces_now = dict(namespaces)
        changed_policies = _changed(self.policies, policies_now)
        changed_pods = _changed(self.facts, facts_now)
        changed_namespaces = _changed(self.namespaces, namespaces_now)
        dirty = None
        if self.compiled and not full:
            dirty = self._touched(
                policies_now, facts_now, namespaces_now, changed_policies, changed_pods, changed_namespaces
            )
        before = self.facts
        self.policies, self.facts, self.namespaces = policies_now, facts_now, namespaces_now
        if dirty is None:
            return self._full()
        return self._partial(dirty, before, bool(changed_policies))

    def _touched(
        self,
        policies: dict[str, PolicyObject],
        facts: dict[str, PodFacts],
        namespaces: dict[str, Mapping[str, str]],
        changed_policies: set[str],
        changed_pods: set[str],
        changed_namespaces: set[str],
    ) -> set[str] | None:
        """The UIDs of the pods whose rules may differ, None when a full compile is the cheaper way."""
        by_namespace: dict[str, list[str]] = {}
        for key, policy in policies.items():
            by_namespace.setdefault(policy.namespace, []).append(key)
        wide = [key for key, p in policies.items() if names_other_namespaces(p)]
        local_peers = max(
            (sum(peer_count(policies[k]) for k in keys) for keys in by_namespace.values()), default=0
        )
        wide_peers = sum(peer_count(policies[k]) for k in wide)
        if len(changed_pods) * (local_peers + wide_peers) + len(changed_policies) * 100 > FULL_COMPILE_AT:
            return None
        pods_in = _by_namespace(facts)
        dirty = set(changed_pods)
        policed = {p.namespace for p in self.policies.values()} ^ {p.namespace for p in policies.values()}
        dirty |= {uid for uid, f in (self.facts | facts).items() if f.namespace in policed}
        for key in changed_policies:
            dirty |= self.selected.get(key, set())
            now = policies.get(key)
            if now is not None:
                dirty |= {f.uid for f in pods_in.get(now.namespace, ()) if selects(now, f)}
        if changed_namespaces:
            for key in wide:
                dirty |= self.selected.get(key, set())
        for uid in changed_pods:
            for pod in (self.facts.get(uid), facts.get(uid)):
                if pod is None:
                    continue
                for key in {*by_namespace.get(pod.namespace, ()), *wide}:
                    if names_as_peer(policies[key], pod, namespaces):
                        dirty |= self.selected.get(key, set())
        return dirty

    def _full(self) -> Compiled:
        rules = pod_rules(list(self.policies.values()), list(self.facts.values()), self.namespaces)
        policed = {p.namespace for p in self.policies.values()}
        self.entries, self.on_node = {}, {}
        for pod in self.facts.values():
            if listed(pod, rules, policed):
                self.entries[pod.uid] = rules.get(pod.uid, {})
                self.on_node.setdefault(pod.node, set()).add(pod.uid)
        pods_in = _by_namespace(self.facts)
        self.selected = {
            key: {f.uid for f in pods_in.get(p.namespace, ()) if selects(p, f)}
            for key, p in self.policies.items()
        }
        self.compiled = True
        maps = self._guard_maps()
        for node in self.on_node:
            maps |= self._node_maps(node)
        labels = {GUARDS} | {node_label(node) for node in self.on_node}
        return Compiled(maps, frozenset(labels), True, len(self.facts))

    def _partial(self, dirty: set[str], before: dict[str, PodFacts], policies_changed: bool) -> Compiled:
        facts = list(self.facts.values())
        rules = pod_rules(list(self.policies.values()), facts, self.namespaces, targets=dirty)
        policed = {p.namespace for p in self.policies.values()}
        nodes: set[str] = set()
        for uid in dirty:
            old, new = before.get(uid), self.facts.get(uid)
            if old is not None and uid in self.on_node.get(old.node, ()):
                self.on_node[old.node].discard(uid)
                nodes.add(old.node)
            self.entries.pop(uid, None)
            if new is not None and listed(new, rules, policed):
                self.entries[uid] = rules.get(uid, {})
                self.on_node.setdefault(new.node, set()).add(uid)
                nodes.add(new.node)
        for key, policy in self.policies.items():
            held = self.selected.setdefault(key, set())
            held -= dirty
            held |= {uid for uid in dirty if uid in self.facts and selects(policy, self.facts[uid])}
        for key in set(self.selected) - set(self.policies):
            del self.selected[key]
        maps = self._guard_maps() if policies_changed else {}
        for node in nodes:
            maps |= self._node_maps(node)
            if not self.on_node.get(node):
                self.on_node.pop(node, None)
        labels = {node_label(node) for node in nodes} | ({GUARDS} if policies_changed else set())
        return Compiled(maps, frozenset(labels), False, len(dirty))

    def made_again(self, compiled: Compiled, labels: set[str]) -> Compiled:
        """The pass's outcome with every part of `labels` made as well, from what is compiled (a label no
        pod is listed under any more: made with no part)."""
        nodes = {node_label(node): node for node in self.on_node}
        maps = dict(compiled.maps)
        for label in labels - compiled.labels:
            if label == GUARDS:
                maps |= self._guard_maps()
            elif label in nodes:
                maps |= self._node_maps(nodes[label])
        return Compiled(maps, compiled.labels | labels, compiled.full, compiled.pods)

    def _guard_maps(self) -> Maps:
        """None while no policy is there: a cluster without policies has no rules objects at all."""
        return guard_maps(self.policies.values()) if self.policies else {}

    def _node_maps(self, node: str) -> Maps:
        return node_maps(node, {uid: self.entries[uid] for uid in self.on_node.get(node, ())})


def _by_namespace(facts: Mapping[str, PodFacts]) -> dict[str, list[PodFacts]]:
    found: dict[str, list[PodFacts]] = {}
    for pod in facts.values():
        found.setdefault(pod.namespace, []).append(pod)
    return found


def _changed(before: Mapping[str, object], after: Mapping[str, object]) -> set[str]:
    return {
        key
        for key in before.keys() | after.keys()
        if before.get(key) is not after.get(key) and before.get(key) != after.get(key)
    }

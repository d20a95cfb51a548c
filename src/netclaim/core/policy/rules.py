"""MultiNetworkPolicies made into each pod's rules on each netclaim network, with NetworkPolicy's meaning
(pure: netclaim.core.policy.spec reads the policies, the caller gathers pods, namespaces and addresses).

- A pod is isolated for ingress (egress) on a network once any policy of its namespace selects it for
  that direction on that network; then only what some such policy's rules allow passes.
- A peer `podSelector` alone means pods of the policy's namespace; `namespaceSelector` alone, every pod of
  the namespaces it selects; both, those pods of those namespaces. A peer's addresses are its addresses on
  the same network, from claim status: a pod without an interface there lends none.
- An empty `from`/`to` allows every address; empty `ports` every port and protocol.
- A named port is the selected pod's container port for ingress, each peer's for egress (a peer without
  it, or an ipBlock, contributes nothing to that port).
- A policy that cannot be read isolates every pod of its namespace on its networks, in both directions,
  allowing nothing: fail closed, never ignored. So do all of a namespace's policies once together they
  exceed the namespace's budget (NAMESPACE_BUDGET): one tenant's policies never cost the controller, or
  another tenant, more than that.
"""

from __future__ import annotations

import ipaddress
import json
import logging
from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import msgspec

from netclaim.core.policy.spec import (
    EgressRule,
    IngressRule,
    Peer,
    PolicySpec,
    netclaim_networks,
    read_policy_spec,
)
from netclaim.errors import ConfigError

log = logging.getLogger(__name__)
ANY = ("0.0.0.0/0", "::/0")
# What one namespace's MultiNetworkPolicies on netclaim networks may hold together: one policy at
# netclaim.core.policy.spec's bounds (100 rules x 100 peers) fits; eight do not. Counted on the JSON
# before anything is parsed, so an oversized namespace costs a count, not a compile.
NAMESPACE_BUDGET = {"rules": 1_000, "peers": 10_000, "bytes": 1 << 20}


@dataclass(frozen=True)
class PolicyObject:
    """One MultiNetworkPolicy naming netclaim networks: its spec, or why it cannot be read."""

    namespace: str
    name: str
    networks: tuple[str, ...]
    spec: PolicySpec | None
    problem: str = ""
    uid: str = ""

    @classmethod
    def from_api(cls, data: Mapping[str, Any], over_budget: str = "") -> PolicyObject:
        """The policy as the API has it: a tenant's free JSON, read field by field; not read at all when
        its namespace is `over_budget` (why)."""
        namespace, name, uid, networks = identity(data)
        return cls.parsed(namespace, name, uid, networks, data.get("spec"), over_budget)

    @classmethod
    def parsed(
        cls, namespace: str, name: str, uid: str, networks: tuple[str, ...], spec: Any, over_budget: str = ""
    ) -> PolicyObject:
        if over_budget:
            return cls(namespace, name, networks, None, over_budget, uid)
        try:
            read = read_policy_spec(spec, f"MultiNetworkPolicy {namespace}/{name}")
        except ConfigError as err:
            return cls(namespace, name, networks, None, str(err), uid)
        return cls(namespace, name, networks, read, uid=uid)


def identity(data: Mapping[str, Any]) -> tuple[str, str, str, tuple[str, ...]]:
    """A policy's namespace, name, UID and the netclaim networks it is for, read without its spec."""
    meta = data.get("metadata")
    meta = meta if isinstance(meta, dict) else {}
    annotations = meta.get("annotations")
    annotations = annotations if isinstance(annotations, dict) else {}
    networks = netclaim_networks({str(k): str(v) for k, v in annotations.items()})
    return str(meta.get("namespace") or ""), str(meta.get("name") or ""), str(meta.get("uid") or ""), networks


@dataclass(frozen=True)
class PolicySource:
    """A MultiNetworkPolicy as the controller's informer keeps it: who, the netclaim networks it is for,
    what its spec holds against NAMESPACE_BUDGET (counted on the JSON, before any parse), and the spec as
    compact JSON, parsed only while its namespace is within budget. A policy for no netclaim network
    (Multus's) keeps no spec: it is never parsed."""

    namespace: str
    name: str
    uid: str
    networks: tuple[str, ...]
    version: str  # resourceVersion
    rules: int = 0
    peers: int = 0
    size: int = 0  # bytes of the spec as compact JSON
    spec: str = ""
    dropped: bool = False  # its text let go while its namespace was over budget (PolicySources)

    @classmethod
    def from_api(cls, data: Mapping[str, Any]) -> PolicySource:
        namespace, name, uid, networks = identity(data)
        meta = data.get("metadata")
        version = str(meta.get("resourceVersion") or "") if isinstance(meta, dict) else ""
        if not networks:
            return cls(namespace, name, uid, networks, version)
        spec = data.get("spec")
        spec = spec if isinstance(spec, dict) else {}
        rules = peers = 0
        for direction, field_name in (("ingress", "from"), ("egress", "to")):
            found = spec.get(direction)
            for rule in found if isinstance(found, list) else ():
                rules += 1
                listed = rule.get(field_name) if isinstance(rule, dict) else None
                peers += len(listed) if isinstance(listed, list) else 0
        try:
            text = json.dumps(spec, separators=(",", ":"))
        except (RecursionError, ValueError, TypeError):  # deeper than any policy: past every budget
            return cls(namespace, name, uid, networks, version, rules, peers, NAMESPACE_BUDGET["bytes"] + 1)
        return cls(namespace, name, uid, networks, version, rules, peers, len(text), text)

    def without_text(self) -> PolicySource:
        return replace(self, spec="", dropped=True)

    def read(self, over_budget: str = "") -> PolicyObject:
        """The policy parsed; unread, isolating, when its namespace is `over_budget` (why), or while its
        text, let go when it was, has not been read again."""
        if self.dropped and not over_budget:
            over_budget = "its namespace was over its budget; its spec is being read again"
        spec = json.loads(self.spec) if self.spec and not over_budget else None
        return PolicyObject.parsed(self.namespace, self.name, self.uid, self.networks, spec, over_budget)


def is_over(counts: Mapping[str, int]) -> bool:
    """Whether a namespace's counts (NAMESPACE_BUDGET's keys) exceed its budget."""
    return any(counts[k] > v for k, v in NAMESPACE_BUDGET.items())


def over_budget(policies: Iterable[PolicySource]) -> dict[str, str]:
    """Namespace → why its policies together exceed NAMESPACE_BUDGET, for the namespaces that do: which
    budgets, not by how much (the words stay the same while a tenant adds more, so each policy is told
    once)."""
    used: dict[str, dict[str, int]] = defaultdict(lambda: dict.fromkeys(NAMESPACE_BUDGET, 0))
    for policy in policies:
        counts = used[policy.namespace]
        counts["rules"] += policy.rules
        counts["peers"] += policy.peers
        counts["bytes"] += policy.size
    return {
        namespace: "the namespace's MultiNetworkPolicies together exceed its budget of "
        + " and ".join(f"{v:,} {k}" for k, v in NAMESPACE_BUDGET.items() if counts[k] > v)
        for namespace, counts in sorted(used.items())
        if is_over(counts)
    }


@dataclass(frozen=True)
class PodFacts:
    """What the rules need of a pod: who, where, its labels, its named container ports and its addresses
    on each netclaim network."""

    namespace: str
    name: str
    uid: str
    node: str
    labels: Mapping[str, str]
    named_ports: Mapping[str, tuple[str, int]]  # container port name → (protocol, number)
    addresses: Mapping[str, tuple[str, ...]]  # network → addresses (no prefix length)


@dataclass(frozen=True, order=True)
class PortMatch:
    protocol: str  # TCP, UDP, SCTP
    first: int | None = None  # None: any port of the protocol
    last: int | None = None


@dataclass(frozen=True, order=True)
class Allow:
    """Traffic from (ingress) or to (egress) `cidrs` but `excepts`, on `ports` (empty: any)."""

    cidrs: tuple[str, ...]
    excepts: tuple[str, ...] = ()
    ports: tuple[PortMatch, ...] = ()


@dataclass(frozen=True)
class Direction:
    """One direction of one network of one pod, once isolated: what is allowed, and by which policies."""

    allows: tuple[Allow, ...]
    policies: tuple[str, ...]  # namespace/name of the policies that isolate it


@dataclass(frozen=True)
class NetworkRules:
    ingress: Direction | None = None  # None: not isolated
    egress: Direction | None = None


@dataclass
class _Building:
    allows: set[Allow] = field(default_factory=set)
    policies: set[str] = field(default_factory=set)


def pod_rules(
    policies: Iterable[PolicyObject],
    pods: list[PodFacts],
    namespaces: Mapping[str, Mapping[str, str]],
    targets: Collection[str] | None = None,
) -> dict[str, dict[str, NetworkRules]]:
    """Pod UID → network → its rules, for the pods some policy selects on a network they are on; only
    those of `targets` (pod UIDs) when given, their peers still resolved over every pod."""
    built: dict[tuple[str, str, str], _Building] = {}  # (pod uid, network, direction)
    peers = _Peers(pods, namespaces)
    for policy in policies:
        try:
            contributions = list(_policy_rules(policy, peers, targets))
        except Exception:  # one policy's, whatever it is: it isolates as one that cannot be read
            log.exception(
                "MultiNetworkPolicy not compiled (a bug): its pods isolated, allowing nothing",
                extra={"policy": f"{policy.namespace}/{policy.name}"},
            )
            unread = replace(policy, spec=None, problem="not compiled")
            contributions = list(_policy_rules(unread, peers, targets))
        where = f"{policy.namespace}/{policy.name}"
        for uid, network, direction, allows in contributions:
            building = built.setdefault((uid, network, direction), _Building())
            building.policies.add(where)
            building.allows.update(allows)
    result: dict[str, dict[str, NetworkRules]] = {}
    for (uid, network, direction), building in built.items():
        made = Direction(tuple(sorted(_merged(building.allows))), tuple(sorted(building.policies)))
        current = result.setdefault(uid, {}).get(network, NetworkRules())
        result[uid][network] = (
            NetworkRules(made, current.egress)
            if direction == "ingress"
            else NetworkRules(current.ingress, made)
        )
    return result


def selects(policy: PolicyObject, pod: PodFacts) -> bool:
    """Whether the policy isolates the pod on some network (one it cannot read: every pod of its
    namespace on its networks)."""
    return (
        pod.namespace == policy.namespace
        and any(network in pod.addresses for network in policy.networks)
        and (policy.spec is None or policy.spec.pod_selector.matches(pod.labels))
    )


def names_as_peer(policy: PolicyObject, pod: PodFacts, namespaces: Mapping[str, Mapping[str, str]]) -> bool:
    """Whether the pod's addresses or ports may be in the rules the policy gives the pods it selects: a
    selector peer selects it, or an egress rule to anyone names a port (each pod's own)."""
    if policy.spec is None:
        return False
    for rule in _all_rules(policy.spec):
        if (
            not rule.peers
            and isinstance(rule, EgressRule)
            and any(isinstance(p.port, str) for p in rule.ports)
        ):
            return True
        if any(
            p.ip_block is None and _peer_selects(p, policy.namespace, pod, namespaces) for p in rule.peers
        ):
            return True
    return False


def names_other_namespaces(policy: PolicyObject) -> bool:
    """Whether pods of other namespaces may be in the policy's rules: a namespaceSelector peer, or an
    egress rule to anyone naming a port."""
    if policy.spec is None:
        return False
    return any(
        bool(
            not rule.peers
            and isinstance(rule, EgressRule)
            and any(isinstance(p.port, str) for p in rule.ports)
        )
        or any(p.namespace_selector is not None for p in rule.peers)
        for rule in _all_rules(policy.spec)
    )


def _all_rules(spec: PolicySpec) -> tuple[IngressRule | EgressRule, ...]:
    return (*spec.ingress, *spec.egress)


def peer_count(policy: PolicyObject) -> int:
    """What checking a pod against the policy's peers costs, in peers (at least 1)."""
    if policy.spec is None:
        return 1
    return 1 + sum(len(rule.peers) for rule in _all_rules(policy.spec))


class _Peers:
    """The pods of each namespace, and the pods a peer selects, resolved once per (peer, namespace) however
    many rules and selected pods name it: without it a policy of 100 rules x 100 `namespaceSelector: {}`
    peers cost 10,000 passes over every pod for each pod it selects (40 CPU-seconds at 200 pods). A rule's
    allows are the same for every pod it applies to but for an ingress named port (the selected pod's), so
    they are made once per rule and network."""

    def __init__(self, pods: list[PodFacts], namespaces: Mapping[str, Mapping[str, str]]) -> None:
        self.pods = pods
        self.namespaces = namespaces
        self.by_namespace: dict[str, list[PodFacts]] = {}
        for pod in pods:
            self.by_namespace.setdefault(pod.namespace, []).append(pod)
        self._resolved: dict[tuple[str, str], list[PodFacts]] = {}
        self._hosts: dict[tuple[str, str], tuple[str, ...]] = {}
        self._keys: dict[int, str] = {}  # id(peer) → its JSON: the policies outlive the compile
        self._rules: dict[tuple[frozenset[str], str], list[PodFacts]] = {}
        self.allows: dict[
            tuple[int, str, str], list[Allow]
        ] = {}  # (id(rule), network, namespace): the policies outlive it

    def _key(self, peer: Peer) -> str:
        key = self._keys.get(id(peer))
        if key is None:
            key = self._keys[id(peer)] = msgspec.json.encode(peer).decode()
        return key

    def of_rule(self, peers: tuple[Peer, ...], namespace: str) -> list[PodFacts]:
        """The pods any selector peer of a rule selects, each once; rules naming the same peers share it."""
        by_key = {self._key(p): p for p in peers if p.ip_block is None}
        rule_key = (frozenset(by_key), namespace)
        found = self._rules.get(rule_key)
        if found is None:
            selected = {o.uid: o for p in by_key.values() for o in self.of(p, namespace)}
            found = self._rules[rule_key] = list(selected.values())
        return found

    def of(self, peer: Peer, namespace: str) -> list[PodFacts]:
        key = (self._key(peer), namespace)
        found = self._resolved.get(key)
        if found is None:
            if peer.namespace_selector is None:
                where = [namespace]
            else:
                selector = peer.namespace_selector
                where = [n for n in self.by_namespace if selector.matches(self.namespaces.get(n, {}))]
            found = self._resolved[key] = [
                other
                for n in where
                for other in self.by_namespace.get(n, ())
                if peer.pod_selector is None or peer.pod_selector.matches(other.labels)
            ]
        return found

    def hosts(self, pod: PodFacts, network: str) -> tuple[str, ...]:
        """The pod's addresses on `network` as host networks (/32, /128)."""
        found = self._hosts.get((pod.uid, network))
        if found is None:
            found = self._hosts[(pod.uid, network)] = _hosts(pod, network)
        return found


def _policy_rules(
    policy: PolicyObject, peers: _Peers, targets: Collection[str] | None
) -> Iterable[tuple[str, str, str, set[Allow]]]:
    """(pod UID, network, direction, its allows) of each pod the policy selects on a network it is on."""
    for pod in peers.by_namespace.get(policy.namespace, ()):
        if targets is not None and pod.uid not in targets:
            continue
        if policy.spec is not None and not policy.spec.pod_selector.matches(pod.labels):
            continue
        for network in policy.networks:
            if network in pod.addresses:
                for direction, allows in _directions(policy, pod, network, peers):
                    yield pod.uid, network, direction, allows


def _merged(allows: Iterable[Allow]) -> set[Allow]:
    """Allows that differ only in their addresses, as one: a rule with one set of every peer, not a rule per
    peer (one per pod would grow each table with the namespace)."""
    grouped: dict[tuple[tuple[str, ...], tuple[PortMatch, ...]], set[str]] = {}
    for allow in allows:
        grouped.setdefault((allow.excepts, allow.ports), set()).update(allow.cidrs)
    return {Allow(tuple(sorted(cidrs)), excepts, ports) for (excepts, ports), cidrs in grouped.items()}


def _directions(
    policy: PolicyObject, pod: PodFacts, network: str, peers: _Peers
) -> Iterable[tuple[str, set[Allow]]]:
    spec = policy.spec
    if spec is None:  # unreadable: isolated both ways, nothing allowed
        yield "ingress", set()
        yield "egress", set()
        return
    if spec.isolates_ingress:
        yield "ingress", {a for rule in spec.ingress for a in _rule_allows(rule, policy, pod, network, peers)}
    if spec.isolates_egress:
        yield "egress", {a for rule in spec.egress for a in _rule_allows(rule, policy, pod, network, peers)}


def _rule_allows(
    rule: IngressRule | EgressRule, policy: PolicyObject, pod: PodFacts, network: str, peers: _Peers
) -> list[Allow]:
    if isinstance(rule, IngressRule) and any(isinstance(p.port, str) for p in rule.ports):
        return list(_allows(rule, policy, pod, network, peers))  # the selected pod's named ports
    key = (id(rule), network, policy.namespace)
    found = peers.allows.get(key)
    if found is None:
        found = peers.allows[key] = list(_allows(rule, policy, pod, network, peers))
    return found


def _allows(
    rule: IngressRule | EgressRule, policy: PolicyObject, pod: PodFacts, network: str, peers: _Peers
) -> Iterable[Allow]:
    egress = isinstance(rule, EgressRule)
    numeric = tuple(p for p in rule.ports if not isinstance(p.port, str))
    named = tuple(p for p in rule.ports if isinstance(p.port, str))
    # (addresses, excepts, the pod they are, if one): the rule's peers
    targets: list[tuple[tuple[str, ...], tuple[str, ...], PodFacts | None]] = []
    if not rule.peers:
        targets.append((ANY, (), None))
        if egress and named:  # to anyone: a named port is that of each pod on the network
            targets += [(peers.hosts(o, network), (), o) for o in peers.pods if o.addresses.get(network)]
    targets += [((p.ip_block.cidr,), p.ip_block.except_, None) for p in rule.peers if p.ip_block is not None]
    targets += [(peers.hosts(o, network), (), o) for o in peers.of_rule(rule.peers, policy.namespace)]
    for cidrs, excepts, other in targets:
        if not cidrs:
            continue
        if not rule.ports:
            yield Allow(tuple(sorted(cidrs)), tuple(sorted(excepts)))
            continue
        owner = other if egress else pod  # whose container ports a name means
        matches = {
            PortMatch(p.protocol, p.port, p.end_port or p.port)
            if isinstance(p.port, int)
            else PortMatch(p.protocol)
            for p in numeric
        }
        if owner is not None:
            for port in named:
                protocol, number = owner.named_ports.get(str(port.port), ("", 0))
                if protocol == port.protocol:
                    matches.add(PortMatch(protocol, number, number))
        if matches:
            yield Allow(tuple(sorted(cidrs)), tuple(sorted(excepts)), tuple(sorted(matches)))


def _peer_selects(
    peer: Peer, namespace: str, pod: PodFacts, namespaces: Mapping[str, Mapping[str, str]]
) -> bool:
    if peer.namespace_selector is None:
        if pod.namespace != namespace:
            return False
    elif not peer.namespace_selector.matches(namespaces.get(pod.namespace, {})):
        return False
    return peer.pod_selector is None or peer.pod_selector.matches(pod.labels)


def _hosts(pod: PodFacts, network: str) -> tuple[str, ...]:
    return tuple(str(ipaddress.ip_network(a)) for a in pod.addresses.get(network, ()))

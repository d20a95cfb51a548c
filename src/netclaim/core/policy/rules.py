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
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

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
        if over_budget:
            return cls(namespace, name, networks, None, over_budget, uid)
        try:
            spec = read_policy_spec(data.get("spec"), f"MultiNetworkPolicy {namespace}/{name}")
        except ConfigError as err:
            return cls(namespace, name, networks, None, str(err), uid)
        return cls(namespace, name, networks, spec, uid=uid)


def identity(data: Mapping[str, Any]) -> tuple[str, str, str, tuple[str, ...]]:
    """A policy's namespace, name, UID and the netclaim networks it is for, read without its spec."""
    meta = data.get("metadata")
    meta = meta if isinstance(meta, dict) else {}
    annotations = meta.get("annotations")
    annotations = annotations if isinstance(annotations, dict) else {}
    networks = netclaim_networks({str(k): str(v) for k, v in annotations.items()})
    return str(meta.get("namespace") or ""), str(meta.get("name") or ""), str(meta.get("uid") or ""), networks


def over_budget(policies: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """Namespace → why its policies together exceed NAMESPACE_BUDGET, for the namespaces that do: which
    budgets, not by how much (the words stay the same while a tenant adds more, so each policy is told
    once)."""
    used: dict[str, dict[str, int]] = defaultdict(lambda: dict.fromkeys(NAMESPACE_BUDGET, 0))
    for data in policies:
        spec = data.get("spec")
        spec = spec if isinstance(spec, dict) else {}
        counts = used[identity(data)[0]]
        for direction, peers in (("ingress", "from"), ("egress", "to")):
            rules = spec.get(direction)
            for rule in rules if isinstance(rules, list) else ():
                counts["rules"] += 1
                found = rule.get(peers) if isinstance(rule, dict) else None
                counts["peers"] += len(found) if isinstance(found, list) else 0
        try:
            counts["bytes"] += len(json.dumps(spec, separators=(",", ":")))
        except (RecursionError, ValueError, TypeError):  # deeper than any policy: past every budget
            counts["bytes"] += NAMESPACE_BUDGET["bytes"] + 1
    return {
        namespace: "the namespace's MultiNetworkPolicies together exceed its budget of "
        + " and ".join(f"{v:,} {k}" for k, v in NAMESPACE_BUDGET.items() if counts[k] > v)
        for namespace, counts in sorted(used.items())
        if any(counts[k] > v for k, v in NAMESPACE_BUDGET.items())
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
    policies: Iterable[PolicyObject], pods: list[PodFacts], namespaces: Mapping[str, Mapping[str, str]]
) -> dict[str, dict[str, NetworkRules]]:
    """Pod UID → network → its rules, for the pods some policy selects on a network they are on."""
    built: dict[tuple[str, str, str], _Building] = {}  # (pod uid, network, direction)
    peers = _Peers(pods, namespaces)
    for policy in policies:
        try:
            contributions = list(_policy_rules(policy, pods, peers))
        except Exception:  # one policy's, whatever it is: it isolates as one that cannot be read
            log.exception(
                "MultiNetworkPolicy not compiled (a bug): its pods isolated, allowing nothing",
                extra={"policy": f"{policy.namespace}/{policy.name}"},
            )
            unread = replace(policy, spec=None, problem="not compiled")
            contributions = list(_policy_rules(unread, pods, peers))
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


class _Peers:
    """The pods a peer selects, resolved once per (peer, namespace) however many rules and selected pods
    name it: without it a policy of 100 rules x 100 `namespaceSelector: {}` peers cost 10,000 passes over
    every pod for each pod it selects (40 CPU-seconds at 200 pods)."""

    def __init__(self, pods: list[PodFacts], namespaces: Mapping[str, Mapping[str, str]]) -> None:
        self.pods = pods
        self.namespaces = namespaces
        self._resolved: dict[tuple[str, str], list[PodFacts]] = {}
        self._hosts: dict[tuple[str, str], tuple[str, ...]] = {}
        self._keys: dict[int, str] = {}  # id(peer) → its JSON: the policies outlive the compile
        self._rules: dict[tuple[frozenset[str], str], list[PodFacts]] = {}

    def _key(self, peer: Peer) -> str:
        key = self._keys.get(id(peer))
        if key is None:
            key = self._keys[id(peer)] = peer.model_dump_json()
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
            found = self._resolved[key] = list(_peer_pods(peer, namespace, self.pods, self.namespaces))
        return found

    def hosts(self, pod: PodFacts, network: str) -> tuple[str, ...]:
        """The pod's addresses on `network` as host networks (/32, /128)."""
        found = self._hosts.get((pod.uid, network))
        if found is None:
            found = self._hosts[(pod.uid, network)] = _hosts(pod, network)
        return found


def _policy_rules(
    policy: PolicyObject, pods: list[PodFacts], peers: _Peers
) -> Iterable[tuple[str, str, str, set[Allow]]]:
    """(pod UID, network, direction, its allows) of each pod the policy selects on a network it is on."""
    for pod in pods:
        if pod.namespace != policy.namespace:
            continue
        if policy.spec is not None and not policy.spec.pod_selector.matches(pod.labels):
            continue
        for network in policy.networks:
            if network in pod.addresses:
                for direction, allows in _directions(policy, pod, network, pods, peers):
                    yield pod.uid, network, direction, allows


def _merged(allows: Iterable[Allow]) -> set[Allow]:
    """Allows that differ only in their addresses, as one: a rule with one set of every peer, not a rule per
    peer (one per pod would grow each table with the namespace)."""
    grouped: dict[tuple[tuple[str, ...], tuple[PortMatch, ...]], set[str]] = {}
    for allow in allows:
        grouped.setdefault((allow.excepts, allow.ports), set()).update(allow.cidrs)
    return {Allow(tuple(sorted(cidrs)), excepts, ports) for (excepts, ports), cidrs in grouped.items()}


def _directions(
    policy: PolicyObject,
    pod: PodFacts,
    network: str,
    pods: list[PodFacts],
    peers: _Peers,
) -> Iterable[tuple[str, set[Allow]]]:
    spec = policy.spec
    if spec is None:  # unreadable: isolated both ways, nothing allowed
        yield "ingress", set()
        yield "egress", set()
        return
    if spec.isolates_ingress:
        yield (
            "ingress",
            {a for rule in spec.ingress for a in _allows(rule, policy, pod, network, pods, peers)},
        )
    if spec.isolates_egress:
        yield (
            "egress",
            {a for rule in spec.egress for a in _allows(rule, policy, pod, network, pods, peers)},
        )


def _allows(
    rule: IngressRule | EgressRule,
    policy: PolicyObject,
    pod: PodFacts,
    network: str,
    pods: list[PodFacts],
    peers: _Peers,
) -> Iterable[Allow]:
    egress = isinstance(rule, EgressRule)
    numeric = tuple(p for p in rule.ports if not isinstance(p.port, str))
    named = tuple(p for p in rule.ports if isinstance(p.port, str))
    # (addresses, excepts, the pod they are, if one): the rule's peers
    targets: list[tuple[tuple[str, ...], tuple[str, ...], PodFacts | None]] = []
    if not rule.peers:
        targets.append((ANY, (), None))
        if egress and named:  # to anyone: a named port is that of each pod on the network
            targets += [(peers.hosts(o, network), (), o) for o in pods if o.addresses.get(network)]
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


def _peer_pods(
    peer: Peer, namespace: str, pods: list[PodFacts], namespaces: Mapping[str, Mapping[str, str]]
) -> Iterable[PodFacts]:
    for other in pods:
        if peer.namespace_selector is None:
            if other.namespace != namespace:
                continue
        elif not peer.namespace_selector.matches(namespaces.get(other.namespace, {})):
            continue
        if peer.pod_selector is None or peer.pod_selector.matches(other.labels):
            yield other


def _hosts(pod: PodFacts, network: str) -> tuple[str, ...]:
    return tuple(str(ipaddress.ip_network(a)) for a in pod.addresses.get(network, ()))

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
  allowing nothing: fail closed, never ignored.
"""

from __future__ import annotations

import ipaddress
import logging
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
    def from_api(cls, data: Mapping[str, Any]) -> PolicyObject:
        """The policy as the API has it: a tenant's free JSON, read field by field."""
        meta = data.get("metadata")
        meta = meta if isinstance(meta, dict) else {}
        namespace, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
        uid = str(meta.get("uid") or "")
        annotations = meta.get("annotations")
        annotations = annotations if isinstance(annotations, dict) else {}
        networks = netclaim_networks({str(k): str(v) for k, v in annotations.items()})
        try:
            spec = read_policy_spec(data.get("spec"), f"MultiNetworkPolicy {namespace}/{name}")
        except ConfigError as err:
            return cls(namespace, name, networks, None, str(err), uid)
        return cls(namespace, name, networks, spec, uid=uid)


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
    for policy in policies:
        try:
            contributions = list(_policy_rules(policy, pods, namespaces))
        except Exception:  # one policy's, whatever it is: it isolates as one that cannot be read
            log.exception(
                "MultiNetworkPolicy not compiled (a bug): its pods isolated, allowing nothing",
                extra={"policy": f"{policy.namespace}/{policy.name}"},
            )
            unread = replace(policy, spec=None, problem="not compiled")
            contributions = list(_policy_rules(unread, pods, namespaces))
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


def _policy_rules(
    policy: PolicyObject, pods: list[PodFacts], namespaces: Mapping[str, Mapping[str, str]]
) -> Iterable[tuple[str, str, str, set[Allow]]]:
    """(pod UID, network, direction, its allows) of each pod the policy selects on a network it is on."""
    for pod in pods:
        if pod.namespace != policy.namespace:
            continue
        if policy.spec is not None and not policy.spec.pod_selector.matches(pod.labels):
            continue
        for network in policy.networks:
            if network in pod.addresses:
                for direction, allows in _directions(policy, pod, network, pods, namespaces):
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
    namespaces: Mapping[str, Mapping[str, str]],
) -> Iterable[tuple[str, set[Allow]]]:
    spec = policy.spec
    if spec is None:  # unreadable: isolated both ways, nothing allowed
        yield "ingress", set()
        yield "egress", set()
        return
    if spec.isolates_ingress:
        yield (
            "ingress",
            {a for rule in spec.ingress for a in _allows(rule, policy, pod, network, pods, namespaces)},
        )
    if spec.isolates_egress:
        yield (
            "egress",
            {a for rule in spec.egress for a in _allows(rule, policy, pod, network, pods, namespaces)},
        )


def _allows(
    rule: IngressRule | EgressRule,
    policy: PolicyObject,
    pod: PodFacts,
    network: str,
    pods: list[PodFacts],
    namespaces: Mapping[str, Mapping[str, str]],
) -> Iterable[Allow]:
    egress = isinstance(rule, EgressRule)
    numeric = tuple(p for p in rule.ports if not isinstance(p.port, str))
    named = tuple(p for p in rule.ports if isinstance(p.port, str))
    # (addresses, excepts, the pod they are, if one): the rule's peers
    targets: list[tuple[tuple[str, ...], tuple[str, ...], PodFacts | None]] = []
    if not rule.peers:
        targets.append((ANY, (), None))
        if egress and named:  # to anyone: a named port is that of each pod on the network
            targets += [(_hosts(o, network), (), o) for o in pods if o.addresses.get(network)]
    for peer in rule.peers:
        if peer.ip_block is not None:
            targets.append(((peer.ip_block.cidr,), peer.ip_block.except_, None))
        else:
            targets += [
                (_hosts(o, network), (), o) for o in _peer_pods(peer, policy.namespace, pods, namespaces)
            ]
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

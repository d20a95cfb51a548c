"""MultiNetworkPolicy (k8s.cni.cncf.io/v1beta1, the CRD multi-networkpolicy defines) as netclaim reads it:
the shape of a NetworkPolicy, for the interfaces of the networks its annotation names.

    apiVersion: k8s.cni.cncf.io/v1beta1
    kind: MultiNetworkPolicy
    metadata:
      name: db-ingress
      annotations:
        k8s.v1.cni.cncf.io/policy-for: netclaim.dev/lan3     # netclaim networks: netclaim.dev/<network>
    spec:
      podSelector: {matchLabels: {app: db}}
      policyTypes: [Ingress]
      ingress:
      - from: [{podSelector: {matchLabels: {role: client}}}]
        ports: [{protocol: TCP, port: 5432}]

A network is named `netclaim.dev/<network>`, where <network> is the NIC's `netclaim.dev/network` attribute.
multi-networkpolicy reads a name with a slash as `<namespace>/<NetworkAttachmentDefinition>`; no namespace
has a dot in its name, so no Multus network is ever named so, and both can serve one cluster. Names of
other forms are Multus's: netclaim leaves them alone.

Every field is read as NetworkPolicy defines it; a policy is a tenant's, so its shape is checked here
(the CRD's schema may be an older or looser one) and a policy that cannot be read is never ignored: it
isolates every pod of its namespace on its networks, allowing nothing (docs/services.md).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from typing import Annotated, Any, Literal

import msgspec

from netclaim.core.config import strict
from netclaim.core.names import DRIVER_DOMAIN, NETWORK_NAME

POLICY_FOR = "k8s.v1.cni.cncf.io/policy-for"
NETWORK_PREFIX = f"{DRIVER_DOMAIN}/"
# What one policy may hold: each rule is nftables rules in every pod it selects, and the whole policy is
# compiled on every change of its namespace. Past any bound the policy is refused (its namespace's pods on
# its networks isolated, allowing nothing), never truncated.
MAX_RULES = 100  # per direction
MAX_PEERS = 100  # per rule
MAX_PORTS = 100  # per rule
MAX_EXCEPTS = 100  # per ipBlock
MAX_LABELS = 32  # matchLabels entries, and matchExpressions, per selector
MAX_VALUES = 64  # per matchExpression
# A label's key: an optional DNS-subdomain prefix (<= 253) and a name (<= 63); a value: <= 63, possibly
# empty (Kubernetes' own rules, so a selector can only name labels the API server lets a pod carry)
LABEL_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")
LABEL_PREFIX = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
# IANA_SVC_NAME, a container port's name: 1-15 of a-z 0-9 -, at least one letter, no '-' at either end
# nor two together
PORT_NAME = re.compile(r"(?=.*[a-z])[a-z0-9]([a-z0-9]|-(?!-))*(?<!-)")


def _label_key(key: str) -> str:
    prefix, slash, name = key.rpartition("/")
    if not LABEL_NAME.fullmatch(name) or (
        slash and (not prefix or len(prefix) > 253 or not LABEL_PREFIX.fullmatch(prefix))
    ):
        raise ValueError(f"{key!r} is not a label key (an optional DNS prefix and '/', then a name of 1-63)")
    return key


def _label_value(value: str) -> str:
    if value and not LABEL_NAME.fullmatch(value):
        raise ValueError(f"{value!r} is not a label value (0-63 of A-Z a-z 0-9 - _ ., alphanumeric ends)")
    return value


def network_of(text: str) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
    """A CIDR as NetworkPolicy's ipBlock takes it, normalized: host bits cleared (10.1.2.3/16 is
    10.1.0.0/16, as every NetworkPolicy implementation reads it). Refused: no prefix length, a zone
    (`fe80::1%eth0`), an IPv4-mapped IPv6 network (`::ffff:10.0.0.0/104`: IPv4 traffic is never
    matched as IPv6, so such a rule would silently allow or except nothing), anything but the plain
    text form."""
    if not isinstance(text, str) or "/" not in text or "%" in text or text.strip() != text:
        raise ValueError(f"{text!r} is not a CIDR (like 10.0.0.0/8 or fd00::/64)")
    try:
        network = ipaddress.ip_network(text, strict=False)
    except ValueError as err:
        raise ValueError(f"{text!r} is not a CIDR: {err}") from None
    if isinstance(network, ipaddress.IPv6Network) and network.network_address.ipv4_mapped is not None:
        raise ValueError(f"{text!r} is an IPv4 network written as IPv6: write it as IPv4")
    return network


class Requirement(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    key: str
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"]
    values: Annotated[tuple[str, ...], msgspec.Meta(max_length=MAX_VALUES)] = ()

    def __post_init__(self) -> None:
        strict.named("key", _label_key, self.key)
        for index, value in enumerate(self.values):
            strict.named(f"values[{index}]", _label_value, value)
        if self.operator in ("In", "NotIn") and not self.values:
            raise ValueError(f"values: operator {self.operator} needs values")
        if self.operator in ("Exists", "DoesNotExist") and self.values:
            raise ValueError(f"values: operator {self.operator} takes no values")


def terms_match(
    match_labels: Mapping[str, str], match_expressions: tuple[Requirement, ...], labels: Mapping[str, str]
) -> bool:
    """Whether `labels` meet every term of a label selector (none: they do)."""
    return all(labels.get(k) == v for k, v in match_labels.items()) and all(
        _holds(r, labels) for r in match_expressions
    )


def check_labels(field: str, labels: Mapping[str, str]) -> None:
    """Each key and value as Kubernetes takes a label's (a ValueError naming `field` and the entry)."""
    for key, value in labels.items():
        strict.named(field, _label_key, key)
        strict.named(f"{field}{strict.step(key)}", _label_value, value)


class LabelSelector(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """metav1.LabelSelector: its terms ANDed; an empty one selects everything."""

    match_labels: Annotated[dict[str, str], msgspec.Meta(max_length=MAX_LABELS)] = msgspec.field(
        default_factory=dict, name="matchLabels"
    )
    match_expressions: Annotated[tuple[Requirement, ...], msgspec.Meta(max_length=MAX_LABELS)] = (
        msgspec.field(default=(), name="matchExpressions")
    )

    def __post_init__(self) -> None:
        check_labels("matchLabels", self.match_labels)

    def matches(self, labels: Mapping[str, str]) -> bool:
        return terms_match(self.match_labels, self.match_expressions, labels)


_TERM = re.compile(
    r"\s*(?P<not>!)?\s*(?P<key>[^\s!=,()]+)\s*"
    r"(?:(?P<op>==|=|!=)\s*(?P<value>[^\s,()]*)|(?<=\s)(?P<set>in|notin)\s*\((?P<values>[^)]*)\))?\s*"
)


def parse_selector(text: str) -> LabelSelector:
    """A label selector as kubectl and the API take it in text (`app=db,tier in (a,b),!canary`), read
    here as the API server reads it, so that the controller selects from memory what a list would.
    ValueError names what cannot be read. A tenant's text: read in one pass, at most 2 x MAX_LABELS terms,
    and quoted back in part only."""
    labels: dict[str, str] = {}
    requirements: list[dict[str, Any]] = []
    shown = repr(text[:80] + ("..." if len(text) > 80 else ""))
    text = text.strip()
    at = 0
    while at < len(text):
        if len(labels) + len(requirements) >= 2 * MAX_LABELS:
            raise ValueError(f"selector {shown}: more than {2 * MAX_LABELS} terms")
        match = _TERM.match(text, at)
        if match is None or match.end() == at:
            raise ValueError(f"selector {shown}: cannot read {text[at : at + 40]!r}")
        key, op, value = match["key"], match["op"], match["value"]
        if match["not"]:
            if op or match["set"]:
                raise ValueError(f"selector {shown}: '!{key[:63]}' takes no value")
            requirements.append({"key": key, "operator": "DoesNotExist"})
        elif op in ("=", "=="):
            labels[key] = value or ""
        elif op == "!=":
            requirements.append({"key": key, "operator": "NotIn", "values": [value or ""]})
        elif match["set"]:
            values = [v.strip() for v in match["values"].split(",") if v.strip()]
            operator = "In" if match["set"] == "in" else "NotIn"
            requirements.append({"key": key, "operator": operator, "values": values})
        else:
            requirements.append({"key": key, "operator": "Exists"})
        at = match.end()
        if at < len(text) and text[at] != ",":
            raise ValueError(f"selector {shown}: expected ',' before {text[at : at + 40]!r}")
        at += 1
    try:
        return strict.read(LabelSelector, {"matchLabels": labels, "matchExpressions": requirements})
    except strict.Invalid as err:
        raise ValueError(f"selector {shown}: {str(err)[:200]}") from None


def _holds(requirement: Requirement, labels: Mapping[str, str]) -> bool:
    if requirement.operator == "In":
        return labels.get(requirement.key) in requirement.values
    if requirement.operator == "NotIn":
        return labels.get(requirement.key) not in requirement.values
    if requirement.operator == "Exists":
        return requirement.key in labels
    return requirement.key not in labels


class IPBlock(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    cidr: str
    except_: Annotated[tuple[str, ...], msgspec.Meta(max_length=MAX_EXCEPTS)] = msgspec.field(
        default=(), name="except"
    )

    def __post_init__(self) -> None:
        network = strict.named("cidr", network_of, self.cidr)
        inners = [strict.named(f"except[{i}]", network_of, text) for i, text in enumerate(self.except_)]
        msgspec.structs.force_setattr(self, "cidr", str(network))
        msgspec.structs.force_setattr(self, "except_", tuple(str(inner) for inner in inners))
        for index, inner in enumerate(inners):
            if inner.version != network.version or not inner.subnet_of(network):  # type: ignore[arg-type]
                raise ValueError(f"except[{index}]: {str(inner)!r} is not inside cidr {network}")


class Peer(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    pod_selector: LabelSelector | None = msgspec.field(default=None, name="podSelector")
    namespace_selector: LabelSelector | None = msgspec.field(default=None, name="namespaceSelector")
    ip_block: IPBlock | None = msgspec.field(default=None, name="ipBlock")

    def __post_init__(self) -> None:
        selectors = (self.pod_selector, self.namespace_selector)
        if self.ip_block is not None and selectors != (None, None):
            raise ValueError("ipBlock: cannot be combined with podSelector or namespaceSelector")
        if self.ip_block is None and selectors == (None, None):
            raise ValueError("a peer needs podSelector, namespaceSelector or ipBlock")


class Port(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    protocol: Literal["TCP", "UDP", "SCTP"] = "TCP"
    port: int | str | None = None
    end_port: int | None = msgspec.field(default=None, name="endPort")

    def __post_init__(self) -> None:
        if isinstance(self.port, int) and not 1 <= self.port <= 65535:
            raise ValueError(f"port: {self.port} is not 1-65535")
        if isinstance(self.port, str) and (len(self.port) > 15 or not PORT_NAME.fullmatch(self.port)):
            raise ValueError(
                f"port: {self.port!r} is neither a number nor a container port's name (1-15 of a-z 0-9 -, "
                "with a letter)"
            )
        if self.end_port is not None:
            if not isinstance(self.port, int):
                raise ValueError("endPort: needs a numeric port")
            if not self.port <= self.end_port <= 65535:
                raise ValueError(f"endPort: {self.end_port} is not between port {self.port} and 65535")


class IngressRule(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    ports: Annotated[tuple[Port, ...], msgspec.Meta(max_length=MAX_PORTS)] = ()
    peers: Annotated[tuple[Peer, ...], msgspec.Meta(max_length=MAX_PEERS)] = msgspec.field(
        default=(), name="from"
    )


class EgressRule(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    ports: Annotated[tuple[Port, ...], msgspec.Meta(max_length=MAX_PORTS)] = ()
    peers: Annotated[tuple[Peer, ...], msgspec.Meta(max_length=MAX_PEERS)] = msgspec.field(
        default=(), name="to"
    )


class PolicySpec(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    pod_selector: LabelSelector = msgspec.field(name="podSelector")
    policy_types: tuple[Literal["Ingress", "Egress"], ...] = msgspec.field(default=(), name="policyTypes")
    ingress: Annotated[tuple[IngressRule, ...], msgspec.Meta(max_length=MAX_RULES)] = ()
    egress: Annotated[tuple[EgressRule, ...], msgspec.Meta(max_length=MAX_RULES)] = ()

    @property
    def isolates_ingress(self) -> bool:
        """NetworkPolicy's rule: Ingress unless policyTypes says otherwise."""
        return "Ingress" in self.policy_types or not self.policy_types

    @property
    def isolates_egress(self) -> bool:
        return "Egress" in self.policy_types or (not self.policy_types and bool(self.egress))


def netclaim_networks(annotations: Mapping[str, str]) -> tuple[str, ...]:
    """The netclaim networks the policy-for annotation names (spaces ignored, as multi-networkpolicy does);
    other names are Multus's. A name after `netclaim.dev/` that no network can have is kept as it is
    written: the policy still names netclaim, and unknown_networks says why it selects nothing there."""
    names = annotations.get(POLICY_FOR, "").replace(" ", "").split(",")
    return tuple(
        sorted({n.removeprefix(NETWORK_PREFIX) for n in names if n.startswith(NETWORK_PREFIX)} - {""})
    )


def malformed_networks(networks: tuple[str, ...]) -> tuple[str, ...]:
    """The names of `networks` that no NIC's `netclaim.dev/network` attribute can hold."""
    return tuple(n for n in networks if not NETWORK_NAME.fullmatch(n))


def read_policy_spec(spec: Any, where: str) -> PolicySpec:
    """The spec, or a ConfigError naming the field that cannot be read (`where` names the policy)."""
    return strict.decode(PolicySpec, spec, where, "spec")

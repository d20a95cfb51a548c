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
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from netclaim.errors import ConfigError, format_validation_error
from netclaim.names import DRIVER_DOMAIN

POLICY_FOR = "k8s.v1.cni.cncf.io/policy-for"
NETWORK_PREFIX = f"{DRIVER_DOMAIN}/"
MAX_RULES = 100  # per direction: a policy past it is refused (each rule is nftables rules in every pod)
MAX_PEERS = 100  # per rule
MAX_PORTS = 100  # per rule


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class Requirement(_Strict):
    key: str
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"]
    values: tuple[str, ...] = ()

    @model_validator(mode="after")
    def _values_as_the_operator_needs(self) -> Requirement:
        if self.operator in ("In", "NotIn") and not self.values:
            raise ValueError(f"operator {self.operator} needs values")
        if self.operator in ("Exists", "DoesNotExist") and self.values:
            raise ValueError(f"operator {self.operator} takes no values")
        return self


class LabelSelector(_Strict):
    """metav1.LabelSelector: its terms ANDed; an empty one selects everything."""

    match_labels: dict[str, str] = Field(default_factory=dict, alias="matchLabels")
    match_expressions: tuple[Requirement, ...] = Field(default=(), alias="matchExpressions")

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(labels.get(k) == v for k, v in self.match_labels.items()) and all(
            _holds(r, labels) for r in self.match_expressions
        )


def _holds(requirement: Requirement, labels: Mapping[str, str]) -> bool:
    if requirement.operator == "In":
        return labels.get(requirement.key) in requirement.values
    if requirement.operator == "NotIn":
        return labels.get(requirement.key) not in requirement.values
    if requirement.operator == "Exists":
        return requirement.key in labels
    return requirement.key not in labels


class IPBlock(_Strict):
    cidr: str
    except_: tuple[str, ...] = Field(default=(), alias="except")

    @field_validator("cidr")
    @classmethod
    def _a_network(cls, value: str) -> str:
        return str(ipaddress.ip_network(value, strict=False))

    @model_validator(mode="after")
    def _excepts_inside(self) -> IPBlock:
        network = ipaddress.ip_network(self.cidr)
        for text in self.except_:
            inner = ipaddress.ip_network(text, strict=False)
            if inner.version != network.version or not inner.subnet_of(network):  # type: ignore[arg-type]
                raise ValueError(f"except {text!r} is not inside cidr {self.cidr}")
        return self


class Peer(_Strict):
    pod_selector: LabelSelector | None = Field(default=None, alias="podSelector")
    namespace_selector: LabelSelector | None = Field(default=None, alias="namespaceSelector")
    ip_block: IPBlock | None = Field(default=None, alias="ipBlock")

    @model_validator(mode="after")
    def _one_kind(self) -> Peer:
        if self.ip_block is not None and (self.pod_selector or self.namespace_selector):
            raise ValueError("ipBlock cannot be combined with podSelector or namespaceSelector")
        if self.ip_block is None and self.pod_selector is None and self.namespace_selector is None:
            raise ValueError("a peer needs podSelector, namespaceSelector or ipBlock")
        return self


class Port(_Strict):
    protocol: Literal["TCP", "UDP", "SCTP"] = "TCP"
    port: int | str | None = None
    end_port: int | None = Field(default=None, alias="endPort")

    @model_validator(mode="after")
    def _a_port_or_range(self) -> Port:
        if isinstance(self.port, int) and not 1 <= self.port <= 65535:
            raise ValueError(f"port {self.port} is not 1-65535")
        if isinstance(self.port, str) and not self.port:
            raise ValueError("port: an empty name")
        if self.end_port is not None:
            if not isinstance(self.port, int):
                raise ValueError("endPort needs a numeric port")
            if not self.port <= self.end_port <= 65535:
                raise ValueError(f"endPort {self.end_port} is not between port {self.port} and 65535")
        return self


class IngressRule(_Strict):
    ports: tuple[Port, ...] = Field(default=(), max_length=MAX_PORTS)
    peers: tuple[Peer, ...] = Field(default=(), alias="from", max_length=MAX_PEERS)


class EgressRule(_Strict):
    ports: tuple[Port, ...] = Field(default=(), max_length=MAX_PORTS)
    peers: tuple[Peer, ...] = Field(default=(), alias="to", max_length=MAX_PEERS)


class PolicySpec(_Strict):
    pod_selector: LabelSelector = Field(alias="podSelector")
    policy_types: tuple[Literal["Ingress", "Egress"], ...] = Field(default=(), alias="policyTypes")
    ingress: tuple[IngressRule, ...] = Field(default=(), max_length=MAX_RULES)
    egress: tuple[EgressRule, ...] = Field(default=(), max_length=MAX_RULES)

    @property
    def isolates_ingress(self) -> bool:
        """NetworkPolicy's rule: Ingress unless policyTypes says otherwise."""
        return "Ingress" in self.policy_types or not self.policy_types

    @property
    def isolates_egress(self) -> bool:
        return "Egress" in self.policy_types or (not self.policy_types and bool(self.egress))


def netclaim_networks(annotations: Mapping[str, str]) -> tuple[str, ...]:
    """The netclaim networks the policy-for annotation names (spaces ignored, as multi-networkpolicy does);
    other names are Multus's."""
    names = annotations.get(POLICY_FOR, "").replace(" ", "").split(",")
    return tuple(
        sorted({n.removeprefix(NETWORK_PREFIX) for n in names if n.startswith(NETWORK_PREFIX)} - {""})
    )


def read_policy_spec(spec: Any, where: str) -> PolicySpec:
    """The spec, or a ConfigError naming each field that cannot be read (`where` names the policy)."""
    try:
        return PolicySpec.model_validate(spec)
    except ValidationError as err:
        raise ConfigError(format_validation_error(where, err, "spec")) from None

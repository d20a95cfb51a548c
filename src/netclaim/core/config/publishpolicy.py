"""The admin's publish policy: which interfaces become DRA devices, shared or exclusive, with what capacity.

    apiVersion: netclaim.dev/v1alpha1
    kind: PublishPolicy
    rules:                      # ordered; the first rule that matches an interface decides
    - match: {names: ["enp*"], cel: 'device.attributes["netclaim.dev"].speed >= 10000'}
      mode: shared            # shared | exclusive | ignore
      bandwidth: {total: 10Gi, default: 100Mi, min: 1Mi, step: 1Mi}
      attachments: 32           # pods on the NIC at once
      attachmentsPerClaim: 1    # of them, one claim's at most
      childType: macvlan        # macvlan | ipvlan: how pods share the NIC (one kind per NIC)
      ipvlanMode: l2            # every ipvlan's mode on the NIC (the kernel keeps one per NIC)
      tenantRanges: [10.70.0.0/16]   # where a claim's own host-local/static IPAM may take addresses
      portSecurity: true        # a pod sends on its share only from its own MAC and addresses (default)
      acceptRouterAdvertisements: false  # pods configure IPv6 from the network's routers (default: no)
      attributes: {netclaim.dev/network: storage}

An interface no rule matches is not published. Loopback, default-route uplinks, bridge ports and the
primary pod network's interfaces are never published, whatever the rules say. What the attribute names
and CEL expressions may refer to is checked when the policy is loaded (netclaim.core.devices.rules).
"""

from __future__ import annotations

import ipaddress
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

from netclaim.core.names import QUALIFIED_NAME, pattern
from netclaim.core.quantity import parse_quantity
from netclaim.errors import ConfigError

AttributeValue = bool | int | str


def _quantity(value: str | None) -> str | None:
    if value is not None:
        try:
            if parse_quantity(value) < 0:
                raise ValueError("must not be negative")
        except ConfigError as err:
            raise ValueError(str(err)) from err
    return value


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Bandwidth(_Strict):
    """Bandwidth as consumable capacity (bits per second, Kubernetes quantities)."""

    total: str | None = Field(default=None, description="default: the link speed")
    default: str = Field(default="100Mi", description="consumed by a claim that asks for no bandwidth")
    min: str = "1Mi"
    step: str = "1Mi"

    _check = field_validator("total", "default", "min", "step")(_quantity)

    @model_validator(mode="after")
    def _consistent(self) -> Bandwidth:
        if parse_quantity(self.step) <= 0:
            raise ValueError("step: must be positive")
        if parse_quantity(self.default) < parse_quantity(self.min):
            raise ValueError("default: must not be below min")
        return self


class Match(_Strict):
    names: list[str] = Field(default=[], description="globs on the interface name; empty matches any")
    attributes: dict[str, AttributeValue] = Field(
        default={}, description="equality on netclaim.dev attributes"
    )
    cel: str | None = Field(default=None, description="CEL over `device` as in DeviceClass selectors")


QualifiedName = Annotated[str, Field(pattern=pattern(QUALIFIED_NAME))]


def _cidr(value: str) -> str:
    try:
        ipaddress.ip_network(value, strict=True)
    except ValueError as err:
        raise ValueError(f"{value!r} is not a network in CIDR form (like 10.70.0.0/16): {err}") from None
    return value


Cidr = Annotated[str, AfterValidator(_cidr)]


class Rule(_Strict):
    match: Match = Match()
    mode: Literal["shared", "exclusive", "ignore"] = "shared"
    bandwidth: Bandwidth = Bandwidth()
    attachments: int = Field(
        default=32, ge=1, le=4096, description="attachments a shared NIC carries at most"
    )
    attachmentsPerClaim: int = Field(
        default=1, ge=1, le=4096, description="attachments one claim may take of a shared NIC at most"
    )
    childType: Literal["macvlan", "ipvlan"] = Field(
        default="macvlan", description="how pods share the NIC: one kind per NIC, the kernel mixes none"
    )
    ipvlanMode: Literal["l2", "l3", "l3s"] = Field(
        default="l2", description="the mode of every ipvlan on the NIC (the kernel keeps one per NIC)"
    )
    tenantRanges: list[Cidr] = Field(
        default=[], max_length=64, description="where a claim's own host-local/static IPAM may take addresses"
    )
    attributes: dict[QualifiedName, AttributeValue] = Field(default={}, description="extra device attributes")
    portSecurity: bool = Field(
        default=True,
        description="a shared NIC's macvlan children send only from their own MAC and addresses (checked "
        "on the node, where a pod cannot reach; docs/security.md). Off only where other software's children "
        "share the NIC: then a pod with NET_RAW or NET_ADMIN can send as another",
    )
    acceptRouterAdvertisements: bool = Field(
        default=False,
        description="pods take addresses and routes from the network's IPv6 router advertisements (a pod's "
        "own are never passed on a NIC with port security)",
    )
    linkDown: Literal["NoSchedule", "NoExecute"] = Field(
        default="NoSchedule",
        description="the effect of the taint a NIC's device gets while its link is down: NoSchedule keeps "
        "new claims off it, NoExecute also evicts the pods using it",
    )

    @model_validator(mode="after")
    def _per_claim(self) -> Rule:
        if self.attachmentsPerClaim > self.attachments:
            raise ValueError("attachmentsPerClaim: must not be above attachments")
        return self


class PublishPolicy(_Strict):
    apiVersion: Literal["netclaim.dev/v1alpha1"]
    kind: Literal["PublishPolicy"]
    rules: list[Rule]


# Without a policy file, or with no rules: nothing is published. An agent installed on a real cluster offers
# no NIC to tenants until the admin names the ones to offer (docs/policy.md).
NO_POLICY = PublishPolicy(apiVersion="netclaim.dev/v1alpha1", kind="PublishPolicy", rules=[])

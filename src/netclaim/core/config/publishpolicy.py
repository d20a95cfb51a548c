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

import msgspec

from netclaim.core.names import QUALIFIED_NAME, pattern
from netclaim.core.quantity import parse_quantity
from netclaim.errors import ConfigError

AttributeValue = bool | int | str


class Bandwidth(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Bandwidth as consumable capacity (bits per second, Kubernetes quantities)."""

    total: Annotated[str | None, msgspec.Meta(description="default: the link speed")] = None
    default: Annotated[str, msgspec.Meta(description="consumed by a claim that asks for no bandwidth")] = (
        "100Mi"
    )
    min: str = "1Mi"
    step: str = "1Mi"

    def __post_init__(self) -> None:
        for name in ("total", "default", "min", "step"):
            value = getattr(self, name)
            try:
                negative = value is not None and parse_quantity(value) < 0
            except ConfigError as err:
                raise ValueError(f"{name}: {err}") from None
            if negative:
                raise ValueError(f"{name}: must not be negative")
        if parse_quantity(self.step) <= 0:
            raise ValueError("step: must be positive")
        if parse_quantity(self.default) < parse_quantity(self.min):
            raise ValueError("default: must not be below min")


class Match(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    names: Annotated[
        list[str], msgspec.Meta(description="globs on the interface name; empty matches any")
    ] = []
    attributes: Annotated[
        dict[str, AttributeValue], msgspec.Meta(description="equality on netclaim.dev attributes")
    ] = {}
    cel: Annotated[str | None, msgspec.Meta(description="CEL over `device` as in DeviceClass selectors")] = (
        None
    )


QualifiedName = Annotated[str, msgspec.Meta(pattern=pattern(QUALIFIED_NAME))]


class Rule(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    match: Match = msgspec.field(default_factory=Match)
    mode: Literal["shared", "exclusive", "ignore"] = "shared"
    bandwidth: Bandwidth = msgspec.field(default_factory=Bandwidth)
    attachments: Annotated[
        int, msgspec.Meta(ge=1, le=4096, description="attachments a shared NIC carries at most")
    ] = 32
    attachmentsPerClaim: Annotated[
        int, msgspec.Meta(ge=1, le=4096, description="attachments one claim may take of a shared NIC at most")
    ] = 1
    childType: Annotated[
        Literal["macvlan", "ipvlan"],
        msgspec.Meta(description="how pods share the NIC: one kind per NIC, the kernel mixes none"),
    ] = "macvlan"
    ipvlanMode: Annotated[
        Literal["l2", "l3", "l3s"],
        msgspec.Meta(description="the mode of every ipvlan on the NIC (the kernel keeps one per NIC)"),
    ] = "l2"
    tenantRanges: Annotated[
        list[str],
        msgspec.Meta(
            max_length=64,
            description="where a claim's own host-local/static IPAM may take addresses",
        ),
    ] = []
    attributes: Annotated[
        dict[QualifiedName, AttributeValue], msgspec.Meta(description="extra device attributes")
    ] = {}
    portSecurity: Annotated[
        bool,
        msgspec.Meta(
            description="a shared NIC's macvlan children send only from their own MAC and addresses (checked "
            "on the node, where a pod cannot reach; docs/security.md). Off only where other software's "
            "children share the NIC: then a pod with NET_RAW or NET_ADMIN can send as another"
        ),
    ] = True
    acceptRouterAdvertisements: Annotated[
        bool,
        msgspec.Meta(
            description="pods take addresses and routes from the network's IPv6 router advertisements (a "
            "pod's own are never passed on a NIC with port security)"
        ),
    ] = False
    linkDown: Annotated[
        Literal["NoSchedule", "NoExecute"],
        msgspec.Meta(
            description="the effect of the taint a NIC's device gets while its link is down: NoSchedule "
            "keeps new claims off it, NoExecute also evicts the pods using it"
        ),
    ] = "NoSchedule"

    def __post_init__(self) -> None:
        for index, network in enumerate(self.tenantRanges):
            try:
                ipaddress.ip_network(network, strict=True)
            except ValueError as err:
                raise ValueError(
                    f"tenantRanges[{index}]: {network!r} is not a network in CIDR form (like 10.70.0.0/16): "
                    f"{err}"
                ) from None
        if self.attachmentsPerClaim > self.attachments:
            raise ValueError("attachmentsPerClaim: must not be above attachments")


class PublishPolicy(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    apiVersion: Literal["netclaim.dev/v1alpha1"]
    kind: Literal["PublishPolicy"]
    rules: list[Rule]


# Without a policy file, or with no rules: nothing is published. An agent installed on a real cluster offers
# no NIC to tenants until the admin names the ones to offer (docs/policy.md).
NO_POLICY = PublishPolicy(apiVersion="netclaim.dev/v1alpha1", kind="PublishPolicy", rules=[])

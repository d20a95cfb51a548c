"""The admin's publish policy: which interfaces become DRA devices, shared or exclusive, with what capacity.

    apiVersion: netclaim.dev/v1alpha1
    kind: PublishPolicy
    rules:                      # ordered; the first rule that matches an interface decides
    - match: {names: ["enp*"], cel: 'device.attributes["netclaim.dev"].speed >= 10000'}
      mode: shared            # shared | exclusive | ignore
      bandwidth: {total: 10Gi, default: 100Mi, min: 1Mi, step: 1Mi}
      attachments: 32
      attributes: {netclaim.dev/network: storage}

An interface no rule matches is not published. Loopback, default-route uplinks, bridge ports and the
primary pod network's interfaces are never published, whatever the rules say.
"""

from __future__ import annotations

import fnmatch
import functools
import re
from pathlib import Path
from typing import Annotated, Any, Literal

import cel
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from netclaim.errors import ConfigError
from netclaim.files import load_yaml_model
from netclaim.quantity import parse_quantity

DRIVER_DOMAIN = "netclaim.dev"
STANDARD_DOMAIN = "resource.kubernetes.io"
_QUALIFIED = re.compile(
    r"^(([a-z0-9]([-a-z0-9]*[a-z0-9])?)(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z_][A-Za-z0-9_]{0,31}$"
)

AttributeValue = bool | int | str

# One device with every standard attribute, to type-check CEL expressions when the policy is loaded.
SAMPLE_ATTRIBUTES: dict[str, dict[str, AttributeValue]] = {
    DRIVER_DOMAIN: {
        "ifName": "enp0s10",
        "mac": "02:00:00:00:00:01",
        "mtu": 1500,
        "state": "up",
        "kind": "physical",
        "virtual": False,
        "speed": 10000,
        "driver": "ice",
        "pciAddress": "0000:5e:00.0",
        "pciVendor": "0x8086",
        "pciDevice": "0x159b",
        "numaNode": 0,
        "sriov": True,
        "sriovTotalVfs": 64,
        "sriovNumVfs": 0,
        "isSriovVf": False,
        "sriovPF": "0000:5e:00.0",
        "ipv4": "192.0.2.10/24",
        "ipv6": "2001:db8::10/64",
        "shared": True,
    },
    STANDARD_DOMAIN: {"pcieRoot": "pci0000:5d", "pciBusID": "0000:5e:00.0"},
}


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

    @field_validator("attributes")
    @classmethod
    def _known(cls, value: dict[str, AttributeValue]) -> dict[str, AttributeValue]:
        unknown = sorted(set(value) - set(SAMPLE_ATTRIBUTES[DRIVER_DOMAIN]))
        if unknown:
            raise ValueError(
                f"unknown attributes {unknown}; known: {sorted(SAMPLE_ATTRIBUTES[DRIVER_DOMAIN])}"
            )
        return value

    @field_validator("cel")
    @classmethod
    def _compiles(cls, expression: str | None) -> str | None:
        if expression is not None:
            check_cel(expression)
        return expression


QualifiedName = Annotated[str, Field(pattern=_QUALIFIED.pattern)]


class Rule(_Strict):
    match: Match = Match()
    mode: Literal["shared", "exclusive", "ignore"] = "shared"
    bandwidth: Bandwidth = Bandwidth()
    attachments: int = Field(
        default=32, ge=1, le=4096, description="attachments a shared NIC carries at most"
    )
    attributes: dict[QualifiedName, AttributeValue] = Field(default={}, description="extra device attributes")

    @field_validator("attributes")
    @classmethod
    def _not_standard(cls, value: dict[str, AttributeValue]) -> dict[str, AttributeValue]:
        for key in value:
            domain, _, name = key.rpartition("/")
            if domain in ("", DRIVER_DOMAIN) and (
                name in SAMPLE_ATTRIBUTES[DRIVER_DOMAIN] or name == "shared"
            ):
                raise ValueError(f"{key}: is a standard attribute netclaim sets itself")
            if domain == STANDARD_DOMAIN:
                raise ValueError(f"{key}: the resource.kubernetes.io domain is Kubernetes' own")
        return value


class PublishPolicy(_Strict):
    apiVersion: Literal["netclaim.dev/v1alpha1"]
    kind: Literal["PublishPolicy"]
    rules: list[Rule]


# Without a policy file: physical NICs, shared, bandwidth from their link speed.
DEFAULT_POLICY = PublishPolicy(
    apiVersion="netclaim.dev/v1alpha1",
    kind="PublishPolicy",
    rules=[Rule(match=Match(attributes={"virtual": False}), mode="shared")],
)


def _context(attributes: dict[str, dict[str, AttributeValue]], driver: str) -> dict[str, Any]:
    return {"device": {"driver": driver, "attributes": attributes}}


def check_cel(expression: str) -> None:
    """Syntax, names and types of a policy CEL expression, checked against a complete sample device."""
    try:
        program = _program(expression)
        result = program.execute(cel.Context(_context(SAMPLE_ATTRIBUTES, DRIVER_DOMAIN)))
    except ValueError as err:
        raise ValueError(f"invalid CEL: {str(err).splitlines()[0]}") from err
    except KeyError as err:
        raise ValueError(
            f"invalid CEL: no attribute {err}; netclaim.dev attributes are "
            f"{sorted(SAMPLE_ATTRIBUTES[DRIVER_DOMAIN])}"
        ) from err
    except (RuntimeError, TypeError) as err:
        raise ValueError(f"invalid CEL: {err}") from err
    if not isinstance(result, bool):
        # pydantic turns a ValueError (not a TypeError) into a field error with its path
        raise ValueError(f"invalid CEL: must evaluate to a bool, not {type(result).__name__}")  # noqa: TRY004


@functools.lru_cache(maxsize=256)
def _program(expression: str) -> cel.Program:
    return cel.compile(expression)


def matches(rule: Rule, if_name: str, attributes: dict[str, dict[str, AttributeValue]], driver: str) -> bool:
    """Whether `rule` selects this interface. A CEL error at run time (a missing attribute) is no match."""
    match = rule.match
    if match.names and not any(fnmatch.fnmatchcase(if_name, glob) for glob in match.names):
        return False
    own = attributes.get(DRIVER_DOMAIN, {})
    if any(own.get(key) != value for key, value in match.attributes.items()):
        return False
    if match.cel is None:
        return True
    try:
        return bool(_program(match.cel).execute(cel.Context(_context(attributes, driver))) is True)
    except (KeyError, RuntimeError, TypeError, ValueError):
        return False


def load_policy(path: Path | None) -> PublishPolicy:
    """The policy in `path` (DEFAULT_POLICY when None); errors name the file and the field."""
    if path is None:
        return DEFAULT_POLICY
    return load_yaml_model(path, PublishPolicy, "kind: PublishPolicy")

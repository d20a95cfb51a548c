"""Which rule of the admin's PublishPolicy (netclaim.core.config.publishpolicy) selects an interface.

Loading a policy checks what its types cannot: attribute names and CEL expressions are checked against
the attributes of an interface with every fact known (`SAMPLE_INTERFACE` through `facts_as_attributes`,
the same function that makes the published attributes), so the two never drift apart.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterator
from pathlib import Path

from netclaim.core.config.files import load_yaml_model
from netclaim.core.config.publishpolicy import NO_POLICY, AttributeValue, PublishPolicy, Rule
from netclaim.core.devices import selectors
from netclaim.core.devices.nic import SAMPLE_INTERFACE, facts_as_attributes
from netclaim.core.names import DRIVER_DOMAIN, STANDARD_DOMAIN
from netclaim.errors import ConfigError

SHARED_ATTRIBUTE = "shared"  # netclaim.dev/shared: set on every device from the rule's mode
# set on shared devices from the rule's childType and ipvlanMode
SHARING_ATTRIBUTES = {"childType": "macvlan", "ipvlanMode": "l2"}


def sample_attributes() -> dict[str, dict[str, AttributeValue]]:
    """Every attribute a published device can carry, grouped by domain, with a sample value."""
    attributes = facts_as_attributes(SAMPLE_INTERFACE)
    attributes[DRIVER_DOMAIN][SHARED_ATTRIBUTE] = True
    attributes[DRIVER_DOMAIN].update(SHARING_ATTRIBUTES)
    return attributes


def check_cel(expression: str) -> None:
    """Syntax, names and types of a policy CEL expression, checked against a complete sample device."""
    known = sample_attributes()
    verdict = selectors.evaluate(expression, DRIVER_DOMAIN, known)
    if verdict.missing:
        raise ValueError(
            f"invalid CEL: {verdict.why}; netclaim.dev attributes are {sorted(known[DRIVER_DOMAIN])}"
        )
    if verdict.selected is None:
        raise ValueError(f"invalid CEL: {verdict.why}")


def rule_problems(policy: PublishPolicy) -> Iterator[str]:
    """`field: problem` for everything the types let through but the attributes do not allow."""
    own = sample_attributes()[DRIVER_DOMAIN]
    for index, rule in enumerate(policy.rules):
        where = f"rules[{index}]"
        unknown = sorted(set(rule.match.attributes) - set(own))
        if unknown:
            yield f"{where}.match.attributes: unknown attributes {unknown}; known: {sorted(own)}"
        if rule.match.cel is not None:
            try:
                check_cel(rule.match.cel)
            except ValueError as err:
                yield f"{where}.match.cel: {err}"
        for key in rule.attributes:
            domain, _, name = key.rpartition("/")
            if domain in ("", DRIVER_DOMAIN) and name in own:
                yield f"{where}.attributes.{key}: is a standard attribute netclaim sets itself"
            if domain == STANDARD_DOMAIN:
                yield f"{where}.attributes.{key}: the resource.kubernetes.io domain is Kubernetes' own"


def matches(rule: Rule, if_name: str, attributes: dict[str, dict[str, AttributeValue]], driver: str) -> bool:
    """Whether `rule` selects this interface. A CEL error at run time (a missing attribute) is no match."""
    match = rule.match
    if match.names and not any(fnmatch.fnmatchcase(if_name, glob) for glob in match.names):
        return False
    own = attributes.get(DRIVER_DOMAIN, {})
    if any(own.get(key) != value for key, value in match.attributes.items()):
        return False
    return match.cel is None or selectors.evaluate(match.cel, driver, attributes).selected is True


def load_policy(path: Path | None) -> PublishPolicy:
    """The policy in `path` (NO_POLICY, publishing nothing, when None); errors name the file and the field."""
    if path is None:
        return NO_POLICY
    policy = load_yaml_model(path, PublishPolicy, "kind: PublishPolicy")
    problems = [f"{path}: {problem}" for problem in rule_problems(policy)]
    if problems:
        raise ConfigError("\n".join(problems))
    return policy

"""Which rule of the admin's PublishPolicy (netclaim.api.publishpolicy) selects an interface.

Loading a policy checks what its types cannot: attribute names and CEL expressions are checked against
the attributes of an interface with every fact known (`SAMPLE_INTERFACE` through `facts_as_attributes`,
the same function that makes the published attributes), so the two never drift apart.
"""

from __future__ import annotations

import fnmatch
import logging
from collections.abc import Iterator
from pathlib import Path

from netclaim.api import selectors
from netclaim.api.publishpolicy import NO_POLICY, AttributeValue, PublishPolicy, Rule
from netclaim.errors import ConfigError
from netclaim.files import load_yaml_model
from netclaim.names import DRIVER_DOMAIN, STANDARD_DOMAIN
from netclaim.publish.inventory import SAMPLE_INTERFACE, facts_as_attributes

log = logging.getLogger(__name__)
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


class PolicyFile:
    """The admin's policy, read again when its file changes (a ConfigMap update swaps the mounted file's
    target): the next publish uses the new rules without a restart. A changed file that does not load
    keeps the last good policy and says why; an absent file is no rule at all. Attached pods are never
    touched by a policy change (a device the new rules no longer offer is only no longer offered)."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._seen = self._stamp()
        # a bad policy at start stops the agent before it touches anything
        self.policy = self._load()
        if path is not None and self._seen is None:
            log.warning(
                "no publish policy yet: nothing is published until the admin creates it",
                extra={"file": str(path)},
            )

    def _load(self) -> PublishPolicy:
        """The file's policy; NO_POLICY while it is absent: the ConfigMap is optional, and the agents run
        before the admin creates it (or after they delete it)."""
        return NO_POLICY if self._seen is None else load_policy(self.path)

    def _stamp(self) -> tuple[int, int, int] | None:
        if self.path is None:
            return None
        try:
            info = self.path.stat()  # follows the ConfigMap's ..data symlink
        except OSError:
            return None
        return info.st_ino, info.st_mtime_ns, info.st_size

    def changed(self) -> bool:
        """Re-read the file when it changed; True when that gave a new policy."""
        stamp = self._stamp()
        if stamp == self._seen:
            return False
        self._seen = stamp
        try:
            policy = self._load()
        except ConfigError as err:
            log.warning(
                "the changed policy does not load; keeping the last good one", extra={"error": str(err)}
            )
            return False
        if policy == self.policy:
            return False
        self.policy = policy
        log.info("policy changed: publishing with the new rules", extra={"file": str(self.path)})
        return True

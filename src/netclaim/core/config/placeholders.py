"""`{{ name }}` placeholders in CNI configs, filled from the allocated device: a lookup, not templating.

Names:
    device.name, device.pool          the DRA device and its pool (the node)
    device.<attribute>                a netclaim.dev attribute (ifName, mac, pciAddress…) or a
                                      resource.kubernetes.io one (pcieRoot, pciBusID)
    consumed.bandwidth                bits/s the claim consumed (an integer)
    claim.name, claim.namespace, claim.uid, request, node.name

A string that is exactly one placeholder takes the value's type (so `"{{ consumed.bandwidth }}"` becomes a
number); elsewhere values are inserted as text. Nothing else is evaluated.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any

from netclaim.errors import ConfigError

_PLACEHOLDER = re.compile(r"\{\{\s*([A-Za-z][A-Za-z0-9_.]*)\s*\}\}")
_FIXED = {
    "device.name",
    "device.pool",
    "consumed.bandwidth",
    "claim.name",
    "claim.namespace",
    "claim.uid",
    "request",
    "node.name",
}
ScalarValue = str | int | bool


def _known(name: str) -> bool:
    return name in _FIXED or (name.startswith("device.") and len(name) > len("device."))


def _walk(value: Any, path: str) -> Iterator[tuple[str, str]]:
    """(path, string) for every string in a JSON value, keys excluded."""
    if isinstance(value, str):
        yield path, value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _walk(item, f"{path}.{key}" if path else str(key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _walk(item, f"{path}[{index}]")


def holds_placeholder(value: Any) -> bool:
    """Whether a value is text with a placeholder in it: checked once rendered, not before."""
    return isinstance(value, str) and "{{" in value


def placeholder_names(value: Any) -> Iterator[tuple[str, str]]:
    """(path, name) of every placeholder in a JSON value."""
    for path, text in _walk(value, ""):
        for name in _PLACEHOLDER.findall(text):
            yield path, name


def check_placeholders(value: Any) -> Iterator[tuple[str, str]]:
    """Static problems: malformed braces or names that can never be filled."""
    for path, text in _walk(value, ""):
        leftover = _PLACEHOLDER.sub("", text)
        if "{{" in leftover or "}}" in leftover:
            yield path, f"malformed placeholder in {text!r} (write {{{{ device.ifName }}}})"
        for name in _PLACEHOLDER.findall(text):
            if not _known(name):
                yield (
                    path,
                    f"unknown placeholder {{{{ {name} }}}}; known: {sorted(_FIXED)} and device.<attribute>",
                )


def render(value: Any, values: Mapping[str, ScalarValue], path: str = "") -> Any:
    """`value` with every placeholder replaced; a name without a value is an error naming the path."""
    if isinstance(value, dict):
        return {
            key: render(item, values, f"{path}.{key}" if path else str(key)) for key, item in value.items()
        }
    if isinstance(value, list):
        return [render(item, values, f"{path}[{index}]") for index, item in enumerate(value)]
    if not isinstance(value, str) or "{{" not in value:
        return value
    whole = _PLACEHOLDER.fullmatch(value.strip())
    if whole:
        return _lookup(whole.group(1), values, path)
    return _PLACEHOLDER.sub(lambda m: str(_lookup(m.group(1), values, path)), value)


def _lookup(name: str, values: Mapping[str, ScalarValue], path: str) -> ScalarValue:
    if name not in values:
        attribute = name.removeprefix("device.")
        if name.startswith("device.") and name not in _FIXED:
            raise ConfigError(
                f"{path}: the allocated device has no attribute {attribute!r} ({{{{ {name} }}}})"
            )
        raise ConfigError(f"{path}: {{{{ {name} }}}} has no value here")
    return values[name]

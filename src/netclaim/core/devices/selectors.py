"""CEL selectors over a DRA device, as the scheduler evaluates a DeviceClass's or a request's (and as the
admin's PublishPolicy matches an interface): the one place netclaim compiles and runs CEL.

The device is what a selector sees: `device.driver`, `device.attributes[domain].name` and, when given,
`device.capacity[domain].name` and `device.allowMultipleAllocations`.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import cel


@dataclass(frozen=True)
class Verdict:
    """What a selector says of one device: whether it selects it, or no answer (None)."""

    selected: bool | None
    why: str = ""  # when it does not select it (or gives no answer): why, in words; "" when simply false
    missing: bool = False  # False because the device has no attribute the selector reads


def _cel() -> ModuleType:
    """The CEL library, imported when a selector is first compiled: its package also loads an interactive
    shell (prompt_toolkit), 12 MiB of every agent's memory that policies matching by name never need."""
    import cel

    return cel


@functools.lru_cache(maxsize=512)
def _program(expression: str) -> cel.Program:
    program: cel.Program = _cel().compile(expression)
    return program


def evaluate(
    expression: str,
    driver: str,
    attributes: Mapping[str, Mapping[str, Any]],
    capacity: Mapping[str, Decimal | int] | None = None,
    shared: bool | None = None,
) -> Verdict:
    """`expression` on the device of `driver` with `attributes` (by domain, then name) and, when known, its
    `capacity` (by qualified name) and whether it is `shared` (allowMultipleAllocations)."""
    device: dict[str, Any] = {"driver": driver, "attributes": attributes}
    if capacity is not None:
        grouped: dict[str, dict[str, int]] = {}
        for name, value in capacity.items():
            domain, _, short = name.rpartition("/")
            grouped.setdefault(domain, {})[short] = int(value)
        device["capacity"] = grouped
    if shared is not None:
        device["allowMultipleAllocations"] = shared
    try:
        result = _program(expression).execute(_cel().Context({"device": device}))
    except KeyError as err:
        return Verdict(False, f"the device has no attribute {err}", missing=True)
    except (ValueError, RuntimeError, TypeError) as err:  # the expression's syntax, names or types
        return Verdict(None, (str(err).splitlines() or [type(err).__name__])[0])
    if not isinstance(result, bool):
        return Verdict(None, f"must evaluate to a bool, not {type(result).__name__}")
    return Verdict(result)

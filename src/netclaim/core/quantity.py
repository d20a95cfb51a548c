"""Kubernetes resource quantities (`10Gi`, `5G`, `1500m`) as exact numbers.

Only what netclaim needs: parse any valid quantity, and format integers the way the
apiserver would keep them, so that what we publish reads back unchanged.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

from netclaim.errors import ConfigError

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "": Decimal(1),
    "k": Decimal(10**3),
    "M": Decimal(10**6),
    "G": Decimal(10**9),
    "T": Decimal(10**12),
    "P": Decimal(10**15),
    "E": Decimal(10**18),
}
_QUANTITY = re.compile(
    r"^([+-]?[0-9]+(?:\.[0-9]*)?|[+-]?\.[0-9]+)(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?[0-9]+)?$"
)


def parse_quantity(text: str | int) -> Decimal:
    """The exact value of a quantity; raises ConfigError naming the text when it is not one."""
    if isinstance(text, int):
        return Decimal(text)
    match = _QUANTITY.match(text.strip()) if isinstance(text, str) else None
    if not match:
        raise ConfigError(f"{text!r} is not a Kubernetes quantity (examples: 10Gi, 5G, 1500m)")
    number, suffix = match.group(1), match.group(2) or ""
    try:
        value = Decimal(number)
    except InvalidOperation as err:  # pragma: no cover - the regex admits only decimals
        raise ConfigError(f"{text!r} is not a Kubernetes quantity") from err
    if suffix in _BINARY:
        return value * _BINARY[suffix]
    if suffix in _DECIMAL:
        return value * _DECIMAL[suffix]
    return value * (Decimal(10) ** int(suffix[1:]))


def format_quantity(value: int) -> str:
    """Canonical text for a non-negative integer: binary suffix when exact, else decimal."""
    if value < 0:
        raise ValueError("quantities netclaim publishes are never negative")
    if value == 0:
        return "0"
    for suffix, factor in sorted(_BINARY.items(), key=lambda kv: -kv[1]):
        if value % factor == 0:
            return f"{value // factor}{suffix}"
    for suffix in ("E", "P", "T", "G", "M", "k"):
        factor = int(_DECIMAL[suffix])
        if value % factor == 0:
            return f"{value // factor}{suffix}"
    return str(value)


def readable_quantity(value: int) -> str:
    """The shortest exact text, for people: a 10 GbE NIC's 10000000000 is 10G (not 9765625Ki), 5Gi is 5Gi."""
    if value <= 0:
        return format_quantity(max(value, 0))
    candidates = [str(value)]
    for suffix, factor in [*_BINARY.items(), *((s, int(f)) for s, f in _DECIMAL.items() if f >= 1000)]:
        if value % factor == 0:
            candidates.append(f"{value // int(factor)}{suffix}")
    return min(candidates, key=len)

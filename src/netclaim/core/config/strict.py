"""Reading a user's object into our types: msgspec Structs, decoded as JSON carries them, errors naming the
object and the field.

msgspec rather than pydantic: the agent reads every type here, and pydantic with its core cost it about
9 MiB of resident memory (docs/design/agent-memory.md); msgspec is already loaded (lightkube's own).
Strict: no silent coercion ("32" is not an int, 1 is not true). msgspec stops at the first problem, so an
error names one field; the user fixes it and hears of the next. A Struct's own checks (`__post_init__`)
raise ValueError naming the field inside the Struct first, `field: problem` (`named`).

msgspec's paths leave map keys out (`[...]`), and its errors about a key do not quote it: the key is found
by decoding the object again with the map cut down to one entry at a time, for objects and maps small
enough that this stays cheap (MAX_SEARCHED_BYTES, MAX_SEARCHED_ENTRIES; a tenant's object is bounded
input too). Beyond them the path keeps `[...]`.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import msgspec

from netclaim.errors import ConfigError

S = TypeVar("S")
T = TypeVar("T")

MAX_DEPTH = 32  # objects and lists inside each other; a CNI config needs 6, a MultiNetworkPolicy 9
MAX_SEARCHED_BYTES = 64 * 1024  # the object as JSON: each try decodes it again
MAX_SEARCHED_ENTRIES = 64

_AT = re.compile(r"^(?P<message>.*?) - at (?P<key>`key` in )?`\$(?P<path>[^`]*)`$", re.DOTALL)
_UNKNOWN = re.compile(r"^Object contains unknown field `(?P<field>.*)`$", re.DOTALL)
_MISSING = re.compile(r"^Object missing required field `(?P<field>.*)`$", re.DOTALL)
_NAMED_STEP = r"(?:\.[A-Za-z_][\w-]*|\[\d+\]|\['[^']*'\])"  # .field, [index], ['key'] (`step`)
_NAMED = re.compile(
    rf"^(?P<field>(?:[A-Za-z_]\w*|\[\d+\]|\['[^']*'\]){_NAMED_STEP}*): (?P<message>.*)$", re.DOTALL
)
_PATH_STEP = re.compile(r"\.(?P<field>[^.\[]+)|\[(?P<index>\d+)\]|(?P<key>\[\.\.\.\])")
_FIELD = re.compile(r"[A-Za-z_][\w-]*", re.ASCII)


class Invalid(ValueError):
    """What is wrong with an object, and where: `path` like `a.b[0].c` ("" for the object itself)."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}" if path else message)
        self.path, self.message = path, message


def decode(model: type[S], raw: object, source: str, prefix: str = "") -> S:
    """`raw` as `model` (`read`); ConfigError `<source>: <field path>: <problem>` otherwise, the path under
    `prefix` (e.g. "spec")."""
    try:
        return read(model, raw)
    except Invalid as err:
        raise ConfigError(f"{source}: {under(prefix, err.path) or '(root)'}: {err.message}") from None


def read(model: type[S], raw: object) -> S:
    """`raw` (plain data as YAML or JSON gave it) as `model`, read as JSON would carry it: values JSON has
    no type for (a YAML date) are text, a path is text. Invalid otherwise, and for a value nested deeper
    than MAX_DEPTH (looked for without recursion: the JSON encoder and msgspec recurse)."""
    deep = too_deep(raw)
    if deep is not None:
        raise Invalid(deep, f"nested deeper than {MAX_DEPTH} levels")
    try:
        text = json.dumps(raw, default=str, allow_nan=False)
    except ValueError:  # a NaN or infinity (YAML's .nan, .inf)
        raise Invalid(_not_finite(raw, ""), "not a finite number (JSON has no NaN or infinity)") from None
    try:
        return _decoded(model, text)
    except msgspec.ValidationError as err:
        raise _invalid(model, raw, str(err), searched=len(text) <= MAX_SEARCHED_BYTES) from None


def too_deep(value: object, limit: int = MAX_DEPTH) -> str | None:
    """The path of the first object or list nested deeper than `limit` in `value` (found without
    recursion: a tenant's value may be nested thousands deep); None when nothing is."""
    pending: list[tuple[object, int, str]] = [(value, 1, "")]
    while pending:
        item, depth, path = pending.pop()
        if isinstance(item, dict):
            children = [(child, f"{path}.{key}" if path else str(key)) for key, child in item.items()]
        elif isinstance(item, list):
            children = [(child, f"{path}[{index}]") for index, child in enumerate(item)]
        else:
            continue
        if depth > limit:
            return path if len(path) <= 80 else f"{path[:80]}…"
        pending.extend((child, depth + 1, where) for child, where in reversed(children))
    return None


def under(prefix: str, path: str) -> str:
    """`path` as a step below `prefix`."""
    if not prefix or not path:
        return prefix or path
    return f"{prefix}{'' if path.startswith('[') else '.'}{path}"


def step(key: object) -> str:
    """A map's key as a step of a path: `.name`, or `['example.com/x']` when it is not a plain name."""
    return f".{key}" if isinstance(key, str) and _FIELD.fullmatch(key) else f"[{str(key)!r}]"


def named(field: str, read: Callable[[str], T], value: str) -> T:
    """`read(value)` in a Struct's own check, its ValueError naming `field` first."""
    try:
        return read(value)
    except ValueError as err:
        raise ValueError(f"{field}: {err}") from None


def _decoded(model: type[S], text: str) -> S:
    return msgspec.json.decode(text, type=model, strict=True, dec_hook=_path)


def _path(kind: type, value: object) -> object:
    """msgspec has no Path of its own: a path is text."""
    if kind is Path and isinstance(value, str):
        return Path(value)
    raise TypeError(f"Expected a path, got {json.dumps(value)}")


def _not_finite(value: object, path: str) -> str:
    """The path of the first NaN or infinity in `value` (no deeper than MAX_DEPTH: too_deep said so)."""
    if isinstance(value, float) and not math.isfinite(value):
        return path.removeprefix(".")
    entries = (
        value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    )
    for key, inner in entries:
        found = _not_finite(inner, f"{path}{f'[{key}]' if isinstance(value, list) else step(key)}")
        if found:
            return found
    return ""


def _invalid(model: type[S], raw: object, said: str, *, searched: bool) -> Invalid:
    """msgspec's error `said` as an Invalid: its path, the keys it leaves out named, the field a message
    names (unknown, missing, or a Struct's own check) made a step of it."""
    found = _AT.match(said)
    message, path = (found["message"], found["path"]) if found else (said, "")
    keys: list[object] = []
    steps: list[str] = []
    trail = raw
    for part in _PATH_STEP.finditer(path):
        key: object
        if part["field"] is not None:
            key = part["field"]
        elif part["index"] is not None:
            key = int(part["index"])
        else:
            key = _failing_key(model, raw, keys, trail, said) if searched else None
            if key is None:  # not to be found: the rest as msgspec said it
                steps.append(path[part.start() :])
                break
        steps.append(f"[{key}]" if part["index"] is not None else step(key) if part["key"] else f".{key}")
        keys.append(key)
        trail = _entry(trail, key)
    else:
        if found is not None and found["key"]:
            bad = _failing_key(model, raw, keys, trail, said) if searched else None
            message = f"key {str(bad)!r}: {message}" if bad is not None else f"a key: {message}"
    where = "".join(steps).removeprefix(".")
    if unknown := _UNKNOWN.match(message):
        return Invalid(under(where, unknown["field"]), "unknown field")
    if missing := _MISSING.match(message):
        return Invalid(under(where, missing["field"]), "Field required")
    if check := _NAMED.match(message):
        return Invalid(under(where, check["field"]), check["message"])
    return Invalid(where, message)


def _entry(value: object, key: object) -> object:
    if isinstance(value, dict):
        return value.get(key)
    if isinstance(value, list) and isinstance(key, int) and key < len(value):
        return value[key]
    return None


def _failing_key(model: type[S], raw: object, keys: list[object], mapping: object, said: str) -> object:
    """The key of `mapping` (reached from `raw` by `keys`) whose entry alone fails as `said`; None when
    none does or the map is too large to search."""
    if not isinstance(mapping, dict) or len(mapping) > MAX_SEARCHED_ENTRIES:
        return None
    return next((key for key in mapping if _fails_alone(model, raw, keys, key, said)), None)


def _fails_alone(model: type[S], raw: object, keys: list[object], key: object, said: str) -> bool:
    def cut(value: object, rest: list[object]) -> object:
        if not rest:
            return {key: value[key]} if isinstance(value, dict) else value
        first, *after = rest
        if isinstance(value, dict) and first in value:
            return {**value, first: cut(value[first], after)}
        if isinstance(value, list) and isinstance(first, int) and first < len(value):
            return [*value[:first], cut(value[first], after), *value[first + 1 :]]
        return value

    try:
        _decoded(model, json.dumps(cut(raw, keys), default=str))
    except msgspec.ValidationError as err:
        return str(err) == said
    return False

"""netclaim.core.config.strict: a user's object read into a Struct, the error naming the object and field."""

from __future__ import annotations

import datetime
import ipaddress
import re
from pathlib import Path
from typing import Annotated

import msgspec
import pytest

from netclaim.core.config import strict
from netclaim.core.names import DNS_LABEL, pattern
from netclaim.errors import ConfigError

Label = Annotated[str, msgspec.Meta(pattern=pattern(DNS_LABEL))]


class Port(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    number: int = 0

    def __post_init__(self) -> None:
        if not 0 <= self.number <= 65535:
            raise ValueError(f"number: {self.number} is not 0-65535")


class Service(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    name: Label
    ports: dict[str, dict[str, Port]] = msgspec.field(default_factory=dict)
    listed: list[dict[str, Port]] = msgspec.field(default_factory=list)
    labels: dict[Label, str] = msgspec.field(default_factory=dict)
    since: str = ""
    home: Path | None = None


def _error(raw: object, prefix: str = "") -> str:
    with pytest.raises(ConfigError) as caught:
        strict.decode(Service, raw, "Service s", prefix)
    return str(caught.value)


@pytest.mark.parametrize(
    ("raw", "said"),
    [
        ({"name": "a", "colour": 1}, "Service s: colour: unknown field"),
        ({}, "Service s: name: Field required"),
        ({"name": 5}, "Service s: name: Expected `str`, got `int`"),
        (
            {"name": "a", "listed": [{"x": {"number": 1}}, {"y": {"numbr": 1}}]},
            "Service s: listed[1].y.numbr: unknown field",
        ),
        # a Struct's own check names its field: it becomes a step of the path
        (
            {"name": "a", "ports": {"web": {"http": {"number": 70000}}}},
            "Service s: ports.web.http.number: 70000 is not",
        ),
        # msgspec leaves map keys out of its paths ([...]): the key whose entry alone fails is named
        (
            {"name": "a", "ports": {"ok": {"a": {"number": 1}}, "bad.one": {"b": {}, "c": {"number": -1}}}},
            "Service s: ports['bad.one'].c.number: -1 is not 0-65535",
        ),
        (
            {"name": "a", "labels": {"fine": "x", "Not A Label": "x"}},
            "Service s: labels: key 'Not A Label': Expected `str` matching regex",
        ),
        ({"name": "a\n"}, "Service s: name: Expected `str` matching regex"),  # `$` would match before it
        ({"name": "a", "home": 5}, "Service s: home: Expected a path, got 5"),
        # YAML's .nan and .inf: JSON has neither
        (
            {"name": "a", "listed": [{"x": {"number": float("nan")}}]},
            "Service s: listed[0].x.number: not a finite",
        ),
    ],
)
def test_an_error_names_the_object_and_the_field(raw: object, said: str) -> None:
    assert _error(raw).startswith(said), _error(raw)


def test_a_prefix_goes_before_the_path() -> None:
    assert _error({"name": "a", "colour": 1}, "spec") == "Service s: spec.colour: unknown field"
    assert _error([1], "spec") == "Service s: spec: Expected `object`, got `array`"


def test_values_json_has_no_type_for_are_text_and_paths_are_paths() -> None:
    read = strict.decode(Service, {"name": "a", "since": datetime.date(2026, 12, 7), "home": "/h"}, "s")
    assert read.since == "2026-12-07" and read.home == Path("/h")


def test_named_puts_the_field_before_the_problem() -> None:
    with pytest.raises(ValueError, match=re.escape("gw: 'x' does not appear")):
        strict.named("gw", ipaddress.ip_address, "x")
    assert strict.named("gw", ipaddress.ip_address, "10.0.0.1") == ipaddress.ip_address("10.0.0.1")


def test_a_key_is_looked_for_in_a_bounded_map_only() -> None:
    """Each try decodes the object again: a tenant's map of thousands of entries stays `[...]`."""
    many = {f"p{n}": {"a": {"number": 1}} for n in range(strict.MAX_SEARCHED_ENTRIES)}
    assert _error({"name": "a", "ports": {**many, "last": {"b": {"number": -1}}}}).startswith(
        "Service s: ports[...][...].number: -1 is not"
    )
    del many["p0"]
    assert _error({"name": "a", "ports": {**many, "last": {"b": {"number": -1}}}}).startswith(
        "Service s: ports.last.b.number: -1 is not"
    )


def test_a_key_is_looked_for_in_a_small_object_only() -> None:
    big = {"name": "a", "since": "x" * strict.MAX_SEARCHED_BYTES, "ports": {"b": {"c": {"number": -1}}}}
    assert _error(big).startswith("Service s: ports[...][...].number: -1 is not")


def test_a_value_nested_past_the_limit_is_refused_without_recursion() -> None:
    """A tenant's value may be nested thousands deep: the JSON encoder and msgspec would recurse."""
    deep: list[object] = []
    innermost = deep
    for _ in range(100_000):
        innermost.append([])
        innermost = innermost[0]  # type: ignore[assignment]
    said = _error({"name": "a", "listed": deep})
    assert said.startswith("Service s: listed[0][0][0]"), said
    assert said.endswith(f"…: nested deeper than {strict.MAX_DEPTH} levels"), said  # the path cut at 80

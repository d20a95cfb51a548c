from __future__ import annotations

from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from netclaim.core.quantity import format_quantity, parse_quantity
from netclaim.errors import ConfigError


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("10Gi", 10 * 2**30),
        ("5G", 5 * 10**9),
        ("1500m", Decimal("1.5")),
        ("1e3", 1000),
        ("0", 0),
        ("2.5Gi", int(2.5 * 2**30)),
        ("100Mi", 100 * 2**20),
        (".5k", 500),
    ],
)
def test_parse(text: str, value: Decimal | int) -> None:
    assert parse_quantity(text) == value


@pytest.mark.parametrize("text", ["", "Gi", "10 Gi", "10GB", "ten", "1.2.3", "10gi"])
def test_parse_rejects_with_the_text(text: str) -> None:
    with pytest.raises(ConfigError, match="not a Kubernetes quantity"):
        parse_quantity(text)


@pytest.mark.parametrize(
    ("value", "text"),
    [(10 * 2**30, "10Gi"), (5 * 10**9, "5G"), (1000, "1k"), (7, "7"), (0, "0"), (3 * 2**20, "3Mi")],
)
def test_format(value: int, text: str) -> None:
    assert format_quantity(value) == text


@given(st.integers(min_value=0, max_value=2**62))
def test_format_round_trips(value: int) -> None:
    assert parse_quantity(format_quantity(value)) == value

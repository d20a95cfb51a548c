"""Small typed helpers for tests that talk to the real apiserver."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

import pytest
from lightkube import Client
from lightkube.core.dictmixin import DictMixin
from lightkube.core.exceptions import ApiError

T = TypeVar("T", bound=DictMixin)


def typed(kind: type[T], data: dict[str, Any]) -> T:
    """A lightkube model from a plain manifest, typed as `kind`."""
    obj = kind.from_dict(data)
    assert isinstance(obj, kind)
    return obj


def wait_for(predicate: Callable[[], bool], timeout: float, what: str, interval: float = 0.5) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)
    pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}")


def delete(kube: Client, kind: type[Any], name: str, namespace: str | None = None) -> None:
    """Delete now (no grace), and be fine with it being gone already."""
    try:
        if namespace is None:
            kube.delete(kind, name)
        else:
            kube.delete(kind, name, namespace=namespace, grace_period=0)
    except ApiError as err:
        if err.status.code != 404:
            raise

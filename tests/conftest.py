"""Shared test wiring: root-only tests fail loudly (never skip) when their prerequisites are missing."""

from __future__ import annotations

import os
import shutil

import pytest


def require_root_prerequisites() -> None:
    """Fail (not skip) with what to install or do when a root test cannot run here."""
    if os.geteuid() != 0:
        pytest.fail("this test needs root (network namespaces, mounts, cgroups): run `sudo make test`")
    for program, package in (("ip", "iproute2"), ("nsenter", "util-linux"), ("runc", "runc")):
        if not shutil.which(program):
            pytest.fail(f"{program} is missing: apt-get install {package} (or run `make deps`)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/cluster/" in str(item.path):
            item.add_marker(pytest.mark.cluster)

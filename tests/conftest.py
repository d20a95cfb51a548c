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


_MODULE_SECONDS: dict[str, float] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Each module's time: its tests' setup, call and teardown (a session cluster's start is counted in
    the module whose test started it)."""
    module = report.nodeid.split("::")[0]
    _MODULE_SECONDS[module] = _MODULE_SECONDS.get(module, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not _MODULE_SECONDS:
        return
    total = sum(_MODULE_SECONDS.values())
    terminalreporter.write_sep("=", f"ten slowest modules (of {len(_MODULE_SECONDS)}, {total / 60:.1f} min)")
    for module, seconds in sorted(_MODULE_SECONDS.items(), key=lambda item: -item[1])[:10]:
        terminalreporter.write_line(f"{seconds:8.1f} s  {module}")

"""Shared test wiring: root-only tests fail loudly (never skip) when their prerequisites are missing."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable

import pytest
from xdist.remote import Producer
from xdist.scheduler import LoadScopeScheduling


def require_root_prerequisites() -> None:
    """Fail (not skip) with what to install or do when a root test cannot run here."""
    if os.geteuid() != 0:
        pytest.fail("this test needs root (network namespaces, mounts, cgroups): run `sudo make test`")
    for program, package in (("ip", "iproute2"), ("nsenter", "util-linux"), ("runc", "runc")):
        if not shutil.which(program):
            pytest.fail(f"{program} is missing: apt-get install {package} (or run `make deps`)")


# `make test` runs two workers (pytest-xdist): every module of tests/cluster/ on one of them, in order, on
# the session cluster; each other module whole on either, so its module fixtures (an image build, a side
# cluster) are made once, beside the session cluster's tests instead of after them. These modules of
# tests/cluster/ run side clusters of their own and never the session one (checked at collection).
SESSION_CLUSTER = "session-cluster"
BESIDE_THE_SESSION_CLUSTER = frozenset(
    f"tests/cluster/{name}.py" for name in ("test_install", "test_preflight", "test_lifecycle")
)


def worker_scope(nodeid: str) -> str:
    """Which tests one worker runs together, in order: a module, or every test of the session cluster."""
    module = nodeid.split("::")[0]
    if module.startswith("tests/cluster/") and module not in BESIDE_THE_SESSION_CLUSTER:
        return SESSION_CLUSTER
    return module


class _SessionClusterScheduling(LoadScopeScheduling):
    """xdist's --dist loadfile, with the session cluster's modules one scope (its --dist loadgroup reads
    groups from node IDs it rewrites, which pytest 9 no longer lets it do)."""

    def _split_scope(self, nodeid: str) -> str:
        return worker_scope(nodeid)


def pytest_xdist_make_scheduler(config: pytest.Config, log: Producer) -> _SessionClusterScheduling:
    return _SessionClusterScheduling(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/cluster/" in str(item.path):
            item.add_marker(pytest.mark.cluster)
        if "cluster" in getattr(item, "fixturenames", ()) and worker_scope(item.nodeid) != SESSION_CLUSTER:
            raise pytest.UsageError(
                f"{item.nodeid} uses the session cluster: it must be in tests/cluster/ and not in "
                "BESIDE_THE_SESSION_CLUSTER (tests/conftest.py), or two workers would each start it"
            )


_MODULE_SECONDS: dict[str, float] = {}
_FIGURES: dict[str, list[str]] = {}


@pytest.fixture
def figures(request: pytest.FixtureRequest) -> Callable[[str], None]:
    """Show a measured figure in the run's output: listed at its end, whichever worker measured it (a
    worker's own output is not shown), so CI's log keeps it."""

    def show(text: str) -> None:
        request.node.user_properties.append(("figure", text))

    return show


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Each module's time: its tests' setup, call and teardown (a session cluster's start is counted in
    the module whose test started it). The figures a test showed come with its teardown's report."""
    module = report.nodeid.split("::")[0]
    _MODULE_SECONDS[module] = _MODULE_SECONDS.get(module, 0.0) + report.duration
    if report.when == "teardown":
        shown = [str(value) for name, value in report.user_properties if name == "figure"]
        if shown:
            _FIGURES[report.nodeid] = shown


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not _MODULE_SECONDS:
        return
    total = sum(_MODULE_SECONDS.values())
    terminalreporter.write_sep("=", f"ten slowest modules (of {len(_MODULE_SECONDS)}, {total / 60:.1f} min)")
    for module, seconds in sorted(_MODULE_SECONDS.items(), key=lambda item: -item[1])[:10]:
        terminalreporter.write_line(f"{seconds:8.1f} s  {module}")
    if _FIGURES:
        terminalreporter.write_sep("=", "figures measured")
        for nodeid, shown in sorted(_FIGURES.items()):
            terminalreporter.write_line(nodeid)
            for text in shown:
                terminalreporter.write_line("  " + text.strip().replace("\n", "\n  "))

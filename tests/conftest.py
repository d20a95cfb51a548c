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


# `make test` runs two workers (pytest-xdist), each one scope of tests in order: the first on the session
# cluster, with half of tests/cluster/'s modules and every module that needs no cluster; the second on a
# session cluster of its own (tests/cluster/conftest.py), with the other half and the modules that run
# side clusters. The halves are of measured time (the summary's module times).
SECOND_WORKER = frozenset(
    f"tests/cluster/{name}.py"
    for name in (
        # side clusters of their own
        "test_install",
        "test_preflight",
        "test_lifecycle",
        # the second session cluster's share
        "test_control_plane",
        "test_restarts",
        "test_cni_lifecycle",
        "test_spoofing",
        "test_upgrade",
        "test_admission",
        "test_attacks",
    )
)


def worker_scope(nodeid: str) -> str:
    return "second" if nodeid.split("::")[0] in SECOND_WORKER else "first"


class _TwoScopes(LoadScopeScheduling):
    """xdist's scope scheduling with two scopes of our choosing (its --dist loadgroup reads groups from
    node IDs it rewrites, which pytest 9 no longer lets it do)."""

    def _split_scope(self, nodeid: str) -> str:
        return worker_scope(nodeid)


def pytest_xdist_make_scheduler(config: pytest.Config, log: Producer) -> _TwoScopes:
    return _TwoScopes(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/cluster/" in str(item.path):
            item.add_marker(pytest.mark.cluster)


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
    by_worker: dict[str, float] = {}
    for module, seconds in _MODULE_SECONDS.items():
        by_worker[worker_scope(module)] = by_worker.get(worker_scope(module), 0.0) + seconds
    workers = ", ".join(f"{scope} {seconds / 60:.1f}" for scope, seconds in sorted(by_worker.items()))
    terminalreporter.write_sep(
        "=", f"modules over 20 s (of {len(_MODULE_SECONDS)}, {total / 60:.1f} min: {workers})"
    )
    for module, seconds in sorted(_MODULE_SECONDS.items(), key=lambda item: -item[1]):
        if seconds > 20:
            terminalreporter.write_line(f"{seconds:8.1f} s  {worker_scope(module):6}  {module}")
    if _FIGURES:
        terminalreporter.write_sep("=", "figures measured")
        for nodeid, shown in sorted(_FIGURES.items()):
            terminalreporter.write_line(nodeid)
            for text in shown:
                terminalreporter.write_line("  " + text.strip().replace("\n", "\n  "))

"""`make bench-policy`, small (5 nodes, 200 pods, 20 policies, 400 claims; `make test-tools`): behaviour, not
speed. It prints the POLICY line with the issue's keys, every policy reaches every pod's rules, each change
is measured, and the controller's informer held every claim before its memory was read."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from netclaim_lab.benchmarks import controller_scale, report
from tests.cluster.helpers import run_quick

pytestmark = pytest.mark.tools

POLICY_KEYS = [
    "policy_change_p99_ms",
    "relabel_p99_ms",
    "endpoint_change_p99_ms",
    "largest_object_kib",
    "controller_rss_mib_50k_claims",
    "compile_cpu_s",
]


def test_make_bench_policy_measures_every_change_on_the_controllers_objects(tmp_path: Path) -> None:
    last = run_quick("netclaim_lab.benchmarks.controller_scale", tmp_path)
    assert last.startswith("POLICY "), last
    values = report.bench_values(last)
    assert list(values) == POLICY_KEYS
    quick = controller_scale.QUICK
    result = json.loads((tmp_path / "bench" / "controller.json").read_text())
    assert result["apply"]["policies"] == quick.namespaces * controller_scale.POLICIES_PER_NAMESPACE
    for change in ("policy_change", "relabel", "endpoint_change"):
        assert result[change]["n"] == quick.changes, result[change]
    assert result["rules_objects"] >= quick.nodes  # every node has pods selected
    largest, rss = values["largest_object_kib"], values["controller_rss_mib_50k_claims"]
    assert largest is not None and 0 < largest <= 256
    assert result["memory"]["claims"] == quick.claims
    assert rss is not None and rss > 0

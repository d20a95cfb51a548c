"""`make bench`, small, inside `make test`: every phase runs on the bench's own cluster and the report,
its plots and README's table are written (into a scratch copy). Behaviour only: no figure is asserted."""

from __future__ import annotations

import json
import os
from pathlib import Path

from netclaim_lab.benchmarks import report, suite
from netclaim_lab.layout import ClusterLayout
from tests.cluster.helpers import run_quick

BENCH_KEYS = [key for key, _, _ in report.TARGETS] + ["fullnode_s"]


def test_make_bench_runs_every_phase_and_writes_the_report(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    last = run_quick("netclaim_lab.benchmarks.suite", tmp_path)
    assert last.startswith("BENCH "), last
    assert sorted(report.bench_values(last)) == sorted(BENCH_KEYS)

    result = json.loads((tmp_path / "bench" / "report.json").read_text())
    quick = suite.QUICK
    serial = result["serial"]
    assert serial["pods"] == {"none": quick.serial_pods, "one": quick.serial_pods, "four": quick.serial_pods}
    # every pod was seen by containerd, every claim by the agent: one attach per one-NIC pod
    assert {k: v["n"] for k, v in serial["run_pod_sandbox"].items()} == serial["pods"]
    assert serial["attach_agent_log"]["n"] == quick.serial_pods
    assert serial["prepare_agent_log"]["n"] == serial["unprepare_agent_log"]["n"] == 2 * quick.serial_pods
    assert result["floor"]["add_4"]["n"] == quick.raw_runs
    assert result["burst"]["with_claim_s"]["n"] == result["burst"]["without_claim_s"]["n"] == quick.burst_pods
    assert set(result["burst"]["phases_s"]["with"]) == set(suite.PHASES)
    assert len(result["fullnode"]["ready_series_s"]) == quick.full_node_pods
    assert result["publish"]["start_to_1024_s"]["n"] == quick.publish_runs
    assert result["memory"]["steps_mib"][-1][0] == "netclaim.agent"
    assert result["profile"]["burst"]["busy_samples"] > 0
    assert result["idle"]["node-1"]["rss_mib"] > 0

    page = (tmp_path / "docs" / "benchmarks.md").read_text()
    assert last in page
    for plot in ("attach.svg", "podstart.svg", "rss.svg", "fullnode.svg"):
        assert (tmp_path / report.PLOTS / plot).stat().st_size > 1000
    assert report.readme_table(result) in (tmp_path / "README.md").read_text()
    # the bench took its cluster down (unless told to keep it)
    if os.environ.get("NETCLAIM_KEEP_CLUSTER") != "1":
        assert not ClusterLayout.for_cluster("ncbench").root.exists()

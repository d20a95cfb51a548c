"""`make bench`, small (`make test-tools`: the lab's measuring program, not the product): every phase runs on
the bench's own cluster and the report, and its plots are written (into a scratch copy). Behaviour only: no
figure is asserted."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from netclaim_lab.benchmarks import report, suite
from netclaim_lab.layout import ClusterLayout
from tests.cluster.helpers import run_quick

pytestmark = pytest.mark.tools

BENCH_KEYS = [key for key, _, _ in report.TARGETS]


def test_make_bench_runs_every_phase_and_writes_the_report(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    last = run_quick("netclaim_lab.benchmarks.suite", tmp_path)
    assert last.startswith("BENCH "), last
    assert list(report.bench_values(last)) == BENCH_KEYS

    result = json.loads((tmp_path / "bench" / "report.json").read_text())
    quick = suite.QUICK
    serial = result["serial"]
    pods = {"none": quick.serial_pods, "dra": quick.serial_pods, "one": quick.serial_pods}
    assert serial["pods"] == {**pods, "four": quick.serial_four_pods}
    # every pod was seen by containerd and by both stopwatch plugins, every claim by the agent
    assert {k: v["n"] for k, v in serial["run_pod_sandbox_ms"].items()} == serial["pods"]
    assert {k: v["n"] for k, v in serial["hook_ext_ms"].items()} == serial["pods"]
    assert serial["hook_ext_ms"]["one"]["p50"] > serial["hook_ext_ms"]["none"]["p50"] > 0
    assert serial["attach_agent_log"]["n"] == quick.serial_pods
    # the hook inside the agent: each one-NIC pod's, no longer than from outside, most of it the attach
    inside = serial["hook_agent_log"]
    assert {v["n"] for v in inside.values()} == {quick.serial_pods}
    assert serial["hook_ext_ms"]["one"]["p50"] >= inside["ms"]["p50"] >= inside["attach_ms"]["p50"] > 0
    claims = quick.serial_pods + quick.serial_four_pods
    assert serial["unprepare_agent_log"]["n"] == claims
    # every claim prepared once, or answered again from the node's state after a call kubelet gave up on
    prepared = serial["claims_prepared_repeated"]
    assert len(set(prepared["prepared"])) == len(prepared["prepared"]) == serial["prepare_agent_log"]["n"]
    assert len(set(prepared["prepared"]) | set(prepared["prepare repeated"])) == claims, prepared
    # each one-NIC pod's start cost the agent a GET of its claim at least, counted in the audit log
    requests = serial["api_requests_one_nic"]
    assert requests["start"]["n"] == quick.serial_pods and requests["start"]["min"] >= 1
    assert requests["lifecycle"]["min"] >= requests["start"]["min"]
    assert requests["by_kind"]["get resourceclaims"] >= quick.serial_pods
    assert result["floor"]["add_4"]["n"] == quick.raw_runs
    burst = result["burst"]
    assert {arm: d["n"] for arm, d in burst["pod_ready_s"].items()} == dict.fromkeys(
        ("none", "dra", "netclaim", "pool"), quick.burst_pods
    )
    assert burst["claim_ready_s"]["n"] == burst["hook_ext_ms"]["n"] == quick.burst_pods
    assert burst["ratios"]["p50_vs_dra"]["value"] > 0
    assert burst["pool_ratios"]["p50_vs_dra"]["value"] > 0
    assert set(burst["phases_s"]["dra"]) == set(suite.PHASES)
    # beside the busy tenant: every pod's hook seen by its node's stopwatch; the DaemonSet's request read
    neighbour = result["neighbour"]
    neighbour_pods = quick.burst_pods * quick.neighbour_rounds
    hooks = [d["n"] for d in neighbour["hook_ext_ms"].values()]
    assert neighbour["pod_ready_s"]["n"] == sum(hooks) == neighbour_pods and min(hooks) > 0
    assert neighbour["dra_pod_ready_s"]["n"] == neighbour_pods  # the floor beside the same tenant
    assert neighbour["ratios"]["p50_vs_dra"]["value"] > 0
    assert neighbour["agent_cpu_request"] == "250m"
    assert set(neighbour["nri_reconnects"]) == set(neighbour["hooks_missed"]) == {"node-1", "node-2"}
    assert len(result["fullnode"]["ready_series_s"]) == quick.full_node_pods
    assert result["fullnode"]["agent_filled_mib"]["anon"] > 0
    # the fill's floors, and every arm's pods split into phases (none left out)
    for arm in (result["fullnode"], *result["fullnode"]["floors"].values()):
        assert {p: d["n"] for p, d in arm["phases_s"].items()} == dict.fromkeys(
            suite.PHASES, quick.full_node_pods
        )
    assert result["publish"]["start_to_1024_s"]["n"] == quick.publish_runs
    assert result["memory"]["steps_mib"][-1][0] == "netclaim.agent.main"
    assert result["profile"]["burst"]["busy_samples"] > 0
    assert result["idle"]["node-1"]["rss_mib"] > 0
    assert result["idle"]["node-1"]["container_mib"]["pss"] > 0

    page = (tmp_path / "docs" / "benchmarks.md").read_text()
    assert last in page
    for plot in ("attach.svg", "podstart.svg", "rss.svg", "fullnode.svg"):
        assert (tmp_path / report.PLOTS / plot).stat().st_size > 1000
    # the bench took its cluster down (unless told to keep it)
    if os.environ.get("NETCLAIM_KEEP_CLUSTER") != "1":
        assert not ClusterLayout.for_cluster("ncbench").root.exists()

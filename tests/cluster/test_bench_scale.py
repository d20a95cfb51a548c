"""`make bench-scale`, small (50 nodes, 500 claims), inside `make test`: behaviour, not speed. Every pod is
scheduled, no NIC's bandwidth is oversubscribed, the slices published for the benchmark's nodes are exactly
what an agent publishes, no agent reads more than its own node's share, and the API server's counters agree
with what a watcher received."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from benchmarks import report, scale

from netclaim.cluster.layout import ClusterLayout

ROOT = Path(__file__).resolve().parents[2]
SCALE_KEYS = [
    "nodes",
    "claims",
    "publish_s",
    "sched_pods_per_s",
    "sched_p99_s",
    "agent_events_per_s",
    "agent_rss_mib",
]


def test_make_bench_scale_schedules_everything_and_oversubscribes_nothing(tmp_path: Path) -> None:
    shutil.copy(ROOT / "README.md", tmp_path / "README.md")
    run = subprocess.run(
        [sys.executable, "-m", "benchmarks.scale", "--quick", "--out", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1200,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-4000:]
    last = run.stdout.strip().splitlines()[-1]
    assert last.startswith("SCALE "), run.stdout[-2000:]
    values = report.bench_values(last)
    assert list(values) == SCALE_KEYS
    quick = scale.QUICK
    assert values["nodes"] == quick.nodes

    result = json.loads((tmp_path / "bench" / "scale.json").read_text())
    assert result["slices_match_agents"] == dict.fromkeys(scale.MEASURED, True)
    assert result["mid"]["nodes"] == quick.mid_nodes and result["large"]["nodes"] == quick.nodes
    assert result["large"]["devices"] == sum(
        scale.nic_count(scale.node_name(i)) for i in range(1, quick.nodes + 1)
    )
    plain, claims = result["large"]["without_claims"], result["large"]["with_claims"]
    assert plain["pods"] == claims["pods"] == quick.pods
    assert claims["allocated"] == quick.pods  # every pod scheduled, each with its claim allocated
    assert claims["oversubscribed"] == []
    assert claims["scheduler"]["attempts"].get("scheduled") == quick.pods

    windows = [result["small"]["churn"], result["mid"]["churn"], claims["window"]]
    for window in windows:
        # three agents, one watch each, on their own slices; none on claims
        assert window["agent_watches"] == {"resourceslices": 3, "resourceclaims": 0}
        # the agents' API server keeps no slice watch of its own: what it counted for slices is exactly
        # the probe's and the agents' (their slices did not change: 0); for claims, what its own watchers
        # and the probe received, give or take its own watchers' bookmarks (about one a minute)
        assert window["own_watches"]["resourceslices"] == 0
        assert window["agent_slice_events"] == 0
        assert 0 <= window["agent_claim_events"] <= window["own_bookmarks_at_most"]
        assert window["probe_events"] > 0  # the window saw claim churn
        assert window["agent_wide_reads"] == []
        assert len(window["agent_rss_mib"]) == len(scale.MEASURED)
    assert result["small"]["churn"]["cycles"] >= 1 and result["mid"]["churn"]["cycles"] >= 1

    assert report.scale_table(result) in (tmp_path / "README.md").read_text()
    if os.environ.get("NETCLAIM_KEEP_CLUSTER") != "1":
        assert not ClusterLayout.for_cluster("ncscale").root.exists()

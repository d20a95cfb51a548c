"""`make bench-scale`, small (50 nodes, 500 claims; `make test-tools`, ~4 min): behaviour, not speed. Every
pod is scheduled, no NIC's bandwidth is oversubscribed, the slices published for the benchmark's nodes are
exactly what an agent publishes, no agent reads more than its own node's share, and the API server's counters
agree with what a watcher received."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from netclaim_lab.benchmarks import report, scale
from netclaim_lab.layout import ClusterLayout
from tests.cluster.helpers import run_quick

pytestmark = pytest.mark.tools

SCALE_KEYS = [
    "nodes",
    "claims",
    "publish_s",
    "sched_pods_per_s",
    "sched_p99_s",
    "agent_events_per_s",
    "agent_rss_mib",
    "dense_claims",
    "dense_agent_anon_mib",
    "dense_agent_pss_mib",
    "sched_ratio_vs_dra",
    "sched_ratio_vs_none",
    "ipam_alloc_p99_ms",
    "sched_ratio_vs_dra_shared",
    "sched_ratio_pool_vs_nic",
    "ipam_alloc32_p99_ms",
]


def test_make_bench_scale_schedules_everything_and_oversubscribes_nothing(tmp_path: Path) -> None:
    last = run_quick("netclaim_lab.benchmarks.scale", tmp_path)
    assert last.startswith("SCALE "), last
    values = report.bench_values(last)
    assert list(values) == SCALE_KEYS
    quick = scale.QUICK
    assert values["nodes"] == quick.nodes

    result = json.loads((tmp_path / "bench" / "scale.json").read_text())
    assert result["slices_match_agents"] == dict.fromkeys(scale.MEASURED, True)
    assert result["mid"]["nodes"] == quick.mid_nodes and result["large"]["nodes"] == quick.nodes
    # counted from the listed slices: every node one slice, with all of its NICs (else the run stops)
    assert result["large"]["devices"] == sum(
        scale.nic_count(scale.node_name(i)) for i in range(1, quick.nodes + 1)
    )
    runs = result["large"]["runs"]
    assert {name: len(arm_runs) for name, arm_runs in runs.items()} == {
        "none": 1,
        "dra": 1,
        "dra_shared": 1,
        "netclaim_gpus": 1,
        "netclaim_pool": 1,
        "netclaim": 1,
    }
    # the no-op driver's devices are on every node for its arms and netclaim_gpus, and gone for the others
    assert {name: run["noop_slices"] for name, (run,) in runs.items()} == {
        "none": 0,
        "dra": quick.nodes,
        "dra_shared": quick.nodes,
        "netclaim_gpus": quick.nodes,
        "netclaim_pool": 0,
        "netclaim": 0,
    }
    for name, (run,) in runs.items():
        assert run["pods"] == quick.pods, name
        assert run["scheduler"]["attempts"].get("scheduled") == quick.pods, name
        if name != "none":
            assert run["allocated"] == quick.pods, name  # every pod scheduled, each with its claim allocated
            assert run["profile"]["parts_percent"]["DRA Filter"] > 0, name
            # a second window late in the run (at 50 nodes it may find the scheduler waiting on backoffs)
            assert set(run["profile_late"]["parts_percent"]) == set(scale.PROFILE_PARTS), name
    # every NIC result consumed bandwidth (at least what it asked) and an attachment; no NIC gave more than
    # it has, nor the pool more addresses
    assert runs["netclaim"][0]["allocation_problems"] == []
    assert runs["netclaim_pool"][0]["allocation_problems"] == []
    assert runs["netclaim_gpus"][0]["allocation_problems"] == []
    # every pool claim's address taken by the agents' own code, counted by the controller, then freed by it
    # once the claims were deleted (the run waits for both)
    ipam = runs["netclaim_pool"][0]["ipam"]
    assert ipam["addresses"] == quick.pods and ipam["freed_after_s"] > 0
    # one agent prepared every claim of the dense node over its kubelet socket, and unprepared them
    dense = result["dense"]
    assert dense["claims"] == quick.dense_claims == values["dense_claims"]
    assert dense["prepare_ms"]["n"] == dense["unprepare_ms"]["n"] == quick.dense_claims
    assert all(dense["memory_mib"][when]["anon"] > 0 for when in ("idle", "prepared", "unprepared"))
    summary = result["large"]["summary"]
    assert values["sched_ratio_vs_dra"] == round(summary["netclaim"]["ratio_vs_dra"], 2)
    assert values["sched_ratio_vs_dra_shared"] == round(summary["netclaim"]["ratio_vs_dra_shared"], 2)
    assert values["sched_ratio_pool_vs_nic"] == round(summary["netclaim_pool"]["ratio_vs_netclaim"], 2)
    assert values["ipam_alloc32_p99_ms"] == round(ipam["bulk_p99_ms"])

    others = {"small": 0, "mid": (quick.mid_nodes - 3) // 10, "large": (quick.nodes - 3) // 10}
    for stage, toggled in others.items():
        window = result[stage]["churn"]
        assert window["cycles"] >= 1 and window["probe_events"] > 0  # the window saw claim churn
        # three agents, one watch each, on their own slices; none on claims
        assert window["agent_watches"] == {"resourceslices": 3, "resourceclaims": 0}
        # every measured node's slice changed twice, and a tenth of the others': a watch on every slice
        # was sent all of those changes; each agent exactly its own node's two
        assert window["changed_nodes"] == 3 + toggled
        assert window["slice_probe_events"] == 2 * (3 + toggled)
        assert window["own_watches"]["resourceslices"] == 0
        assert window["agent_slice_events"] == 2 * 3
        # for claims the counter agrees with what the API server's own watcher and the probe received,
        # give or take that watcher's bookmarks
        assert 0 <= window["agent_claim_events"] <= window["own_bookmarks_allowed"]
        assert window["agent_wide_reads"] == []
        assert len(window["agent_rss_mib"]) == len(scale.MEASURED)
    # the agents' requests in the windows: their own slices after each change, and their Node's condition
    # once (an agent's first write: their slices were published before they started)
    assert {
        k.split()[1] for w in (result[s]["churn"] for s in others) for k in w["agent_requests_by_kind"]
    } <= {
        "resourceslices",
        "nodes",
        "nodes/status",
    }

    assert report.scale_table(result) in (tmp_path / "docs" / "scale.md").read_text()
    if os.environ.get("NETCLAIM_KEEP_CLUSTER") != "1":
        assert not ClusterLayout.for_cluster("ncscale").root.exists()

"""make bench-scale's pure parts: the audit log's agent requests and which are wide, Prometheus histogram
quantiles, the SCALE line and docs/scale.md's table, the node keeper's Lease time."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
import tempfile
from pathlib import Path
from typing import Any

import pytest
from lightkube.models.coordination_v1 import LeaseSpec
from lightkube.resources.resource_v1 import ResourceSlice

from netclaim.core.names import DRIVER_DOMAIN
from netclaim_lab import keeper
from netclaim_lab.benchmarks import arms, measure, report, scale

NODE_EXTRA = {measure.NODE_NAME_EXTRA: ["node-1"]}


def _entry(
    audit_id: str, verb: str, uri: str, resource: str, name: str = "", **extra: str
) -> dict[str, object]:
    ref: dict[str, str] = {"resource": resource, **extra}
    if name:
        ref["name"] = name
    return {
        "auditID": audit_id,
        "stage": "ResponseComplete",
        "verb": verb,
        "requestURI": uri,
        "objectRef": ref,
        "user": {"username": measure.AGENT_USER, "extra": NODE_EXTRA},
    }


def _write(path: Path, entries: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(e) + "\n" for e in entries))
    return path


def test_named_reads_and_own_node_selectors_are_narrow_everything_else_is_wide(tmp_path: Path) -> None:
    slices = "/apis/resource.k8s.io/v1/resourceslices"
    rules = "/api/v1/namespaces/netclaim-system/configmaps?labelSelector=netclaim.dev%2Fpolicy-rules+in+"
    entries = [
        _entry("1", "get", "/apis/resource.k8s.io/v1/namespaces/a/resourceclaims/c", "resourceclaims", "c"),
        _entry(
            "2",
            "watch",
            f"{slices}?fieldSelector=spec.nodeName%3Dnode-1%2Cspec.driver%3Dnetclaim.dev&watch=true",
            "resourceslices",
        ),
        _entry(
            "3",
            "list",
            "/apis/netclaim.dev/v1alpha1/ipallocations?labelSelector=netclaim.dev%2Fclaim-uid%3Du",
            "ipallocations",
        ),
        _entry(
            "4",
            "patch",
            "/apis/resource.k8s.io/v1/namespaces/a/resourceclaims/c/status",
            "resourceclaims",
            "c",
            subresource="status",
        ),
        _entry("5", "create", "/api/v1/namespaces/a/events", "events"),
        # the admin's pools: as many as the admin made, whatever the cluster's size
        _entry("5b", "list", "/apis/netclaim.dev/v1alpha1/ippools", "ippools"),
        # the policy guards and its own node's rules: two ConfigMaps
        _entry("5c", "watch", f"{rules}%28guards%2Cnode-1%29&watch=true", "configmaps"),
        # wide: another node's slices, every slice, every claim
        _entry("6", "list", f"{slices}?fieldSelector=spec.nodeName%3Dnode-2", "resourceslices"),
        _entry("7", "watch", f"{slices}?watch=true", "resourceslices"),
        _entry("8", "watch", "/apis/resource.k8s.io/v1/resourceclaims?watch=true", "resourceclaims"),
        _entry(
            "9",
            "list",
            "/apis/netclaim.dev/v1alpha1/ipallocations?labelSelector=netclaim.dev%2Fpool%21%3Dx",
            "ipallocations",
        ),
        _entry("9b", "list", f"{rules}%28guards%2Cnode-2%29", "configmaps"),  # another node's
        {
            **_entry("10", "watch", "/api/v1/pods?watch=true", "pods"),
            "user": {"username": "system:kube-scheduler"},
        },
    ]
    requests = measure.agent_requests(_write(tmp_path / "audit.log", entries))
    assert [r.resource for r in requests][3] == "resourceclaims/status"
    assert [r.node for r in requests] == ["node-1"] * 12  # the scheduler's entry is not an agent's
    wide = [r.wide() for r in requests]
    assert wide[:7] == [None] * 7
    assert all(wide[7:]) and "node-2" in str(wide[7]) and "resourceclaims" in str(wide[9])
    assert "pool!=x" in str(wide[10])  # every pool's but one
    assert "guards,node-2" in str(wide[11])


def test_a_request_logged_at_two_stages_counts_once_and_a_half_written_line_is_skipped(
    tmp_path: Path,
) -> None:
    started = {**_entry("1", "watch", "/apis/x?watch=true", "resourceslices"), "stage": "ResponseStarted"}
    done = _entry("1", "watch", "/apis/x?watch=true", "resourceslices")
    path = _write(tmp_path / "audit.log", [started, done])
    with path.open("a") as log:
        log.write('{"auditID": "2", "verb": "ge')
    assert len(measure.agent_requests(path)) == 1


def test_histogram_quantile_interpolates_within_the_bucket_as_prometheus_does() -> None:
    buckets = [(0.1, 50.0), (0.2, 90.0), (0.4, 100.0), (float("inf"), 100.0)]
    assert scale.histogram_quantile(buckets, 0.5) == pytest.approx(0.1)
    assert scale.histogram_quantile(buckets, 0.7) == pytest.approx(0.15)
    assert scale.histogram_quantile(buckets, 0.99) == pytest.approx(0.38)
    with pytest.raises(ValueError, match="no samples"):
        scale.histogram_quantile([(0.1, 0.0), (float("inf"), 0.0)], 0.5)


def test_every_node_has_two_to_eight_nics() -> None:
    counts = {scale.nic_count(scale.node_name(i)) for i in range(1, 501)}
    assert counts == set(range(2, 9))


def _window(events: float, rss: float, slices: int) -> dict[str, object]:
    return {
        "agent_events_per_agent": events,
        "agent_events_per_s": events / 60,
        "slice_probe_events": slices,
        "probe_events_per_s": 100.0,
        "agent_rss_mean_mib": rss,
    }


def _run(pods_per_s: float, algorithm_p99_s: float, **extra: object) -> dict[str, object]:
    return {
        "allocated": 5000,
        "pods_per_s": pods_per_s,
        "scheduler": {"attempt_p99_s": 1.5, "algorithm_p99_s": algorithm_p99_s},
        **extra,
    }


def _ipam(alone_p99_ms: float, bulk_p99_ms: float = 90.0) -> dict[str, float]:
    return {
        "bulk_p50_ms": 40.0,
        "bulk_p99_ms": bulk_p99_ms,
        "bulk_per_s": 700.0,
        "alloc_p50_ms": 12.0,
        "alloc_p99_ms": alone_p99_ms,
        "status_counted_after_s": 1.5,
        "claims_deleted_s": 380.0,
        "freed_after_s": 4.2,
        "controller_rss_mib": 80.0,
    }


def _scale_result() -> dict[str, Any]:
    runs = {  # three runs of each arm: the medians and ranges are what is reported
        "none": [_run(r, 0.02) for r in (200.0, 240.0, 150.0)],
        "dra": [_run(r, 0.05) for r in (100.0, 90.0, 110.0)],
        "dra_shared": [_run(r, 0.08) for r in (100.0, 80.0, 100.0)],
        "netclaim_pool": [
            _run(r, 0.2, ipam=_ipam(p, b))
            for r, p, b in ((40.0, 30.0, 400.0), (45.0, 80.0, 300.0), (35.0, 50.0, 500.0))
        ],
        "netclaim": [_run(r, 0.1) for r in (80.0, 85.0, 75.0)],
        "netclaim_gpus": [_run(r, 0.3) for r in (30.0, 25.0, 20.0)],
    }
    result: dict[str, Any] = {
        "sizes": {"nodes": 500, "mid_nodes": 100, "churn_pods": 30, "pods": 5000, "repeats": 3},
        "publish_s": 3.2,
        "small": {"churn": _window(2, 75.4, 6)},
        "mid": {"added": 97, "churn": _window(2, 75.4, 24)},
        "large": {
            "added": 400,
            "churn": _window(2, 75.5, 104),
            "runs": runs,
            "summary": scale.arms_summary(runs),
        },
        "dense": {
            "claims": 1000,
            "memory_mib": {
                "idle": {"rss": 66.0, "anon": 40.0, "pss": 60.0},
                "prepared": {"rss": 80.5, "anon": 54.25, "pss": 74.0},
                "unprepared": {"rss": 79.0, "anon": 53.0, "pss": 73.0},
            },
            "prepare_ms": measure.distribution([10.0] * 98 + [30.0, 40.0]),
            "unprepare_ms": measure.distribution([20.0] * 50),
        },
    }
    result["scale_line"] = scale.scale_line(result)
    return result


def test_the_scale_line_and_docs_table_come_from_the_result() -> None:
    result = _scale_result()
    summary = result["large"]["summary"]
    assert summary["netclaim"]["pods_per_s_median"] == 80.0 and summary["dra"]["pods_per_s_median"] == 100.0
    assert summary["netclaim"]["ratio_vs_dra"] == pytest.approx(0.8)
    assert summary["netclaim"]["ratio_vs_none"] == pytest.approx(0.4)
    assert summary["netclaim_pool"]["ratio_vs_dra"] == pytest.approx(0.4)
    assert summary["netclaim_gpus"]["ratio_vs_dra"] == pytest.approx(0.25)
    assert summary["ipam_alloc_p99_ms_median"] == 50.0
    assert summary["netclaim"]["ratios_vs_dra_shared"] == pytest.approx([0.8, 85 / 80, 0.75])
    assert summary["netclaim"]["ratio_vs_dra_shared"] == pytest.approx(0.8)
    assert summary["netclaim_pool"]["ratios_vs_netclaim"] == pytest.approx([0.5, 45 / 85, 35 / 75])
    assert summary["netclaim_pool"]["ratio_vs_netclaim"] == pytest.approx(0.5)
    assert result["scale_line"] == (
        "SCALE nodes=500 claims=5000 publish_s=3.20 sched_pods_per_s=80.0 sched_p99_s=1.500 "
        "agent_events_per_s=0.033 agent_rss_mib=75.5 dense_claims=1000 dense_agent_anon_mib=54.2 "
        "dense_agent_pss_mib=74.0 sched_ratio_vs_dra=0.80 sched_ratio_vs_none=0.40 "
        "ipam_alloc_p99_ms=50 sched_ratio_vs_dra_shared=0.80 sched_ratio_pool_vs_nic=0.50 "
        "ipam_alloc32_p99_ms=400"
    )
    table = report.scale_table(result)
    assert "| 3, 30 | 100, 30 | 500, 5,000 + 30 |" in table
    assert "| 2 | 2 | 2 |" in table and "| 6 | 24 | 104 |" in table and "| 75.4 | 75.4 | 75.5 |" in table
    assert (
        "200.0 (150.0 to 240.0) / 100.0 (90.0 to 110.0) / 100.0 (80.0 to 100.0) / 80.0 (75.0 to 85.0) / "
        "40.0 (35.0 to 45.0) / 25.0 (20.0 to 30.0)" in table
    )
    assert "| 0.80 (0.80, 1.06, 0.75); 0.50 (0.50, 0.53, 0.47) |" in table
    assert "| 0.80; 0.40; 0.25 |" in table and "| 0.40; 0.20; 0.12 |" in table
    assert "| 20.0 / 50.0 / 80.0 / 100.0 / 200.0 / 300.0 |" in table
    assert "40 / 400, 700/s; 12 / 50 |" in table and "| 1.5; 380, 4.2; 80.0 |" in table
    assert "publish 497 nodes' slices" in table
    assert "| 66.0 / 40.0 / 60.0; 80.5 / 54.2 / 74.0; 79.0 / 53.0 / 73.0; 10.0 / 30.0, 20.0 / — |" in table


def test_the_scale_table_is_written_into_docs_scale_md_between_its_markers(tmp_path: Path) -> None:
    result = _scale_result()
    document = tmp_path / "docs" / "scale.md"
    document.parent.mkdir()
    document.write_text(
        f"# scale\n\nbefore\n\n{report.SCALE_BEGIN}\nold table\n{report.SCALE_END}\n\nafter\n"
    )
    report.render_scale(result, tmp_path)
    written = document.read_text()
    assert "old table" not in written and report.scale_table(result) in written
    assert written.startswith("# scale\n\nbefore") and written.endswith("after\n")
    document.write_text("# scale\n")  # no markers: an error naming them, not a silent skip
    with pytest.raises(SystemExit, match="scale:begin"):
        report.render_scale(result, tmp_path)


def test_lease_renew_times_are_written_with_their_six_fraction_digits() -> None:
    """The API server refuses a Lease's renewTime without them (a MicroTime)."""
    written = LeaseSpec(renewTime=keeper._micro_now()).to_dict()["renewTime"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z", written), written


def test_discovery_is_not_a_read_and_the_answer_is_kept(tmp_path: Path) -> None:
    discovery = {**_entry("1", "get", "/apis", ""), "responseStatus": {"code": 200}}
    refused = {**_entry("2", "list", "/api/v1/secrets", "secrets"), "responseStatus": {"code": 403}}
    requests = measure.agent_requests(_write(tmp_path / "audit.log", [discovery, refused]))
    assert [(r.wide() is None, r.code) for r in requests] == [(True, 200), (False, 403)]


def test_the_arm_beside_the_no_op_devices_runs_in_the_first_repeat_only() -> None:
    names = [[arm.name for arm in scale.arms_of_repeat(scale.FULL, repeat)] for repeat in range(3)]
    assert names == [
        ["none", "dra", "dra_shared", "netclaim_gpus", "netclaim_pool", "netclaim"],
        ["none", "dra", "dra_shared", "netclaim_pool", "netclaim"],
        ["none", "dra", "dra_shared", "netclaim_pool", "netclaim"],
    ]
    only = dataclasses.replace(scale.FULL, only=("netclaim_gpus", "netclaim"))
    assert [arm.name for arm in scale.arms_of_repeat(only, 1)] == ["netclaim"]


def test_the_shared_no_op_devices_are_the_nodes_nics_with_netclaims_request_policy() -> None:
    """What separates DRA's consumable capacity from netclaim's attributes: the same NICs, bandwidth and
    request policy as the agent publishes for the node, four attributes and no other capacity."""
    node = scale.node_name(3)
    body = arms.noop_slice(node, scale.nic_count(node))
    devices = ResourceSlice.from_dict(body).to_dict()["spec"]["devices"]  # through the API's own model
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        nics = asyncio.run(scale.node_devices(scale.write_inventory(work, node), scale.virtual_policy(work)))
    assert len(devices) == len(nics) == 4
    for device, nic in zip(devices, nics, strict=True):
        assert device["allowMultipleAllocations"] is True
        assert device["capacity"] == {"bandwidth": nic.to_api()["capacity"][f"{DRIVER_DOMAIN}/bandwidth"]}
        assert sorted(device["attributes"]) == ["driverVersion", "index", "model", "uuid"]
    claim = arms.noop_shared_claim("c", "ns", "5G")["spec"]["devices"]["requests"][0]["exactly"]
    assert claim == {"deviceClassName": arms.NOOP_DRIVER, "capacity": {"requests": {"bandwidth": "5G"}}}


def test_an_unknown_arm_for_only_is_refused_naming_the_known_ones(capsys: pytest.CaptureFixture[str]) -> None:
    """Before, `--only netclaim_nic` ran no arm and still wrote its file: 0.7 min of nothing."""
    with pytest.raises(SystemExit) as exited:
        scale.main(["--only", "netclaim,netclaim_nic"])
    assert exited.value.code == 2
    known = "none, dra, dra_shared, netclaim_gpus, netclaim_pool, netclaim"
    assert f"--only: no arm netclaim_nic (arms: {known})" in capsys.readouterr().err

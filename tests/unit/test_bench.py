"""make bench's own logic: percentiles, what it reads from containerd's log and py-spy, the report."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from netclaim_lab.benchmarks import measure, report, suite


def test_percentiles_are_measured_values_by_nearest_rank() -> None:
    values = [float(v) for v in range(100, 0, -1)]
    d = measure.distribution(values)
    assert (d["n"], d["p50"], d["p90"], d["p99"], d["min"], d["max"]) == (100, 50, 90, 99, 1, 100)
    assert measure.distribution([7.0])["p99"] == 7.0
    with pytest.raises(ValueError, match="measured nothing"):
        measure.distribution([])


def test_run_pod_sandbox_spans_are_read_from_containerds_log(tmp_path: Path) -> None:
    log = tmp_path / "containerd.log"
    uid = "1f2aa80c-0daa-4109-9cbf-510a6b6dae44"
    other = "99999999-0daa-4109-9cbf-510a6b6dae44"
    meta = f'name:\\"p\\"  uid:\\"{uid}\\"  namespace:\\"bench\\"'
    at = 'time="2026-11-30T09:11:2'
    lines = [
        f'{at}0.000000000Z" level=info msg="unrelated"',
        f'{at}1.000000000Z" level=info msg="RunPodSandbox for {meta}"',
        f'{at}1.100000000Z" level=error msg="RunPodSandbox for {meta} failed, x"',
        # kubelet retried
        f'{at}2.000000000Z" level=info msg="RunPodSandbox for {meta}"',
        f'{at}2.250000000Z" level=info msg="RunPodSandbox for {meta} returns sandbox id x"',
        f'{at}3.000000000Z" level=info msg="RunPodSandbox for {meta.replace(uid, other)}"',
    ]
    log.write_text("\n".join(lines) + "\n")
    durations = measure.run_pod_sandbox_ms(log, 0, {uid, other})
    assert list(durations) == [uid]  # the other one never returned
    assert durations[uid] == pytest.approx(250, abs=0.01)
    assert measure.run_pod_sandbox_ms(log, log.stat().st_size, {uid}) == {}  # from the offset on only


def test_busy_profile_counts_the_main_threads_work_not_its_waits(tmp_path: Path) -> None:
    stacks = tmp_path / "raw.txt"
    root = "thread (1): MainThread;<module> (netclaim:7);main (netclaim/cli.py:294);_run (asyncio/e.py:80)"
    attach = f"{root};Attacher.attach (netclaim/configure/attach.py:110)"
    stacks.write_text(
        "\n".join(
            [
                f"{root};EpollSelector.select (selectors.py:468) 500",  # waiting: not counted
                f"{attach};interface (netclaim/adapters/netlink.py:170);decode (pyroute2/base.py:9) 30",
                f"{attach};Store.put (netclaim/configure/store.py:214);execute (sqlite3/x.py:1) 10",
                f"{root};publish_loop (netclaim/publish/loop.py:60);links (netclaim/adapters/n.py:113) 60",
                "thread (2): grpc;poll (grpc/x.py:1) 1000",  # another thread
            ]
        )
        + "\n"
    )
    whole = measure.busy_profile(stacks)
    assert whole["busy_samples"] == 100
    assert whole["functions"][0] == ["publish_loop (publish/loop.py)", 60.0]
    assert ["netlink", 60.0] not in whole["packages"] and ["netclaim", 60.0] in whole["packages"]
    under = measure.busy_profile(stacks, "Attacher.attach")
    assert under["busy_samples"] == 40
    assert under["functions"][:2] == [
        ["Attacher.attach (configure/attach.py)", 100.0],
        ["interface (adapters/netlink.py)", 75.0],
    ]
    assert under["packages"] == [["pyroute2", 75.0], ["sqlite3", 25.0]]


def _distribution(p50: float) -> dict[str, Any]:
    return measure.distribution([p50 * 0.9, p50, p50 * 1.2])


def sample_result() -> dict[str, Any]:
    phases = {p: _distribution(0.5) for p in suite.PHASES}
    result: dict[str, Any] = {
        "when": "2026-11-30T10:00:00+00:00",
        "seconds": 900.0,
        "sizes": dataclasses.asdict(suite.FULL),
        "machine": {"cpus": 2, "memory_gib": 23.5, "kernel": "6.18", "python": "3.11.7"},
        "idle": {
            n: {"rss_mib": 70.0, "cpu_mcores": 2.0, "seconds": 59.0, "rss_series": [[0, 70.0], [1, 70.1]]}
            for n in ("node-1", "node-2")
        },
        "floor": {
            k: _distribution(v) for k, v in (("add_1", 9), ("del_1", 20), ("add_4", 36), ("del_4", 80))
        },
        "serial": {
            "run_pod_sandbox": {k: _distribution(v) for k, v in (("none", 100), ("one", 115), ("four", 180))},
            "added_by_netclaim_1": _distribution(15),
            "added_by_netclaim_4": _distribution(80),
            "attach_agent_log": _distribution(12),
            "cni_add_agent_log": _distribution(10),
            "prepare_agent_log": _distribution(5),
            "unprepare_agent_log": _distribution(10),
            "pods": {"none": 3, "one": 3, "four": 3},
        },
        "burst": {
            "without_claim_s": _distribution(4),
            "with_claim_s": _distribution(6),
            "ratio_p50": 1.5,
            "ratio_p99": 1.5,
            "peak_rss_mib": 80.0,
            "rss_series": [[0, 75.0], [0.1, 80.0]],
            "machine_cpu_s": {
                arm: {"seconds": 20.0, "top": [["containerd", 10.0], ["kube-apiserver", 5.0]]}
                for arm in ("without", "with")
            },
            "phases_s": {"without": phases, "with": phases},
        },
        "fullnode": {
            "pods": 110,
            "all_ready_s": 60.0,
            "ready_series_s": [1.0, 2.0, 60.0],
            "agent_rss_end_mib": 85.0,
            "agent_peak_rss_mib": 90.0,
            "agent_cpu_mcores_during": 150.0,
            "rss_series": [[0, 75.0], [0.5, 90.0]],
        },
        "publish": {"start_to_1024_s": _distribution(2.5), "nic_added_s": _distribution(0.12)},
        "memory": {
            "steps_mib": [["asyncio", 11.0], ["netclaim.agent", 11.0]],
            "python_mib": 9.0,
            "after_imports_mib": 68.0,
        },
        "profile": {
            k: {
                "busy_samples": 10,
                "functions": [["Attacher.attach (configure/attach.py)", 100.0]],
                "packages": [["pyroute2", 60.0]],
            }
            for k in ("attach", "prepare", "burst")
        },
    }
    result["bench_line"] = suite.bench_line(result)
    return result


def test_the_bench_line_has_every_field_the_issue_names_once_in_order() -> None:
    line = sample_result()["bench_line"]
    assert line.startswith("BENCH ") and "\n" not in line
    keys = [pair.split("=")[0] for pair in line.split()[1:]]
    assert keys == [
        "attach_ratio",
        "attach4_p99_ms",
        "prepare_p99_ms",
        "podstart_p50_ratio",
        "podstart_p99_ratio",
        "rss_idle_mib",
        "cpu_idle_mcores",
        "publish1024_s",
        "fullnode_s",
    ]
    values = report.bench_values(line)
    assert values["attach_ratio"] == pytest.approx(12 / 9, abs=0.01)
    assert values["fullnode_s"] == 60.0


def test_the_report_the_plots_and_readmes_table_come_from_one_result(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    readme = tmp_path / "README.md"
    readme.write_text(f"# x\n\nbefore\n\n{report.README_BEGIN}\nold table\n{report.README_END}\n\nafter\n")
    result = sample_result()
    report.render(json.loads(json.dumps(result)), tmp_path)
    text = (tmp_path / "docs" / "benchmarks.md").read_text()
    assert result["bench_line"] in text
    assert "| attach p50 ÷ raw plugin exec p50, one NIC | ≤ 1.2 | 1.33 | **missed** (see below) |" in text
    assert "| agent idle RSS (MiB) | ≤ 60 | 70 | **missed** (see below) |" in text
    assert "| NodePrepareResources per claim, p99 (ms) | ≤ 20 | 6 | met |" in text
    for plot in ("attach.svg", "podstart.svg", "rss.svg", "fullnode.svg"):
        assert (tmp_path / report.PLOTS / plot).read_text().startswith("<?xml")
    updated = readme.read_text()
    assert "old table" not in updated and updated.startswith("# x\n\nbefore") and updated.endswith("after\n")
    assert "| agent idle RSS (MiB) | ≤ 60 | 70 |" in updated
    first_svg = (tmp_path / report.PLOTS / "rss.svg").read_bytes()
    report.render(result, tmp_path)  # the same data gives the same files
    assert (tmp_path / report.PLOTS / "rss.svg").read_bytes() == first_svg


def test_a_readme_without_the_table_markers_is_an_error_not_a_silent_skip(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text("# x\n")
    with pytest.raises(SystemExit, match="bench:begin"):
        report.render(sample_result(), tmp_path)

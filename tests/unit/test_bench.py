"""make bench's own logic: percentiles, what it reads from containerd's log and py-spy, the report."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import pytest

from netclaim_lab.benchmarks import measure, report, stopwatch, suite


def test_percentiles_are_measured_values_by_nearest_rank_with_their_bootstrap_intervals() -> None:
    values = [float(v) for v in range(100, 0, -1)]
    d = measure.distribution(values)
    assert (d["n"], d["p50"], d["p90"], d["p99"], d["min"], d["max"]) == (100, 50, 90, 99, 1, 100)
    low, high = d["ci95"]["p50"]
    assert low < 50 < high and high - low < 25  # an interval around the median, narrower than the range
    assert d["ci95"]["p99"][1] <= 100
    assert measure.distribution(values) == d  # seeded: the same samples, the same intervals
    with pytest.raises(ValueError, match="measured nothing"):
        measure.distribution([])


def test_counts_have_quantiles_and_intervals_too() -> None:
    """make bench died at the end of its serial phase: the requests per pod are ints, which scipy's
    bootstrap refused ("`p` must have real floating dtype")."""
    found = measure.distribution([3, 3, 4, 3, 5, 3, 3, 4, 3, 3, 3])
    assert found["p50"] == 3.0 and found["ci95"]["p50"] == [3.0, 4.0]  # 3 of 11 samples are above 3


def test_a_quantile_needs_its_samples_no_maximum_passes_as_p99() -> None:
    d = measure.distribution([float(v) for v in range(1, 11)])
    assert (d["p50"], d["p90"], d["p99"]) == (5, 9, None)
    assert set(d["ci95"]) == {"p50", "p90"}
    assert measure.distribution([7.0])["p90"] is None
    assert measure.ratio([1.0] * 50, [2.0] * 50, 99) == {"value": None, "ci95": None}


def test_a_ratio_of_quantiles_has_its_interval_from_both_samples_resampled() -> None:
    slow = [2.0 + i / 100 for i in range(100)]
    fast = [1.0 + i / 100 for i in range(100)]
    found = measure.ratio(slow, fast, 50)
    assert found["value"] == pytest.approx(2.49 / 1.49)
    low, high = found["ci95"]
    assert low < found["value"] < high
    assert measure.ratio(fast, fast, 50)["value"] == 1.0


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


def test_pod_marks_take_the_first_container_of_the_pods_last_sandbox(tmp_path: Path) -> None:
    log = tmp_path / "containerd.log"
    uid = "1f2aa80c-0daa-4109-9cbf-510a6b6dae44"
    meta = f'name:\\"p\\"  uid:\\"{uid}\\"  namespace:\\"bench\\"'
    at = 'time="2026-11-30T09:11:2'

    def container(second: str, sandbox: str, container_id: str) -> list[str]:
        return [
            f'{at}{second}.100000000Z" level=info msg="CreateContainer within sandbox \\"{sandbox}\\" '
            f'for container name:\\"main\\""',
            f'{at}{second}.300000000Z" level=info msg="CreateContainer within sandbox \\"{sandbox}\\" '
            f'for name:\\"main\\" returns container id \\"{container_id}\\""',
            f'{at}{second}.310000000Z" level=info msg="StartContainer for \\"{container_id}\\""',
            f'{at}{second}.700000000Z" level=info msg="StartContainer for \\"{container_id}\\" '
            'returns successfully"',
        ]

    lines = [
        f'{at}0.000000000Z" level=info msg="RunPodSandbox for {meta}"',
        f'{at}0.500000000Z" level=info msg="RunPodSandbox for {meta} returns sandbox id \\"aaaa\\""',
        *container("1", "aaaa", "c1c1"),  # the first sandbox's container; the sandbox then died
        f'{at}2.000000000Z" level=info msg="RunPodSandbox for {meta}"',
        f'{at}2.250000000Z" level=info msg="RunPodSandbox for {meta} returns sandbox id \\"bbbb\\""',
        *container("3", "cccc", "d0d0"),  # another pod's
        *container("4", "bbbb", "c2c2"),
        *container("5", "bbbb", "c3c3"),  # a second container of the pod: not the first
    ]
    log.write_text("\n".join(lines) + "\n")
    marks = measure.pod_marks(log, 0, {uid})
    assert list(marks) == [uid]
    assert marks[uid].sandbox[1] - marks[uid].sandbox[0] == pytest.approx(0.25, abs=1e-6)
    assert marks[uid].created - marks[uid].sandbox[1] == pytest.approx(4.3 - 2.25, abs=1e-6)
    assert marks[uid].started - marks[uid].created == pytest.approx(0.4, abs=1e-6)
    assert measure.pod_marks(log, log.stat().st_size, {uid}) == {}


def test_busy_profile_counts_the_main_threads_work_not_its_waits(tmp_path: Path) -> None:
    stacks = tmp_path / "raw.txt"
    root = "thread (1): MainThread;<module> (netclaim:7);main (netclaim/cli/main.py:29);_run (asyncio/e.py:8)"
    attach = f"{root};Attacher.attach (netclaim/agent/pods/attach.py:110)"
    stacks.write_text(
        "\n".join(
            [
                f"{root};EpollSelector.select (selectors.py:468) 500",  # waiting: not counted
                f"{attach};interface (netclaim/adapters/netlink.py:170);decode (pyroute2/base.py:9) 30",
                f"{attach};Store.put (netclaim/agent/store.py:214);execute (sqlite3/x.py:1) 10",
                f"{root};publish_loop (netclaim/agent/publish/loop.py:6);links (netclaim/adapters/n.py:1) 60",
                "thread (2): grpc;poll (grpc/x.py:1) 1000",  # another thread
                "thread (0x7f1): MainThread;",  # no count: a line make bench died on
            ]
        )
        + "\n"
    )
    whole = measure.busy_profile(stacks)
    assert whole["busy_samples"] == 100
    assert whole["functions"][0] == ["publish_loop (agent/publish/loop.py)", 60.0]
    assert ["netlink", 60.0] not in whole["packages"] and ["netclaim", 60.0] in whole["packages"]
    under = measure.busy_profile(stacks, "Attacher.attach")
    assert under["busy_samples"] == 40
    assert under["functions"][:2] == [
        ["Attacher.attach (agent/pods/attach.py)", 100.0],
        ["interface (adapters/netlink.py)", 75.0],
    ]
    assert under["packages"] == [["pyroute2", 75.0], ["sqlite3", 25.0]]


def _distribution(p50: float, n: int = 3) -> dict[str, Any]:
    return measure.distribution([p50 * 0.9] * (n // 2) + [p50] + [p50 * 1.2] * (n - n // 2 - 1))


def _memory(anon: float) -> dict[str, float]:
    return {"anon": anon, "usage": anon + 20, "pss": anon + 5, "rss": anon + 10}


def sample_result() -> dict[str, Any]:
    arms = {"none": 4.0, "dra": 4.5, "netclaim": 5.4, "pool": 5.9}
    pod_ready = {arm: [v * (1 + i / 1000) for i in range(120)] for arm, v in arms.items()}
    phases = {p: _distribution(0.5) for p in suite.PHASES}
    busy = [4.2 * (1 + i / 1000) for i in range(60)]
    result: dict[str, Any] = {
        "when": "2026-11-30T10:00:00+00:00",
        "seconds": 900.0,
        "sizes": dataclasses.asdict(suite.FULL),
        "machine": {"cpus": 2, "memory_gib": 23.5, "kernel": "6.18", "python": "3.11.7"},
        "idle": {
            n: {
                "rss_mib": 70.0,
                "container_mib": _memory(55.0),
                "cpu_mcores": 2.0,
                "seconds": 59.0,
                "rss_series": [[0, 70.0], [1, 70.1]],
            }
            for n in ("node-1", "node-2")
        },
        "floor": {
            k: _distribution(v) for k, v in (("add_1", 9), ("del_1", 20), ("add_4", 36), ("del_4", 80))
        },
        "serial": {
            "run_pod_sandbox_ms": {
                k: _distribution(v) for k, v in (("none", 100), ("dra", 100), ("one", 115), ("four", 180))
            },
            "hook_ext_ms": {
                k: _distribution(v) for k, v in (("none", 1), ("dra", 1), ("one", 12), ("four", 50))
            },
            "pod_ready_s": {
                k: _distribution(v) for k, v in (("none", 1), ("dra", 1.1), ("one", 1.2), ("four", 1.5))
            },
            "claim_ready_s": {k: _distribution(v) for k, v in (("one", 1.3), ("four", 1.6))},
            "api_requests_one_nic": {
                "start": _distribution(5),
                "lifecycle": _distribution(7),
                "by_kind": {"get resourceclaims": 6, "patch resourceclaims/status": 6},
                "others": 4,
            },
            "attach_agent_log": _distribution(11),
            "hook_agent_log": {k: _distribution(v) for k, v in HOOK_PARTS_SAMPLE},
            "cni_add_agent_log": _distribution(10),
            "prepare_agent_log": _distribution(5),
            "unprepare_agent_log": _distribution(10),
            "claims_prepared_repeated": {"prepared": ["ns/c1"], "prepare repeated": []},
            "pods": {"none": 3, "dra": 3, "one": 3, "four": 3},
        },
        "neighbour": {
            "burner_cpu": "1",
            "agent_cpu_request": "250m",
            "hook_ext_ms": {"node-1": _distribution(41), "node-2": _distribution(38)},
            "pod_ready_s": _distribution(4.2),
            "dra_pod_ready_s": _distribution(3.5),
            "ratios": {
                f"p{q}_vs_dra": measure.ratio(busy, [v * 3.5 / 4.2 for v in busy], q) for q in (50, 99)
            },
            "nri_reconnects": {"node-1": 1, "node-2": 0},
            "hooks_missed": {"node-1": 7, "node-2": 0},
        },
        "burst": {
            "pod_ready_s": {arm: measure.distribution(v) for arm, v in pod_ready.items()},
            "claim_ready_s": _distribution(6),
            "hook_ext_ms": _distribution(14),
            "hook_empty_ext_ms": _distribution(3),
            "hook_agent_log": {k: _distribution(v) for k, v in HOOK_PARTS_SAMPLE},
            "cni_add_agent_log": _distribution(9),
            "raw_add_beside_ms": {"dra": _distribution(11), "netclaim": _distribution(13)},
            "raw_hook_ms": {"add": _distribution(12), "hook": _distribution(12.5)},
            "ratios": {
                f"p{q}_vs_{base}": measure.ratio(pod_ready["netclaim"], pod_ready[base], q)
                for base in ("dra", "none")
                for q in (50, 90, 99)
            },
            "pool_ratios": {
                f"p{q}_vs_dra": measure.ratio(pod_ready["pool"], pod_ready["dra"], q) for q in (50, 90, 99)
            },
            "pool_reserved_s": measure.distribution([x + 5 for x in pod_ready["pool"]]),
            "pool_reserved_ratios": {
                f"p{q}_vs_dra": measure.ratio([x + 5 for x in pod_ready["pool"]], pod_ready["dra"], q)
                for q in (50, 90, 99)
            },
            "dra_vs_none": {f"p{q}": measure.ratio(pod_ready["dra"], pod_ready["none"], q) for q in (50, 99)},
            "peak_rss_mib": 80.0,
            "rss_series": [[0, 75.0], [0.1, 80.0]],
            "machine_cpu_s": {
                arm: {"seconds": 20.0, "top": [["containerd", 10.0], ["kube-apiserver", 5.0]]} for arm in arms
            },
            "phases_s": {arm: phases for arm in arms},
        },
        "fullnode": {
            "pods": 110,
            "all_ready_s": 60.0,
            "ready_series_s": [1.0, 2.0, 60.0],
            "agent_filled_mib": _memory(62.0),
            "agent_emptied_mib": _memory(58.0),
            "agent_peak_rss_mib": 90.0,
            "agent_cpu_mcores_during": 150.0,
            "rss_series": [[0, 75.0], [0.5, 90.0]],
        },
        "publish": {"start_to_1024_s": _distribution(2.5), "nic_added_s": _distribution(0.12)},
        "memory": {
            "steps_mib": [["asyncio", 11.0], ["netclaim.agent.main", 11.0]],
            "python_mib": 9.0,
            "libraries_mib": 47.0,
            "after_imports_mib": 68.0,
        },
        "profile": {
            k: {
                "busy_samples": 10,
                "functions": [["Attacher.attach (agent/pods/attach.py)", 100.0]],
                "packages": [["pyroute2", 60.0]],
            }
            for k in ("attach", "prepare", "burst")
        },
    }
    result["bench_line"] = suite.bench_line(result)
    return result


def test_the_bench_line_has_the_issues_keys_in_its_order() -> None:
    line = sample_result()["bench_line"]
    assert line.startswith("BENCH ") and "\n" not in line
    keys = [pair.split("=")[0] for pair in line.split()[1:]]
    assert keys == [
        "attach_overhead_ms",
        "attach4_ratio",
        "hook_burst_p50_ms",
        "raw_burst_p50_ms",
        "raw_hook_burst_p50_ms",
        "hook_burst_empty_p50_ms",
        "agent_rss_active_mib",
        "agent_pss_idle_mib",
        "attach_ext_ratio",
        "podstart_p50_vs_dra",
        "podstart_p99_vs_dra",
        "podstart_p50_vs_none",
        "podstart_pool_p50_vs_dra",
        "podstart_pool_reserved_p50_vs_dra",
        "podstart_busy_p50_vs_dra",
        "api_requests_per_pod",
        "agent_mem_active_mib",
        "agent_rss_idle_mib",
        "agent_import_floor_mib",
    ]
    values = report.bench_values(line)
    assert values["attach_overhead_ms"] == pytest.approx(12 - 1 - 9)  # hook, less the claimless hook and exec
    assert values["attach4_ratio"] == pytest.approx((50 - 1) / 36, abs=0.01)
    assert values["hook_burst_p50_ms"] == 14
    assert values["raw_burst_p50_ms"] == 11
    assert values["hook_burst_empty_p50_ms"] == 3
    assert values["raw_hook_burst_p50_ms"] == 12
    assert values["agent_import_floor_mib"] == 47.0
    assert values["attach_ext_ratio"] == pytest.approx(12 / 9, abs=0.01)
    assert values["podstart_p50_vs_dra"] == pytest.approx(5.4 / 4.5, abs=0.01)
    assert values["podstart_pool_p50_vs_dra"] == pytest.approx(5.9 / 4.5, abs=0.01)
    assert values["podstart_busy_p50_vs_dra"] == pytest.approx(4.2 / 3.5, abs=0.01)
    assert values["api_requests_per_pod"] == 5
    assert values["agent_mem_active_mib"] == 62.0


def test_figures_with_too_few_samples_read_na_not_a_number_from_elsewhere() -> None:
    result = sample_result()
    few = [1.0, 2.0, 3.0]
    result["burst"]["ratios"]["p99_vs_dra"] = measure.ratio(few, few, 99)
    values = report.bench_values(suite.bench_line(result))
    assert values["podstart_p99_vs_dra"] is None


HOOK_PARTS_SAMPLE = (("ms", 12), ("lock_ms", 0), ("attach_ms", 11), ("policy_ms", 0), ("metadata_ms", 1))


def test_the_report_and_the_plots_come_from_one_result(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    result = sample_result()
    report.render(json.loads(json.dumps(result)), tmp_path)
    text = (tmp_path / "docs" / "benchmarks.md").read_text()
    assert result["bench_line"] in text
    goal = "| netclaim's NRI hook from outside ÷ raw plugin exec, one NIC, p50 | ≤ 1.1 | 1.33 |"
    assert f"{goal} **missed** (see below) |" in text
    assert "| agent idle RSS (MiB) | ≤ 45 | 70 | **missed** (see below) |" in text
    share = "netclaim's share of an attach: hook less a claimless pod's and the raw exec, 1 NIC, p50 (ms)"
    assert f"| {share} | ≤ 2 | 2 |" in text
    assert "| pod start, netclaim claim ÷ no claim, p50 | — | 1.35 |  |" in text
    assert "| get resourceclaims | 6 |" in text
    assert "| hook inside the agent, 1 NIC (agent's log) | 12.0 " in text
    inside = "12.0 ms inside the agent (p50s of its parts, ms: waiting for the pod's lock 0.0, attaching 11.0"
    assert inside in text
    assert "(1.0 + 9.0) / 9.0 = 1.11; the goal leaves 0.90 ms for everything besides the exec." in text
    assert "requests 1 CPU and keeps two busy" in text and "(250m, the DaemonSet's)" in text
    assert "| netclaim's hook on node-1 (stopwatch) | 41.0 " in text
    assert "NRI connection (a hook past its timeout): node-1 1, node-2 0;" in text
    assert "(the gate holding their containers): node-1 7, node-2 0." in text
    for plot in ("attach.svg", "podstart.svg", "rss.svg", "fullnode.svg"):
        assert (tmp_path / report.PLOTS / plot).read_text().startswith("<?xml")
    first_svg = (tmp_path / report.PLOTS / "rss.svg").read_bytes()
    report.render(result, tmp_path)  # the same data gives the same files
    assert (tmp_path / report.PLOTS / "rss.svg").read_bytes() == first_svg


def test_a_kept_baseline_is_compared_figure_by_figure(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "bench").mkdir()
    before, after = sample_result(), sample_result()
    before["commit"] = "abc1234"
    before["bench_line"] = before["bench_line"].replace("agent_rss_idle_mib=70", "agent_rss_idle_mib=80")
    (tmp_path / report.BASELINE).write_text(json.dumps(before))
    report.render(after, tmp_path)
    text = (tmp_path / "docs" / "benchmarks.md").read_text()
    assert "at commit abc1234" in text
    assert "| agent idle RSS (MiB) | 80 | 70 | -12 % |" in text
    assert "| netclaim's NRI hook from outside ÷ raw plugin exec, one NIC, p50 | 1.33 | 1.33 | +0 % |" in text


def test_the_stopwatch_hook_is_after_minus_before_of_pods_both_plugins_saw(tmp_path: Path) -> None:
    out = tmp_path / "stopwatch.jsonl"
    lines = [
        {"plugin": "before", "synchronized": True},
        {"plugin": "before", "uid": "a", "t": 10.0},
        {"plugin": "after", "uid": "a", "t": 10.25},
        {"plugin": "before", "uid": "b", "t": 11.0},  # failed inside netclaim's hook: `after` never saw it
        {"plugin": "before", "uid": "c", "t": 12.0},
        {"plugin": "after", "uid": "c", "t": 12.5},
    ]
    out.write_text("".join(json.dumps(line) + "\n" for line in lines) + '{"plugin": "aft')
    assert stopwatch.hook_seconds(out, {"a", "b"}) == {"a": 0.25}
    assert stopwatch.hook_seconds(out, {"a", "b", "c"}) == {"a": 0.25, "c": 0.5}
    assert stopwatch.hook_seconds(tmp_path / "never-written", {"a"}) == {}


def _request(
    verb: str, resource: str, name: str, at: float, namespace: str = "bench"
) -> measure.AgentRequest:
    return measure.AgentRequest("node-1", verb, resource, name, {}, 200, namespace, at)


def test_requests_are_counted_for_the_pod_whose_claim_or_pod_they_name_others_apart() -> None:
    requests = [
        _request("get", "resourceclaims", "p1-net-x", 1.0),
        _request("patch", "resourceclaims/status", "p1-net-x", 2.0),
        _request("get", "pods", "p1", 2.5),
        _request("get", "resourceclaims", "p1-net-x", 9.0),  # at unprepare: after the pod was Ready
        _request("get", "resourceclaims", "p2-net-y", 1.5),
        _request("get", "resourceclaims", "p1-net-x", 1.0, namespace="elsewhere"),
        _request("list", "resourceslices", "", 3.0, namespace=""),
    ]
    claims = {"p1": {"p1-net-x"}, "p2": {"p2-net-y"}}
    per_pod, others = measure.requests_per_pod(requests, "bench", claims, {"p1": 3.0, "p2": 1.0})
    assert per_pod == {"p1": measure.PodRequests(3, 4), "p2": measure.PodRequests(0, 1)}
    assert others == 2


def test_container_memory_is_read_from_the_process_cgroup_and_proc() -> None:
    found = measure.container_memory(os.getpid())
    assert found["rss"] > 10 and found["pss"] > 10  # this Python process at least
    assert found["usage"] >= found["anon"] > 0

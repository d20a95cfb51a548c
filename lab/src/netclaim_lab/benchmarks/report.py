"""docs/benchmarks.md and its plots from one bench/report.json, and docs/scale.md's table from
bench/scale.json: the only places the project's measured figures are written (README links to them, quoting
none).

Usage: .venv/bin/python -m netclaim_lab.benchmarks.report [bench/report.json]   (make bench runs it)
"""

from __future__ import annotations

import json
import os
import platform
import re
import statistics
import sys
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from netclaim_lab.layout import REPO_ROOT

PLOTS = "docs/benchmarks"

# (BENCH key, what, goal: the measured value is at most this; None: reported beside the goals)
TARGETS: list[tuple[str, str, float | None]] = [
    (
        "attach_overhead_ms",
        "netclaim's share of an attach: hook less a claimless pod's and the raw exec, 1 NIC, p50 (ms)",
        2.0,
    ),
    ("attach4_ratio", "4 NICs: the hook less a claimless pod's hook, ÷ the 4 raw execs, p50", 1.15),
    ("hook_burst_p50_ms", "netclaim's NRI hook from outside during the bursts, p50 (ms)", 40),
    (
        "raw_burst_p50_ms",
        "its floor: the raw plugin's ADD alone during a burst of example-driver pods, p50 (ms)",
        None,
    ),
    (
        "raw_hook_burst_p50_ms",
        "the raw plugin's ADD inside a hook that does nothing else, bursts of the same size, p50 (ms)",
        None,
    ),
    (
        "hook_burst_empty_p50_ms",
        "the same hook for the bursts' pods without a claim (nothing to do), p50 (ms)",
        None,
    ),
    ("agent_rss_active_mib", "agent RSS after the 110-pod fill (MiB)", 55),
    ("agent_pss_idle_mib", "agent idle PSS (MiB): its own share of shared pages", None),
    ("attach_ext_ratio", "netclaim's NRI hook from outside ÷ raw plugin exec, one NIC, p50", 1.10),
    ("podstart_p50_vs_dra", "pod start, netclaim claim ÷ example-driver claim, p50", 1.10),
    ("podstart_p99_vs_dra", "pod start, netclaim claim ÷ example-driver claim, p99", 1.20),
    ("podstart_p50_vs_none", "pod start, netclaim claim ÷ no claim, p50", None),
    (
        "podstart_pool_p50_vs_dra",
        "pod start, netclaim NIC + pool address claim ÷ example-driver claim, p50",
        1.10,
    ),
    ("podstart_busy_p50_vs_dra", "the same beside a tenant burning CPU (both arms), p50", 1.15),
    ("api_requests_per_pod", "agent API requests per pod start, one NIC, p50", 3),
    ("agent_mem_active_mib", "agent container anonymous memory after the 110-pod fill (MiB)", 60),
    ("agent_rss_idle_mib", "agent idle RSS (MiB)", 45),
    (
        "agent_import_floor_mib",
        "its floor: the interpreter with every library the agent imports, no netclaim module (MiB)",
        None,
    ),
]


def goal_of(key: str) -> float:
    [goal] = [goal for name, _, goal in TARGETS if name == key and goal is not None]
    return goal


BURST_ARM_NAMES = {
    "none": "no claim",
    "dra": "example-driver GPU claim",
    "netclaim": "netclaim NIC claim",
    "pool": "netclaim NIC + pool address claim",
}
SERIAL_ARM_NAMES = {
    "none": "no claim",
    "dra": "example-driver GPU",
    "one": "netclaim, 1 NIC",
    "four": "netclaim, 4 NICs",
}


def machine() -> dict[str, Any]:
    return {
        "cpus": os.cpu_count(),
        "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "kernel": platform.release(),
        "python": platform.python_version(),
    }


def bench_values(line: str) -> dict[str, float | None]:
    """The BENCH line's figures; None where the run had too few samples ("na")."""
    return {k: None if v == "na" else float(v) for k, v in (pair.split("=") for pair in line.split()[1:])}


def _cell(d: dict[str, Any], q: str, scale: float, digits: int) -> str:
    value = d.get(q)
    if value is None:
        return "—"
    interval = d.get("ci95", {}).get(q)
    text = f"{value * scale:.{digits}f}"
    if interval:
        text += f" ({interval[0] * scale:.{digits}f} to {interval[1] * scale:.{digits}f})"
    return text


HOOK_PARTS = {  # the parts of the hook's log line (netclaim.agent.pods.hooks), as the report names them
    "lock_ms": "waiting for the pod's lock",
    "attach_ms": "attaching",
    "policy_ms": "network policy",
    "metadata_ms": "device metadata files",
}


def _burst_hook_table(burst: dict[str, Any]) -> list[str]:
    """The netclaim arm's hook in the bursts from outside, what a pod with nothing to do costs there, and
    the same hook as the agent timed it, part by part: outside less inside is the time the call spent
    reaching the hook's code and its answer reaching containerd (the NRI round trip, the agent's event
    loop)."""
    inside = burst["hook_agent_log"]
    return [
        "The hook in the bursts, from outside and inside the agent:",
        "",
        *QUANTILE_HEAD,
        _row("netclaim's hook, NIC arm (stopwatch)", burst["hook_ext_ms"], "ms"),
        _row("netclaim's hook, no-claim arm: nothing to do (stopwatch)", burst["hook_empty_ext_ms"], "ms"),
        _row("hook inside the agent, NIC arm (agent's log)", inside["ms"], "ms"),
        *(_row(f"… {part} (agent's log)", inside[key], "ms") for key, part in HOOK_PARTS.items()),
        _row("… CNI ADD exec inside that attach (agent's log)", burst["cni_add_agent_log"], "ms"),
        _row(
            "raw plugin ADD beside a burst of example-driver pods (floor)",
            burst["raw_add_beside_ms"]["dra"],
            "ms",
        ),
        _row(
            "raw plugin ADD inside a hook that does nothing else, example-driver bursts (floor)",
            burst["raw_hook_ms"]["add"],
            "ms",
        ),
        _row("… that hook, whole (its own timing)", burst["raw_hook_ms"]["hook"], "ms"),
        "",
        "The raw plugin's loop beside a burst runs from the burst's first pod to its last Ready, quiet "
        "tail included; the hook that does nothing else runs it where netclaim runs it, in "
        "RunPodSandbox, while the node's other sandboxes are made (`raw_hook.py`).",
        "",
    ]


def _row(name: str, d: dict[str, Any], unit: str, scale: float = 1.0, digits: int = 1) -> str:
    cells = [_cell(d, q, scale, digits) for q in ("p50", "p90", "p99")]
    return f"| {name} | {' | '.join(cells)} | {unit} | {d['n']} |"


QUANTILE_HEAD = [
    "| figure | p50 (95 % interval) | p90 | p99 | unit | n |",
    "|---|---|---|---|---|---|",
]


def _ratio_text(ratio: dict[str, Any]) -> str:
    if ratio["value"] is None:
        return "— (too few samples)"
    interval = ratio["ci95"]
    return f"{ratio['value']:.2f}" + (f" ({interval[0]:.2f} to {interval[1]:.2f})" if interval else "")


def _plots(result: dict[str, Any], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    plt.rcParams["svg.hashsalt"] = "netclaim"  # the same data, the same file

    def save(figure: Any, name: str) -> None:
        figure.tight_layout()
        figure.savefig(out / name, format="svg", metadata={"Date": None})
        plt.close(figure)

    serial, floor, sizes = result["serial"], result["floor"], result["sizes"]
    figure, axis = plt.subplots(figsize=(7, 3.6))
    series = {
        "raw exec, 1 config list": floor["add_1"]["values"],
        "hook, 1 NIC (stopwatch)": serial["hook_ext_ms"]["one"]["values"],
        "hook, no claim (stopwatch)": serial["hook_ext_ms"]["none"]["values"],
        "raw exec, 4 config lists": floor["add_4"]["values"],
        "hook, 4 NICs (stopwatch)": serial["hook_ext_ms"]["four"]["values"],
    }
    axis.boxplot(list(series.values()), orientation="horizontal", tick_labels=list(series), whis=(1, 99))
    axis.set_xlabel("ms")
    axis.set_title("netclaim's NRI hook from outside vs the raw CNI exec, one pod at a time")
    save(figure, "attach.svg")

    figure, axis = plt.subplots(figsize=(7, 3.6))
    for arm, d in result["burst"]["pod_ready_s"].items():
        values = d["values"]
        axis.plot(
            values,
            [(i + 1) / len(values) for i in range(len(values))],
            label=BURST_ARM_NAMES[arm],
            drawstyle="steps-post",
        )
    axis.set_xlabel("create → pod Ready (s)")
    axis.set_ylabel("fraction of pods")
    axis.set_title(
        f"Pod start, {result['burst']['pod_ready_s']['none']['n']} pods per arm in bursts of "
        f"{sizes['burst_pods']}"
    )
    axis.legend()
    save(figure, "podstart.svg")

    figure, axis = plt.subplots(figsize=(7, 3.6))
    idle = result["idle"]["node-1"]["rss_series"]
    axis.plot([t for t, _ in idle], [r for _, r in idle], label="idle")
    burst = result["burst"]["rss_series"]
    axis.plot([t for t, _ in burst], [r for _, r in burst], label=f"{sizes['burst_pods']}-pod burst")
    full = result["fullnode"]["rss_series"]
    axis.plot(
        [t for t, _ in full], [r for _, r in full], label=f"{result['fullnode']['pods']} pods on one node"
    )
    axis.set_xlabel("s")
    axis.set_ylabel("agent RSS (MiB)")
    axis.set_title("node-1 agent resident memory (/proc)")
    axis.legend()
    save(figure, "rss.svg")

    figure, axis = plt.subplots(figsize=(7, 3.6))
    ready = result["fullnode"]["ready_series_s"]
    axis.plot(ready, range(1, len(ready) + 1))
    axis.set_xlabel("s after the first create")
    axis.set_ylabel("pods Ready with their claim")
    axis.set_title(f"A full node: {result['fullnode']['pods']} pods with one NIC each")
    save(figure, "fullnode.svg")


def _goal_rows(values: dict[str, float | None]) -> list[str]:
    rows = []
    for key, what, goal in TARGETS:
        value = values[key]
        shown = "—" if value is None else f"{value:g}"
        if goal is None or value is None:
            verdict = "" if goal is None else "not measured (too few samples)"
        else:
            verdict = "met" if value <= goal else "**missed** (see below)"
        rows.append(f"| {what} | {'—' if goal is None else f'≤ {goal:g}'} | {shown} | {verdict} |")
    return rows


BASELINE = "bench/baseline.json"  # a report.json kept from the run before a change of the pod path


def _change(before: float | None, after: float | None) -> str:
    if before is None or after is None or before == 0:
        return ""
    return f"{(after - before) / before * 100:+.0f} %"


def _baseline_rows(result: dict[str, Any], baseline: dict[str, Any]) -> list[str]:
    """The goals' figures and the quantities behind them, this run against the baseline's."""
    now, then = bench_values(result["bench_line"]), bench_values(baseline["bench_line"])
    rows = [  # a key the baseline's run did not have yet reads "—"
        f"| {what} | {'—' if then.get(key) is None else f'{then[key]:g}'} | "
        f"{'—' if now[key] is None else f'{now[key]:g}'} | {_change(then.get(key), now[key])} |"
        for key, what, _ in TARGETS
    ]

    def quantity(what: str, path: tuple[str, ...]) -> str:
        def read(report: dict[str, Any]) -> float | None:
            value: Any = report
            for part in path:
                value = value.get(part) if isinstance(value, dict) else None
            return float(value) if isinstance(value, int | float) else None

        before, after = read(baseline), read(result)
        shown = ["—" if v is None else f"{v:.3g}" for v in (before, after)]
        return f"| {what} | {shown[0]} | {shown[1]} | {_change(before, after)} |"

    rows += [
        quantity(f"pod Ready p50, burst, {name} (s)", ("burst", "pod_ready_s", arm, "p50"))
        for arm, name in BURST_ARM_NAMES.items()
    ]
    rows += [
        quantity("claim Ready p50, burst, netclaim NIC claim (s)", ("burst", "claim_ready_s", "p50")),
        quantity(
            "netclaim's hook from outside p50, one pod at a time (ms)",
            ("serial", "hook_ext_ms", "one", "p50"),
        ),
        quantity(
            "agent API requests per pod lifecycle, one NIC, p50",
            ("serial", "api_requests_one_nic", "lifecycle", "p50"),
        ),
        quantity("agent peak RSS during the bursts (MiB)", ("burst", "peak_rss_mib")),
        quantity("agent container anonymous memory, idle (MiB)", ("idle", "node-1", "container_mib", "anon")),
    ]
    return rows


def baseline_section(result: dict[str, Any], baseline: dict[str, Any] | None) -> list[str]:
    if baseline is None:
        return []
    commit = baseline.get("commit", "?")
    return [
        "## Against the baseline",
        "",
        f"`{BASELINE}`: the same `make bench` on {baseline['when']} at commit {commit}, before the changes "
        "of the pod path it is kept for (docs/benchmarks.md's history says which). Same machine, same sizes.",
        "",
        "| figure | baseline | this run | change |",
        "|---|---|---|---|",
        *_baseline_rows(result, baseline),
        "",
    ]


def _memory_row(what: str, m: dict[str, float]) -> str:
    return f"| {what} | {m['anon']:.1f} | {m['pss']:.1f} | {m['rss']:.1f} | {m['usage']:.1f} |"


def markdown(result: dict[str, Any], baseline: dict[str, Any] | None = None) -> str:
    values = bench_values(result["bench_line"])
    serial, floor, burst, idle, full, publish, sizes = (
        result[k] for k in ("serial", "floor", "burst", "idle", "fullnode", "publish", "sizes")
    )
    requests = serial["api_requests_one_nic"]
    beside = burst["raw_add_beside_ms"]
    lines = [
        "# Benchmarks",
        "",
        f"Written by `make bench` on {result['when']} ({result['machine']['cpus']} CPUs, "
        f"{result['machine']['memory_gib']} GiB, kernel {result['machine']['kernel']}, Python "
        f"{result['machine']['python']}) in {result['seconds'] / 60:.1f} min; every figure below is from "
        "that one run (`bench/report.json` keeps every sample). The cluster is "
        "lab/src/netclaim_lab/benchmarks/cluster.yaml: real kube-apiserver, scheduler, kubelet and "
        "containerd, netclaim's agents deployed from `deploy/` as the DaemonSet users run, and Kubernetes' "
        "example DRA driver (sigs.k8s.io/dra-example-driver, its own Helm chart) beside it: pods with one "
        "of its fake GPUs cost what DRA itself costs, the floor netclaim's claims are held against.",
        "",
        "Quantiles are nearest-rank (each a measured value); the intervals are 95 % percentile bootstraps "
        "(scipy); a p99 needs 100 samples and a p90 ten, or it reads —.",
        "",
        "## Against the goals",
        "",
        "| figure | goal | measured | |",
        "|---|---|---|---|",
        *_goal_rows(values),
        "",
        "```",
        result["bench_line"],
        "```",
        "",
        *baseline_section(result, baseline),
        "## Pod start as users feel it",
        "",
        f"{sizes['burst_rounds']} rounds of {sizes['burst_pods']} pods created at once for each arm in "
        "turn, spread by the scheduler over both nodes: no claim, a claim of one example-driver GPU, a claim "
        "of one shaped netclaim NIC, and the same NIC with an address of an IPPool (its address taken by "
        "the agent at prepare: IPAllocation writes on the pod's path). Create → pod Ready, and for "
        "netclaim's NIC arm create → its claim's devices Ready in `status.devices` (written by the agent "
        "after the attach), as the API server's watch delivered them.",
        "",
        *QUANTILE_HEAD,
        *(
            _row(f"pod Ready, {BURST_ARM_NAMES[arm]}", d, "s", digits=2)
            for arm, d in burst["pod_ready_s"].items()
        ),
        _row("claim Ready, netclaim NIC claim", burst["claim_ready_s"], "s", digits=2),
        "",
        "| ratio of pod Ready | p50 | p90 | p99 |",
        "|---|---|---|---|",
        *(
            f"| netclaim ÷ {BURST_ARM_NAMES[base]} | "
            + " | ".join(_ratio_text(burst["ratios"][f"p{q}_vs_{base}"]) for q in (50, 90, 99))
            + " |"
            for base in ("dra", "none")
        ),
        "| netclaim NIC + pool address ÷ example-driver GPU claim | "
        + " | ".join(_ratio_text(burst["pool_ratios"][f"p{q}_vs_dra"]) for q in (50, 90, 99))
        + " |",
        "| the same, its address reserved before binding ÷ example-driver GPU claim | "
        + " | ".join(_ratio_text(burst["pool_reserved_ratios"][f"p{q}_vs_dra"]) for q in (50, 90, 99))
        + " |",
        f"| example driver ÷ no claim | {_ratio_text(burst['dra_vs_none']['p50'])} | | "
        f"{_ratio_text(burst['dra_vs_none']['p99'])} |",
        "",
        f"netclaim's hook during the bursts (stopwatch, both nodes): p50 "
        f"{_cell(burst['hook_ext_ms'], 'p50', 1, 1)} ms, n = {burst['hook_ext_ms']['n']}; the raw plugin's "
        f"ADD (the floor's, not through netclaim) run over and over on node-1 during bursts of the same "
        f"size, of example-driver pods: p50 {_cell(beside['dra'], 'p50', 1, 1)} ms, "
        f"n = {beside['dra']['n']}; of netclaim pods: p50 {_cell(beside['netclaim'], 'p50', 1, 1)} "
        f"ms, n = {beside['netclaim']['n']}. The node-1 "
        f"agent's peak RSS during the bursts: {burst['peak_rss_mib']:.1f} MiB.",
        "",
        *_burst_hook_table(burst),
        "![pod start](benchmarks/podstart.svg)",
        "",
        *_neighbour_section(result["neighbour"], sizes),
        "## One pod at a time (node-1)",
        "",
        "The arms interleaved. RunPodSandbox as containerd logged it (request → sandbox id, NRI hooks "
        "included); netclaim's hook by two NRI plugins that only read the clock, registered before and after "
        "netclaim's (`stopwatch.py`: their difference is the hook as containerd ran it, state writes and "
        "NRI round trip included; for pods without a netclaim claim it is what the hook costs doing "
        "nothing); the raw exec timed by `raw_cni.py` inside the node. The agent's own log lines are "
        "labelled so.",
        "",
        *QUANTILE_HEAD,
        _row("raw exec, macvlan + host-local (floor)", floor["add_1"], "ms"),
        _row("raw exec, 4 such config lists (floor)", floor["add_4"], "ms"),
        *(
            _row(f"hook, {SERIAL_ARM_NAMES[a]} (stopwatch)", d, "ms")
            for a, d in serial["hook_ext_ms"].items()
        ),
        *(
            _row(f"RunPodSandbox, {SERIAL_ARM_NAMES[a]} (containerd)", d, "ms")
            for a, d in serial["run_pod_sandbox_ms"].items()
        ),
        *(
            _row(f"create → pod Ready, {SERIAL_ARM_NAMES[a]}", d, "s", digits=2)
            for a, d in serial["pod_ready_s"].items()
        ),
        *(
            _row(f"create → claim Ready, {SERIAL_ARM_NAMES[a]}", d, "s", digits=2)
            for a, d in serial["claim_ready_s"].items()
        ),
        _row("hook inside the agent, 1 NIC (agent's log)", serial["hook_agent_log"]["ms"], "ms"),
        *(
            _row(f"… {part} (agent's log)", serial["hook_agent_log"][key], "ms")
            for key, part in HOOK_PARTS.items()
        ),
        _row("attach, 1 NIC (agent's log)", serial["attach_agent_log"], "ms"),
        _row("CNI ADD exec inside that attach (agent's log)", serial["cni_add_agent_log"], "ms"),
        _row(
            "NodePrepareResources per claim (agent's log; "
            f"{_repeated_prepares(serial)} answered again from its state)",
            serial["prepare_agent_log"],
            "ms",
        ),
        _row("NodeUnprepareResources per claim (agent's log)", serial["unprepare_agent_log"], "ms"),
        "",
        "![attach](benchmarks/attach.svg)",
        "",
        "## API requests",
        "",
        "The node-1 agent's requests about each one-NIC pod of the serial phase (its claim, its claim's "
        "status, the pod), counted in the API server's audit log: answered by the time the pod and its claim "
        f"were Ready (start) p50 {_cell(requests['start'], 'p50', 1, 0)}, over the pod's whole life "
        f"p50 {_cell(requests['lifecycle'], 'p50', 1, 0)}; {requests['others']} other requests of that "
        "agent in the same window (its own upkeep and the other arms' pods). All of its requests in the "
        "benchmark's namespace over the phase, by kind:",
        "",
        "| request | n |",
        "|---|---|",
        *(f"| {kind} | {n} |" for kind, n in requests["by_kind"].items()),
        "",
        "## Memory",
        "",
        "The agent's container as its cgroup counts it (anonymous memory: what no file backs; usage: "
        "page cache included), the PSS of its processes (shared pages split among who maps them) and the "
        "agent process's RSS, MiB:",
        "",
        "| when | anon | PSS | RSS | usage |",
        "|---|---|---|---|---|",
        *(_memory_row(f"idle, {node}", v["container_mib"]) for node, v in sorted(idle.items())),
        _memory_row(f"node-1, {full['pods']} one-NIC pods Ready", full["agent_filled_mib"]),
        _memory_row("node-1, those pods gone", full["agent_emptied_mib"]),
        "",
        "| node | RSS (MiB, max over the idle window) | CPU (millicores) | window (s) |",
        "|---|---|---|---|",
        *(
            f"| {node} | {v['rss_mib']:.1f} | {v['cpu_mcores']:.1f} | {v['seconds']:.0f} |"
            for node, v in sorted(idle.items())
        ),
        "",
        "![rss](benchmarks/rss.svg)",
        "",
        "## A full node",
        "",
        f"{full['pods']} pods, each with a one-NIC claim, created at once on node-1 (4 NICs, 32 "
        f"attachments): all Ready with their claims in {full['all_ready_s']:.1f} s; the agent's CPU while "
        f"the node filled {full['agent_cpu_mcores_during']:.0f} millicores, its peak RSS "
        f"{full['agent_peak_rss_mib']:.1f} MiB.",
        "",
        "![full node](benchmarks/fullnode.svg)",
        "",
        *_fill_phases(full),
        "## Publish",
        "",
        *QUANTILE_HEAD,
        _row(
            "1,024 devices: agent process start → last slice write (audit log)",
            publish["start_to_1024_s"],
            "s",
            digits=2,
        ),
        _row("one NIC added → its node's slice written (audit log)", publish["nic_added_s"], "s", digits=2),
        "",
    ]
    lines += _missed(result, values)
    lines += _where_the_time_goes(result)
    return "\n".join(lines)


def _profile_table(title: str, profile: dict[str, Any]) -> list[str]:
    rows = [
        f"**{title}** ({profile['busy_samples']} busy samples of the agent's main thread)",
        "",
        "| netclaim function (inclusive) | share | package of the innermost frame (self) | share |",
        "|---|---|---|---|",
    ]
    functions, packages = profile["functions"], profile["packages"]
    for index in range(max(len(functions), len(packages))):
        f = functions[index] if index < len(functions) else ["", ""]
        k = packages[index] if index < len(packages) else ["", ""]
        rows.append(
            f"| {f[0]} | {f[1]}{'%' if f[1] != '' else ''} | {k[0]} | {k[1]}{'%' if k[1] != '' else ''} |"
        )
    return [*rows, ""]


# what each phase of a pod's start holds when the pod has a claim (the phases in suite.PHASES)
PHASE_WORK = {
    "create → bound": "the resource claim controller creates the pod's claim from its template and the "
    "scheduler allocates a device before it binds the pod",
    "bound → RunPodSandbox": "kubelet reads the claim and calls the driver's NodePrepareResources before "
    "it asks containerd for the sandbox",
    "RunPodSandbox": "the NRI hooks run; containerd holds one lock across each NRI RunPodSandbox call, "
    "so a node's hooks run one after another",
    "CreateContainer": "kubelet asks for the container, containerd creates it with the claim's CDI edits; "
    "its NRI calls wait for the same lock, behind the node's RunPodSandbox hooks in flight",
    "StartContainer": "runc runs the claim's gate hook and starts the process (the NRI lock again)",
    "started → Ready": "kubelet sees the container run and writes the pod's Ready",
}


def _fill_floors(full: dict[str, Any]) -> str:
    floors = full.get("floors", {})
    if not floors:
        return ""
    return (
        f" (no claim {floors['none']['all_ready_s']:.1f}, example driver {floors['dra']['all_ready_s']:.1f})"
    )


def _fill_phases(full: dict[str, Any]) -> list[str]:
    """The same fill without a claim and with an example-driver GPU, and each arm's phases."""
    arms = {**full.get("floors", {}), "netclaim": full}
    if len(arms) == 1:  # a report from before the floors
        return []
    names = {"none": "no claim", "dra": "example-driver GPU", "netclaim": "netclaim NIC"}
    lines = [
        "The same node filled the same way, all pods Ready (s): "
        + ", ".join(f"{names[a]} {v['all_ready_s']:.1f}" for a, v in arms.items())
        + ". By phase, p50 / p99 (s):",
        "",
        "| phase | " + " | ".join(names[a] for a in arms) + " |",
        "|---|" + "---|" * len(arms),
    ]
    for phase in PHASE_WORK:
        cells = []
        for arm in arms.values():
            d = arm["phases_s"].get(phase)
            cells.append("—" if d is None else f"{d['p50']:.2f} / {_cell(d, 'p99', 1, 2)}")
        lines.append(f"| {phase} | " + " | ".join(cells) + " |")
    return [*lines, ""]


def _phase_growth(burst: dict[str, Any]) -> str:
    """The phases whose p50 grew from the example driver's arm to netclaim's, largest first."""
    phases = burst["phases_s"]
    growth = sorted(
        ((phases["netclaim"][p]["p50"] - phases["dra"][p]["p50"], p) for p in phases["netclaim"]),
        reverse=True,
    )
    return "; ".join(
        f"{name} {phases['dra'][name]['p50']:.2f} → {phases['netclaim'][name]['p50']:.2f} s "
        f"({PHASE_WORK[name]})"
        for grown, name in growth
        if grown > 0
    )


def _neighbour_section(neighbour: dict[str, Any], sizes: dict[str, Any]) -> list[str]:
    hooks = neighbour["hook_ext_ms"]
    return [
        "### Beside a busy tenant",
        "",
        f"{sizes['neighbour_rounds']} more rounds of netclaim's NIC arm and of the example driver's, in "
        f"turn, while a tenant's pod on node-1 requests {neighbour['burner_cpu']} CPU and keeps two busy "
        "(node-2 has none). containerd makes every NRI "
        "call of a node under one lock (RunPodSandbox, CreateContainer, StartContainer; containerd/nri#165), "
        "so while a netclaim hook runs no other container of its node is created or started: the hook's "
        "time in a busy node is every pod's there. The agent gets CPU by its container's request "
        f"({neighbour['agent_cpu_request']}, the DaemonSet's), weighed against the tenants' requests.",
        "",
        *QUANTILE_HEAD,
        *(_row(f"netclaim's hook on {node} (stopwatch)", d, "ms") for node, d in hooks.items()),
        _row("pod Ready, netclaim NIC claim, both nodes", neighbour["pod_ready_s"], "s", digits=2),
        _row("pod Ready, example-driver GPU claim, both nodes", neighbour["dra_pod_ready_s"], "s", digits=2),
        "",
        "netclaim ÷ example driver, pod Ready beside the tenant: "
        + ", ".join(f"p{q} {_ratio_text(neighbour['ratios'][f'p{q}_vs_dra'])}" for q in (50, 99))
        + ".",
        "",
        "Times containerd closed netclaim's NRI connection (a hook past its timeout): "
        + ", ".join(f"{node} {n}" for node, n in neighbour["nri_reconnects"].items())
        + "; pods whose RunPodSandbox went by before the agent was back, attached into their running "
        "sandboxes by its resync (the gate holding their containers): "
        + ", ".join(f"{node} {n}" for node, n in neighbour["hooks_missed"].items())
        + ".",
        "",
        "The bench's pods request no CPU (BestEffort, the least cgroup weight): on node-1 their own "
        "containers wait for the tenant too, so their pod Ready says what a busy node does to such pods; "
        "the example driver's arm, beside the same tenant, is what it does without netclaim.",
        "",
    ]


def _missed(result: dict[str, Any], values: dict[str, float | None]) -> list[str]:
    """One paragraph per missed goal: what this run measured that bounds it."""
    serial, floor, burst, memory = result["serial"], result["floor"], result["burst"], result["memory"]
    hook, cni = serial["hook_ext_ms"]["one"]["p50"], serial["cni_add_agent_log"]["p50"]
    inside = serial["hook_agent_log"]
    parts = ", ".join(f"{part} {inside[key]['p50']:.1f}" for key, part in HOOK_PARTS.items())
    empty, raw = serial["hook_ext_ms"]["none"]["p50"], floor["add_1"]["p50"]
    said = {
        "attach_ext_ratio": (
            f"The hook took {hook:.1f} ms at p50 from outside, {inside['ms']['p50']:.1f} ms inside the agent "
            f"(p50s of its parts, ms: {parts}; agent's log), the rest NRI's round trip and the agent's "
            f"lookup of the pod, which a pod without a netclaim claim costs "
            f"{empty:.1f} ms. Inside the attach "
            f"({serial['attach_agent_log']['p50']:.1f} ms) the CNI exec took {cni:.1f} ms against "
            f"{raw:.1f} ms for the same exec alone in the node; the attach's rest is the "
            "interface read back from the pod's namespace and the state written after the ADD, and before "
            "the attach's timer starts: the plugins' readiness (STATUS, kept 30 s) and the state written "
            "before the ADD (profile below). What bounds the ratio from below: a hook that did nothing but "
            f"the exec would still pay the NRI round trip of a pod netclaim has nothing to do for, "
            f"({empty:.1f} + {raw:.1f}) / {raw:.1f} = {(empty + raw) / raw:.2f}; the goal leaves "
            f"{raw * 0.1:.2f} ms for everything besides the exec."
        ),
        "podstart_p50_vs_dra": (
            "By phase, p50 example driver → netclaim, the largest growth first: "
            f"{_phase_growth(burst) or 'no phase grew'}. containerd makes every NRI call of a node under "
            "one lock (RunPodSandbox, CreateContainer, StartContainer alike; containerd/nri#165), so each "
            "container's create and start waits for the node's netclaim hooks in flight; in the bursts the "
            f"hook took {burst['hook_ext_ms']['p50']:.1f} ms at p50 (stopwatch), one pod at a time "
            f"{hook:.1f} ms."
        ),
        "hook_burst_p50_ms": (
            f"Inside the agent the hook took {burst['hook_agent_log']['ms']['p50']:.1f} ms at p50, of which "
            f"the CNI ADD {burst['cni_add_agent_log']['p50']:.1f} ms; the same ADD inside a hook that does "
            f"nothing else, in bursts of the same size, took {burst['raw_hook_ms']['add']['p50']:.1f} ms "
            "(raw_hook.py), and the hook of a pod netclaim has nothing to do for "
            f"{burst['hook_empty_ext_ms']['p50']:.1f} ms from outside. "
            + (
                "A hook that only ran the plugin would miss the goal too: in a burst the ADD runs while "
                "the node makes its other sandboxes, and containerd holds its one NRI lock of the node "
                "meanwhile (containerd/nri#165)."
                if burst["raw_hook_ms"]["add"]["p50"] > goal_of("hook_burst_p50_ms")
                else "A hook that only ran the plugin would meet the goal: the rest is netclaim's."
            )
        ),
        "api_requests_per_pod": "By kind, in the API requests table above.",
        "agent_mem_active_mib": (
            f"The interpreter with the libraries the agent imports holds {memory['libraries_mib']} MiB of "
            f"RSS before a module of netclaim's own is imported; netclaim's modules add "
            f"{memory['after_imports_mib'] - memory['libraries_mib']:.1f} MiB, and the agent's running "
            "state the rest (the imports table below)."
        ),
    }
    said["podstart_p99_vs_dra"] = said["podstart_p50_vs_dra"]
    said["agent_rss_idle_mib"] = said["agent_mem_active_mib"]
    lines = []
    for key, what, goal in TARGETS:
        value = values[key]
        if goal is not None and value is not None and value > goal and key in said:
            lines += [f"**{what}: {value:g} against ≤ {goal:g}.** {said[key]}", ""]
    return ["## Goals missed, and what bounds them", "", *lines] if lines else []


def _where_the_time_goes(result: dict[str, Any]) -> list[str]:
    burst, memory, sizes = result["burst"], result["memory"], result["sizes"]
    phases = burst["phases_s"]
    arms = [arm for arm in BURST_ARM_NAMES if arm in phases]
    lines = [
        "## Where the time goes",
        "",
        "### Pod start, phase by phase",
        "",
        "Each pod's start split at the moments the benchmark sees from outside: bound to a node (API "
        "watch), kubelet asking containerd for the sandbox and containerd returning it (containerd's log), "
        "pod Ready (API watch). p50 / p99 in seconds:",
        "",
        "| phase | " + " | ".join(BURST_ARM_NAMES[a] for a in arms) + " |",
        "|---|" + "---|" * len(arms),
    ]
    for phase in phases[arms[0]]:
        cells = []
        for arm in arms:
            d = phases[arm].get(phase)
            cells.append("—" if d is None else f"{d['p50']:.2f} / {_cell(d, 'p99', 1, 2)}")
        lines.append(f"| {phase} | " + " | ".join(cells) + " |")
    cpu = burst["machine_cpu_s"]
    lines += [
        "",
        "What the machine's CPU did during the first burst of each arm (CPU seconds per command, all "
        "processes, from /proc; `process_api` is this machine's own PID 1, not part of the cluster):",
        "",
        "| " + " | | ".join(BURST_ARM_NAMES[a] for a in arms) + " | |",
        "|" + "---|---|" * len(arms),
    ]
    for row in zip(*(cpu[a]["top"] for a in arms), strict=False):
        lines.append("| " + " | ".join(f"{command} | {seconds} s" for command, seconds in row) + " |")
    lines += [
        "| " + " | ".join(f"*elapsed* | {cpu[a]['seconds']:.1f} s" for a in arms) + " |",
        "",
        "### The agent's CPU, profiled",
        "",
        "py-spy sampled the node-1 agent from outside, without pausing it, at 1,000 Hz while "
        f"{sizes['profiled_pods']} one-NIC pods started one at a time, then at 200 Hz during a "
        f"{sizes['burst_pods']}-pod burst (a phase of its own, after the timed ones). A busy sample is one "
        "where the main thread was not waiting in epoll.",
        "",
        *_profile_table("attach (under `Attacher.attach`)", result["profile"]["attach"]),
        *_profile_table("NodePrepareResources (under `Preparer.prepare`)", result["profile"]["prepare"]),
        *_profile_table(
            f"the whole agent during a {sizes['burst_pods']}-pod burst", result["profile"]["burst"]
        ),
        "### What the agent's imports hold",
        "",
        f"Each library as the agent image's Python imports it, one after the other, in the agent's "
        f"container (RSS): the interpreter alone {memory['python_mib']} MiB, "
        f"{memory['after_imports_mib']} MiB with every module of the agent imported.",
        "",
        "| import | adds (MiB) |",
        "|---|---|",
        *(f"| {name} | {mib} |" for name, mib in memory["steps_mib"]),
        "",
    ]
    return lines


def _write_section(document: Path, begin: str, end: str, section: str) -> None:
    """Replace the text between the markers of a hand-written document with `section` (markers included)."""
    text = document.read_text()
    pattern = re.compile(re.escape(begin) + ".*?" + re.escape(end), re.S)
    if not pattern.search(text):
        raise SystemExit(f"{document} has no {begin!r} … {end!r} section to write")
    document.write_text(pattern.sub(lambda _: section, text))


def _repeated_prepares(serial: dict[str, Any]) -> str:
    """How many claims kubelet asked for again ("?" in a report.json from before they were counted)."""
    claims = serial.get("claims_prepared_repeated")
    return "?" if claims is None else str(len(claims["prepare repeated"]))


def render(result: dict[str, Any], root: Path = REPO_ROOT) -> None:
    _plots(result, root / PLOTS)
    kept = root / BASELINE
    baseline = json.loads(kept.read_text()) if kept.is_file() else None
    (root / "docs" / "benchmarks.md").write_text(markdown(result, baseline))


SCALE_BEGIN = "<!-- scale:begin (make bench-scale writes this table from bench/scale.json) -->"
SCALE_END = "<!-- scale:end -->"


def scale_table(result: dict[str, Any]) -> str:
    """docs/scale.md's table: the same churn window at each cluster size, then the scheduling arms."""
    sizes, large = result["sizes"], result["large"]
    windows = [result["small"]["churn"], result["mid"]["churn"], large["churn"]]
    runs, summary = large["runs"], large["summary"]
    claims = runs["netclaim"][-1]
    churn = sizes["churn_pods"]

    def row(what: str, cells: list[str]) -> str:
        return f"| {what} | " + " | ".join(cells) + " |"

    def each(key: str, form: str) -> list[str]:
        return [format(window[key], form) for window in windows]

    def rate(arm: str) -> str:
        figures = summary[arm]
        low, high = figures["pods_per_s_min"], figures["pods_per_s_max"]
        return f"{figures['pods_per_s_median']:.1f} ({low:.1f} to {high:.1f})"

    def algorithm(arm: str) -> str:
        return f"{statistics.median(float(r['scheduler']['algorithm_p99_s']) * 1000 for r in runs[arm]):.1f}"

    def ipam(key: str, form: str) -> str:
        return format(statistics.median(float(r["ipam"][key]) for r in runs["netclaim_pool"]), form)

    published = result["mid"]["added"] + large["added"]
    dense = result["dense"]
    nic, pool, gpus = summary["netclaim"], summary["netclaim_pool"], summary["netclaim_gpus"]
    arm_names = ("none", "dra", "dra_shared", "netclaim", "netclaim_pool", "netclaim_gpus")

    def per_repeat(figures: dict[str, Any], base: str) -> str:
        each_run = ", ".join(f"{r:.2f}" for r in figures[f"ratios_vs_{base}"])
        return f"{figures[f'ratio_vs_{base}']:.2f} ({each_run})"

    last = ["", ""]
    rows = [
        SCALE_BEGIN,
        "",
        row(
            "`make bench-scale`: nodes, claims in the cluster",
            [
                f"3, {churn}",
                f"{sizes['mid_nodes']}, {churn}",
                f"{sizes['nodes']}, {claims['allocated']:,} + {churn}",
            ],
        ),
        "|---|---|---|---|",
        row(
            "watch events the API server sent each agent in the window (its node's slice changed twice)",
            each("agent_events_per_agent", "g"),
        ),
        row("… per second", each("agent_events_per_s", ".3f")),
        row("… sent to one watch on every slice, in the window", each("slice_probe_events", "g")),
        row("… sent to one watch on every claim, as agents had (/s)", each("probe_events_per_s", ".1f")),
        row("agent RSS (MiB)", each("agent_rss_mean_mib", ".1f")),
        row(
            f"scheduling {sizes['pods']:,} pods, pods/s, median (range) of {sizes['repeats']} runs: "
            "no claim / no-op DRA driver's claim / a bandwidth share of the no-op driver's NIC-like shared "
            "devices / netclaim NIC share / NIC share and pool address / NIC share beside the no-op "
            "driver's 16 devices per node (its first run only)",
            [*last, " / ".join(rate(arm) for arm in arm_names)],
        ),
        row(
            "… netclaim ÷ no-op DRA driver (NIC share; with a pool address; beside the no-op devices)",
            [*last, f"{nic['ratio_vs_dra']:.2f}; {pool['ratio_vs_dra']:.2f}; {gpus['ratio_vs_dra']:.2f}"],
        ),
        row(
            "… netclaim ÷ no claim (NIC share; with a pool address; beside the no-op devices)",
            [*last, f"{nic['ratio_vs_none']:.2f}; {pool['ratio_vs_none']:.2f}; {gpus['ratio_vs_none']:.2f}"],
        ),
        row(
            "… per repeat, median (each run): netclaim NIC share ÷ the no-op driver's shared devices "
            "(`sched_ratio_vs_dra_shared`); NIC share and pool address ÷ NIC share "
            "(`sched_ratio_pool_vs_nic`)",
            [*last, f"{per_repeat(nic, 'dra_shared')}; {per_repeat(pool, 'netclaim')}"],
        ),
        row(
            "the scheduler's algorithm per pod, p99 (ms), same arms",
            [*last, " / ".join(algorithm(arm) for arm in arm_names)],
        ),
        row(
            f"a pool claim's address taken as at prepare, {sizes['pods']:,} claims: 32 at once, p50 / p99 "
            "(ms) and per second; then the last ones one at a time, the pool nearly full, p50 / p99 (ms)",
            [
                *last,
                f"{ipam('bulk_p50_ms', '.0f')} / {ipam('bulk_p99_ms', '.0f')}, "
                f"{ipam('bulk_per_s', '.0f')}/s; "
                f"{ipam('alloc_p50_ms', '.0f')} / {ipam('alloc_p99_ms', '.0f')}",
            ],
        ),
        row(
            "the controller: its status counts them after (s); once the claims are gone (after s), it has "
            "freed their addresses in (s); its RSS (MiB)",
            [
                *last,
                f"{ipam('status_counted_after_s', '.1f')}; {ipam('claims_deleted_s', '.0f')}, "
                f"{ipam('freed_after_s', '.1f')}; {ipam('controller_rss_mib', '.1f')}",
            ],
        ),
        row(
            f"one agent, {dense['claims']:,} claims prepared (kubelet-less node, 32 NICs): its RSS / anon / "
            "PSS (MiB) idle, then prepared, then unprepared; prepare and unprepare p50 / p99 (ms)",
            [
                *last,
                "; ".join(_process_memory(dense["memory_mib"][w]) for w in ("idle", "prepared", "unprepared"))
                + f"; {_p50_p99(dense['prepare_ms'])}, {_p50_p99(dense['unprepare_ms'])}",
            ],
        ),
        row(f"publish {published:g} nodes' slices, one process (s)", [*last, f"{result['publish_s']:.2f}"]),
        "",
        SCALE_END,
    ]
    return "\n".join(rows)


def _process_memory(mib: dict[str, float]) -> str:
    return f"{mib['rss']:.1f} / {mib['anon']:.1f} / {mib['pss']:.1f}"


def _p50_p99(distribution: dict[str, Any]) -> str:
    return " / ".join("—" if distribution[q] is None else f"{distribution[q]:.1f}" for q in ("p50", "p99"))


def render_scale(result: dict[str, Any], root: Path = REPO_ROOT) -> None:
    _write_section(root / "docs" / "scale.md", SCALE_BEGIN, SCALE_END, scale_table(result))


if __name__ == "__main__":
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else REPO_ROOT / "bench" / "report.json"
    render(json.loads(path.read_text()))

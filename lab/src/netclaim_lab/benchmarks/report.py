"""docs/benchmarks.md, its plots and README's figures table, all from one bench/report.json.

Usage: .venv/bin/python -m netclaim_lab.benchmarks.report [bench/report.json]   (make bench runs it)
"""

from __future__ import annotations

import json
import os
import platform
import re
import sys
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from netclaim_lab.layout import REPO_ROOT

PLOTS = "docs/benchmarks"
README_BEGIN = "<!-- bench:begin (make bench writes this table from bench/report.json) -->"
README_END = "<!-- bench:end -->"

# (BENCH key, what, target, how the measured value compares: "le" = at most the target)
TARGETS: list[tuple[str, str, float]] = [
    ("attach_ratio", "attach p50 ÷ raw plugin exec p50, one NIC", 1.2),
    ("attach4_p99_ms", "4 NICs: RunPodSandbox time netclaim adds, p99 (ms)", 500),
    ("prepare_p99_ms", "NodePrepareResources per claim, p99 (ms)", 20),
    ("podstart_p50_ratio", "pod start with ÷ without a claim, p50", 1.1),
    ("podstart_p99_ratio", "pod start with ÷ without a claim, p99", 1.2),
    ("rss_idle_mib", "agent idle RSS (MiB)", 60),
    ("cpu_idle_mcores", "agent idle CPU (millicores over 60 s)", 10),
    ("publish1024_s", "1,024 devices, agent start → last slice written (s)", 2),
]


def machine() -> dict[str, Any]:
    return {
        "cpus": os.cpu_count(),
        "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "kernel": platform.release(),
        "python": platform.python_version(),
    }


def bench_values(line: str) -> dict[str, float]:
    return {k: float(v) for k, v in (pair.split("=") for pair in line.split()[1:])}


def _row(
    name: str, d: dict[str, Any], unit: str, scale: float = 1.0, floor: dict[str, Any] | None = None
) -> str:
    cells = [f"{d[p] * scale:.1f}" for p in ("p50", "p90", "p99")]
    ratio = f"{d['p50'] / floor['p50']:.2f}x" if floor else ""
    return f"| {name} | {' | '.join(cells)} | {unit} | {d['n']} | {ratio} |"


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
        "attach, 1 NIC (agent log)": serial["attach_agent_log"]["values"],
        "raw exec, 4 config lists": floor["add_4"]["values"],
        "added to RunPodSandbox, 4 NICs": serial["added_by_netclaim_4"]["values"],
    }
    axis.boxplot(list(series.values()), orientation="horizontal", tick_labels=list(series), whis=(1, 99))
    axis.set_xlabel("ms")
    axis.set_title("Attach vs the raw CNI exec, one pod at a time")
    save(figure, "attach.svg")

    figure, axis = plt.subplots(figsize=(7, 3.6))
    for label, key in (("without a claim", "without_claim_s"), ("with a netclaim claim", "with_claim_s")):
        values = result["burst"][key]["values"]
        axis.plot(
            values, [(i + 1) / len(values) for i in range(len(values))], label=label, drawstyle="steps-post"
        )
    axis.set_xlabel("create → Ready (s)")
    axis.set_ylabel("fraction of pods")
    axis.set_title(
        f"Pod start, {result['burst']['without_claim_s']['n']} pods in bursts of {sizes['burst_pods']}"
    )
    axis.legend()
    save(figure, "podstart.svg")

    figure, axis = plt.subplots(figsize=(7, 3.6))
    idle = result["idle"]["node-1"]["rss_series"]
    axis.plot([t for t, _ in idle], [r for _, r in idle], label="idle (60 s)")
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


def markdown(result: dict[str, Any]) -> str:
    values = bench_values(result["bench_line"])
    serial, floor, burst, idle, full, publish, sizes = (
        result[k] for k in ("serial", "floor", "burst", "idle", "fullnode", "publish", "sizes")
    )
    lines = [
        "# Benchmarks",
        "",
        f"Written by `make bench` on {result['when']} ({result['machine']['cpus']} CPUs, "
        f"{result['machine']['memory_gib']} GiB, kernel {result['machine']['kernel']}, Python "
        f"{result['machine']['python']}) in {result['seconds'] / 60:.1f} min; every figure below is from "
        "that one run "
        "(`bench/report.json`). The cluster is lab/src/netclaim_lab/benchmarks/cluster.yaml: real "
        "kube-apiserver, scheduler, kubelet and containerd, the agents deployed from `deploy/` as the "
        "DaemonSet users run.",
        "",
        "## Against the targets",
        "",
        "| figure | target | measured | |",
        "|---|---|---|---|",
    ]
    for key, what, target in TARGETS:
        met = "met" if values[key] <= target else "**missed** (see below)"
        lines.append(f"| {what} | ≤ {target:g} | {values[key]:g} | {met} |")
    lines += [
        f"| a full node: {full['pods']} pods with one NIC each, all Ready (s) | — "
        f"| {values['fullnode_s']:g} | |",
        "",
        "```",
        result["bench_line"],
        "```",
        "",
        "## Configure path, one pod at a time (node-1)",
        "",
        "Where: the raw exec is timed by `lab/src/netclaim_lab/benchmarks/raw_cni.py` inside the node; "
        "RunPodSandbox by containerd's "
        "own log (request → sandbox id, NRI hook included); attach, CNI ADD and Node(Un)PrepareResources by "
        "the agent's log lines (kubelet's DRA histograms start at 100 ms, too coarse for these).",
        "",
        "| figure | p50 | p90 | p99 | unit | n | ÷ floor p50 |",
        "|---|---|---|---|---|---|---|",
        _row("raw exec, macvlan + host-local (floor)", floor["add_1"], "ms"),
        _row("raw exec, 4 such config lists (floor)", floor["add_4"], "ms"),
        _row(
            "attach, 1 NIC: ADD + read-back + state (agent log)",
            serial["attach_agent_log"],
            "ms",
            floor=floor["add_1"],
        ),
        _row(
            "CNI ADD exec inside that attach (agent log)",
            serial["cni_add_agent_log"],
            "ms",
            floor=floor["add_1"],
        ),
        _row("RunPodSandbox, no claim (containerd)", serial["run_pod_sandbox"]["none"], "ms"),
        _row("RunPodSandbox, 1 NIC (containerd)", serial["run_pod_sandbox"]["one"], "ms"),
        _row("RunPodSandbox, 4 NICs (containerd)", serial["run_pod_sandbox"]["four"], "ms"),
        _row(
            "added by netclaim to RunPodSandbox, 1 NIC",
            serial["added_by_netclaim_1"],
            "ms",
            floor=floor["add_1"],
        ),
        _row(
            "added by netclaim to RunPodSandbox, 4 NICs",
            serial["added_by_netclaim_4"],
            "ms",
            floor=floor["add_4"],
        ),
        _row("NodePrepareResources per claim (agent log)", serial["prepare_agent_log"], "ms"),
        _row("NodeUnprepareResources per claim (agent log)", serial["unprepare_agent_log"], "ms"),
        "",
        "\"Added by netclaim\" is each pod's RunPodSandbox minus the p50 of the claimless pods', "
        "interleaved in "
        "the same run; it includes the NRI round trip through containerd.",
        "",
        "![attach](benchmarks/attach.svg)",
        "",
        "## Pod start as users feel it",
        "",
        f"{sizes['burst_rounds']} rounds of {sizes['burst_pods']} pods created at once (spread by the "
        "scheduler over both nodes), alternately without a claim and with a one-NIC claim (bandwidth "
        "enforced with tc); "
        "create → the pod Ready and, with a claim, every device of its claim Ready in `status.devices`, as "
        "the API server's watch delivered them to the benchmark.",
        "",
        "| figure | p50 | p90 | p99 | unit | n | ÷ floor p50 |",
        "|---|---|---|---|---|---|---|",
        _row("pods without a claim (floor)", burst["without_claim_s"], "s"),
        _row("pods with a netclaim claim", burst["with_claim_s"], "s", floor=burst["without_claim_s"]),
        "",
        f"Ratio p50 {burst['ratio_p50']:.2f}, p99 {burst['ratio_p99']:.2f}; the node-1 agent's peak RSS "
        "during "
        f"the bursts: {burst['peak_rss_mib']:.1f} MiB.",
        "",
        "![pod start](benchmarks/podstart.svg)",
        "",
        "## A full node",
        "",
        f"{full['pods']} pods, each with a one-NIC claim, created at once on node-1 (4 NICs, 32 "
        f"attachments): all Ready with their claims in {full['all_ready_s']:.1f} s. The agent's RSS at the "
        f"end {full['agent_rss_end_mib']:.1f} MiB (peak {full['agent_peak_rss_mib']:.1f}), its CPU while "
        f"the node filled {full['agent_cpu_mcores_during']:.0f} millicores.",
        "",
        "![full node](benchmarks/fullnode.svg)",
        "",
        "## The agent at rest",
        "",
        "| node | RSS (MiB, max over the window) | CPU (millicores) | window (s) |",
        "|---|---|---|---|",
        *(
            f"| {node} | {v['rss_mib']:.1f} | {v['cpu_mcores']:.1f} | {v['seconds']:.0f} |"
            for node, v in sorted(idle.items())
        ),
        "",
        "![rss](benchmarks/rss.svg)",
        "",
        "## Publish",
        "",
        "| figure | p50 | p90 | p99 | unit | n | |",
        "|---|---|---|---|---|---|---|",
        _row(
            "1,024 devices: agent process start → last slice write (audit log)",
            publish["start_to_1024_s"],
            "s",
        ),
        _row("one NIC added on a node → its slice written (audit log)", publish["nic_added_s"], "s"),
        "",
    ]
    lines += _bounds(result, values)
    lines += _where_the_time_goes(result, values)
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
    "bound → RunPodSandbox": "kubelet reads the claim and calls NodePrepareResources before it asks "
    "containerd for the sandbox",
    "RunPodSandbox": "the NRI hook attaches the interface; containerd holds one lock across each NRI "
    "RunPodSandbox call (internal/nri/nri.go, `local.RunPodSandbox`), so a node's attaches run one "
    "after another",
    "sandbox → Ready": "each container start runs the claim's CDI gate, and the agent writes the "
    "claim's Ready condition after the attach",
}


def _pod_start_bounds(burst: dict[str, Any], cpus: int) -> str:
    """The phases whose p50 grew the most with a claim, largest first, each with what it holds."""
    phases, cpu = burst["phases_s"], burst["machine_cpu_s"]
    growth = sorted(
        ((phases["with"][p]["p50"] - phases["without"][p]["p50"], p) for p in phases["with"]), reverse=True
    )
    steps = "; ".join(
        f"{name} {phases['without'][name]['p50']:.2f} → {phases['with'][name]['p50']:.2f} s "
        f"({PHASE_WORK[name]})"
        for grown, name in growth
        if grown > 0
    )
    used = {arm: sum(cpu_s for _, cpu_s in cpu[arm]["top"]) for arm in ("without", "with")}
    with_claims = dict(cpu["with"]["top"])
    return (
        f"By phase, p50 without → with a claim, the largest growth first: {steps}. The machine did more "
        f"work, too: the busiest commands used {used['without']:.1f} CPU-seconds in the first burst "
        f"without claims ({cpu['without']['seconds']:.1f} s) and {used['with']:.1f} in the first with "
        f"claims ({cpu['with']['seconds']:.1f} s) on {cpus} CPUs (table below): netclaim's two agents "
        "(with the CNI plugins they ran) "
        f"{with_claims.get('netclaim', 0.0):.1f}, this machine's own PID 1 (process_api, no part of the "
        f"cluster) {with_claims.get('process_api', 0.0):.1f}, the rest Kubernetes' DRA work (claims "
        "created, allocated, reserved, written) and the runtime's."
    )


def _bounds(result: dict[str, Any], values: dict[str, float]) -> list[str]:
    """One paragraph per missed target: what the measurements of this run say bounds it."""
    serial, floor, burst, memory = result["serial"], result["floor"], result["burst"], result["memory"]
    said = {
        "attach_ratio": (
            f"The CNI exec inside the attach took {serial['cni_add_agent_log']['p50']:.1f} ms (p50) against "
            f"{floor['add_1']['p50']:.1f} ms for the same config list run in the node with nothing else "
            f"going on ({serial['cni_add_agent_log']['p50'] / floor['add_1']['p50']:.2f}x): inside "
            "RunPodSandbox the plugins run while containerd and kubelet are still at work on the same pod. "
            "netclaim's own part of the "
            f"attach is {serial['attach_agent_log']['p50'] - serial['cni_add_agent_log']['p50']:.1f} ms: the "
            "interface read back from the pod's namespace for the claim's status, and the state row written "
            "after the ADD (profile below). The row written before the ADD (so a crash inside it can be "
            "undone) precedes this figure; the whole hook as containerd sees it is the RunPodSandbox "
            f"difference above, {serial['added_by_netclaim_1']['p50']:.1f} ms at p50, NRI's round trip "
            "included."
        ),
        "podstart_p50_ratio": _pod_start_bounds(burst, result["machine"]["cpus"]),
        "rss_idle_mib": (
            f"The interpreter and the libraries the agent imports hold {memory['after_imports_mib']} MiB "
            "before the agent does anything (table below: gRPC for kubelet's plugin API, pyroute2 for "
            "netlink, httpx2 and lightkube for the API, pydantic for the types); the agent's run-time "
            f"state adds {values['rss_idle_mib'] - memory['after_imports_mib']:.1f} MiB. Under 60 MiB "
            "would need fewer or lighter libraries than the ones this project standardised on."
        ),
    }
    said["podstart_p99_ratio"] = said["podstart_p50_ratio"]
    lines = []
    for key, what, target in TARGETS:
        if values[key] > target and key in said:
            if key == "podstart_p99_ratio" and values["podstart_p50_ratio"] > TARGETS[3][2]:
                continue  # the same reasons, said once
            lines += [f"**{what}: {values[key]:g} against ≤ {target:g}.** {said[key]}", ""]
    return ["## Targets missed, and what bounds them", "", *lines] if lines else []


def _where_the_time_goes(result: dict[str, Any], values: dict[str, float]) -> list[str]:
    burst, serial, floor, memory = result["burst"], result["serial"], result["floor"], result["memory"]
    phases, sizes = burst["phases_s"], result["sizes"]
    lines = [
        "## Where the time goes",
        "",
        "### Pod start, phase by phase",
        "",
        "Each pod's start split at the moments the benchmark can see from outside: bound to a node (API "
        "watch), kubelet asking containerd for the sandbox and containerd returning it (containerd's log), "
        "Ready (API watch; with a claim, also the claim's devices Ready).",
        "",
        "| phase | without a claim p50 | p99 | with a claim p50 | p99 |",
        "|---|---|---|---|---|",
    ]
    for phase in phases["without"]:
        a, b = phases["without"][phase], phases["with"].get(phase)
        if b is not None:
            lines.append(
                f"| {phase} | {a['p50']:.2f} s | {a['p99']:.2f} s | {b['p50']:.2f} s | {b['p99']:.2f} s |"
            )
    cpu = burst["machine_cpu_s"]
    lines += [
        "",
        "What the machine's CPU did during the first burst of each kind (CPU seconds per command, all "
        "processes, from /proc; `process_api` is this machine's own PID 1, not part of the cluster or "
        "of netclaim):",
        "",
        "| without a claim | | with a claim | |",
        "|---|---|---|---|",
    ]
    for (c1, s1), (c2, s2) in zip(cpu["without"]["top"], cpu["with"]["top"], strict=False):
        lines.append(f"| {c1} | {s1} s | {c2} | {s2} s |")
    lines += [
        f"| *elapsed* | {cpu['without']['seconds']:.1f} s | *elapsed* | {cpu['with']['seconds']:.1f} s |",
        "",
        "### The agent's CPU, profiled",
        "",
        "py-spy sampled the node-1 agent from outside, without pausing it, at 1,000 Hz while "
        f"{sizes['profiled_pods']} one-NIC pods started one at a time, then at 200 Hz during a "
        f"{sizes['burst_pods']}-pod burst (a phase of its own, after the "
        "timed ones). A busy sample is one where the main thread was not waiting in epoll.",
        "",
        *_profile_table("attach (under `Attacher.attach`)", result["profile"]["attach"]),
        *_profile_table("NodePrepareResources (under `Preparer.prepare`)", result["profile"]["prepare"]),
        *_profile_table(
            f"the whole agent during a {sizes['burst_pods']}-pod burst", result["profile"]["burst"]
        ),
        "### The agent's memory",
        "",
        f"Each library as the agent image's Python imports it, one after the other, in the agent's "
        f"container: the interpreter alone {memory['python_mib']} MiB, "
        f"{memory['after_imports_mib']} MiB with every module of the agent imported; idle, the agent "
        f"holds {values['rss_idle_mib']:g} MiB.",
        "",
        "| import | adds (MiB) |",
        "|---|---|",
        *(f"| {name} | {mib} |" for name, mib in memory["steps_mib"]),
        "",
        "### The attach, one pod at a time",
        "",
        f"The CNI exec inside the agent's attach took {serial['cni_add_agent_log']['p50']:.1f} ms at p50 "
        f"against {floor['add_1']['p50']:.1f} ms for the same exec run alone in the node; the attach "
        f"around it (the interface read back, the state written after the ADD) "
        f"{serial['attach_agent_log']['p50'] - serial['cni_add_agent_log']['p50']:.1f} ms more.",
        "",
    ]
    return lines


def readme_table(result: dict[str, Any]) -> str:
    values = bench_values(result["bench_line"])
    rows = [
        README_BEGIN,
        "",
        "| benchmark (`make bench`, docs/benchmarks.md) | target | measured |",
        "|---|---|---|",
    ]
    rows += [f"| {what} | ≤ {target:g} | {values[key]:g} |" for key, what, target in TARGETS]
    rows += [
        f"| a full node, {result['fullnode']['pods']} one-NIC pods Ready (s) | — "
        f"| {values['fullnode_s']:g} |",
        "",
        README_END,
    ]
    return "\n".join(rows)


def _write_readme_section(root: Path, begin: str, end: str, section: str) -> None:
    readme = root / "README.md"
    text = readme.read_text()
    pattern = re.compile(re.escape(begin) + ".*?" + re.escape(end), re.S)
    if not pattern.search(text):
        raise SystemExit(f"README.md has no {begin!r} … {end!r} section to write")
    readme.write_text(pattern.sub(lambda _: section, text))


def render(result: dict[str, Any], root: Path = REPO_ROOT) -> None:
    _write_readme_section(root, README_BEGIN, README_END, readme_table(result))
    _plots(result, root / PLOTS)
    (root / "docs" / "benchmarks.md").write_text(markdown(result))


SCALE_BEGIN = "<!-- scale:begin (make bench-scale writes this table from bench/scale.json) -->"
SCALE_END = "<!-- scale:end -->"


def scale_table(result: dict[str, Any]) -> str:
    """README's scale table: the same churn window at each cluster size, then the scheduler's runs."""
    sizes, large = result["sizes"], result["large"]
    windows = [result["small"]["churn"], result["mid"]["churn"], large["churn"]]
    claims, plain = large["with_claims"], large["without_claims"]
    churn = sizes["churn_pods"]

    def row(what: str, cells: list[str]) -> str:
        return f"| {what} | " + " | ".join(cells) + " |"

    def each(key: str, form: str) -> list[str]:
        return [format(window[key], form) for window in windows]

    published = result["mid"]["added"] + large["added"]
    ratio = large["claims_to_plain_ratio"]

    def algorithm(run: dict[str, Any]) -> float:
        return float(run["scheduler"]["algorithm_p99_s"]) * 1000

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
            "scheduling, pods with a bandwidth claim ÷ without (pods/s)",
            ["", "", f"{claims['pods_per_s']:.1f} ÷ {plain['pods_per_s']:.1f} = {ratio:.2f}"],
        ),
        row(
            "the scheduler's algorithm (filters, scores) per pod with ÷ without a claim, p99 (ms)",
            ["", "", f"{algorithm(claims):.1f} ÷ {algorithm(plain):.1f}"],
        ),
        row(
            "a scheduling attempt (algorithm and binding) with a claim, p99 (ms)",
            ["", "", f"{claims['scheduler']['attempt_p99_s'] * 1000:.0f}"],
        ),
        row(f"publish {published:g} nodes' slices, one process (s)", ["", "", f"{result['publish_s']:.2f}"]),
        "",
        SCALE_END,
    ]
    return "\n".join(rows)


def render_scale(result: dict[str, Any], root: Path = REPO_ROOT) -> None:
    _write_readme_section(root, SCALE_BEGIN, SCALE_END, scale_table(result))


if __name__ == "__main__":
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else REPO_ROOT / "bench" / "report.json"
    render(json.loads(path.read_text()))

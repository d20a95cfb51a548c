"""How the benchmark observes the agent from outside: /proc, containerd's log, the API server's watch.

Nothing here asks the agent anything; what the agent logs about itself is read by the suite, labelled so.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2
import numpy as np
import scipy.stats
from lightkube import Client
from lightkube.resources.core_v1 import Pod
from lightkube.resources.resource_v1 import ResourceClaim

TICKS = os.sysconf("SC_CLK_TCK")


# Fewer samples than this and a quantile is no figure: with under 100, "p99" would be the largest sample.
MIN_SAMPLES = {50: 1, 90: 10, 99: 100}
BOOTSTRAP_RESAMPLES = 2000


def _quantile(values: Any, q: int, axis: int = -1) -> Any:
    """The nearest-rank quantile: always a value that was measured (numpy's "inverted_cdf")."""
    return np.percentile(values, q, axis=axis, method="inverted_cdf")


def _bootstrap(samples: tuple[list[float], ...], statistic: Callable[..., Any]) -> list[float]:
    """The 95 % percentile-bootstrap interval of `statistic` over independent `samples` (scipy's), seeded
    so that the same samples give the same interval."""
    found = scipy.stats.bootstrap(
        tuple(np.asarray(s) for s in samples),
        statistic,
        n_resamples=BOOTSTRAP_RESAMPLES,
        method="percentile",
        paired=False,
        vectorized=True,
        rng=np.random.default_rng(0),
    )
    return [float(found.confidence_interval.low), float(found.confidence_interval.high)]


def distribution(values: Iterable[float]) -> dict[str, Any]:
    """n, p50/p90/p99 by nearest rank (each a measured value), each with its 95 % bootstrap interval, and
    the samples. A quantile with fewer samples than MIN_SAMPLES says is None: no maximum passes as p99."""
    ordered = sorted(float(v) for v in values)  # counts too: scipy's quantiles take floats only
    if not ordered:
        raise ValueError("no samples: the phase measured nothing")
    result: dict[str, Any] = {"n": len(ordered)}
    ci: dict[str, list[float]] = {}
    for q, needed in MIN_SAMPLES.items():
        enough = len(ordered) >= needed
        result[f"p{q}"] = float(_quantile(ordered, q)) if enough else None
        if enough and len(ordered) >= 10:
            ci[f"p{q}"] = _bootstrap((ordered,), functools.partial(_quantile, q=q))
    return {**result, "ci95": ci, "min": ordered[0], "max": ordered[-1], "values": ordered}


def ratio(numerator: list[float], denominator: list[float], q: int) -> dict[str, Any]:
    """The q-th quantile of `numerator` over that of `denominator`, with its 95 % bootstrap interval (the
    two resampled independently); None where either has fewer samples than the quantile needs."""
    if min(len(numerator), len(denominator)) < MIN_SAMPLES[q]:
        return {"value": None, "ci95": None}

    def quotient(a: Any, b: Any, axis: int = -1) -> Any:
        return _quantile(a, q, axis) / _quantile(b, q, axis)

    value = float(quotient(numerator, denominator))
    enough = min(len(numerator), len(denominator)) >= 10
    return {"value": value, "ci95": _bootstrap((numerator, denominator), quotient) if enough else None}


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise ValueError(f"/proc/{pid}/status has no VmRSS")


def cpu_seconds(pid: int) -> float:
    """utime + stime of the process, all its threads (its waited-for children not included)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


CGROUP_ROOT = Path("/sys/fs/cgroup")


def _memory_cgroup(pid: int) -> Path:
    """The memory cgroup directory of the process (cgroup v1's memory controller, or v2's one tree)."""
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            return CGROUP_ROOT / "memory" / path.lstrip("/")
        if controllers == "" and (CGROUP_ROOT / "cgroup.controllers").exists():
            return CGROUP_ROOT / path.lstrip("/")
    raise ValueError(f"process {pid}: no memory cgroup")


def _kib_field(path: Path, name: str) -> float:
    for line in path.read_text().splitlines():
        if line.startswith(f"{name}:"):
            return int(line.split()[1]) / 1024
    raise ValueError(f"{path}: no {name}")


def container_memory(pid: int) -> dict[str, float]:
    """MiB of the container that `pid` runs in, as its cgroup counts it (anonymous memory: what the
    container holds that no file backs, v1 `total_rss` or v2 `anon`; and everything, cache included), and
    the PSS of each process in it summed (shared pages split among who maps them): {"anon", "usage",
    "pss", "rss"} (rss: `pid`'s own)."""
    cgroup = _memory_cgroup(pid)
    stat = dict(line.split() for line in (cgroup / "memory.stat").read_text().splitlines())
    anon = int(stat.get("total_rss", stat.get("anon", "0")))
    usage_file = cgroup / "memory.usage_in_bytes"  # v1
    if not usage_file.exists():
        usage_file = cgroup / "memory.current"
    pss = 0.0
    for member in (cgroup / "cgroup.procs").read_text().split():
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):
            pss += _kib_field(Path(f"/proc/{member}/smaps_rollup"), "Pss")
    return {
        "anon": anon / 2**20,
        "usage": int(usage_file.read_text()) / 2**20,
        "pss": pss,
        "rss": rss_mib(pid),
    }


@dataclass
class ProcessSampler:
    """Samples a process's RSS and CPU time every `interval` seconds in a thread, until stopped."""

    pid: int
    interval: float = 0.2
    samples: list[tuple[float, float, float]] = field(default_factory=list)  # (monotonic, MiB, cpu s)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> ProcessSampler:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.samples.append((time.monotonic(), rss_mib(self.pid), cpu_seconds(self.pid)))
            except (FileNotFoundError, ProcessLookupError):
                return
            self._stop.wait(self.interval)

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def peak_rss(self) -> float:
        return max(s[1] for s in self.samples)

    def millicores(self) -> float:
        (t0, _, c0), (t1, _, c1) = self.samples[0], self.samples[-1]
        return (c1 - c0) / (t1 - t0) * 1000


AGENT_USER = "system:serviceaccount:netclaim-system:netclaim-agent"
NODE_NAME_EXTRA = "authentication.kubernetes.io/node-name"  # in tokens bound to a pod or a node


@dataclass
class AgentRequest:
    """One request of a netclaim agent, as the API server's audit log recorded it."""

    node: str  # the node the agent's token is bound to
    verb: str
    resource: str
    name: str
    query: dict[str, list[str]]
    code: int  # the API server's answer (403: refused)
    namespace: str = ""
    at: float = 0.0  # when the API server answered (time.time())

    def wide(self) -> str | None:
        """Why this read grows with the cluster rather than with the agent's own node (None: it does not).
        Named reads and writes are narrow; a list or watch must be narrowed server-side to this node's
        slices, or to one claim's (or, after an address collision, one pool's) IPAllocations. IPPools are
        the exception: a claim whose own config names IPAM lists them to keep its addresses out of every
        pool, and there are as many as the admin made, however large the cluster grows."""
        if not self.resource:  # discovery (/api, /apis, /version): no objects read
            return None
        if self.verb not in ("list", "watch"):
            return (
                None if self.name or self.verb == "create" else f"{self.verb} {self.resource} without a name"
            )
        fields = ",".join(self.query.get("fieldSelector", []))
        labels = ",".join(self.query.get("labelSelector", []))
        if self.resource == "ippools":
            return None
        if self.resource == "resourceslices" and f"spec.nodeName={self.node}" in fields.split(","):
            return None
        if self.resource == "configmaps" and labels == f"netclaim.dev/policy-rules in (guards,{self.node})":
            return None  # the policy guards and this node's rules: two objects, whatever the cluster's size
        keys = {term.split("=", 1)[0] for term in labels.split(",") if "=" in term and "!=" not in term}
        if self.resource == "ipallocations" and keys & {"netclaim.dev/claim-uid", "netclaim.dev/pool"}:
            return None
        return (
            f"{self.verb} {self.resource} (fieldSelector {fields!r}, labelSelector {labels!r}) "
            f"by the agent of {self.node}"
        )


def agent_requests(audit_log: Path, offset: int = 0) -> list[AgentRequest]:
    """Every request of a netclaim agent in the audit log after `offset` (one per request: the stage
    ResponseComplete, or ResponseStarted for a watch still open)."""
    found: dict[str, AgentRequest] = {}
    with audit_log.open() as log:
        log.seek(offset)
        for line in log:
            try:
                entry = json.loads(line)
            except json.JSONDecodeError:  # the line the API server is writing now
                continue
            user = entry.get("user") or {}
            if user.get("username") != AGENT_USER:
                continue
            ref = entry.get("objectRef") or {}
            uri = urllib.parse.urlsplit(entry.get("requestURI", ""))
            found[entry["auditID"]] = AgentRequest(
                node=((user.get("extra") or {}).get(NODE_NAME_EXTRA) or ["?"])[0],
                verb=entry.get("verb", ""),
                resource=ref.get("resource", "")
                + (f"/{ref['subresource']}" if ref.get("subresource") else ""),
                name=ref.get("name", ""),
                query=urllib.parse.parse_qs(uri.query),
                code=int((entry.get("responseStatus") or {}).get("code", 0)),
                namespace=ref.get("namespace", ""),
                at=_audit_time(entry),
            )
    return list(found.values())


def _audit_time(entry: dict[str, Any]) -> float:
    stamp = entry.get("stageTimestamp") or entry.get("requestReceivedTimestamp")
    return datetime.datetime.fromisoformat(stamp).timestamp() if stamp else 0.0


@dataclass(frozen=True)
class PodRequests:
    """The agent's requests about one pod: on its claims (the claim and its status) and on the pod itself
    (its annotation, its Events), those answered by the time the pod was Ready, and all of them."""

    start: int
    lifecycle: int


def requests_per_pod(
    requests: list[AgentRequest], namespace: str, claims: dict[str, set[str]], ready: dict[str, float]
) -> tuple[dict[str, PodRequests], int]:
    """Per pod of `claims` ({pod: its claims' names}), the agent requests about it (PodRequests); and how
    many other agent requests there were (the agent's own upkeep, another pod's: never hidden)."""
    owner = {claim: pod for pod, names in claims.items() for claim in names}
    start: dict[str, int] = dict.fromkeys(claims, 0)
    total: dict[str, int] = dict.fromkeys(claims, 0)
    others = 0
    for request in requests:
        kind = request.resource.split("/")[0]
        pod = None
        if request.namespace == namespace and kind == "resourceclaims":
            pod = owner.get(request.name)
        elif request.namespace == namespace and kind == "pods" and request.name in claims:
            pod = request.name
        elif request.namespace == namespace and kind == "events":
            pod = next((p for p in claims if request.name.startswith(f"{p}.")), None)
        if pod is None:
            others += 1
            continue
        total[pod] += 1
        if request.at <= ready.get(pod, 0.0):
            start[pod] += 1
    return {pod: PodRequests(start[pod], total[pod]) for pod in claims}, others


_SANDBOX = re.compile(
    r'^time="([^"]+)" level=info msg="RunPodSandbox for name:\\"[^\\]*\\"\s+uid:\\"([0-9a-f-]+)\\"'
)


def _stamp(text: str) -> float:
    # containerd writes nanoseconds; datetime keeps microseconds, which is finer than anything measured here
    whole, _, fraction = text.rstrip("Z").partition(".")
    stamp = datetime.datetime.fromisoformat(whole).replace(tzinfo=datetime.UTC)
    return stamp.timestamp() + float(f"0.{fraction or '0'}")


def run_pod_sandbox_ms(containerd_log: Path, offset: int, uids: set[str]) -> dict[str, float]:
    """RunPodSandbox's duration per pod UID as containerd logged it (request → sandbox id returned), which
    includes the NRI RunPodSandbox hook: what netclaim adds to a pod's sandbox, seen by the runtime."""
    return {
        uid: (end - start) * 1000
        for uid, (start, end) in run_pod_sandbox(containerd_log, offset, uids).items()
    }


_SANDBOX_ID = re.compile(r'returns sandbox id \\"([0-9a-f]+)\\"')
_CREATED = re.compile(
    r'^time="([^"]+)" level=info msg="CreateContainer within sandbox \\"([0-9a-f]+)\\" for .* '
    r'returns container id \\"([0-9a-f]+)\\"'
)
_STARTED = re.compile(
    r'^time="([^"]+)" level=info msg="StartContainer for \\"([0-9a-f]+)\\" returns successfully'
)


@dataclass(frozen=True)
class PodMarks:
    """A pod's start as containerd logged it, wall clock: RunPodSandbox asked and answered (its last
    successful one), and its first container created and started in that sandbox."""

    sandbox: tuple[float, float]
    created: float
    started: float


def pod_marks(containerd_log: Path, offset: int, uids: set[str]) -> dict[str, PodMarks]:
    """PodMarks per pod UID, for the pods whose marks are all in the log from `offset` on.

    containerd's CreateContainer and StartContainer take the same lock as its NRI RunPodSandbox calls
    (containerd/nri#165): their time grows with the hooks of the other pods of the node."""
    sandboxes = run_pod_sandbox(containerd_log, offset, uids)
    sandbox_of: dict[str, str] = {}  # sandbox id → pod UID, every successful RunPodSandbox
    created: dict[str, tuple[str, float]] = {}  # sandbox id → (first container's id, created at)
    started: dict[str, float] = {}  # container id → started at
    with containerd_log.open() as log:
        log.seek(offset)
        for line in log:
            if (match := _SANDBOX.match(line)) and match.group(2) in uids:
                if found := _SANDBOX_ID.search(line):
                    sandbox_of[found.group(1)] = match.group(2)
            elif match := _CREATED.match(line):
                created.setdefault(match.group(2), (match.group(3), _stamp(match.group(1))))
            elif match := _STARTED.match(line):
                started.setdefault(match.group(2), _stamp(match.group(1)))
    marks: dict[str, PodMarks] = {}
    for sandbox_id, (container_id, created_at) in created.items():
        uid = sandbox_of.get(sandbox_id, "")
        span = sandboxes.get(uid)
        if span is None or container_id not in started or not span[1] <= created_at:
            continue  # another pod's, a sandbox given up, or not started in the window
        marks[uid] = PodMarks(span, created_at, started[container_id])
    return marks


def run_pod_sandbox(containerd_log: Path, offset: int, uids: set[str]) -> dict[str, tuple[float, float]]:
    """(request, sandbox id returned) per pod UID, wall clock, the last successful RunPodSandbox of each."""
    started: dict[str, float] = {}
    spans: dict[str, tuple[float, float]] = {}
    with containerd_log.open() as log:
        log.seek(offset)
        for line in log:
            match = _SANDBOX.match(line)
            if not match or match.group(2) not in uids:
                continue
            uid, stamp = match.group(2), _stamp(match.group(1))
            if "returns sandbox id" in line and uid in started:
                spans[uid] = (started.pop(uid), stamp)
            elif "returns sandbox id" not in line and "failed" not in line:
                started[uid] = stamp
    return spans


@dataclass
class ReadyWatch:
    """Watches a namespace's pods and claims through the API server and records, per pod, when it was
    bound to a node, when it was first Ready and when all of its claims' devices had a Ready condition
    (wall clock, comparable with containerd's log)."""

    client: Client
    namespace: str
    pod_ready: dict[str, float] = field(default_factory=dict)
    pod_bound: dict[str, float] = field(default_factory=dict)
    pod_uid: dict[str, str] = field(default_factory=dict)
    claim_ready: dict[str, float] = field(default_factory=dict)  # by the owning pod's name
    pod_claims: dict[str, set[str]] = field(default_factory=dict)  # pod name → its claims' names
    _threads: list[threading.Thread] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def __enter__(self) -> ReadyWatch:
        for target in (self._pods, self._claims):
            thread = threading.Thread(target=target, daemon=True)
            thread.start()
            self._threads.append(thread)
        time.sleep(0.5)  # both watches established before the first create
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()

    def _follow(self, kind: type[Pod] | type[ResourceClaim], handle: Callable[[Any], None]) -> None:
        """Every event of `kind` in the namespace until stopped; a watch the API server ends is opened
        again (it starts with the objects as they are, so nothing is missed)."""
        while not self._stop.is_set():
            try:
                for _, item in self.client.watch(kind, namespace=self.namespace):
                    if self._stop.is_set():
                        return
                    handle(item)
            except httpx2.HTTPError:
                time.sleep(0.2)

    def _pods(self) -> None:
        self._follow(Pod, self._pod_event)

    def _claims(self) -> None:
        self._follow(ResourceClaim, self._claim_event)

    def _pod_event(self, pod: Pod) -> None:
        name = pod.metadata.name if pod.metadata else None
        if not name or name in self.pod_ready:
            return
        if pod.spec and pod.spec.nodeName and name not in self.pod_bound:
            self.pod_bound[name] = time.time()
            self.pod_uid[name] = str(pod.metadata.uid if pod.metadata else "")
        conditions = (pod.status.conditions if pod.status else None) or []
        if any(c.type == "Ready" and c.status == "True" for c in conditions):
            self.pod_ready[name] = time.time()

    def _claim_event(self, claim: ResourceClaim) -> None:
        pod = _owning_pod(claim)
        if pod is None:
            return
        self.pod_claims.setdefault(pod, set()).add(str(claim.metadata.name if claim.metadata else ""))
        if pod in self.claim_ready:
            return
        devices = (claim.status.devices if claim.status else None) or []
        if devices and all(
            any(c.type == "Ready" and c.status == "True" for c in (d.conditions or [])) for d in devices
        ):
            self.claim_ready[pod] = time.time()

    def ready_at(self, pod: str, with_claim: bool) -> float | None:
        if pod not in self.pod_ready or (with_claim and pod not in self.claim_ready):
            return None
        return max(self.pod_ready[pod], self.claim_ready.get(pod, 0.0))


def _owning_pod(claim: ResourceClaim) -> str | None:
    for owner in (claim.metadata.ownerReferences if claim.metadata else None) or []:
        if owner.kind == "Pod":
            return str(owner.name)
    return None


@dataclass
class Profile:
    """py-spy sampling a process from outside (no code of ours in it), its stacks kept as raw text."""

    pid: int
    path: Path
    rate: int = 200
    _process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Profile:
        py_spy = Path(sys.executable).parent / "py-spy"
        if not py_spy.exists():
            raise SystemExit(f"bench: {py_spy} is missing; run make deps (py-spy is in the dev extras)")
        command = [str(py_spy), "record", "--nonblocking", "--threads", "-r", str(self.rate), "-f", "raw"]
        self._process = subprocess.Popen(
            [*command, "-o", str(self.path), "-p", str(self.pid)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        time.sleep(1)  # attached before the measured work starts
        return self

    def __exit__(self, *_: object) -> None:
        assert self._process is not None
        self._process.send_signal(signal.SIGINT)  # py-spy writes its file on SIGINT
        stderr = self._process.communicate(timeout=60)[1]
        if not self.path.exists():
            raise SystemExit(f"bench: py-spy wrote no profile: {stderr.decode(errors='replace')[-500:]}")


def _frames(line: str) -> tuple[str, list[tuple[str, str]], int] | None:
    """(thread, (function, file) outermost first, samples) of one line of py-spy's raw output (--threads);
    None for a line that is no stack and count (py-spy also writes a thread's name alone)."""
    stack, _, count = line.rstrip().rpartition(" ")
    if not count.isdigit():
        return None
    thread, *frames = stack.split(";")
    parsed = []
    for frame in frames:
        function, _, where = frame.partition(" (")
        parsed.append((function, where.rpartition(":")[0]))
    return thread, parsed, int(count)


def busy_profile(path: Path, under: str | None = None, top: int = 10) -> dict[str, Any]:
    """Where the agent's main thread spent its busy samples (those not waiting in epoll): the inclusive
    share of each of netclaim's own functions (only those called under the function `under`, if given),
    and the self time by package of the innermost frame (pyroute2, lightkube, httpx2, json…)."""
    inclusive: dict[str, int] = {}
    by_package: dict[str, int] = {}
    busy = 0
    for line in path.read_text().splitlines():
        sample = _frames(line)
        if sample is None:
            continue
        thread, frames, count = sample
        if (
            not thread.endswith("MainThread")
            or not frames
            or frames[-1][0] in ("EpollSelector.select", "select")
        ):
            continue
        names = [function for function, _ in frames]
        if under is not None:
            if under not in names:
                continue
            frames = frames[names.index(under) :]
        busy += count
        for function, where in dict.fromkeys(frames):
            if where.startswith("netclaim/") and where != "netclaim/cli/main.py":
                key = f"{function} ({where.removeprefix('netclaim/')})"
                inclusive[key] = inclusive.get(key, 0) + count
        package = frames[-1][1].split("/")[0].removesuffix(".py") or "?"
        by_package[package] = by_package.get(package, 0) + count

    def ranked(counts: dict[str, int]) -> list[list[Any]]:
        ordered = sorted(counts.items(), key=lambda kv: -kv[1])[:top]
        return [[name, round(100 * n / busy, 1)] for name, n in ordered]

    return {"busy_samples": busy, "functions": ranked(inclusive), "packages": ranked(by_package)}


def _cpu_by_command() -> dict[int, tuple[str, float]]:
    """Every process's CPU seconds (its own and its reaped children's), by pid, with its command name."""
    found: dict[int, tuple[str, float]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            text = (entry / "stat").read_text()
        except (FileNotFoundError, ProcessLookupError):
            continue
        command = text[text.index("(") + 1 : text.rindex(")")]
        fields = text.rsplit(")", 1)[1].split()
        found[int(entry.name)] = (command, sum(int(f) for f in fields[11:15]) / TICKS)
    return found


@dataclass
class CpuSplit:
    """CPU seconds the whole machine spent per command name while the block ran (/proc of every process;
    a process gone meanwhile is counted in its parent once reaped)."""

    seconds: float = 0.0
    by_command: dict[str, float] = field(default_factory=dict)
    _before: dict[int, tuple[str, float]] = field(default_factory=dict)
    _started: float = 0.0

    def __enter__(self) -> CpuSplit:
        self._before, self._started = _cpu_by_command(), time.monotonic()
        return self

    def __exit__(self, *_: object) -> None:
        self.seconds = time.monotonic() - self._started
        for pid, (command, cpu) in _cpu_by_command().items():
            before = self._before.get(pid)  # a kernel worker renames itself after its current work
            used = cpu - before[1] if before is not None else cpu
            self.by_command[command] = self.by_command.get(command, 0.0) + used

    def top(self, count: int = 8) -> list[list[Any]]:
        ordered = sorted(self.by_command.items(), key=lambda kv: -kv[1])[:count]
        return [[command, round(cpu, 1)] for command, cpu in ordered]


def _cpu_times() -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs since boot (/proc/stat)."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = values[3] + values[4]  # idle + iowait
    return sum(values) - idle, sum(values)


QUIET_TIMEOUT_SECONDS = 120.0


def skip_quiet_waits() -> None:
    """For the --quick runs of make test, whose figures mean nothing: there, beside the test session's own
    cluster, the CPUs were seldom under a quarter busy and each wait ran to its time-out (2 minutes a
    phase)."""
    global QUIET_TIMEOUT_SECONDS
    QUIET_TIMEOUT_SECONDS = 0.0


def wait_quiet(busy_below: float = 0.25, window: float = 2.0) -> float:
    """Wait until the machine's CPUs were less than `busy_below` busy over a `window` (what the phase
    before left behind, such as 110 pods being torn down, is not measured by the next), QUIET_TIMEOUT_SECONDS
    at the most; returns the wait."""
    started = time.monotonic()
    while time.monotonic() - started < QUIET_TIMEOUT_SECONDS:
        busy0, total0 = _cpu_times()
        time.sleep(window)
        busy1, total1 = _cpu_times()
        if (busy1 - busy0) < busy_below * (total1 - total0):
            break
    return time.monotonic() - started

"""Two NRI plugins that only read the clock, registered around netclaim's (index 50): `before` at index 10,
`after` at 90. containerd calls a RunPodSandbox's plugins one after another in index order, each once the
one before has answered, so `after`'s time minus `before`'s is netclaim's whole hook as the runtime saw it:
the plugin call, the agent's state writes before and after the CNI ADD, and the answer's way back. Neither
plugin reads anything of netclaim's; the agent does not know they are there.

`running()` starts them beside a node (`python -m netclaim_lab.benchmarks.stopwatch <nri.sock> <out.jsonl>`)
and returns once the runtime has synchronized both; one line per event, {"plugin": "before"|"after",
"uid": <pod UID>, "t": <time.time()>}; `hook_seconds()` reads them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TextIO

from netclaim.adapters.nri import run_plugin
from netclaim.core.node import PodSandbox
from netclaim.runtime.supervisor import Supervisor
from netclaim_lab import processes
from netclaim_lab.cluster import ClusterHandle

INDICES = {"before": "10", "after": "90"}  # netclaim's agent registers at 50


class Clock:
    """A plugin's hooks: RunPodSandbox is stamped, everything else answered at once."""

    def __init__(self, plugin: str, out: TextIO) -> None:
        self.plugin, self.out = plugin, out

    async def synchronize(self, pods: list[PodSandbox]) -> None:
        self._write({"plugin": self.plugin, "synchronized": True})

    def _write(self, entry: dict[str, object]) -> None:
        self.out.write(json.dumps(entry) + "\n")
        self.out.flush()

    async def run_pod_sandbox(self, pod: PodSandbox, budget: float) -> None:
        self._write({"plugin": self.plugin, "uid": pod.uid, "t": time.time()})

    async def stop_pod_sandbox(self, pod: PodSandbox, budget: float) -> None:
        return None

    async def remove_pod_sandbox(self, pod: PodSandbox, budget: float) -> None:
        return None


def entries(path: Path) -> list[dict[str, Any]]:
    """The lines a bench NRI plugin wrote so far (a line being written left out)."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]


def stamps(path: Path) -> dict[str, dict[str, float]]:
    """{pod UID: {"before": t, "after": t}} of the pods both plugins saw (the last sandbox of each)."""
    found: dict[str, dict[str, float]] = {}
    for entry in entries(path):
        if "uid" in entry:
            found.setdefault(entry["uid"], {})[entry["plugin"]] = entry["t"]
    return {uid: seen for uid, seen in found.items() if len(seen) == 2}


def hook_seconds(path: Path, uids: set[str]) -> dict[str, float]:
    """netclaim's RunPodSandbox hook, as `after` minus `before`, of each of `uids` both plugins saw."""
    return {uid: s["after"] - s["before"] for uid, s in stamps(path).items() if uid in uids}


@contextlib.contextmanager
def plugin_running(
    name: str,
    command: list[str],
    work: Path,
    out: Path,
    synchronized: Callable[[list[dict[str, Any]]], bool],
) -> Iterator[None]:
    """A bench NRI plugin (`command`, its log and pid in `work`) until the block ends, once `synchronized`
    says the lines it wrote to `out` show containerd synchronized it."""
    processes.start(name, command, pid_dir=work, log_dir=work)
    try:
        processes.wait_until(
            lambda: synchronized(entries(out)),
            30,
            f"{name} synchronized by containerd (log: {work / name}.log)",
        )
        yield
    finally:
        processes.stop(work, name)


@contextlib.contextmanager
def running(handle: ClusterHandle, node: str, work: Path) -> Iterator[Path]:
    """Both plugins registered with `node`'s containerd until the block ends; yields the file they write."""
    name = f"stopwatch-{node}"
    out = work / f"{name}.jsonl"
    out.unlink(missing_ok=True)
    socket = handle.node(node).layout.nri_dir / "nri.sock"
    command = [sys.executable, "-m", "netclaim_lab.benchmarks.stopwatch", str(socket), str(out)]
    with plugin_running(name, command, work, out, _all_synchronized):
        yield out


def _all_synchronized(lines: list[dict[str, Any]]) -> bool:
    return {e["plugin"] for e in lines if e.get("synchronized")} == set(INDICES)


async def _run(socket: Path, out: TextIO) -> None:
    background = Supervisor()
    await asyncio.gather(
        *(
            run_plugin(socket, Clock(plugin, out), background, name=f"stopwatch-{plugin}", index=index)
            for plugin, index in INDICES.items()
        )
    )


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m netclaim_lab.benchmarks.stopwatch <nri.sock> <out.jsonl>", file=sys.stderr)
        return 2
    with Path(argv[1]).open("a") as out:
        asyncio.run(_run(Path(argv[0]), out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

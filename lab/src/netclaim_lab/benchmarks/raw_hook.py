"""The floor of a hook: an NRI plugin that does nothing in RunPodSandbox but run the raw plugin, the same
macvlan + host-local config list raw_cni.py runs, into the new pod's namespace (an interface `raw1`), and
DEL it when the sandbox stops. Run inside a node's namespaces, beside netclaim's agent; it acts only on the
pods whose name starts with the prefix it is given, so netclaim's own pods never meet it.

In a burst, that exec meets what netclaim's meets: the node's other sandboxes being made at the same
moment, under containerd's one NRI lock. Its time is the floor of the ADD inside netclaim's hook (the agent
logs that as `cni_ms`); raw_cni.py's loop beside a burst runs over the whole burst, quiet tail included.

One line per RunPodSandbox it acted on: {"uid": <pod UID>, "add_ms": <the exec>, "hook_ms": <its whole
hook>}; a line {"synchronized": true} once containerd has synchronized it.

Usage: python -m netclaim_lab.benchmarks.raw_hook <nri.sock> <out.jsonl> <pod name prefix> <master NIC>
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

from netclaim.adapters.nri import run_plugin
from netclaim.core.node import PodSandbox
from netclaim.runtime.supervisor import Supervisor
from netclaim_lab.benchmarks import stopwatch
from netclaim_lab.cluster import ClusterHandle

HERE = Path(__file__).parent
INDEX = "60"  # after netclaim's agent (50), which has nothing to do for these pods
INTERFACE = "raw1"


def config(master: str) -> dict[str, object]:
    """raw_cni.py's config list, a network of its own."""
    return {
        "cniVersion": "1.1.0",
        "name": "raw-hook",
        "type": "macvlan",
        "master": master,
        "mode": "bridge",
        "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.99.9.0/24"}]]},
    }


class RawHook:
    def __init__(self, prefix: str, master: str, out: TextIO) -> None:
        self.prefix, self.master, self.out = prefix, master, out
        self._added: dict[str, PodSandbox] = {}  # pod UID → the sandbox its ADD went into

    def _write(self, entry: dict[str, object]) -> None:
        self.out.write(json.dumps(entry) + "\n")
        self.out.flush()

    def _exec(self, command: str, sandbox: PodSandbox) -> float:
        """The plugin run as raw_cni.py runs it (blocking: this plugin does nothing else); its ms."""
        env = {
            "CNI_COMMAND": command,
            "CNI_CONTAINERID": sandbox.id,
            "CNI_NETNS": sandbox.netns,
            "CNI_IFNAME": INTERFACE,
            "CNI_PATH": "/opt/cni/bin",
            "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
        }
        started = time.perf_counter()
        result = subprocess.run(
            ["/opt/cni/bin/macvlan"],
            input=json.dumps(config(self.master)).encode(),
            env=env,
            capture_output=True,
            check=False,
        )
        elapsed = (time.perf_counter() - started) * 1000
        if result.returncode != 0:
            self._write({"uid": sandbox.uid, "failed": command, "output": result.stdout.decode()[-300:]})
        return elapsed

    async def synchronize(self, pods: list[PodSandbox]) -> None:
        self._write({"synchronized": True})

    async def run_pod_sandbox(self, pod: PodSandbox, budget: float) -> None:
        if not pod.name.startswith(self.prefix) or not pod.netns:
            return
        started = time.perf_counter()
        add_ms = self._exec("ADD", pod)
        self._added[pod.uid] = pod
        self._write({"uid": pod.uid, "add_ms": add_ms, "hook_ms": (time.perf_counter() - started) * 1000})

    async def stop_pod_sandbox(self, pod: PodSandbox, budget: float) -> None:
        added = self._added.pop(pod.uid, None)
        if added is not None:
            self._exec("DEL", added)

    async def remove_pod_sandbox(self, pod: PodSandbox, budget: float) -> None:
        await self.stop_pod_sandbox(pod, budget)


def timings(path: Path) -> tuple[list[float], list[float]]:
    """(ADD ms, whole hook ms) of every sandbox the plugin acted on; SystemExit if an exec failed."""
    found = stopwatch.entries(path)
    failed = [e for e in found if "failed" in e]
    if failed:
        raise SystemExit(f"bench: the raw hook's plugin failed: {failed[0]}")
    timed = [e for e in found if "add_ms" in e]
    return [float(e["add_ms"]) for e in timed], [float(e["hook_ms"]) for e in timed]


@contextlib.contextmanager
def running(handle: ClusterHandle, node: str, work: Path, prefix: str, master: str) -> Iterator[Path]:
    """The plugin registered with `node`'s containerd, inside the node, until the block ends; yields the
    file it writes."""
    name = f"raw-hook-{node}"
    out = work / f"{name}.jsonl"
    out.unlink(missing_ok=True)
    command = [sys.executable, "-m", "netclaim_lab.benchmarks.raw_hook", "/run/nri/nri.sock", str(out)]
    inside = [*handle.node(node).enter(), *command, prefix, master]
    with stopwatch.plugin_running(name, inside, work, out, _synchronized):
        yield out


def _synchronized(lines: list[dict[str, Any]]) -> bool:
    return any(e.get("synchronized") for e in lines)


async def _run(socket: Path, hook: RawHook) -> None:
    await run_plugin(socket, hook, Supervisor(), name="raw-hook", index=INDEX)


def main(argv: list[str]) -> int:
    if len(argv) != 4:
        print(__doc__.rsplit("Usage: ", 1)[1], file=sys.stderr)
        return 2
    socket, out_path, prefix, master = argv
    with Path(out_path).open("a") as out:
        asyncio.run(_run(Path(socket), RawHook(prefix, master, out)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

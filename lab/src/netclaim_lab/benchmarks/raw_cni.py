"""The floor: the same CNI config lists executed directly (no netclaim, no runtime), inside a node.

Each run makes a fresh network namespace and ADDs one macvlan + host-local config list per master into it
(net1, net2, ... in order, as netclaim attaches a pod's devices), then DELs them. Run inside the node's
namespaces; prints JSON {"add_ms": [per run, all masters], "del_ms": [...]}.

Usage: raw_cni.py RUNS MASTER[,MASTER...]   (RUNS 0: run until stdin ends, the bench's floor beside a burst)
"""

from __future__ import annotations

import itertools
import json
import os
import select
import subprocess
import sys
import time
from collections.abc import Mapping

CNI = "/opt/cni/bin"  # the node's plugins: those its agent runs (the lab's reference set by default)


def config(index: int, master: str) -> dict[str, object]:
    """The config list netclaim runs for the benchmark's claims (suite.py), master filled in."""
    return {
        "cniVersion": "1.1.0",
        "name": f"raw-bench-{index}",
        "type": "macvlan",
        "master": master,
        "mode": "bridge",
        "ipam": {"type": "host-local", "ranges": [[{"subnet": f"10.99.{index}.0/24"}]]},
    }


def plugin(command: str, container: str, netns: str, ifname: str, conf: Mapping[str, object]) -> float:
    env = {
        "CNI_COMMAND": command,
        "CNI_CONTAINERID": container,
        "CNI_NETNS": netns,
        "CNI_IFNAME": ifname,
        "CNI_PATH": CNI,
        "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
    }
    started = time.perf_counter()
    result = subprocess.run(
        [f"{CNI}/macvlan"], input=json.dumps(conf).encode(), env=env, capture_output=True, check=False
    )
    elapsed = (time.perf_counter() - started) * 1000
    if result.returncode != 0:
        sys.exit(f"macvlan {command} failed: {result.stdout.decode()} {result.stderr.decode()}")
    return elapsed


def _stdin_ended() -> bool:
    readable, _, _ = select.select([sys.stdin], [], [], 0)
    return bool(readable) and not os.read(sys.stdin.fileno(), 4096)


def main(runs: int, masters: list[str]) -> None:
    adds, deletes = [], []
    for run in range(runs) if runs else itertools.takewhile(lambda _: not _stdin_ended(), itertools.count()):
        name = f"rawbench{os.getpid()}-{run}"
        subprocess.run(["ip", "netns", "add", name], check=True)
        try:
            add = sum(
                plugin("ADD", name, f"/run/netns/{name}", f"net{i + 1}", config(i, m))
                for i, m in enumerate(masters)
            )
            delete = sum(
                plugin("DEL", name, f"/run/netns/{name}", f"net{i + 1}", config(i, m))
                for i, m in enumerate(masters)
            )
            adds.append(add)
            deletes.append(delete)
        finally:
            subprocess.run(["ip", "netns", "delete", name], check=True)
    print(json.dumps({"add_ms": adds, "del_ms": deletes}))


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2].split(","))

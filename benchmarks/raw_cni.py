"""Baseline: the same CNI config list executed directly (no netclaim), inside a node, n times.

Run inside the node's namespaces; prints JSON {"add_ms": [...], "del_ms": [...]}.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Mapping

CNI = "/usr/lib/cni"


def plugin(command: str, container: str, netns: str, config: Mapping[str, object]) -> float:
    env = {
        "CNI_COMMAND": command,
        "CNI_CONTAINERID": container,
        "CNI_NETNS": netns,
        "CNI_IFNAME": "net1",
        "CNI_PATH": CNI,
        "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
    }
    started = time.perf_counter()
    result = subprocess.run(
        [f"{CNI}/macvlan"], input=json.dumps(config).encode(), env=env, capture_output=True, check=False
    )
    elapsed = (time.perf_counter() - started) * 1000
    if result.returncode != 0:
        sys.exit(f"macvlan {command} failed: {result.stdout.decode()} {result.stderr.decode()}")
    return elapsed


def main(runs: int, master: str) -> None:
    config = {
        "cniVersion": "1.0.0",
        "name": "raw-bench",
        "type": "macvlan",
        "master": master,
        "mode": "bridge",
        "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.99.0.0/24"}]]},
    }
    adds, deletes = [], []
    for run in range(runs):
        name = f"rawbench{os.getpid()}-{run}"
        subprocess.run(["ip", "netns", "add", name], check=True)
        try:
            adds.append(plugin("ADD", name, f"/run/netns/{name}", config))
            deletes.append(plugin("DEL", name, f"/run/netns/{name}", config))
        finally:
            subprocess.run(["ip", "netns", "delete", name], check=True)
    print(json.dumps({"add_ms": adds, "del_ms": deletes}))


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2])

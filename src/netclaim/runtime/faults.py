"""Named fault points for crash tests: `NETCLAIM_FAULTS=run-pod-sandbox,inside-add` (or the same in the
file $NETCLAIM_FAULTS_FILE names, removed as the first one fires) makes the agent kill itself (SIGKILL, as
a crash would) when it reaches one of them; `stall-run-pod-sandbox` makes the RunPodSandbox hook sleep past
containerd's budget first (the runtime then starts the sandbox without us). Off unless one of them is set.

Points: after-address, after-prepare, run-pod-sandbox, inside-add, before-detach, before-unprepare,
before-status. Stalls: stall-run-pod-sandbox.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from pathlib import Path

log = logging.getLogger(__name__)
POINTS = (
    "after-address",
    "after-prepare",
    "run-pod-sandbox",
    "inside-add",
    "before-detach",
    "before-unprepare",
    "before-status",
)


def _requested() -> str:
    """$NETCLAIM_FAULTS, and the file $NETCLAIM_FAULTS_FILE names (the local cluster's DaemonSet: a test
    writes it on the node, then restarts the agent's pod)."""
    path = os.environ.get("NETCLAIM_FAULTS_FILE")
    try:
        written = Path(path).read_text() if path else ""
    except FileNotFoundError:
        written = ""
    return f"{os.environ.get('NETCLAIM_FAULTS', '')},{written}"


_ENABLED = frozenset(p.strip() for p in _requested().split(",") if p.strip())
STALLS = ("stall-run-pod-sandbox",)
STALL_SECONDS = 5.0  # more than containerd's 2 s NRI request timeout
_unknown = _ENABLED - set(POINTS) - set(STALLS)
if _unknown:
    raise SystemExit(
        f"NETCLAIM_FAULTS: unknown fault points {sorted(_unknown)}; known: {list(POINTS) + list(STALLS)}"
    )


def point(name: str) -> None:
    """Crash here when the test asked for it."""
    assert name in POINTS, name
    if name in _ENABLED:
        log.warning("fault point reached: killing the agent", extra={"point": name})
        for handler in logging.getLogger().handlers:
            handler.flush()
        written = os.environ.get("NETCLAIM_FAULTS_FILE")
        if written:  # a crash happens once: the agent kubelet restarts runs without it
            Path(written).unlink(missing_ok=True)
        os.kill(os.getpid(), signal.SIGKILL)


async def stall(name: str) -> None:
    """Sleep past the runtime's budget here when the test asked for it."""
    assert name in STALLS, name
    if name in _ENABLED:
        log.warning("stall point reached: sleeping past the runtime's budget", extra={"point": name})
        await asyncio.sleep(STALL_SECONDS)

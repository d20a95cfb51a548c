"""Named fault points for crash tests: `NETCLAIM_FAULTS=run-pod-sandbox,inside-add` makes the agent
kill itself (SIGKILL, as a crash would) when it reaches one of them; `stall-run-pod-sandbox` makes the
RunPodSandbox hook sleep past containerd's budget first (the runtime then starts the sandbox without us).
Off unless that variable is set.

Points: after-address, after-prepare, run-pod-sandbox, inside-add, before-detach, before-unprepare,
before-status. Stalls: stall-run-pod-sandbox.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal

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
_ENABLED = frozenset(p.strip() for p in os.environ.get("NETCLAIM_FAULTS", "").split(",") if p.strip())
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
        os.kill(os.getpid(), signal.SIGKILL)


async def stall(name: str) -> None:
    """Sleep past the runtime's budget here when the test asked for it."""
    assert name in STALLS, name
    if name in _ENABLED:
        log.warning("stall point reached: sleeping past the runtime's budget", extra={"point": name})
        await asyncio.sleep(STALL_SECONDS)

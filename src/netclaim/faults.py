"""Named fault points for crash tests: `NETCLAIM_FAULTS=run-pod-sandbox,inside-add` makes the agent
kill itself (SIGKILL, as a crash would) when it reaches one of them. Off unless that variable is set.

Points: after-address, after-prepare, run-pod-sandbox, inside-add, before-detach, before-unprepare,
before-status.
"""

from __future__ import annotations

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
_unknown = _ENABLED - set(POINTS)
if _unknown:
    raise SystemExit(f"NETCLAIM_FAULTS: unknown fault points {sorted(_unknown)}; known: {list(POINTS)}")


def point(name: str) -> None:
    """Crash here when the test asked for it."""
    assert name in POINTS, name
    if name in _ENABLED:
        log.warning("fault point reached: killing the agent", extra={"point": name})
        for handler in logging.getLogger().handlers:
            handler.flush()
        os.kill(os.getpid(), signal.SIGKILL)

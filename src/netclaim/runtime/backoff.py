"""Capped exponential backoff: the one retry policy of the agent and the controller
(netclaim.runtime.supervisor restarts their tasks with it)."""

from __future__ import annotations

import asyncio


class Backoff:
    """`await wait()` sleeps `first`, then twice as long each time up to `cap`; `reset()` after a success.
    `next()` is the delay to wait now, for who schedules the retry rather than sleeping."""

    def __init__(self, first: float = 0.5, cap: float = 10.0) -> None:
        self.first, self.cap = first, cap
        self.delay = first

    def reset(self) -> None:
        self.delay = self.first

    def next(self) -> float:
        delay, self.delay = self.delay, min(self.delay * 2, self.cap)
        return delay

    async def wait(self) -> None:
        await asyncio.sleep(self.next())

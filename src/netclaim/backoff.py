"""Capped exponential backoff, and the supervised loop: the one retry policy of the agent."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from netclaim.errors import NetclaimError

log = logging.getLogger(__name__)


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


async def supervise(what: str, attempt: Callable[[], Awaitable[None]], on_error: Callable[[], None]) -> None:
    """Run `attempt` forever; after a failure wait with backoff, then go on. A netclaim error is logged as
    a warning; anything else is a bug and is logged with its traceback (errors.py, the table)."""
    backoff = Backoff()
    while True:
        try:
            await attempt()
            backoff.reset()
        except asyncio.CancelledError:
            raise
        except NetclaimError as err:
            on_error()
            log.warning("%s failed; retrying in %.1f s", what, backoff.delay, extra={"error": str(err)})
            await backoff.wait()
        except Exception:
            on_error()
            log.exception("%s failed (a bug); retrying in %.1f s", what, backoff.delay)
            await backoff.wait()

"""How the long-running commands (agent, controller) stop: on SIGTERM or SIGINT
(netclaim.runtime.supervisor), letting the work under way finish first (InFlight)."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import AsyncIterator, Iterator


@contextlib.asynccontextmanager
async def stopping_on_signals() -> AsyncIterator[asyncio.Event]:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        yield stop
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)


class InFlight:
    """Work under way, counted, so that a program stopping lets it finish rather than cut it short."""

    def __init__(self) -> None:
        self._count = 0
        self._idle = asyncio.Event()
        self._idle.set()

    @contextlib.contextmanager
    def working(self) -> Iterator[None]:
        self._count += 1
        self._idle.clear()
        try:
            yield
        finally:
            self._count -= 1
            if not self._count:
                self._idle.set()

    async def settle(self, seconds: float) -> bool:
        """Wait (at most `seconds`) until no work is under way; False if some still is."""
        if self._idle.is_set():
            return True
        try:
            await asyncio.wait_for(self._idle.wait(), seconds)
        except TimeoutError:
            return False
        return True

"""How the long-running commands (agent, controller) stop: on SIGTERM or SIGINT (netclaim.supervisor)."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import AsyncIterator


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

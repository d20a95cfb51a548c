"""How the long-running commands (agent, controller) stop: on SIGTERM or SIGINT."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import AsyncIterator, Sequence
from typing import Any


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


async def until_stopped(tasks: Sequence[asyncio.Task[Any]]) -> None:
    """Wait for a signal; the tasks run forever, so one that ends is a bug worth stopping for."""
    async with stopping_on_signals() as stop:
        stopper = asyncio.create_task(stop.wait(), name="stop")
        done, _ = await asyncio.wait([*tasks, stopper], return_when=asyncio.FIRST_COMPLETED)
        stopper.cancel()
        for task in done - {stopper}:
            raise task.exception() or RuntimeError(f"{task.get_name()} ended unexpectedly")

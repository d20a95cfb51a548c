"""The background work of the agent and the controller, in one place: started, named, restarted, reported.

keep(name, attempt)   a long-running task: `attempt` is called again each time it ends (a publish pass, a
                      watch until its stream ends, a loop that never ends). When it raises, the failure is
                      logged (a netclaim error as a warning, anything else with its traceback: a bug, the
                      errors.py table), counted in netclaim_task_restarts_total{task,error}, and the next
                      attempt starts after a backoff (reset by an attempt that ends without an error).
spawn(name, work)     a one-shot job off the caller's path (a pod's Event, the undo of an ADD out of time,
                      an NRI call): a failure is logged with its traceback and counted in
                      netclaim_task_failures_total{task}; nothing restarts it. Cancelling it is no failure.
run_until_stopped()   until SIGTERM or SIGINT; stop() then cancels the kept tasks, lets one-shot jobs finish
                      for a grace period (the agent's: an undo of an ADD must not be cut short), cancels
                      what is left and waits for it to end.

A failed task never stops the process and never changes its readiness (/readyz says what serves; the log
and the metrics say what failed): a restarted watch or writer is the agent working as designed.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from netclaim.errors import NetclaimError
from netclaim.runtime import metrics
from netclaim.runtime.backoff import Backoff
from netclaim.runtime.stopping import stopping_on_signals

log = logging.getLogger(__name__)


class Supervisor:
    def __init__(self, backoff: Callable[[], Backoff] = Backoff) -> None:
        self._backoff = backoff
        self._kept: dict[str, asyncio.Task[None]] = {}
        self._spawned: set[asyncio.Task[Any]] = set()

    def keep(
        self, name: str, attempt: Callable[[], Awaitable[None]], on_error: Callable[[], None] | None = None
    ) -> None:
        """Run `attempt` for ever under `name`; `on_error` is told of each failure (a metric of its own)."""
        if name in self._kept:
            raise ValueError(f"a task named {name} is kept already")
        self._kept[name] = asyncio.create_task(self._keep(name, attempt, on_error), name=name)

    async def _keep(
        self, name: str, attempt: Callable[[], Awaitable[None]], on_error: Callable[[], None] | None
    ) -> None:
        backoff = self._backoff()
        while True:
            try:
                await attempt()
                backoff.reset()
                continue
            except NetclaimError as err:
                log.warning("%s failed; retrying in %.1f s", name, backoff.delay, extra={"error": str(err)})
                error = type(err).__name__
            except Exception as err:
                log.exception("%s failed (a bug); restarting it in %.1f s", name, backoff.delay)
                error = type(err).__name__
            metrics.TASK_RESTARTS.labels(name, error).inc()
            if on_error is not None:
                on_error()
            await backoff.wait()

    def spawn(self, name: str, work: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        """Run `work` once, off the caller's path; the task, for who must cancel it."""
        task = asyncio.create_task(work, name=name)
        self._spawned.add(task)
        task.add_done_callback(self._spawned_done)
        return task

    def _spawned_done(self, task: asyncio.Task[Any]) -> None:
        self._spawned.discard(task)
        if task.cancelled() or task.exception() is None:
            return
        metrics.TASK_FAILURES.labels(task.get_name()).inc()
        log.error("%s failed", task.get_name(), exc_info=task.exception())

    async def settle(self, seconds: float | None = None) -> bool:
        """Wait until no one-shot job is at work (those they spawn included), `seconds` at most; False if
        one still is."""
        deadline = None if seconds is None else time.monotonic() + seconds
        while self._spawned:
            timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
            _, pending = await asyncio.wait(set(self._spawned), timeout=timeout)
            if pending:
                return False
        return True

    async def run_until_stopped(self) -> None:
        """Until SIGTERM or SIGINT."""
        async with stopping_on_signals() as stop:
            await self.run_until(stop)

    async def run_until(self, stop: asyncio.Event) -> None:
        """Until `stop` is set or the caller is cancelled. A kept task ends only on what nothing can
        supervise (a BaseException that is not a cancellation, such as SystemExit): it is raised."""
        stopper = asyncio.create_task(stop.wait(), name="stop")
        try:
            done, _ = await asyncio.wait([*self._kept.values(), stopper], return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopper.cancel()
        for task in done - {stopper}:
            raise task.exception() or RuntimeError(f"{task.get_name()} ended")

    async def stop(self, grace: float = 0.0) -> None:
        """Cancel the kept tasks and wait for them to end; give the one-shot jobs `grace` seconds to finish
        (an undo of an ADD cut short is left for the next agent to finish under a pod that may run
        already), then cancel those still at work."""
        kept = list(self._kept.values())
        for task in kept:
            task.cancel()
        await asyncio.gather(*kept, return_exceptions=True)
        self._kept.clear()
        if grace > 0 and not await self.settle(grace):
            busy = sorted(task.get_name() for task in self._spawned)
            log.warning("stopping with one-shot jobs still at work", extra={"jobs": busy, "waited_s": grace})
        spawned = list(self._spawned)
        for task in spawned:
            task.cancel()
        await asyncio.gather(*spawned, return_exceptions=True)

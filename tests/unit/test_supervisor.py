"""Background work is supervised: a task that fails is restarted and reported, a one-shot job's failure is
never lost, and neither stops the agent nor makes it unready."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest

from netclaim.adapters import http
from netclaim.adapters.http import Health
from netclaim.errors import ApiUnavailableError
from netclaim.runtime.backoff import Backoff
from netclaim.runtime.metrics import REGISTRY
from netclaim.runtime.supervisor import Supervisor
from tests.unit.test_http import _get

SAFETY_NET = 10.0  # seconds: not a measurement, a bound on what never happens


def _restarts(task: str, error: str) -> float:
    labels = {"task": task, "error": error}
    return REGISTRY.get_sample_value("netclaim_task_restarts_total", labels) or 0.0


def _failures(task: str) -> float:
    return REGISTRY.get_sample_value("netclaim_task_failures_total", {"task": task}) or 0.0


@pytest.fixture
async def supervisor() -> AsyncIterator[Supervisor]:
    keeper = Supervisor(backoff=lambda: Backoff(first=0.0, cap=0.0))
    yield keeper
    await keeper.stop()


class Attempts:
    """A kept task's attempts: the first ones raise what `failures` holds, the next one stays at work."""

    def __init__(self, *failures: Exception) -> None:
        self.failures = list(failures)
        self.started = 0
        self.working = asyncio.Event()

    async def __call__(self) -> None:
        self.started += 1
        if self.failures:
            raise self.failures.pop(0)
        self.working.set()
        await asyncio.Event().wait()


async def test_a_task_with_a_bug_is_restarted_and_reported_and_the_agent_stays_ready(
    supervisor: Supervisor, caplog: pytest.LogCaptureFixture
) -> None:
    """Before, the first task to end stopped the whole agent (its pod restarted, unready meanwhile), and
    a bug in a fire-and-forget task was lost without a trace."""
    health = Health()
    health.expect("published")
    health.set("published", True)
    server = await http.serve("127.0.0.1:0", health)
    assert server is not None
    port = server.sockets[0].getsockname()[1]
    before = _restarts("status-writer", "KeyError")
    attempts = Attempts(KeyError("a bug"))
    try:
        supervisor.keep("status-writer", attempts)
        running = asyncio.create_task(supervisor.run_until_stopped())
        await asyncio.wait_for(attempts.working.wait(), SAFETY_NET)
        assert attempts.started == 2  # restarted after the bug
        assert not running.done()  # the agent goes on
        assert _restarts("status-writer", "KeyError") == before + 1
        [record] = [r for r in caplog.records if r.name == "netclaim.runtime.supervisor"]
        assert record.levelno == logging.ERROR and record.exc_info is not None  # with its traceback
        assert record.getMessage().startswith("status-writer failed (a bug)")
        ready = await _get(port, b"GET /readyz HTTP/1.1\r\n\r\n")
        assert ready.startswith(b"HTTP/1.1 200 OK")
        metrics = await _get(port, b"GET /metrics HTTP/1.1\r\n\r\n")
        assert b'netclaim_task_restarts_total{error="KeyError",task="status-writer"}' in metrics
        running.cancel()
        with pytest.raises(asyncio.CancelledError):
            await running
    finally:
        server.close()


async def test_a_netclaim_error_is_retried_with_a_warning_and_counted_by_its_class(
    supervisor: Supervisor, caplog: pytest.LogCaptureFixture
) -> None:
    before = _restarts("slice-watch", "ApiUnavailableError")
    attempts = Attempts(ApiUnavailableError("watch: 410 Gone"), ApiUnavailableError("503"))
    supervisor.keep("slice-watch", attempts)
    await asyncio.wait_for(attempts.working.wait(), SAFETY_NET)
    assert _restarts("slice-watch", "ApiUnavailableError") == before + 2
    records = [r for r in caplog.records if r.name == "netclaim.runtime.supervisor"]
    assert [(r.levelno, r.exc_info) for r in records] == [(logging.WARNING, None)] * 2


async def test_an_attempt_that_ends_is_started_again(supervisor: Supervisor) -> None:
    """A watch whose stream the server ended, a publish pass: the next one starts at once."""
    attempts = Attempts()
    passes: list[int] = []
    third = asyncio.Event()

    async def one_pass() -> None:
        passes.append(len(passes))
        if len(passes) == 3:
            third.set()
            await attempts()
        await asyncio.sleep(0)

    supervisor.keep("publish", one_pass)
    await asyncio.wait_for(third.wait(), SAFETY_NET)
    assert passes == [0, 1, 2]


async def test_a_one_shot_jobs_failure_is_logged_and_counted_and_a_cancelled_one_is_not(
    supervisor: Supervisor, caplog: pytest.LogCaptureFixture
) -> None:
    before = _failures("pod-event")

    async def buggy() -> None:
        raise ValueError("a bug in an Event")

    async def endless() -> None:
        await asyncio.Event().wait()

    supervisor.spawn("pod-event", buggy())
    cancelled = supervisor.spawn("pod-event", endless())
    await asyncio.sleep(0)
    cancelled.cancel()
    await asyncio.wait_for(supervisor.settle(), SAFETY_NET)
    assert _failures("pod-event") == before + 1
    [record] = [r for r in caplog.records if r.name == "netclaim.runtime.supervisor"]
    assert record.levelno == logging.ERROR and record.getMessage() == "pod-event failed"
    assert isinstance(record.exc_info and record.exc_info[1], ValueError)


async def test_stop_cancels_every_task_and_waits_for_it() -> None:
    supervisor = Supervisor()
    ended: list[str] = []

    async def work(name: str) -> None:
        try:
            await asyncio.Event().wait()
        finally:
            ended.append(name)

    supervisor.keep("kept", lambda: work("kept"))
    supervisor.spawn("one-shot", work("one-shot"))
    await asyncio.sleep(0)
    await supervisor.stop()
    assert sorted(ended) == ["kept", "one-shot"]


async def test_a_name_is_kept_once() -> None:
    supervisor = Supervisor()
    attempt: Any = Attempts()
    supervisor.keep("publish", attempt)
    with pytest.raises(ValueError, match="kept already"):
        supervisor.keep("publish", attempt)
    await supervisor.stop()


async def test_stopping_lets_one_shot_jobs_finish_for_the_grace_then_cancels_the_rest(
    supervisor: Supervisor, caplog: pytest.LogCaptureFixture
) -> None:
    """What the agent's stop waits for, after its pod hooks: the work they left for later. A kept task
    is cancelled at once; a job that outlives the grace is cancelled and said."""
    kept_running, finished = asyncio.Event(), asyncio.Event()

    async def kept() -> None:
        kept_running.set()
        await asyncio.Event().wait()

    async def short_job() -> None:
        await asyncio.sleep(0.05)
        finished.set()

    supervisor.keep("watch", kept)
    await kept_running.wait()
    job = supervisor.spawn("attach-undo", short_job())
    endless = supervisor.spawn("pod-event", asyncio.Event().wait())
    await asyncio.wait_for(supervisor.stop(grace=0.5), SAFETY_NET)
    assert finished.is_set() and not job.cancelled()
    assert endless.cancelled()
    [record] = [r for r in caplog.records if r.getMessage() == "stopping with one-shot jobs still at work"]
    assert record.jobs == ["pod-event"]  # type: ignore[attr-defined]

"""Programs run from a thread: the event loop goes on while one spawns, and none outlives its call."""

from __future__ import annotations

import asyncio
import queue
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from netclaim.adapters import processes


def _alive(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return status not in ("Z", "X")


def _dead_soon(*pids: int) -> bool:
    """Each of `pids` has died or is dying. A killed grandchild closes its files (which ends the call)
    before the kernel marks it a zombie: under load that takes a moment the call need not wait for."""
    deadline = time.monotonic() + 5
    while any(_alive(pid) for pid in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_the_event_loop_runs_while_a_program_is_being_spawned(monkeypatch: pytest.MonkeyPatch) -> None:
    """The spawn waits until the event loop has run another task: if it ran on the loop, that task never
    could, and the spawn gives up and says so."""
    loop_ran = threading.Event()
    real_popen = subprocess.Popen

    def slow_popen(*args: Any, **kwargs: Any) -> subprocess.Popen[bytes]:
        if not loop_ran.wait(10):
            raise AssertionError("the event loop did not run while the program was being spawned")
        return real_popen(*args, **kwargs)

    monkeypatch.setattr(subprocess, "Popen", slow_popen)

    async def both() -> bytes:
        running = asyncio.create_task(processes.run(["cat"], stdin=b"through", time_limit=20))
        await asyncio.sleep(0)
        loop_ran.set()
        return (await running).stdout

    assert asyncio.run(both()) == b"through"


def test_a_program_past_its_time_is_killed_with_what_it_started(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    script = f"sleep 60 & echo $$ $! > {pids}; wait"
    started = time.monotonic()
    with pytest.raises(TimeoutError, match=r"timed out after 0\.50 s"):
        asyncio.run(processes.run(["sh", "-c", script], time_limit=0.5))
    assert time.monotonic() - started < 10
    shell, sleeper = (int(pid) for pid in pids.read_text().split())
    assert not _alive(shell), "the program itself is reaped before the call ends"
    assert _dead_soon(sleeper), "what the program started is killed with it"


def test_a_cancelled_call_kills_its_program_and_its_children_before_it_ends(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    script = f"sleep 60 & echo $$ $! > {pids}; wait"

    async def cancel_it() -> None:
        running = asyncio.create_task(processes.run(["sh", "-c", script], time_limit=60))
        for _ in range(500):
            if pids.exists() and len(pids.read_text().split()) == 2:
                break
            await asyncio.sleep(0.02)
        running.cancel()
        with pytest.raises(asyncio.CancelledError):
            await running
        shell, sleeper = (int(pid) for pid in pids.read_text().split())
        assert not _alive(shell), "the program itself is reaped before the cancelled call ends"
        assert _dead_soon(sleeper), "what the program started is killed with it"

    asyncio.run(cancel_it())


def test_a_call_cancelled_before_its_program_started_never_starts_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ran = tmp_path / "ran"
    queued, abandoned = threading.Event(), threading.Event()
    real_run, real_abandon = processes._Program.run, processes._Program.abandon

    def held_run(self: processes._Program) -> processes.Finished:
        queued.set()
        abandoned.wait(10)
        return real_run(self)

    def abandon(self: processes._Program) -> None:
        real_abandon(self)
        abandoned.set()

    monkeypatch.setattr(processes._Program, "run", held_run)
    monkeypatch.setattr(processes._Program, "abandon", abandon)

    async def cancel_it() -> None:
        running = asyncio.create_task(processes.run(["touch", str(ran)], time_limit=10))
        assert await asyncio.to_thread(queued.wait, 10)
        running.cancel()
        with pytest.raises(asyncio.CancelledError):
            await running

    asyncio.run(cancel_it())
    assert not ran.exists()


def test_a_program_that_cannot_be_spawned_says_why() -> None:
    with pytest.raises(FileNotFoundError):
        asyncio.run(processes.run(["/nonexistent/netclaim-test"], time_limit=5))
    with pytest.raises(ValueError, match="null byte"):
        asyncio.run(processes.run(["true"], env={"A": "b\0"}, time_limit=5))
    finished = asyncio.run(
        processes.run(["sh", "-c", "head -c 3; echo oops >&2; exit 3"], stdin=b"abcdef", time_limit=5)
    )
    assert (finished.returncode, finished.stdout, finished.stderr) == (3, b"abc", b"oops\n")


def test_calls_never_wait_for_each_other_s_threads(tmp_path: Path) -> None:
    """A thread per call: 40 programs that each wait until all 40 have started (a tenant's hanging plugins,
    say) all run at once, and none waits for a thread another holds."""
    started, go = tmp_path / "started", tmp_path / "go"
    started.mkdir()
    script = f"touch {started}/$$; while [ ! -e {go} ]; do sleep 0.02; done; echo done"

    async def all_at_once() -> list[bytes]:
        calls = [asyncio.create_task(processes.run(["sh", "-c", script], time_limit=30)) for _ in range(40)]
        while len(list(started.iterdir())) < 40:
            assert not any(call.done() for call in calls)
            await asyncio.sleep(0.05)
        go.touch()
        return [(await call).stdout for call in calls]

    assert asyncio.run(all_at_once()) == [b"done\n"] * 40


def test_a_call_after_another_ended_runs_on_its_thread_without_starting_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The thread that ran a program takes the next call: no thread is started (starting one makes the
    event loop wait until it has run, milliseconds with the CPUs busy)."""
    spares = processes.Spares("test-spare", spare_seconds=30)
    ran_on: list[int] = []
    done = threading.Semaphore(0)

    def call() -> None:
        ran_on.append(threading.get_ident())
        done.release()

    spares.submit(call)
    assert done.acquire(timeout=10)
    deadline = time.monotonic() + 10
    while spares.idle != 1:  # the first thread is back, waiting
        assert time.monotonic() < deadline
        time.sleep(0.01)
    started: list[threading.Thread] = []
    real_start = threading.Thread.start

    def start(self: threading.Thread) -> None:
        started.append(self)
        real_start(self)

    monkeypatch.setattr(threading.Thread, "start", start)
    for _ in range(5):
        spares.submit(call)
        assert done.acquire(timeout=10)
        while spares.idle != 1:
            assert time.monotonic() < deadline
            time.sleep(0.01)
    assert started == []
    assert len(set(ran_on)) == 1


def test_every_call_runs_once_however_spare_threads_come_and_go() -> None:
    """Calls handed out while spare threads time out: each runs exactly once, a busy thread is never
    waited for, and once all is quiet no thread is left waiting."""
    spares = processes.Spares("test-spare-churn", spare_seconds=0.001)
    counts: dict[int, int] = {}
    lock = threading.Lock()
    all_ran = threading.Event()
    total = 2000

    def call_of(number: int) -> Callable[[], None]:
        def call() -> None:
            with lock:
                counts[number] = counts.get(number, 0) + 1
                if len(counts) == total:
                    all_ran.set()

        return call

    for number in range(total):
        spares.submit(call_of(number))
        if number % 7 == 0:
            time.sleep(0.002)  # long enough for waiting threads to time out now and then
    assert all_ran.wait(30)
    assert set(counts.values()) == {1}
    deadline = time.monotonic() + 10
    while spares.idle or any(t.name == "test-spare-churn" for t in threading.enumerate()):
        assert time.monotonic() < deadline, "spare threads left waiting"
        time.sleep(0.01)


def test_a_spare_thread_whose_time_ran_out_as_it_was_given_a_call_runs_the_call() -> None:
    """The race the idle count is for: the waiting thread's time runs out just after a call counted on it.
    It must stay for the call, which no other thread would run."""
    spares = processes.Spares("test-spare-race", spare_seconds=30)
    given, ran = threading.Event(), threading.Event()
    real_calls = spares._calls
    timed_out_once: list[bool] = []

    class Late:
        """The waiting thread's queue: its first wait ends as if its time ran out, once a call is given."""

        def get(self, timeout: float) -> Callable[[], None]:
            if not timed_out_once:
                timed_out_once.append(True)
                given.wait(10)
                raise queue.Empty
            return real_calls.get(timeout=timeout)

        def put(self, call: Callable[[], None]) -> None:
            real_calls.put(call)

    spares._calls = Late()  # type: ignore[assignment]
    spares.submit(lambda: None)
    deadline = time.monotonic() + 10
    while spares.idle != 1:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    spares.submit(ran.set)
    given.set()
    assert ran.wait(10), "the call given to the spare thread never ran"

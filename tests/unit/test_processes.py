"""Programs run from a thread: the event loop goes on while one spawns, and none outlives its call."""

from __future__ import annotations

import asyncio
import subprocess
import threading
import time
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

"""Programs the agent runs (CNI plugins, nft), each from a thread: the event loop never forks, execs or
waits on a pipe. A thread of its own for each call, as asyncio's child watcher had: no pool whose threads
a tenant's hanging plugins could all hold while another pod's ADD waits for one. A thread whose program
ended waits a while for the next call (`Spares`): starting a thread waits until the new thread has run,
0.08 ms on an idle machine but 2-12 ms at p99 with the CPUs busy, on the event loop, for each program.

asyncio's own subprocesses fork and exec on the event loop and wait there until the child has exec'd; on
a node whose CPU a tenant burns that wait took up to 0.4 s at a time (py-spy of the agent beside a
busy neighbour), while a RunPodSandbox hook, under containerd's one NRI lock, waited in the same loop, and
hooks went past containerd's 2 s NRI timeout. A thread does the spawn, the pipes and the wait instead.

A program never outlives its call: at its timeout, and when the awaiting task is cancelled (a runtime
that dropped the hook's connection), its process group is killed and reaped before the call ends.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import queue
import signal
import subprocess
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from netclaim.errors import KernelError, PrerequisiteError

KILLED_SECONDS = 2.0  # how long a killed program's group may take to close its pipes
SPARE_SECONDS = 60.0  # how long a thread whose program ended waits for the next call before it ends


@dataclass(frozen=True)
class Finished:
    returncode: int
    stdout: bytes
    stderr: bytes


class _Abandoned(Exception):
    """The caller went away before the program started: it never will."""


class _Program:
    """One program's run in its thread, and the way to stop it from the event loop."""

    def __init__(self, argv: Sequence[str], env: Mapping[str, str] | None, stdin: bytes) -> None:
        self._argv, self._env, self._stdin = list(argv), env, stdin
        self._lock = threading.Lock()
        self._process: subprocess.Popen[bytes] | None = None
        self._abandoned = False

    def run(self) -> Finished:
        """In the thread. No timeout here: Popen's own waits for the child's end by polling, in sleeps that
        cost ~1 ms a call; the event loop keeps the time and kills the program instead (`abandon`)."""
        with self._lock:
            if self._abandoned:
                raise _Abandoned
        process = subprocess.Popen(
            self._argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=None if self._env is None else dict(self._env),
            start_new_session=True,
        )
        with self._lock:
            self._process = process
            abandoned = self._abandoned
        with process:
            if abandoned:
                _kill_group(process)
            stdout, stderr = process.communicate(self._stdin)  # ends when the group's pipes close
        return Finished(process.returncode, stdout, stderr)

    def abandon(self) -> None:
        """From the event loop: kill the program and its group if it started, never start it if not."""
        with self._lock:
            self._abandoned = True
            process = self._process
        if process is not None and process.returncode is None:  # a reaped leader's ID may be another's
            _kill_group(process)

    async def stop(self, done: asyncio.Future[Finished]) -> None:
        """Abandon the run and wait until its group has let go of the pipes (all of it is dead then), as
        long as a killed group takes: one that left the group (setsid) could hold them for ever."""
        self.abandon()
        with contextlib.suppress(Exception):  # the run's own end is nobody's news now
            await asyncio.wait_for(asyncio.shield(done), KILLED_SECONDS)


class Spares:
    """Threads for calls: a call goes to a thread waiting for one if there is any, else to a new thread.
    Never a bound on how many run at once. `idle` counts the waiting threads no call has been given to yet:
    each call that finds one takes it (the count goes down before the work is queued), so a queued call
    always has a thread that will take it, and a waiting thread whose time is up leaves only while the
    count says it is not needed."""

    def __init__(self, name: str, spare_seconds: float = SPARE_SECONDS) -> None:
        self.name = name
        self.spare_seconds = spare_seconds
        self._calls: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self.idle = 0

    def submit(self, call: Callable[[], None]) -> None:
        with self._lock:
            spare = self.idle > 0
            if spare:
                self.idle -= 1
        if spare:
            self._calls.put(call)
        else:  # a daemon: an agent ending never waits for a program whose killed group left a pipe open
            threading.Thread(target=self._serve, args=(call,), name=self.name, daemon=True).start()

    def _serve(self, call: Callable[[], None]) -> None:
        while True:
            call()
            with self._lock:
                self.idle += 1
            while True:
                try:
                    call = self._calls.get(timeout=self.spare_seconds)
                    break
                except queue.Empty:
                    with self._lock:
                        if self.idle > 0:
                            self.idle -= 1
                            return
                    # every waiting thread was given a call, this one included: it is on its way


_SPARES = Spares("netclaim-program")


async def run(
    argv: Sequence[str], *, stdin: bytes = b"", env: Mapping[str, str] | None = None, time_limit: float
) -> Finished:
    """Run `argv` (no shell) to its end, feeding it `stdin`. TimeoutError past `time_limit` seconds;
    OSError or ValueError (a NUL byte in an argument or the environment) when it cannot be spawned."""
    program = _Program(argv, env, stdin)
    ran: concurrent.futures.Future[Finished] = concurrent.futures.Future()

    def work() -> None:
        try:
            ran.set_result(program.run())
        except Exception as err:  # noqa: BLE001 - the caller's to see, whatever it is
            ran.set_exception(err)

    _SPARES.submit(work)
    done = asyncio.wrap_future(ran)
    try:
        return await asyncio.wait_for(asyncio.shield(done), time_limit)
    except TimeoutError:
        await program.stop(done)
        raise TimeoutError(f"{argv[0]}: timed out after {time_limit:.2f} s") from None
    except asyncio.CancelledError:
        await program.stop(done)
        raise


def _kill_group(process: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)


async def run_tool(
    program: str, args: Sequence[str], *, netns: str = "", stdin: bytes = b"", package: str, time_limit: float
) -> str:
    """A tool of the node's (nft, tc) run to its end, in `netns` ("": the agent's own namespace) under
    nsenter: its output. PrerequisiteError when it is not installed (`package` says where it comes from),
    KernelError when it fails (its words)."""
    where = f" in {netns}" if netns else ""
    what = f"{program} {' '.join(args)}{where}"
    command = ["nsenter", f"--net={netns}", "--", program, *args] if netns else [program, *args]
    try:
        finished = await run(command, stdin=stdin, time_limit=time_limit)
    except FileNotFoundError as err:
        raise PrerequisiteError(f"{what}: {err.filename} is not installed (Debian: {package})") from err
    if finished.returncode != 0:
        said = finished.stderr.decode(errors="replace").strip()
        raise KernelError(f"{what}: exit {finished.returncode}: {said}")
    return finished.stdout.decode(errors="replace")

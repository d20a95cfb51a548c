"""Start, find and stop the daemons of the local cluster, by pid files that remember what they ran."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from netclaim.errors import PrerequisiteError, TransientError


@dataclass(frozen=True)
class Daemon:
    """One started program: its pid file records `<pid> <start time>` so a reused pid is never killed."""

    name: str
    pid: int
    log: Path


class CommandFailed(subprocess.CalledProcessError):
    """A failed command whose message carries its stderr (CalledProcessError's own leaves it out)."""

    def __str__(self) -> str:
        return f"{super().__str__()}\n{self.stderr}"


def exit_on_sigterm() -> None:
    """SIGTERM ends a long benchmark as Ctrl-C does: its `finally` blocks stop the agents and the
    controller it started and take its cluster down, instead of leaving them running."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))


def run(command: list[str], *, check: bool = True, timeout: float = 60, input_text: str | None = None) -> str:
    """Run a short program (no shell) and return stdout; the error names the command and its stderr."""
    try:
        result = subprocess.run(
            command, capture_output=True, text=True, timeout=timeout, input=input_text, check=False
        )
    except FileNotFoundError as err:
        raise PrerequisiteError(f"{command[0]}: not installed (run `make deps`)") from err
    if check and result.returncode != 0:
        raise CommandFailed(
            result.returncode, command, output=result.stdout, stderr=result.stderr.strip()[-2000:]
        )
    return result.stdout


def wait_until(check: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll `check` twice a second; TransientError naming `what` when it is still false after `timeout`."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TransientError(f"{what}: not after {timeout:.0f} s")
        time.sleep(0.5)


def _start_time(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # Field 22 (starttime) counted after the parenthesised command name, which may hold spaces.
    return stat.rsplit(")", 1)[1].split()[19]


def alive(pid: int, started: str | None = None) -> bool:
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)  # reap our own exited daemons so they do not linger as zombies
    current = _start_time(pid)
    if current is None:
        return False
    with contextlib.suppress(OSError):
        if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
            return False
    return started is None or current == started


def start(
    name: str, command: list[str], *, pid_dir: Path, log_dir: Path, env: dict[str, str] | None = None
) -> Daemon:
    """Start `command` in its own session with output to `<log_dir>/<name>.log`; record its pid."""
    log_dir.mkdir(parents=True, exist_ok=True)
    pid_dir.mkdir(parents=True, exist_ok=True)
    log = log_dir / f"{name}.log"
    log_fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        # posix_spawn, not Popen: a daemon outlives its starter and needs no Popen object to reap.
        pid = os.posix_spawnp(
            command[0],
            command,
            {**os.environ, **(env or {})},
            file_actions=[
                (os.POSIX_SPAWN_OPEN, 0, "/dev/null", os.O_RDONLY, 0),
                (os.POSIX_SPAWN_DUP2, log_fd, 1),
                (os.POSIX_SPAWN_DUP2, log_fd, 2),
            ],
            setsid=True,
        )
    except FileNotFoundError as err:
        raise PrerequisiteError(f"{command[0]}: not installed (run `make deps`)") from err
    finally:
        os.close(log_fd)
    (pid_dir / f"{name}.pid").write_text(f"{pid} {_start_time(pid) or ''}\n")
    (pid_dir / f"{name}.cmd").write_text(
        json.dumps({"command": command, "env": env or {}, "log_dir": str(log_dir)})
    )
    return Daemon(name, pid, log)


def start_recorded(pid_dir: Path, name: str) -> Daemon:
    """Start `name` again exactly as it was last started (fault tests stop and restart components)."""
    recipe = json.loads((pid_dir / f"{name}.cmd").read_text())
    return start(name, recipe["command"], pid_dir=pid_dir, log_dir=Path(recipe["log_dir"]), env=recipe["env"])


def recorded(pid_dir: Path, name: str) -> tuple[int, str | None] | None:
    try:
        fields = (pid_dir / f"{name}.pid").read_text().split()
    except OSError:
        return None
    return int(fields[0]), (fields[1] if len(fields) > 1 else None)


def running(pid_dir: Path, name: str) -> bool:
    entry = recorded(pid_dir, name)
    return entry is not None and alive(*entry)


def stop_pid(pid: int, started: str | None = None, *, grace: float = 10.0) -> None:
    """SIGTERM, wait up to `grace` seconds, then SIGKILL; silently done when it is already gone."""
    if not alive(pid, started):
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if not alive(pid, started):
            return
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while alive(pid, started) and time.monotonic() < deadline:
        time.sleep(0.05)


def stop(pid_dir: Path, name: str, *, grace: float = 10.0) -> None:
    entry = recorded(pid_dir, name)
    if entry is not None:
        stop_pid(*entry, grace=grace)
        (pid_dir / f"{name}.pid").unlink(missing_ok=True)


def pids_matching(fragment: str) -> list[int]:
    """Pids whose command line contains `fragment` (used to find shims and stray helpers)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            if fragment in (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"):
                found.append(int(entry.name))
    return found

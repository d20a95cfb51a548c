"""Leader election on a Lease, as client-go's leaderelection: of the controller's replicas, the one holding
the Lease runs the reconcilers; the others keep their informers synced and stand by.

- A candidate takes the Lease when it is free, or when its holder has not renewed it within its duration,
  as this candidate has seen it (the time the record last changed here, on this machine's monotonic clock:
  no clock of another machine is trusted).
- The holder renews it every RETRY_SECONDS; if it cannot for RENEW_DEADLINE_SECONDS (less than the Lease's
  duration), it stops leading before anyone else may start, and `run` raises LeadershipLost: the process
  exits and comes back as a candidate.
- A holder that stops (SIGTERM) gives the Lease up: the standby takes it within RETRY_SECONDS. A holder
  killed outright is replaced once its Lease expires: within DURATION_SECONDS + RETRY_SECONDS.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, replace
from typing import Any, Protocol

from netclaim.errors import AlreadyExistsError, ConflictError, NetclaimError
from netclaim.runtime import metrics

log = logging.getLogger(__name__)
DURATION_SECONDS = 10
RENEW_DEADLINE_SECONDS = 7.0
RETRY_SECONDS = 2.0


@dataclass(frozen=True)
class LeaseRecord:
    holder: str  # "" when given up
    duration_seconds: int
    transitions: int
    acquired: str = ""  # RFC 3339 (MicroTime), as written: shown, never compared
    renewed: str = ""
    version: str = ""  # resourceVersion: every write is conditional on it


class LeaseApi(Protocol):
    async def get_lease(self) -> LeaseRecord | None: ...

    async def create_lease(self, record: LeaseRecord) -> LeaseRecord:
        """AlreadyExistsError when another candidate made it first."""
        ...

    async def update_lease(self, record: LeaseRecord) -> LeaseRecord:
        """ConflictError when it changed since `record.version` was read."""
        ...


class LeadershipLost(NetclaimError):
    """The Lease could not be renewed in time: this replica stopped leading."""


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime())


class Election:
    def __init__(
        self,
        api: LeaseApi,
        identity: str,
        duration: int = DURATION_SECONDS,
        renew_deadline: float = RENEW_DEADLINE_SECONDS,
        retry: float = RETRY_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.api = api
        self.identity = identity
        self.duration = duration
        self.renew_deadline = renew_deadline
        self.retry = retry
        self.clock = clock
        self._seen: LeaseRecord | None = None
        self._seen_at = 0.0  # when `_seen` last changed, on our clock
        self.leading = asyncio.Event()
        self.seen = asyncio.Event()  # the Lease was read once: this candidate can reach the API

    async def run(self, lead: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Stand by until the Lease is ours, then run `lead` while renewing it. Returns only by raising:
        LeadershipLost when a renewal failed for too long (or `lead`'s own error)."""
        while not await self._attempt():  # noqa: ASYNC110 - the Lease is read: nothing tells when it frees
            await asyncio.sleep(self.retry)
        log.info("leading", extra={"identity": self.identity})
        self.leading.set()
        metrics.LEADER.set(1)
        leading = asyncio.create_task(lead(), name="leading")
        try:
            renewed = self.clock()
            while not leading.done():
                done, _ = await asyncio.wait({leading}, timeout=self.retry)
                if done:
                    break
                if await self._attempt():
                    renewed = self.clock()
                elif self.clock() - renewed > self.renew_deadline:
                    raise LeadershipLost(
                        f"Lease not renewed for {self.renew_deadline:.0f} s: "
                        "stopped leading before it expires"
                    )
            await leading  # its error, if it ended by itself
            raise LeadershipLost("the leading work ended")
        finally:
            self.leading.clear()
            metrics.LEADER.set(0)
            leading.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await leading

    async def release(self) -> None:
        """Give the Lease up (on a clean stop): the standby need not wait for it to expire."""
        record = self._seen
        if record is None or record.holder != self.identity:
            return
        with contextlib.suppress(NetclaimError):
            await self.api.update_lease(replace(record, holder="", renewed=_now()))
            log.info("Lease given up", extra={"identity": self.identity})

    async def _attempt(self) -> bool:
        """`_try`, given up after one round's time: a request the API leaves hanging must not keep a
        leader from seeing its renew deadline pass (it would lead on after its Lease expired)."""
        try:
            return await asyncio.wait_for(self._try(), self.retry)
        except TimeoutError:
            log.warning("Lease not read or written in time", extra={"identity": self.identity})
            return False

    async def _try(self) -> bool:
        """Take or renew the Lease: whether it is ours now."""
        try:
            current = await self.api.get_lease()
            self.seen.set()
            if current != self._seen:
                self._seen, self._seen_at = current, self.clock()
            if current is None:
                record = LeaseRecord(self.identity, self.duration, 0, _now(), _now())
                self._seen = await self.api.create_lease(record)
                self._seen_at = self.clock()
                return True
            ours = current.holder == self.identity
            expired = not current.holder or self.clock() - self._seen_at > current.duration_seconds
            if not ours and not expired:
                return False
            record = replace(
                current,
                holder=self.identity,
                duration_seconds=self.duration,
                renewed=_now(),
                acquired=current.acquired if ours else _now(),
                transitions=current.transitions + (0 if ours else 1),
            )
            self._seen = await self.api.update_lease(record)
        except (AlreadyExistsError, ConflictError):
            return False  # another candidate wrote first: look again next round
        except NetclaimError as err:
            log.warning("Lease not read or written", extra={"identity": self.identity, "error": str(err)})
            return False
        self._seen_at = self.clock()
        return True

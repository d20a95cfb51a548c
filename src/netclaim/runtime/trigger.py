"""When a program's loops run: a coalescing trigger, passes paced by their own cost, watches that fire
the passes they concern, and a periodic resync."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")
REST_FACTOR = 4.0  # after a paced pass, rest this many times its duration
CHANGES_REST = 0.5  # the most a pass over what changed rests: seconds


class Trigger:
    """A coalescing wake-up: many fire() calls before the next wait() make one pass. A fire that says
    `compare=False` (a change on the node only) lets the pass leave the API alone when the devices it finds
    are those it last published; any other fire makes the pass compare them with the slices."""

    def __init__(self, settle: float = 0.1, interval: float = 0.0) -> None:
        self.settle = settle  # a burst of fires becomes one pass
        self.interval = interval  # the least time from one pass's start to the next's
        self._event = asyncio.Event()
        self._last_pass = -math.inf
        self._compare = False

    def fire(self, compare: bool = True) -> None:
        self._compare = self._compare or compare
        self._event.set()

    async def wait(self) -> bool:
        """Whether the pass must compare with the slices."""
        await self._event.wait()
        now = asyncio.get_running_loop().time()
        await asyncio.sleep(max(self.settle, self._last_pass + self.interval - now))
        self._event.clear()
        self._last_pass = asyncio.get_running_loop().time()
        compare, self._compare = self._compare, False
        return compare


class KeyBackoff:
    """What client-go's per-item rate limiter gives each key of a work queue, for the keys of a pass (a
    namespace's slices, a node's rules): a key whose work failed is tried again after its own backoff,
    BASE seconds doubling at each failure in a row to MOST, while every other key goes on at once; `wake`
    (the pass's trigger) fires when it is due. A success forgets the key; so does `keep_only` for the keys
    that no longer exist. A new change of a key is worked on at once, as client-go's Add ignores the
    limiter: the backoff holds back only retries."""

    BASE = 0.5
    MOST = 300.0

    def __init__(
        self, wake: Callable[[], None] = lambda: None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.wake = wake
        self.clock = clock
        self._failures: dict[str, int] = {}
        self._due: dict[str, float] = {}

    def failed(self, key: str) -> float:
        """The key's work failed: the seconds until it is tried again."""
        failures = self._failures[key] = self._failures.get(key, 0) + 1
        delay: float = min(self.MOST, self.BASE * 2.0 ** (failures - 1))
        self._due[key] = self.clock() + delay
        asyncio.get_running_loop().call_later(delay, self.wake)
        return delay

    def succeeded(self, key: str) -> None:
        self._failures.pop(key, None)
        self._due.pop(key, None)

    def due(self, key: str) -> bool:
        return self._due.get(key, -math.inf) <= self.clock()

    def keep_only(self, keys: set[str]) -> None:
        for key in set(self._failures) - keys:
            self.succeeded(key)

    def __len__(self) -> int:
        return len(self._failures)


async def periodic(trigger: Trigger, seconds: float) -> None:
    while True:
        await asyncio.sleep(seconds)
        trigger.fire()


class PassClock:
    """When the last successful pass of a reconciler started: what a quarantine waits for."""

    def __init__(self) -> None:
        self.started = float("-inf")

    def timed(self, one_pass: Callable[[], Awaitable[None]]) -> Callable[[], Awaitable[None]]:
        async def run() -> None:
            started = time.monotonic()
            await one_pass()
            self.started = max(self.started, started)

        return run

    def since(self, moment: float) -> bool:
        return self.started >= moment


async def paced_pass(
    trigger: Trigger,
    one_pass: Callable[[], Awaitable[None]],
    most_rest: float = math.inf,
    unpaced: Callable[[], float] = lambda: 0.0,
) -> None:
    """One pass once triggered, then a rest of REST_FACTOR times its duration, at most `most_rest`
    seconds: a pass whose work is the cluster's rests in full, so it never takes more than its share; one
    whose work is what changed (netclaim.core.policy.compiled) rests little, or a large change would hold
    back the small ones after it. `unpaced`: the seconds of the pass just ended that went to writes about
    what changed (a deleted namespace's addresses), not rested for. A pass that fails leaves the trigger
    fired: the next one (after the supervisor's backoff) does not wait for another change."""
    await trigger.wait()
    started = time.monotonic()
    try:
        await one_pass()
    except BaseException:
        trigger.fire()
        raise
    paced = max(0.0, time.monotonic() - started - unpaced())
    await asyncio.sleep(min(most_rest, REST_FACTOR * paced))


async def fire_on_changes(
    changes: Callable[[], AsyncIterator[T]], *routes: tuple[Trigger, Callable[[T], bool]]
) -> None:
    """Fire every route's trigger once connected (whatever happened meanwhile, reconcile once), then, at
    each change, the triggers of the routes it concerns: one watch serves several passes."""
    for trigger, _ in routes:
        trigger.fire()
    async for changed in changes():
        for trigger, concerns in routes:
            if concerns(changed):
                trigger.fire()


def always(_: object) -> bool:
    return True

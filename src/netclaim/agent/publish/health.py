"""Which of the node's NICs have lost their link, damped: what their devices' taints say.

A NIC is down from the first loss of its carrier until the carrier has stayed back for SETTLE_SECONDS
with no loss between; the kernel's count of carrier changes shows a loss and return that fell between two
scans. So a link flapping faster than once a second stays down: its slice is written once when it goes
down and once when it has settled, never at each flap.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable, Iterable, Mapping

from netclaim.core.devices.nic import NetworkInterface
from netclaim.runtime import metrics

SETTLE_SECONDS = 1.0


def _utc_now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC).replace(microsecond=0)


class LinkHealth:
    def __init__(
        self,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], datetime.datetime] = _utc_now,
        settle_seconds: float = SETTLE_SECONDS,
    ) -> None:
        self._clock = clock
        self._settle_seconds = settle_seconds
        self._wall_clock = wall_clock
        self._down_since: dict[str, datetime.datetime] = {}  # interface name -> its carrier's first loss
        self._back: dict[
            str, tuple[float, int]
        ] = {}  # interface name -> (seen back at, carrier changes then)

    @property
    def down(self) -> Mapping[str, datetime.datetime]:
        """The interfaces that are down, by name, with the moment each went down."""
        return self._down_since

    def observe(self, interfaces: Iterable[NetworkInterface]) -> float | None:
        """Take one scan's carriers. Returns in how many seconds a link that came back may have settled
        (the caller scans again then), or None when no link is waiting to."""
        now = self._clock()
        settling: list[float] = []
        present = set()
        for interface in interfaces:
            name = interface.name
            present.add(name)
            if interface.up and not interface.carrier:  # admin down: no cable to judge (a whole NIC
                # handed back from a pod stays down until the next pod's plugin sets it up)
                if name not in self._down_since:
                    self._down_since[name] = self._wall_clock()
                    metrics.NIC_LINK_LOSSES.inc()
                self._back.pop(name, None)
                continue
            if name not in self._down_since:
                continue
            back = self._back.get(name)
            if back is None or back[1] != interface.carrier_changes:  # back now, or lost and back again
                back = self._back[name] = (now, interface.carrier_changes)
            left = back[0] + self._settle_seconds - now
            if left > 0:
                settling.append(left)
            else:
                del self._down_since[name], self._back[name]
        for gone in set(self._down_since) - present:
            del self._down_since[gone]
            self._back.pop(gone, None)
        return min(settling, default=None)

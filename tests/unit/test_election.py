"""Leader election on a Lease (netclaim.runtime.election): one replica leads, the other takes over when the
leader gives the Lease up or stops renewing it, and a leader that cannot renew stops leading by itself."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, replace

import pytest

from netclaim.errors import AlreadyExistsError, ApiUnavailableError, ConflictError
from netclaim.runtime.election import Election, LeadershipLost, LeaseRecord


@dataclass
class Leases:
    """One Lease as the API keeps it: every write conditional on the version read; `down` fails all."""

    record: LeaseRecord | None = None
    down: bool = False
    writes: int = 0

    async def get_lease(self) -> LeaseRecord | None:
        if self.down:
            raise ApiUnavailableError("API away")
        return self.record

    async def create_lease(self, record: LeaseRecord) -> LeaseRecord:
        if self.down:
            raise ApiUnavailableError("API away")
        if self.record is not None:
            raise AlreadyExistsError("exists")
        return self._write(record)

    async def update_lease(self, record: LeaseRecord) -> LeaseRecord:
        if self.down:
            raise ApiUnavailableError("API away")
        if self.record is None or self.record.version != record.version:
            raise ConflictError("changed")
        return self._write(record)

    def _write(self, record: LeaseRecord) -> LeaseRecord:
        self.writes += 1
        self.record = replace(record, version=str(self.writes))
        return self.record


def _candidate(leases: Leases, name: str) -> Election:
    return Election(leases, name, duration=1, renew_deadline=0.5, retry=0.05)


async def _lead_forever(led: list[str], name: str) -> None:
    led.append(name)
    await asyncio.Event().wait()


async def test_one_leads_and_the_standby_takes_over_once_the_lease_is_given_up() -> None:
    leases, led = Leases(), list[str]()
    first, second = _candidate(leases, "a"), _candidate(leases, "b")
    leading = asyncio.create_task(first.run(lambda: _lead_forever(led, "a")))
    await asyncio.wait_for(first.leading.wait(), 5)
    standing_by = asyncio.create_task(second.run(lambda: _lead_forever(led, "b")))
    await asyncio.sleep(0.3)  # several of the standby's rounds
    assert led == ["a"] and leases.record is not None and leases.record.holder == "a"
    leading.cancel()
    await asyncio.gather(leading, return_exceptions=True)
    await first.release()
    await asyncio.wait_for(second.leading.wait(), 5)
    assert led == ["a", "b"] and leases.record.holder == "b" and leases.record.transitions == 1
    standing_by.cancel()
    await asyncio.gather(standing_by, return_exceptions=True)


async def test_a_leader_that_stops_renewing_is_replaced_after_the_lease_expires() -> None:
    leases, led = Leases(), list[str]()
    first, second = _candidate(leases, "a"), _candidate(leases, "b")
    killed = asyncio.create_task(first.run(lambda: _lead_forever(led, "a")))
    await asyncio.wait_for(first.leading.wait(), 5)
    killed.cancel()  # kill -9: no release
    await asyncio.gather(killed, return_exceptions=True)
    renewed_by_a = leases.writes
    standing_by = asyncio.create_task(second.run(lambda: _lead_forever(led, "b")))
    await asyncio.wait_for(second.leading.wait(), 5)
    assert leases.record is not None and leases.record.holder == "b"
    assert leases.writes == renewed_by_a + 1  # taken once, after a full duration seen unchanged
    standing_by.cancel()
    await asyncio.gather(standing_by, return_exceptions=True)


async def test_a_leader_that_cannot_renew_stops_leading_and_its_work_is_cancelled() -> None:
    leases = Leases()
    election = _candidate(leases, "a")
    work_ended = asyncio.Event()

    async def lead() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            work_ended.set()

    running = asyncio.create_task(election.run(lead))
    await asyncio.wait_for(election.leading.wait(), 5)
    leases.down = True
    with pytest.raises(LeadershipLost):
        await asyncio.wait_for(running, 5)
    assert work_ended.is_set() and not election.leading.is_set()


async def test_a_leader_whose_renewals_hang_stops_before_its_lease_could_be_taken() -> None:
    """A request the API never answers (a partition) must not hold the leader's loop past its deadline."""
    leases = Leases()
    election = _candidate(leases, "a")
    running = asyncio.create_task(election.run(lambda: _lead_forever([], "a")))
    await asyncio.wait_for(election.leading.wait(), 5)

    async def hanging() -> LeaseRecord | None:
        await asyncio.Event().wait()
        return None

    leases.get_lease = hanging  # type: ignore[method-assign]
    with pytest.raises(LeadershipLost):
        await asyncio.wait_for(running, 5)  # within its renew deadline (0.5 s) and a round (0.05 s)

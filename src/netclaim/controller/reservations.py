"""Pool addresses reserved before the pod binds (netclaim.core.ipam.reservation): a work queue of claims.

claims mirror ──a claim whose pool device the scheduler waits on──▶ pending (by claim UID, once each)
    ──▶ RESERVE_AT_ONCE at a time: the claim read afresh ─▶ its addresses taken by the agents' own code
        (netclaim.core.ipam.addresses.AddressBook, in the name of the node the claim is allocated on)
        ─▶ RESERVED and the addresses on the pool device's status entry: the scheduler binds the pod
      or, when the claim's config or the pool can give none (an address held by another claim, none free,
      one in quarantine): RESERVATION_FAILED and a Warning Event on the pod; the scheduler gives the
      allocation back and tries the pod again, which stays Pending rather than failing its sandbox.

A claim whose work failed for a reason of the moment (the API, a conflicting write) is tried again after
its own backoff while the others go on; one that raised anything else is logged and tried the same way. A
pod is told a failure once, not at each of the scheduler's tries.
The scheduler reads the claim's status every 5 s while it waits (kube-scheduler's PreBind up to 1.37), so
a reservation costs the pod up to 5 s however fast it is made.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import time
from typing import Any

from netclaim.core.events import EventReason
from netclaim.core.ipam.addresses import AddressBook
from netclaim.core.ipam.reservation import awaiting, failed_entry, reserved_entry
from netclaim.core.kubeapi import AddressesApi, ClaimsApi
from netclaim.core.objects import AllocatedDevice, Claim
from netclaim.core.plan import address_requests
from netclaim.errors import (
    AddressQuarantinedError,
    ConfigError,
    GoneError,
    NetclaimError,
    PoolExhaustedError,
    per_object,
)
from netclaim.runtime import metrics
from netclaim.runtime.trigger import KeyBackoff

log = logging.getLogger(__name__)
RESERVE_AT_ONCE = 8  # claims worked on at once: each is a few API round trips
TOLD_KEPT = 4096  # failures told to their pods, remembered so that the scheduler's next try is not told again


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def _key(entry: dict[str, Any]) -> tuple[Any, Any, Any]:
    return entry.get("pool"), entry.get("device"), entry.get("shareID") or ""


class Reservations:
    def __init__(self, claims: ClaimsApi, addresses: AddressesApi, driver: str) -> None:
        self.claims = claims
        self.addresses = addresses
        self.driver = driver
        self.book = AddressBook(addresses, "")  # each claim's in the name of its node
        self._pending: dict[str, tuple[str, str]] = {}  # claim UID → (namespace, name)
        self._working: set[str] = set()
        self._wake = asyncio.Event()
        self.backoff = KeyBackoff(self._wake.set)
        self._told: dict[tuple[str, str], None] = {}  # (pod UID, message) of the Events written, oldest first

    def changed(self, before: Claim | None, after: Claim | None) -> None:
        """A claim seen to change (the claims mirror): queued if the scheduler waits on one of its devices."""
        if after is not None and awaiting(after, self.driver):
            self._pending[after.uid] = (after.namespace, after.name)
            self._wake.set()

    async def run(self) -> None:
        tasks: set[asyncio.Task[None]] = set()
        try:
            while True:
                await self._wake.wait()
                self._wake.clear()
                for uid, (namespace, name) in list(self._pending.items()):
                    if len(self._working) >= RESERVE_AT_ONCE:
                        break
                    if uid in self._working or not self.backoff.due(uid):
                        continue
                    del self._pending[uid]
                    self._working.add(uid)
                    task = asyncio.create_task(self._work(uid, namespace, name))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _work(self, uid: str, namespace: str, name: str) -> None:
        try:
            await self.reserve(uid, namespace, name)
            self.backoff.succeeded(uid)
        except Exception as err:  # one claim's failure, whatever it is, never stops the others
            delay = self.backoff.failed(uid)
            metrics.RESERVATIONS.labels("error").inc()
            log.warning(
                "reservation failed; trying again",
                extra={"claim": f"{namespace}/{name}", "error": str(err), "retry_in_s": round(delay, 1)},
                exc_info=not isinstance(err, NetclaimError),
            )
            self._pending.setdefault(uid, (namespace, name))
        finally:
            self._working.discard(uid)
            self._wake.set()

    async def reserve(self, uid: str, namespace: str, name: str) -> None:
        """The claim's awaited pool devices settled: RESERVED with their addresses, or RESERVATION_FAILED."""
        try:
            claim = await self.claims.get_claim(namespace, name)
        except GoneError:
            return
        # reservedFor empty: the scheduler is not waiting (a pod's claim after its unprepare, say)
        devices = awaiting(claim, self.driver) if claim.uid == uid and claim.reserved_for else []
        if not devices:
            return
        started = time.monotonic()
        failure = None
        try:
            entries = await self._reserved(claim, devices)
        except (ConfigError, PoolExhaustedError, AddressQuarantinedError) as err:
            failure = str(err)
            entries = [failed_entry(self.driver, device, failure, _now()) for device in devices]
        written = {_key(e) for e in entries}
        kept = [e for e in claim.devices_status if e.get("driver") == self.driver and _key(e) not in written]
        try:
            await self.claims.write_claim_devices(claim, self.driver, kept + entries)
        except GoneError:
            return
        where = {"claim": f"{namespace}/{name}", "ms": round((time.monotonic() - started) * 1000, 1)}
        if failure is None:
            metrics.RESERVATIONS.labels("reserved").inc()
            log.info("addresses reserved before binding", extra={**where, "node": claim.node})
            return
        metrics.RESERVATIONS.labels("failed").inc()
        log.info("reservation failed: the scheduler tries the pod again", extra={**where, "problem": failure})
        for pod in claim.reserved_for:
            message = f"claim {name}: no address reserved, the pod is scheduled again: {failure}"
            if (pod.uid, message) in self._told:  # the scheduler tries again every few seconds
                continue
            self._told[(pod.uid, message)] = None
            while len(self._told) > TOLD_KEPT:
                del self._told[next(iter(self._told))]
            event = self.claims.create_pod_event(
                namespace, pod.name, pod.uid, EventReason.RESERVATION_FAILED, message
            )
            await per_object(f"event on pod {namespace}/{pod.name}", event)

    async def _reserved(self, claim: Claim, devices: list[AllocatedDevice]) -> list[dict[str, Any]]:
        if claim.problems():  # what the agent would refuse is not given an address first
            raise ConfigError(f"claim {claim.namespace}/{claim.name}: {'; '.join(claim.problems())}")
        if not claim.node:
            raise ConfigError(
                f"claim {claim.namespace}/{claim.name}: its allocation names no node (a pool's address goes "
                "with a NIC of the same claim)"
            )
        requests = [r for r in address_requests(claim, self.driver) if r.allocated in devices]
        grants = await self.book.allocate(claim, requests, claim.node)
        return [reserved_entry(self.driver, g.allocated, g.addresses, _now()) for g in grants]

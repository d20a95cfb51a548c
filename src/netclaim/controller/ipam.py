"""The controller's IPAM pass: the cluster's IP pools as DRA devices, and their addresses given back.

IPPools, IPAllocations, ResourceClaims of the pools ──changes──▶ Trigger ──▶ reconcile:
    free the addresses of claims that are gone ─▶ the admission parameters of the restricted pools
    ─▶ publish each pool as a device with its capacity (a restricted one once its parameter is in place)
    ─▶ the pools' status ─▶ a Warning Event on Pending pods whose pool is full

A pass reads the claims and IPAllocations from memory (netclaim.controller.mirror: a list, then a watch from
it), reads afresh only the claim of an address it would free, and lists only while a watch is being started
again; IPPools are listed each pass (a handful). When a pass listed every claim and any claim change started
one, at 5,000 claims a pass cost the controller 1.2 CPU-seconds and kept the API server serving its lists, and
back to back they held half a core of this 2-core machine while the scheduler placed 4.2 pods/s (make bench-
scale, docs/scale.md). Now only changes of the pools' claims start one (concerns_pools), and after each pass
the controller rests REST_FACTOR times as long as the pass took (netclaim.runtime.trigger.paced_pass): its
share of its own core and of the API server stays under 1 / (1 + REST_FACTOR) whatever the cluster's size,
while a small cluster's passes (milliseconds) still follow a change within a second. The addresses' releases
(RELEASES_AT_ONCE writes in flight) are work on what changed, not the cluster's: not rested for.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from netclaim.controller.mirror import Mirror
from netclaim.core.events import EventReason
from netclaim.core.ipam.ippool import ADDRESSES, POOLS_POOL, IPPool, pool_class
from netclaim.core.ipam.pools import (
    PoolUse,
    Quarantine,
    beyond_allocation,
    exhausted_message,
    namespace_params,
    orphans,
    pool_device,
    pool_slices,
    pool_use,
    read_pools,
)
from netclaim.core.ipam.published import AddressReports, PublishedAddresses
from netclaim.core.kubeapi import ClusterClaimsApi, IPPoolsApi, PoolParamsApi, PoolSlicesApi
from netclaim.core.objects import Claim, IPAllocation, condition
from netclaim.errors import GoneError, per_object, per_object_at_once
from netclaim.runtime import metrics

log = logging.getLogger(__name__)
ADDRESS_CLASS = "netclaim-address"  # deploy/deviceclasses.yaml
READS_BY_NAME = 100  # claims a pass reads one by one before freeing their addresses; past it, one list
# addresses marked released or freed at a time: one by one (two writes each, the quarantine's mark then the
# delete, every pool's device and status waiting behind them), a deleted namespace's 5,000 were freed 374 s
# after their claims went (make bench-scale at 500 nodes)
RELEASES_AT_ONCE = 16


class Reconciler:
    def __init__(
        self,
        claims: ClusterClaimsApi,
        addresses: IPPoolsApi,
        slices: PoolSlicesApi,
        params: PoolParamsApi,
        driver: str,
        quarantine: Quarantine | None = None,
        reserve_before_binding: bool = False,
        claim_changed: Callable[[Claim | None, Claim | None], None] = lambda before, after: None,
    ) -> None:
        self.reserve_before_binding = reserve_before_binding  # the pools' devices carry binding conditions
        self.quarantine = quarantine or Quarantine(lambda since: True, 0.0)
        self.claims = claims
        self.addresses = addresses
        self.slices = slices
        self.params = params
        self.driver = driver
        self.pool_slices = pool_slices(slices, driver)
        self.warned: set[tuple[str, str]] = set()  # (pod UID, message) reported, of pods still waiting
        self.published: set[str] = set()  # pools with a free-claims gauge
        # the addresses the claims seen report, kept as they change (what may be published)
        self.reports = AddressReports(driver)

        # kept by run()'s watches; of a claim, what the passes read (50,000 whole claims: ≈ 450 MiB)
        def seen(before: Claim | None, after: Claim | None) -> None:
            self.reports.change(before, after)
            claim_changed(before, after)

        self.claims_seen: Mirror[Claim] = Mirror(
            "claims", lambda claim: claim.uid, lambda claim: claim.compact(driver), seen
        )
        self.allocations_seen: Mirror[IPAllocation] = Mirror(
            "ipallocations", lambda allocation: allocation.name
        )
        # of the last pass, the seconds its addresses' releases took: work on what changed, which the
        # pass's pacing does not rest for (5,000 of them rested 4 times their 20 s before being freed)
        self.release_seconds = 0.0

    async def reconcile(self) -> None:
        """One pass, counted: netclaim_reconcile_total{result}, and the time of the last that succeeded."""
        await metrics.counted_pass(metrics.RECONCILES, self.once)
        metrics.LAST_RECONCILE.set_to_current_time()

    async def once(self) -> dict[str, PoolUse]:
        allocations, claims = await self._read()
        beyond = beyond_allocation(allocations, claims, self.driver)
        released = [(a, "address of a deleted claim freed") for a in orphans(allocations, set(claims))]
        released += [(a, "address held beyond the claim's allocation freed") for a in beyond]
        self.quarantine.keep({a.uid for a, _ in released})
        releasing = time.monotonic()
        await per_object_at_once(
            [
                (f"freeing address {a.address} of IPPool {a.pool}", self._release(a, what))
                for a, what in released
            ],
            RELEASES_AT_ONCE,
        )
        self.release_seconds = time.monotonic() - releasing
        live = [a for a in allocations if a.claim_uid in claims and a not in beyond]
        objects = await self.addresses.list_ippools()
        pools, problems = read_pools(objects)
        for name, problem in problems.items():
            log.warning("IPPool not published: invalid", extra={"pool": name, "problem": problem})
        uses = {pool.name: pool_use(pool, live, claims, self.driver) for pool in pools}
        guarded = await self._write_params(pools, {str(o["metadata"]["name"]): o for o in objects})
        published = [p for p in pools if p.spec.namespaces is None or p.name in guarded]
        await self.pool_slices.write(
            [pool_device(pool, uses[pool.name], self.reserve_before_binding) for pool in published]
        )
        current = {str(o["metadata"]["name"]): o.get("status") for o in objects}
        for gone in self.published - set(uses):
            metrics.POOL_FREE.remove(gone)
        self.published = set(uses)
        for pool in pools:
            metrics.POOL_FREE.labels(pool.name).set(uses[pool.name].free)
            missing = pool.spec.namespaces is not None and not await self.slices.device_class_exists(
                pool_class(pool.name)
            )
            status = _status(pool, uses[pool.name], missing)
            await per_object(f"status of IPPool {pool.name}", self._write_status(pool.name, status, current))
        for name, problem in problems.items():
            invalid = {"conditions": [condition("False", "Invalid", problem)]}
            await per_object(f"status of IPPool {name}", self._write_status(name, invalid, current))
        await self._warn_pending(claims, uses)
        return uses

    async def _read(self) -> tuple[list[IPAllocation], dict[str, Claim]]:
        """Every IPAllocation, then every claim by UID (in that order: netclaim.core.ipam.pools). From the
        mirrors while both are synced; what would be freed is decided on its claim read afresh, after the
        allocations were read (a claim's change may reach its mirror after its address's): one GET per
        claim concerned, or one list of every claim (in pages) past READS_BY_NAME of them."""
        if not (self.allocations_seen.synced and self.claims_seen.synced):
            allocations = await self.addresses.list_ip_allocations()
            return allocations, {c.uid: c for c in await self.claims.list_claims(self.driver)}
        allocations = list(self.allocations_seen.objects.values())
        claims = dict(self.claims_seen.objects)
        suspects = orphans(allocations, set(claims)) + beyond_allocation(allocations, claims, self.driver)
        concerned = {a.claim_uid: a for a in suspects}
        if len(concerned) > READS_BY_NAME:  # a namespace deleted: one list (in pages) costs less
            return allocations, {c.uid: c for c in await self.claims.list_claims(self.driver)}
        for allocation in concerned.values():
            uid = allocation.claim_uid
            try:
                now = await self.claims.get_claim(allocation.claim_namespace, allocation.claim_name)
            except GoneError:
                claims.pop(uid, None)
                continue
            if now.uid == uid:
                claims[uid] = now.compact(self.driver)
            else:  # the name is another claim's now: this one is gone
                claims.pop(uid, None)
        return allocations, claims

    async def publishable(self) -> PublishedAddresses:
        """What the Services' and policies' passes may publish (netclaim.core.ipam.published): from the
        claims and IPAllocations seen (listed while their watches have not listed once) and the pools as
        listed now."""
        allocations = (
            list(self.allocations_seen.objects.values())
            if self.allocations_seen.synced
            else await self.addresses.list_ip_allocations()
        )
        pools, _ = read_pools(await self.addresses.list_ippools())
        if self.claims_seen.listed.is_set():
            return PublishedAddresses(self.reports, allocations, pools)
        return PublishedAddresses.of_claims(await self.current_claims(), allocations, pools, self.driver)

    async def current_claims(self) -> list[Claim]:
        """Every claim, as seen (its watch starting again: as seen last; listed before the first list)."""
        if self.claims_seen.listed.is_set():
            return list(self.claims_seen.objects.values())
        return await self.claims.list_claims(self.driver)

    async def _write_params(self, pools: list[IPPool], objects: dict[str, dict[str, Any]]) -> set[str]:
        """Each restricted pool's parameter of admission policy netclaim-pool-namespaces, written before its
        device is published: the restricted pools whose parameter is in place. A parameter of no restricted
        pool is deleted (an IPPool deleted also deletes its own)."""
        present = await self.params.list_pool_params()
        wanted = {pool_class(p.name): p for p in pools if p.spec.namespaces is not None}
        guarded = set()
        for name, pool in wanted.items():
            data = namespace_params(pool)
            if present.get(name) != data:
                uid = str(objects[pool.name]["metadata"].get("uid", ""))
                write = self.params.apply_pool_params(name, data, pool.name, uid)
                if not await per_object(f"admission parameter of IPPool {pool.name}", write):
                    continue
            guarded.add(pool.name)
        for name in sorted(set(present) - set(wanted)):
            await per_object(f"admission parameter {name}", self.params.delete_pool_params(name))
        return guarded

    async def _release(self, allocation: IPAllocation, what: str) -> None:
        """Quarantine the address (annotated RELEASED_AT), then free it once the quarantine says so."""
        if self.quarantine.over(allocation.uid):
            await self._free(allocation, what)
            return
        if not allocation.released_at:
            await self.addresses.mark_released(allocation, self.quarantine.started(allocation.uid))
            log.info(
                "address quarantined",
                extra={
                    "pool": allocation.pool,
                    "address": allocation.address,
                    "claim": allocation.claim_name,
                },
            )

    async def _free(self, orphan: IPAllocation, what: str) -> None:
        await self.addresses.delete_ip_allocation(orphan)
        metrics.ADDRESSES_RECLAIMED.inc()
        log.info(
            what,
            extra={
                "pool": orphan.pool,
                "address": orphan.address,
                "claim": f"{orphan.claim_namespace}/{orphan.claim_name}",
                "node": orphan.node,
            },
        )

    async def _write_status(
        self, name: str, status: dict[str, Any], current: dict[str, dict[str, Any] | None]
    ) -> None:
        if current.get(name) != status:  # as the API has it: a recreated pool or a cleared status is seen
            await self.addresses.write_ippool_status(name, status)

    async def _warn_pending(self, claims: dict[str, Claim], uses: dict[str, PoolUse]) -> None:
        if not any(use.free == 0 for use in uses.values()):
            return
        by_name = {(c.namespace, c.name): c for c in claims.values()}
        waiting = await self.claims.unschedulable_pods()
        uids = {pod.uid for pod in waiting}
        self.warned = {(uid, message) for uid, message in self.warned if uid in uids}
        for pod in waiting:
            for name in pod.claim_names():
                claim = by_name.get((pod.namespace, name))
                if claim is None or not any(r.device_class == ADDRESS_CLASS for r in claim.requests):
                    continue
                selectors = [
                    s for r in claim.requests if r.device_class == ADDRESS_CLASS for s in r.selectors
                ]
                message = exhausted_message(selectors, uses)
                if message is None or (pod.uid, message) in self.warned:
                    continue
                self.warned.add((pod.uid, message))
                event = self.claims.create_pod_event(
                    pod.namespace, pod.name, pod.uid, EventReason.POOL_EXHAUSTED, message
                )
                await per_object(f"event on pod {pod.namespace}/{pod.name}", event)


def _count(number: int) -> int | str:
    """A count for the API: as text past 2**53 (an IPv6 /64 holds 2**64 - 1), which JSON numbers hold
    exactly only in some clients (Go's int64 not at all)."""
    return number if number < 2**53 else str(number)


def _status(pool: IPPool, use: PoolUse, class_missing: bool = False) -> dict[str, Any]:
    ready = (
        condition(
            "False",
            "DeviceClassMissing",
            f"published, but restricted to namespaces {', '.join(pool.spec.namespaces or ())}: their claims "
            f"take its addresses through DeviceClass {pool_class(pool.name)}, which does not exist "
            "(docs/ipam.md)",
        )
        if class_missing
        else condition("True", "Published", f"published with capacity {ADDRESSES}")
    )
    return {
        "capacity": use.capacity,
        "allocatedClaims": use.allocated_claims,
        "free": use.free,
        "addresses": {
            f"ipv{version}": {"size": _count(family.size), "held": use.addresses.get(version, 0)}
            for version, family in sorted(pool.families().items())
        },
        "conditions": [ready],
    }


def concerns_pools(claim: Claim, driver: str) -> bool:
    """Whether a claim's change can change a pass: it has results on a pool's device (allocated, changed or
    deleted), or asks the general address class (its pod may wait on a full pool), or cannot be read. Other
    drivers' claims, and NIC-only ones, start no pass: before, every claim of the cluster did, and a no-op
    driver's 5,000 claims cost the controller 14.6 CPU-seconds (docs/scale.md, run G)."""
    return (
        bool(claim.unreadable)
        or any(r.pool == POOLS_POOL and r.driver == driver for r in claim.results)
        or any(r.device_class == ADDRESS_CLASS for r in claim.requests)
    )

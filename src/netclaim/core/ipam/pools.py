"""The controller's side of cluster-wide IPAM: IP pools as DRA devices, and the reconciler.

Every valid IPPool is one device of the cluster-wide pool `netclaim.dev/ip-pools` (a ResourceSlice of all
nodes), shared by many claims, with the consumable capacity `netclaim.dev/addresses`: the scheduler then
allocates a claim only while its pool has an address left, and a pod whose pool is full stays Pending.

The reconciler frees the addresses of claims that are gone (deleted while their node was lost, the agent
was down or its state directory was wiped) and nothing else. It reads the IPAllocations before it lists the
claims it decides on: an allocation is only made for a claim that exists, so one whose claim is missing
from the later list belongs to a deleted claim (the controller's mirrors say only when to look). It
deletes with the allocation's UID as precondition, so an address released and taken again by another claim
meanwhile is never freed. What cannot be read is left out of the lists
(netclaim.adapters.kube): an IPAllocation that cannot be read (a malformed address) is neither counted nor
freed, and a claim read only in part (an opaque config nested too deep) is listed all the same, so the
addresses it holds are never taken for an orphan's.
"""

from __future__ import annotations

import datetime
import re
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial
from typing import Any

from netclaim.core.devices.slices import SliceOwner, SliceWriter
from netclaim.core.ipam.ippool import ADDRESSES, POOLS_POOL, IPPool, capacity
from netclaim.core.ipam.reservation import BINDING_FIELDS
from netclaim.core.kubeapi import PoolSlicesApi
from netclaim.core.names import DRIVER_DOMAIN, NETWORK
from netclaim.core.objects import Claim, IPAllocation
from netclaim.errors import ConfigError

SLICE_PREFIX = "netclaim.dev-ip-pools"
RESTRICTED = f"{DRIVER_DOMAIN}/restricted"
IPPOOL_CRD = "ippools.netclaim.dev"


def read_pools(objects: Iterable[dict[str, Any]]) -> tuple[list[IPPool], dict[str, str]]:
    """The valid pools, and each invalid pool's problems (it publishes no device)."""
    pools, problems = [], {}
    for data in objects:
        try:
            pools.append(IPPool.from_api(data))
        except ConfigError as err:
            problems[str((data.get("metadata") or {}).get("name", ""))] = str(err)
    return pools, problems


@dataclass(frozen=True)
class PoolUse:
    """A pool's addresses in use, as the controller sees them."""

    capacity: int  # what its device publishes
    allocated_claims: int  # allocation results on it, one unit each, as the scheduler counts
    addresses: dict[int, int]  # family → addresses held

    @property
    def free(self) -> int:
        return max(self.capacity - self.allocated_claims, 0)


def allocated_from(claim: Claim, pool: str, driver: str) -> bool:
    return results_on(claim, pool, driver) > 0


def results_on(claim: Claim, pool: str, driver: str) -> int:
    """The claim's allocation results on the pool's device of `driver` (the configured driver name): what
    the scheduler subtracts from its capacity (one unit each)."""
    return sum(1 for r in claim.results if r.pool == POOLS_POOL and r.device == pool and r.driver == driver)


def pool_use(pool: IPPool, allocations: list[IPAllocation], claims: dict[str, Claim], driver: str) -> PoolUse:
    families = pool.families()
    mine = [a for a in allocations if a.pool == pool.name]
    inside: dict[int, int] = defaultdict(int)
    held: dict[int, int] = defaultdict(int)
    for allocation in mine:
        address = allocation.interface.ip
        held[address.version] += 1
        family = families.get(address.version)
        if family is not None and family.hands_out(address):
            inside[address.version] += 1
    live_holders = {
        a.claim_uid
        for a in mine
        if a.claim_uid in claims and allocated_from(claims[a.claim_uid], pool.name, driver)
    }
    allocated = sum(results_on(c, pool.name, driver) for c in claims.values())
    return PoolUse(
        capacity=capacity(pool, len(live_holders), dict(inside)),
        allocated_claims=allocated,
        addresses=dict(held),
    )


def pool_device(pool: IPPool, use: PoolUse, reserve_before_binding: bool = False) -> dict[str, Any]:
    families = pool.families()
    attributes: dict[str, Any] = {
        f"{DRIVER_DOMAIN}/pool": {"string": pool.name},
        f"{DRIVER_DOMAIN}/ipv4": {"bool": 4 in families},
        f"{DRIVER_DOMAIN}/ipv6": {"bool": 6 in families},
    }
    if pool.spec.network is not None:
        attributes[NETWORK] = {"string": pool.spec.network}
    # a pool of some namespaces: the general class netclaim-address never selects it (deploy/admission.yaml,
    # netclaim-pool-namespaces: only those namespaces may name its own class)
    attributes[RESTRICTED] = {"bool": pool.spec.namespaces is not None}
    return {
        "name": pool.name,
        "attributes": attributes,
        "capacity": {
            ADDRESSES: {
                "value": str(use.capacity),
                "requestPolicy": {"default": "1", "validRange": {"min": "1", "max": "1"}},
            }
        },
        "allowMultipleAllocations": True,
        **(BINDING_FIELDS if reserve_before_binding else {}),
    }


def namespace_params(pool: IPPool) -> dict[str, str]:
    """What admission policy netclaim-pool-namespaces needs of a restricted pool: its parameter's data. The
    parameters are ConfigMaps the controller keeps, not the IPPools themselves: with a CRD as paramKind,
    kube-apiserver denies every request the policy matches (every ResourceClaim of the cluster) from its
    restart until the policy is written again (kubernetes#122658, #124237); a core kind is always served."""
    return {"pool": pool.name, "namespaces": ",".join(pool.spec.namespaces or ())}


def orphans(allocations: list[IPAllocation], live_claim_uids: set[str]) -> list[IPAllocation]:
    """The allocations whose claim is gone (`allocations` listed before the claims)."""
    return [a for a in allocations if a.claim_uid not in live_claim_uids]


def beyond_allocation(
    allocations: list[IPAllocation], claims: dict[str, Claim], driver: str
) -> list[IPAllocation]:
    """Addresses live claims hold beyond what their allocation gives them: more than one per family of a
    pool, or, while allocated, of a pool they are not allocated. An agent takes exactly one per family and
    reuses it, so these are what a node's token made for claims it was never asked to prepare. Of several,
    the one on the node the claim is allocated on is kept, else the first by name. A standalone claim not
    allocated at the moment (between pods) keeps one per family of each pool it holds: a node's token can
    hold no more than that in its name. A pod's own claim not allocated keeps none: its pod is gone, or was
    never bound (the scheduler gave back an allocation the controller had reserved for, and allocates again,
    reserving again): kept, it would shrink the pool's capacity under the very claim that waits for it."""
    held: dict[tuple[str, str, int], list[IPAllocation]] = defaultdict(list)
    for allocation in allocations:
        if allocation.claim_uid in claims:
            version = allocation.interface.version
            held[(allocation.claim_uid, allocation.pool, version)].append(allocation)
    beyond = []
    for (claim_uid, pool, _), found in held.items():
        claim = claims[claim_uid]
        if (claim.allocated and not allocated_from(claim, pool, driver)) or (
            not claim.allocated and claim.owned_by_pod
        ):
            beyond += found
            continue
        nodes = {r.pool for r in claim.results if r.pool != POOLS_POOL}
        kept = min(found, key=lambda a: (a.node not in nodes, a.name))
        beyond += [a for a in found if a is not kept]
    return beyond


class Quarantine:
    """How long a released pool address stays taken before its IPAllocation is deleted (and the address
    can go to another claim): while any Service's endpoints or any policy peer may still name it.

    A claim's address is released when the claim is gone (its pod deleted, or the claim) or holds more than
    its allocation gives it. Other tenants' allow rules and EndpointSlices named it until the controller's
    passes that publish addresses run again and the agents apply what they wrote; another claim taking it
    meanwhile (by name, at once) would be let in by a rule meant for the one before. So the address is freed
    only once both hold: `seconds` have passed since the controller found it released (the agents' time to
    apply, a pass's worst time at the cluster's size), and every pass that publishes addresses has
    succeeded once since (`followed`). A controller that is down, or whose passes fail, frees nothing; one
    that restarts starts every quarantine again. A claim asking for a quarantined address by name waits
    (its prepare fails with the reason, and kubelet retries)."""

    def __init__(
        self,
        followed: Callable[[float], bool],
        seconds: float,
        on_start: Callable[[float], None] = lambda seconds: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.followed = followed
        self.seconds = seconds
        self.on_start = on_start  # the passes to run, and when to look again
        self.clock = clock
        self._since: dict[str, tuple[float, str]] = {}  # allocation UID → when found released (clock, text)

    def keep(self, uids: set[str]) -> None:
        """Forget the allocations no longer released (freed, or their claim back)."""
        for uid in set(self._since) - uids:
            del self._since[uid]

    def started(self, uid: str) -> str:
        """When the allocation was found released (RFC 3339), from now if it was not before."""
        if uid not in self._since:
            now = datetime.datetime.now(datetime.UTC).replace(microsecond=0)
            self._since[uid] = (self.clock(), now.isoformat().replace("+00:00", "Z"))
            self.on_start(self.seconds)
        return self._since[uid][1]

    def over(self, uid: str) -> bool:
        self.started(uid)
        since = self._since[uid][0]
        return self.clock() - since >= self.seconds and self.followed(since)


def pool_slices(api: PoolSlicesApi, driver: str) -> SliceWriter:
    """The pools' slices, through the one slice writer: owned by the IPPool CRD, so that uninstalling
    netclaim (deleting the CRD) lets the garbage collector remove them, as kubelet removes the nodes' slices
    of a driver that is gone. Only its own are read: a slice another writer put in this pool (a node's
    token, say) never decides what the controller writes, nor its generation."""
    owner = SliceOwner(
        "apiextensions.k8s.io/v1",
        "CustomResourceDefinition",
        IPPOOL_CRD,
        partial(api.crd_uid, IPPOOL_CRD),
        asked_every_pass=True,
    )
    return SliceWriter(api, driver, POOLS_POOL, SLICE_PREFIX, owner)


_QUOTED = re.compile(r"""["']([a-z0-9]([-a-z0-9]*[a-z0-9])?)["']""")


def exhausted_message(claim_selectors: list[str], uses: dict[str, PoolUse]) -> str | None:
    """Why a Pending pod whose claim asks for an address may wait: the full pools its selectors name (or
    every full pool when they name none). None when no pool is full."""
    full = {name: use for name, use in uses.items() if use.free == 0}
    named = {m.group(1) for text in claim_selectors for m in _QUOTED.finditer(text)} & set(uses)
    chosen = sorted(set(full) & named if named else full)
    if not chosen:
        return None
    parts = [
        f"IPPool {name} has no free address: {full[name].allocated_claims} of {full[name].capacity} "
        f"({ADDRESSES}) are allocated"
        for name in chosen
    ]
    return "; ".join(parts) + ". The pod is scheduled when a claim of the pool is released."

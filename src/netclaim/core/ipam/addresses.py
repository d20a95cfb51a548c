"""Cluster-wide addresses for a claim, taken at NodePrepareResources and recorded in Kubernetes.

An address is held by an `IPAllocation` object named after the pool and the address: creating it is the
lock (the apiserver lets one create of a name succeed), so agents on every node can allocate at once
without a shared lock or a read-modify-write of one big object. The object names the claim by UID; it is
released by the controller's reconciler once the claim is gone, whatever happened to the node
(netclaim.core.ipam.pools.orphans), after a quarantine: until every policy rule and Service that named the
address has followed, no other claim takes it (netclaim.core.ipam.pools.Quarantine).

A claim prepared again (kubelet retrying, the agent restarted after a crash, a standalone claim moving to
another node) finds its objects by the claim-UID label and keeps its addresses. That list (HeldReads) is
read from the API server's watch cache when it safely can: a consistent list waits for the cache to catch
up with etcd, up to 100 ms on any cluster with writes elsewhere, on the pod path of every claim with a pool
address. An IPAllocation that cannot be read (a malformed address) is left out of the lists
(netclaim.adapters.kube): never reused; the address its name stands for stays taken all the same, since
creating that name fails.
"""

from __future__ import annotations

import ipaddress
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass

from netclaim.core.ipam.ippool import IPAddress, IPPool, allocation_name, claim_seed, pool_class
from netclaim.core.ipam.reservation import reserved_before_binding
from netclaim.core.kubeapi import AddressesApi
from netclaim.core.objects import AllocatedDevice, Claim, IPAllocation
from netclaim.errors import (
    AddressQuarantinedError,
    AlreadyExistsError,
    ConfigError,
    GoneError,
    PoolExhaustedError,
)
from netclaim.runtime import metrics

log = logging.getLogger(__name__)
BLIND_PROBES = 4  # creates at seeded addresses before the pool's allocations are listed
MAX_RACES = 16  # creates lost to another claim taking the same address at the same moment
REMEMBERED_CLAIMS = 4096  # claims whose held list this process read: read consistently from then on


@dataclass(frozen=True)
class AddressRequest:
    """A pool device allocated to the claim, what the claim's AddressConfig asks of it."""

    allocated: AllocatedDevice  # the pool's device: device name = pool name
    static: dict[int, IPAddress]  # family → the address asked for
    interface_request: str  # the claim's request whose interface gets the addresses


@dataclass(frozen=True)
class Grant:
    """The addresses a claim holds from one pool, and how the interface is to be configured with them."""

    allocated: AllocatedDevice
    pool: IPPool
    addresses: tuple[str, ...]  # with prefix length, e.g. 10.10.3.7/24
    interface_request: str

    def static_addresses(self) -> list[dict[str, str]]:
        """The entries of a `static` IPAM section for these addresses (any CNI chain can carry it)."""
        entries = []
        for text in self.addresses:
            interface = ipaddress.ip_interface(text)
            entry = {"address": text}
            pool_range = self.pool.families()[interface.version].range_of(interface.ip)
            if pool_range is not None and pool_range.gateway is not None:
                entry["gateway"] = pool_range.gateway
            entries.append(entry)
        return entries

    def routes(self) -> list[dict[str, str]]:
        return [{"dst": r.dst} if r.gw is None else {"dst": r.dst, "gw": r.gw} for r in self.pool.spec.routes]


class AddressBook:
    def __init__(self, api: AddressesApi, node: str) -> None:
        self.api = api
        self.node = node
        self.held_reads = HeldReads()

    async def allocate(
        self, claim: Claim, requests: list[AddressRequest], node: str | None = None
    ) -> list[Grant]:
        """One address per family of each requested pool, held for the claim (reusing what it holds), in
        the name of `node` (the controller's, reserving before binding) or of this book's node."""
        held = await self._held(claim, requests) if requests else []
        grants = []
        for request in requests:
            started = time.monotonic()
            pool = await self._pool(claim, request.allocated.device)
            _admitted(claim, request, pool)
            for version in request.static:
                if version not in pool.families():
                    raise ConfigError(
                        f"claim {claim.namespace}/{claim.name}: asks for an IPv{version} address; "
                        f"IPPool {pool.name} has no IPv{version} range"
                    )
            addresses = []
            for version in sorted(pool.families()):
                family = pool.families()[version]
                mine = [  # held before (an earlier prepare, on this node or another): kept, if the pool's
                    a  # (one made in any node's name for an address the pool does not hand out is not)
                    for a in held
                    if a.claim_uid == claim.uid  # the label it was listed by is anyone's to write
                    and not a.released_at  # one the controller is freeing is no longer the claim's
                    and a.pool == pool.name
                    and a.interface.version == version
                    and family.hands_out(a.interface.ip)
                ]
                if mine:
                    addresses.append(mine[0].address)
                    continue
                wanted = request.static.get(version)
                taken = await self._take(claim, pool, version, wanted, node or self.node)
                addresses.append(taken.address)
            metrics.ADDRESS_ALLOCATION_SECONDS.observe(time.monotonic() - started)
            log.info(
                "addresses allocated",
                extra={
                    "claim": f"{claim.namespace}/{claim.name}",
                    "pool": pool.name,
                    "addresses": addresses,
                    "ms": round((time.monotonic() - started) * 1000, 1),
                },
            )
            grants.append(Grant(request.allocated, pool, tuple(addresses), request.interface_request))
        return grants

    async def _held(self, claim: Claim, requests: list[AddressRequest]) -> list[IPAllocation]:
        """What the claim holds. Reserved before binding (the controller's write, then the claim's status
        naming it, then the pod bound), it is read from the cache once that holds the claim as read: what
        the claim's status says was reserved is in it (the cache never goes back, so that read is also no
        older than this process's first)."""
        bound = self.held_reads.bound(claim.uid)
        if bound is not None and any(reserved_before_binding(r.allocated) for r in requests):
            bound = claim.resource_version or bound  # a read this process needs consistent stays so
        listed = await self.api.held_ip_allocations(claim.uid, bound)
        self.held_reads.read(claim.uid, listed.version, consistent=bound is None)
        return listed.items

    async def _pool(self, claim: Claim, name: str) -> IPPool:
        try:
            pool = IPPool.from_api(await self.api.get_ippool(name))
        except GoneError:
            raise ConfigError(
                f"claim {claim.namespace}/{claim.name}: IPPool {name} no longer exists"
            ) from None
        if not pool.serves(claim.namespace):
            raise ConfigError(
                f"claim {claim.namespace}/{claim.name}: IPPool {name} does not serve namespace "
                f"{claim.namespace} (spec.namespaces)"
            )
        return pool

    async def _take(
        self, claim: Claim, pool: IPPool, version: int, wanted: IPAddress | None, node: str
    ) -> IPAllocation:
        family = pool.families()[version]
        if wanted is not None:
            if not family.hands_out(wanted):
                raise ConfigError(
                    f"claim {claim.namespace}/{claim.name}: address {wanted} is not handed out by IPPool "
                    f"{pool.name} (outside its ranges, or excluded, or a gateway)"
                )
            try:
                return await self._create(claim, pool, wanted, node)
            except AlreadyExistsError:
                holder = await self.api.get_ip_allocation(allocation_name(pool.name, wanted))
                if holder.claim_uid == claim.uid and not holder.released_at:  # its own, which a held list
                    return holder  # from the cache had not yet
                if holder.released_at:
                    raise AddressQuarantinedError(
                        f"claim {claim.namespace}/{claim.name}: address {wanted} of IPPool {pool.name} was "
                        f"released by claim {holder.claim_namespace}/{holder.claim_name} at "
                        f"{holder.released_at} and is quarantined until every policy rule and Service that "
                        "named it has followed; the claim waits for it (kubelet retries)"
                    ) from None
                raise ConfigError(
                    f"claim {claim.namespace}/{claim.name}: address {wanted} of IPPool {pool.name} is held "
                    f"by claim {holder.claim_namespace}/{holder.claim_name}"
                ) from None
        for probe in range(BLIND_PROBES):
            # in a pool with room a seeded address is most likely free: one round trip. A pool a fraction
            # f full lists its allocations (thousands of objects, read by the API server from etcd) for
            # only f**BLIND_PROBES of the claims, not for f of them
            guess = family.pick(set(), claim_seed(claim.uid, probe))
            if guess is None:
                break
            try:
                return await self._create(claim, pool, guess, node)
            except AlreadyExistsError:
                continue
        seed = claim_seed(claim.uid)
        existing = await self.api.list_ip_allocations(pool=pool.name)
        taken = {int(a.interface.ip) for a in existing if a.interface.version == version}
        for _ in range(MAX_RACES):
            address = family.pick(taken, seed)
            if address is None:
                raise PoolExhaustedError(
                    f"IPPool {pool.name}: no free IPv{version} address ({family.size} handed out, all held)"
                )
            try:
                return await self._create(claim, pool, address, node)
            except AlreadyExistsError:
                taken.add(int(address))  # another claim took it meanwhile: the next one
        raise PoolExhaustedError(f"IPPool {pool.name}: lost {MAX_RACES} races for an address; retrying")

    async def _create(self, claim: Claim, pool: IPPool, address: IPAddress, node: str) -> IPAllocation:
        pool_range = pool.families()[address.version].range_of(address)
        assert pool_range is not None  # hands_out() said it is in a range
        record = IPAllocation(
            name=allocation_name(pool.name, address),
            uid="",
            pool=pool.name,
            address=f"{address}/{pool_range.network.prefixlen}",
            claim_namespace=claim.namespace,
            claim_name=claim.name,
            claim_uid=claim.uid,
            node=node,
        )
        return await self.api.create_ip_allocation(record)

    async def release(self, claim_uid: str) -> list[str]:
        """Free every address the claim holds in this node's name, at once; returns them: what a prepare
        that failed took (no pod used them, no rule or Service named them). An agent releases only its own
        node's (deploy/admission.yaml). Addresses a pod used are the controller's to free, after their
        quarantine."""
        freed, elsewhere = [], []
        self.held_reads.touched(claim_uid)
        for allocation in await self.api.list_ip_allocations(claim_uid=claim_uid):
            if allocation.node != self.node:
                elsewhere.append(f"{allocation.address} ({allocation.node})")
                continue
            await self.api.delete_ip_allocation(allocation)
            freed.append(allocation.address)
        if freed or elsewhere:
            log.info(
                "addresses released",
                extra={"claim_uid": claim_uid, "addresses": freed, "left_to_the_controller": elsewhere},
            )
        return freed


def _admitted(claim: Claim, request: AddressRequest, pool: IPPool) -> None:
    """A pool of some namespaces gives addresses only through its own DeviceClass: admission refuses that
    class to other namespaces, and another class an admin made that happens to select the pool's device
    (`device.driver == "netclaim.dev"`, say) must not be a way around it."""
    name = request.allocated.request
    device_class = next((r.device_class for r in claim.requests if r.name == name), "")
    if not pool.admits_class(device_class):
        raise ConfigError(
            f"claim {claim.namespace}/{claim.name}: request {name} took IPPool {pool.name} through "
            f"DeviceClass {device_class or '(unknown)'}; a pool of some namespaces gives addresses only "
            f"through its own class, {pool_class(pool.name)}"
        )


class HeldReads:
    """How to read a claim's held addresses without waiting on the API server's watch cache, and without
    missing one: from the cache, once it holds `since`, the resourceVersion of this process's first
    consistent held list.

    What can hold addresses for a claim this process has not read before: an agent process before this one
    on this node (killed in a prepare, its state directory lost): all its creates come before this process
    ran, so before `since`; or another node's agent (a standalone claim that moved): a read that misses
    it (the cache a moment behind) takes a new address, and the controller frees the one on the node the
    claim is no longer allocated on (netclaim.core.ipam.pools.beyond_allocation). For a claim this process
    read (and so may have taken or freed addresses of: a kubelet retry after a failure, a re-prepare after an
    unprepare) the cache may not yet hold its own writes: read consistently, for the last
    REMEMBERED_CLAIMS of them; one forgotten was read minutes ago, which the cache has long caught up with.
    """

    def __init__(self) -> None:
        self.since: str | None = None
        self._read: OrderedDict[str, None] = OrderedDict()

    def bound(self, claim_uid: str) -> str | None:
        """The resourceVersion the claim's held list must hold all up to; None: a consistent list."""
        return None if claim_uid in self._read else self.since

    def read(self, claim_uid: str, version: str | None, consistent: bool) -> None:
        if consistent and self.since is None:
            self.since = version  # None when unreadable: the next held list is consistent as well
        self.touched(claim_uid)

    def touched(self, claim_uid: str) -> None:
        self._read[claim_uid] = None
        self._read.move_to_end(claim_uid)
        while len(self._read) > REMEMBERED_CLAIMS:
            self._read.popitem(last=False)

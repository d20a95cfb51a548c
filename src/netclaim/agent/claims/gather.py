"""Gather: everything planning a claim needs from outside, read before planning starts.

The claim itself, by name and checked by UID (one deleted and recreated is gone; one netclaim can read
only in part is the claim's ConfigError). Then what it needs (netclaim.core.plan.claim_needs): the
cluster's IP pools when its own config names IPAM, the CNI versions of every plugin its configs name
(asked of the installed binaries, cached by the runner until one changes; a plugin that cannot run here
is noted for planning to refuse, should a chain use it), and last its addresses from the IP pools it was
allocated (netclaim.core.ipam.addresses: API calls outside the runtime's budget; the one step that takes
something, given back by `give_back` when planning refuses the claim).
"""

from __future__ import annotations

import asyncio
import logging

from netclaim.core.ipam.addresses import AddressBook
from netclaim.core.ipam.ippool import IPPool
from netclaim.core.ipam.pools import read_pools
from netclaim.core.kubeapi import ClaimsApi
from netclaim.core.node import Cni
from netclaim.core.objects import Claim
from netclaim.core.plan import ClaimInputs, ClaimNeeds, PluginVersions
from netclaim.errors import ConfigError, GoneError, NetclaimError

log = logging.getLogger(__name__)


class Gatherer:
    def __init__(self, api: ClaimsApi, addresses: AddressBook, cni: Cni, driver: str) -> None:
        self.api = api
        self.addresses = addresses
        self.cni = cni
        self.driver = driver

    async def claim(self, namespace: str, name: str, uid: str) -> Claim:
        """The claim kubelet asks about, as far as netclaim can read what is its driver's."""
        claim = await self.api.get_claim(namespace, name)
        if claim.uid != uid:
            raise GoneError(
                f"claim {namespace}/{name} has UID {claim.uid}, kubelet asked for {uid}: "
                "it was deleted and recreated"
            )
        unreadable = [claim.unreadable] + [c.unreadable for c in claim.configs if c.driver == self.driver]
        if any(unreadable):
            raise ConfigError(f"claim {namespace}/{name}: {'; '.join(p for p in unreadable if p)}")
        return claim

    async def inputs(self, claim: Claim, needs: ClaimNeeds) -> ClaimInputs:
        """What `needs` names: the pools and the plugins' versions at once, then the addresses."""
        pools, versions = await asyncio.gather(self._pools(needs), self._versions(needs))
        grants = await self.addresses.allocate(claim, needs.addresses)
        return ClaimInputs(claim, versions, grants, pools)

    async def _pools(self, needs: ClaimNeeds) -> list[IPPool]:
        """From the API server's watch cache: a consistent list waits until that cache has caught up with
        etcd, and with writes elsewhere in the cluster (nearly all are: pods, claims, leases) that takes a
        progress request, sent at most every 100 ms (one ConfigMap written every 20 ms: the list's p50 75 ms,
        p99 98 ms; from the cache 3 and 8 ms). The cache is behind etcd by its watch's delivery: a pool
        made that moment ago may be missed, as one made just after a consistent list would be."""
        return read_pools(await self.addresses.api.list_ippools(cached=True))[0] if needs.pools else []

    async def _versions(self, needs: ClaimNeeds) -> PluginVersions:
        kinds = sorted(needs.plugin_types)
        answers = await asyncio.gather(*(self._spoken(kind) for kind in kinds))
        found = dict(zip(kinds, answers, strict=True))
        spoken = {kind: answer for kind, answer in found.items() if isinstance(answer, list)}
        return PluginVersions(
            spoken, {kind: answer for kind, answer in found.items() if isinstance(answer, str)}
        )

    async def _spoken(self, kind: str) -> list[str] | str:
        """The versions plugin `kind` speaks, or why it cannot run on this node (a ConfigError's words)."""
        try:
            return await self.cni.versions(kind)
        except ConfigError as err:
            return str(err)

    async def give_back(self, claim_uid: str) -> None:
        """Release what `inputs` took: the retry takes them again."""
        try:
            await self.addresses.release(claim_uid)
        except NetclaimError as err:  # the retry reuses them; the reconciler frees them if the claim goes
            log.warning("could not release addresses", extra={"claim_uid": claim_uid, "error": str(err)})

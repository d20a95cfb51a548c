"""ResourceClaims allocated on this node: a watch-fed cache, with a GET (checked by UID) when it misses."""

from __future__ import annotations

import asyncio
import logging

from lightkube import ALL_NS, AsyncClient
from lightkube.core.exceptions import ApiError
from lightkube.resources.resource_v1 import ResourceClaim

from netclaim.errors import ConfigError, TransientError
from netclaim.kube import is_not_found

log = logging.getLogger(__name__)


def allocated_here(claim: ResourceClaim, driver: str, node: str) -> bool:
    allocation = claim.status.allocation if claim.status else None
    if allocation is None or allocation.devices is None:
        return False
    return any(r.driver == driver and r.pool == node for r in allocation.devices.results or [])


class ClaimCache:
    def __init__(self, client: AsyncClient, driver: str, node: str) -> None:
        self.client = client
        self.driver = driver
        self.node = node
        self._claims: dict[str, ResourceClaim] = {}
        self.synced = asyncio.Event()

    def _remember(self, event: str, claim: ResourceClaim) -> None:
        uid = claim.metadata.uid if claim.metadata else None
        if uid is None:
            return
        if event == "DELETED" or not allocated_here(claim, self.driver, self.node):
            self._claims.pop(uid, None)
        else:
            self._claims[uid] = claim

    async def run(self) -> None:
        """Keep the cache current; on a broken watch start over (the cache may serve stale data meanwhile)."""
        while True:
            try:
                async for event, claim in self.client.watch(ResourceClaim, namespace=ALL_NS):
                    self._remember(event, claim)
                    self.synced.set()
            except asyncio.CancelledError:
                raise
            except Exception as err:  # noqa: BLE001 - the watch is retried; GET covers the gap
                log.info("claim watch restarting", extra={"error": repr(err)})
                await asyncio.sleep(1.0)

    async def get(self, namespace: str, name: str, uid: str) -> ResourceClaim:
        """The claim kubelet asks about; an error when it is gone or was replaced (another UID)."""
        cached = self._claims.get(uid)
        if cached is not None:
            return cached
        try:
            claim = await self.client.get(ResourceClaim, name, namespace=namespace)
        except ApiError as err:
            if is_not_found(err):
                raise ConfigError(f"claim {namespace}/{name} no longer exists") from err
            raise TransientError(f"claim {namespace}/{name}: {err.status.message}") from err
        if claim.metadata is None or claim.metadata.uid != uid:
            raise ConfigError(
                f"claim {namespace}/{name} has UID {claim.metadata and claim.metadata.uid}, "
                f"kubelet asked for {uid}: it was deleted and recreated"
            )
        self._remember("ADDED", claim)
        return claim

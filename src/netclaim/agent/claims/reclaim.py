"""Reclaim: the way back when NodeUnprepareResources never comes for a claim that is gone.

kubelet lost its own record of a claim, or its pod was force-deleted while this node's agent was away:
the claim's rows would stay for ever, holding an interface, addresses, and (a whole NIC) a device. Each
round (every RECLAIM_SECONDS, kept running by netclaim.runtime.supervisor) rows that no running sandbox uses,
still there one round later, are checked against the API, and a claim that no longer exists, or is no
longer reserved for the pod its rows were planned for, is unprepared as kubelet would have
(netclaim.agent.claims.unprepare). One claim failing, whatever the error, is logged and counted
(netclaim_reclaim_errors_total) and tried again the next round; the round goes on with the others.
"""

from __future__ import annotations

import asyncio
import logging

from netclaim.agent.claims.unprepare import Unpreparer, bug
from netclaim.agent.pods.attach import netns_exists
from netclaim.agent.status import ClaimRef
from netclaim.agent.store import State, Store
from netclaim.core.kubeapi import ClaimsApi
from netclaim.errors import GoneError
from netclaim.runtime import metrics

log = logging.getLogger(__name__)
# How often rows outside any running sandbox are looked at (kubelet's own DRA reconcile runs every 60 s).
RECLAIM_SECONDS = 60.0


class Reclaimer:
    def __init__(
        self, store: Store, api: ClaimsApi, unpreparer: Unpreparer, seconds: float = RECLAIM_SECONDS
    ) -> None:
        self.store = store
        self.api = api
        self.unpreparer = unpreparer
        self.seconds = seconds
        self._idle_claims: set[str] = set()  # claims whose rows no running sandbox used last round

    async def next_round(self) -> None:
        """Wait for the next round, then run it (what the agent keeps running)."""
        await asyncio.sleep(self.seconds)
        await self.reclaim()

    async def reclaim(self) -> list[ClaimRef]:
        """Unprepare the claims that are gone from the API but still have rows here; returns them.

        A claim is looked up only when none of its rows was in a running sandbox in this round and the
        last one: a node whose pods all run reads nothing, and kubelet's own unprepare has a round to come.
        A claim that still exists but is no longer reserved for the pod its rows were planned for is over
        for that pod (a standalone claim outlives it): its rows go too, or its next pod would get them.
        """
        idle: dict[str, ClaimRef] = {}
        pods: dict[str, set[str]] = {}
        busy: set[str] = set()
        for row in self.store.all():
            pods.setdefault(row.claim_uid, set()).add(row.pod_uid)
            if row.state == State.ATTACHED and netns_exists(row.netns):
                busy.add(row.claim_uid)
            else:
                idle[row.claim_uid] = ClaimRef(row.claim_namespace, row.claim_name, row.claim_uid)
        for uid in busy:
            idle.pop(uid, None)
        suspects = [claim for uid, claim in idle.items() if uid in self._idle_claims]
        self._idle_claims = set(idle)
        gone: list[ClaimRef] = []
        for claim in suspects:
            try:
                if await self._reclaim(claim, pods[claim.uid]):
                    gone.append(claim)
            except Exception as err:  # this claim's only: the round goes on, the next one retries it
                metrics.RECLAIM_ERRORS.inc()
                where = {"claim": f"{claim.namespace}/{claim.name}", "error": str(err)}
                log.warning("reclaim of a claim failed; next round retries", extra=where, exc_info=bug(err))
        return gone

    async def _reclaim(self, claim: ClaimRef, pod_uids: set[str]) -> bool:
        """Unprepare the claim if it is gone or over for the pods of its rows; whether it was."""
        try:
            current = await self.api.get_claim(claim.namespace, claim.name)
            if current.uid == claim.uid and pod_uids & {pod.uid for pod in current.reserved_for}:
                return False
        except GoneError:
            pass
        states = sorted({r.state.value for r in self.store.for_claim(claim.uid)})
        log.warning(
            "claim gone (or over for its pod) without NodeUnprepareResources: unpreparing it here",
            extra={"claim": f"{claim.namespace}/{claim.name}", "uid": claim.uid, "states": states},
        )
        await self.unpreparer.unprepare(claim.namespace, claim.name, claim.uid)
        metrics.CLAIMS_RECLAIMED.inc()
        return True

"""CNI CHECK of what is attached, and its repair: every CHECK_SECONDS (the agent's --check-seconds), each
attached row whose pod sandbox is still there is CHECKed against its ADD's result, under the pod's lock.
A chain that finds its part missing or changed (an address removed by hand, an interface renamed) is
repaired by DEL and ADD into the same sandbox with the addresses it had (host-local hands them out again
through CNI_ARGS IP=; pool and static addresses are in the config), then said on the claim (a
`CheckFailed` condition with the plugin's words) and in an Event on the pod. A repair that fails leaves the
row as a failed attach (Ready False, AttachFailed): the pod runs on, without that interface, and says so.
A CHECK that fails while the chain itself cannot run (a plugin not installed, or its STATUS not ready) is
no finding about the attachment: nothing is repaired. One row failing, whatever the error, is logged and
counted; the round goes on with the others.
"""

from __future__ import annotations

import asyncio
import logging
import time

from netclaim.agent.pods.attach import Attacher, PodLocks, netns_exists
from netclaim.agent.pods.hooks import claim_of
from netclaim.agent.status import StatusWriter
from netclaim.agent.store import Attachment, State, Store
from netclaim.core.config.cniconfig import plugin_types
from netclaim.core.events import EventReason
from netclaim.errors import CniError, NetclaimError, TransientError
from netclaim.runtime import metrics

log = logging.getLogger(__name__)
CHECK_SECONDS = 300.0  # 110 attached pods: about 220 plugin runs every 5 min
CHECK_CALL_SECONDS = 10.0  # one row's CHECK, and its repair


class AttachmentChecker:
    def __init__(
        self,
        store: Store,
        attacher: Attacher,
        locks: PodLocks,
        status: StatusWriter,
        seconds: float = CHECK_SECONDS,
    ) -> None:
        self.store = store
        self.attacher = attacher
        self.locks = locks
        self.status = status
        self.seconds = seconds

    async def run(self) -> None:
        """A round every `seconds` (what the agent keeps running)."""
        while True:
            await asyncio.sleep(self.seconds)
            await self.check_all()

    async def check_all(self) -> list[Attachment]:
        """One round; returns the rows a failed CHECK made it repair (as they are after)."""
        repaired: list[Attachment] = []
        for row in self.store.all():
            if row.state != State.ATTACHED or not netns_exists(row.netns):
                continue
            try:
                after = await self._check(row)
            except Exception as err:  # this row's only: the round goes on, the next one retries it
                metrics.CNI_CHECKS.labels(result="error").inc()
                log.warning(
                    "CNI CHECK of an attachment could not run; the next round retries",
                    extra={"claim": row.claim_name, "device": row.device, "error": str(err)},
                    exc_info=None if isinstance(err, NetclaimError) else err,
                )
                continue
            if after is not None:
                repaired.append(after)
        return repaired

    async def _check(self, row: Attachment) -> Attachment | None:
        async with self.locks(row.pod_uid):
            current = self.store.get(row.key)
            if current != row:  # a hook changed it since the round listed it: the next round sees it
                return None
            deadline = time.monotonic() + CHECK_CALL_SECONDS
            try:
                await self.attacher.check(current, deadline)
            except CniError as err:
                if isinstance(err, TransientError):  # out of time, or "try again": not a finding
                    raise
                await self._runnable(current, deadline)
                metrics.CNI_CHECKS.labels(result="failed").inc()
                return await self._repair(current, f"CNI CHECK failed: {err}", deadline)
            metrics.CNI_CHECKS.labels(result="ok").inc()
            return None

    async def _runnable(self, row: Attachment, deadline: float) -> None:
        """Raises when the chain itself cannot run now (a plugin not installed, or not ready): its CHECK
        failing then says nothing about the attachment, and a DEL and ADD would only break what works."""
        for kind in plugin_types(row.plan.conflist):
            self.attacher.cni.plugin_path(kind)
        await self.attacher.readiness.check(row.plan.conflist, deadline)

    async def _repair(self, row: Attachment, problem: str, deadline: float) -> Attachment | None:
        log.warning("attachment broken; DEL and ADD again", extra={"claim": row.claim_name, "error": problem})
        try:
            after = await self.attacher.reattach(row, deadline)
        except NetclaimError as err:
            told = f"{problem}; DEL and ADD did not restore it: {err}"
            failed = self.store.get(row.key)
            if failed is not None:
                await self.store.transition(failed.with_state(failed.state, error=told), durable=False)
            self._tell(row, told)
            return failed
        told = f"{problem}; DEL and ADD restored it"
        after = after.with_state(after.state, outcome=after.outcome.with_check(told))
        await self.store.transition(after, durable=False)
        self._tell(row, told)
        return after

    def _tell(self, row: Attachment, message: str) -> None:
        claim = claim_of(row)
        self.status.enqueue(claim)
        self.status.tell_pod_later(claim, row.pod_uid, EventReason.CHECK_FAILED, message, warning=True)

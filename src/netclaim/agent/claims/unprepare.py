"""NodeUnprepareResources, per claim (and reclaim's way back, netclaim.agent.claims.reclaim).

Make sure every interface of the claim was DELeted (IPAM released, an exclusive NIC back on the node: the
attacher does it under each pod's lock), forget the claim's rows, its CDI spec and its status entries.
Its pool addresses are not released here: other tenants' rules and Services named them until the
controller's passes follow, so the controller frees them once the claim is gone, after a quarantine
(netclaim.core.ipam.pools.Quarantine); a standalone claim keeps them for its next pod.

It raises only what kubelet should retry (a TransientError): any other failure of an interface is final
for it, cleaned up by hand and said on the claim (TeardownIncomplete); the claim and its pod go all the
same (errors.py has the table).
"""

from __future__ import annotations

import logging
import time

from netclaim.agent.claims.gate import CdiGate
from netclaim.agent.claims.metadata import DeviceMetadataFiles
from netclaim.agent.pods.attach import Attacher
from netclaim.agent.status import ClaimRef, Failure, StatusWriter
from netclaim.agent.store import Store
from netclaim.errors import NetclaimError
from netclaim.runtime import faults

log = logging.getLogger(__name__)
UNPREPARE_SECONDS = 10.0


class Unpreparer:
    def __init__(
        self,
        store: Store,
        attacher: Attacher,
        status: StatusWriter,
        gate: CdiGate | None,
        metadata: DeviceMetadataFiles | None = None,
    ) -> None:
        self.store = store
        self.attacher = attacher
        self.status = status
        self.gate = gate
        self.metadata = metadata

    async def unprepare(self, namespace: str, name: str, uid: str) -> None:
        started = time.monotonic()
        rows = self.store.for_claim(uid)
        faults.point("before-unprepare")
        problems = await self.attacher.release(rows, time.monotonic() + UNPREPARE_SECONDS)
        # what is on this node goes before the API calls below, which may fail: the rows are gone by now,
        # and a retry (kubelet's; reclaim finds claims by their rows) would not see it again
        if self.gate is not None:
            try:
                self.gate.remove(uid)
            except OSError as err:
                problems.append(f"its CDI spec could not be removed: {err}")
        if self.metadata is not None:
            try:
                await self.metadata.remove(namespace, name, uid)
            except OSError as err:
                problems.append(f"its device metadata could not be removed: {err}")
        ref = ClaimRef(namespace, name, uid)
        self.status.forget(ref)
        if problems:  # the claim and its pod go all the same; the claim's status says what happened
            devices = tuple((r.pool, r.device, r.share_id) for r in rows)
            self.status.fail(ref, Failure(devices, "TeardownIncomplete", "; ".join(problems)))
            log.warning(
                "unprepared with problems", extra={"claim": f"{namespace}/{name}", "problems": problems}
            )
        elapsed_ms = round((time.monotonic() - started) * 1000, 1)
        released = [r.device for r in rows]
        log.info("unprepared", extra={"claim": f"{namespace}/{name}", "devices": released, "ms": elapsed_ms})


def bug(err: Exception) -> Exception | None:
    """The error to log with its traceback: a bug's (errors.py), not netclaim's own errors."""
    return None if isinstance(err, NetclaimError) else err

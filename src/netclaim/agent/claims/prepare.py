"""NodePrepareResources, per claim: gather → plan → persist. RunPodSandbox then only carries out the plans.

Prepare does the slow, fallible work ahead of the pod's sandbox, in three steps that each go once:
1. gather (netclaim.agent.claims.gather): the claim, and what it needs from outside (its IP pools' check,
   the installed plugins' CNI versions, its addresses): every API call and every plugin exec is here;
2. plan (netclaim.core.plan.plan_claim): pure, one call for the whole claim;
3. persist: one row per allocated device in the store (netclaim.agent.store), the claim's fail-closed
   CDI spec (netclaim.agent.claims.gate); its status is written with the attach, or as WaitingForPodSandbox if
   the sandbox has not come within status.INTERIM_AFTER.

It is idempotent: a claim with rows is answered from them. A claim's failure is that claim's only and
leaves no address taken, but when its rows could not be written: they may still land (the store), so the
addresses they name stay with the claim for kubelet's retry. A claim whose config cannot work is reported
on it (`report_failure`: Ready=False PrepareFailed, a Warning Event) when the kubelet plugin says so
(errors.py has the table). NodeUnprepareResources is netclaim.agent.claims.unprepare.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace

from netclaim.agent.claims.gate import CdiGate
from netclaim.agent.claims.gather import Gatherer
from netclaim.agent.claims.metadata import DeviceMetadataFiles, base_request
from netclaim.agent.pods.guard import PortGuard
from netclaim.agent.status import ClaimRef, StatusWriter
from netclaim.agent.store import Attachment, Store
from netclaim.core.ipam.reservation import reserved_before_binding
from netclaim.core.node import PreparedDevice
from netclaim.core.objects import Claim
from netclaim.core.plan import NodeContext, PlannedDevice, claim_needs, plan_claim
from netclaim.errors import ConfigError
from netclaim.runtime import faults

log = logging.getLogger(__name__)


class Preparer:
    def __init__(
        self,
        store: Store,
        gather: Gatherer,
        node: NodeContext,
        status: StatusWriter,
        gate: CdiGate | None,
        metadata: DeviceMetadataFiles | None = None,
        guard: PortGuard | None = None,
    ) -> None:
        self.guard = guard
        self.store = store
        self.gather = gather
        self.node = node
        self.status = status
        self.gate = gate  # None: containerd without CDI (docs/security.md)
        self.metadata = metadata  # None: no CDI, or turned off (--device-metadata=false)

    async def prepare(self, namespace: str, name: str, uid: str) -> list[PreparedDevice]:
        existing = self.store.for_claim(uid)
        if existing:  # kubelet asks again after a restart, a lost answer or a call it cancelled
            log.info("prepare repeated", extra={"claim": f"{namespace}/{name}"})
            return await self._answer(ClaimRef(namespace, name, uid), existing, None)
        started = time.monotonic()
        claim = await self.gather.claim(namespace, name, uid)
        needs = claim_needs(claim, self.node.driver)
        try:
            inputs = await self.gather.inputs(claim, needs)
            faults.point("after-address")
            planned = plan_claim(inputs, self.node)
            _refuse_clashes(claim, planned, self.store.for_pod(claim.reserved_for[0].uid))
            rows = [_row(claim, p) for p in planned]
        except BaseException:
            # nothing left behind: the retry takes them again. Not what the controller reserved before the
            # pod was bound: the claim's status says it is held, and the retry finds it
            reserved = any(reserved_before_binding(r.allocated) for r in needs.addresses)
            if needs.addresses and not reserved:
                await self.gather.give_back(claim.uid)
            raise
        await self.store.put(*rows)  # rows the disk was slow to take still land: their addresses stay theirs
        if self.guard is not None:  # while containerd makes the sandbox; the attach waits for it if need be
            self.guard.bind_soon(rows)
        answer = await self._answer(ClaimRef(namespace, name, uid), rows, claim.pod_claim_name)
        faults.point("after-prepare")
        self.status.prepared(claim)
        for lowered in (p for p in planned if p.lowered_from is not None):
            log.info(
                "CNI version lowered to what the installed plugins speak",
                extra={"asked": lowered.lowered_from, "using": lowered.plan.conflist["cniVersion"]},
            )
        elapsed_ms = round((time.monotonic() - started) * 1000, 1)
        devices = [r.device for r in rows]
        log.info("prepared", extra={"claim": f"{namespace}/{name}", "devices": devices, "ms": elapsed_ms})
        return answer

    async def _answer(
        self, claim: ClaimRef, rows: list[Attachment], pod_claim_name: str | None
    ) -> list[PreparedDevice]:
        """The claim's devices for kubelet, its NICs carrying the claim's CDI device: its containers start
        only once its interfaces are in the pod. The first device of each request also carries the
        request's metadata file (configure.metadata)."""
        interfaces = [r.plan.interface_name for r in rows]
        cdi_ids = tuple(self.gate.write(claim.uid, interfaces) if self.gate else ())
        nics = [PreparedDevice(r.request, r.pool, r.device, r.share_id or None, cdi_ids) for r in rows]
        pools = [
            PreparedDevice(a.request, a.pool, a.device, a.share_id or None)
            for r in rows
            for a in r.plan.pool_addresses
        ]
        unmounted = await self.metadata.prepared(rows, pod_claim_name) if self.metadata else {}
        answer = []
        for device in nics + pools:
            mount = unmounted.pop(base_request(device.request), None)
            if mount is not None:
                device = replace(device, cdi_device_ids=(*device.cdi_device_ids, mount))
            answer.append(device)
        return answer

    async def report_failure(self, namespace: str, name: str, uid: str, message: str) -> None:
        """The claim's config cannot work (the kubelet plugin decides by the error's class): say so on it."""
        await self.status.prepare_failed(ClaimRef(namespace, name, uid), message)


def _refuse_clashes(claim: Claim, planned: list[PlannedDevice], pods_rows: list[Attachment]) -> None:
    """A claim naming an interface another claim of its pod names already: refused here, before the pod's
    sandbox (kubelet prepares a pod's claims one after another, in one call); the plan checks one claim's
    own requests."""
    named = {r.plan.interface_name: r for r in pods_rows if r.claim_uid != claim.uid}
    for device in planned:
        other = named.get(device.plan.interface_name)
        if other is not None:
            raise ConfigError(
                f"claim {claim.namespace}/{claim.name}: request {device.allocated.request} names interface "
                f"{device.plan.interface_name}, as claim {other.claim_namespace}/{other.claim_name} of the "
                "same pod does; give one of them another interfaceName"
            )


def _row(claim: Claim, planned: PlannedDevice) -> Attachment:
    """The store's row of one planned device, for the one pod the claim is reserved for."""
    allocated = planned.allocated
    return Attachment(
        claim_uid=claim.uid,
        pool=allocated.pool,
        device=allocated.device,
        share_id=allocated.share_id,
        claim_namespace=claim.namespace,
        claim_name=claim.name,
        request=allocated.request,
        pod_uid=claim.reserved_for[0].uid,
        plan=planned.plan,
    )

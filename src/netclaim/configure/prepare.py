"""NodePrepareResources/NodeUnprepareResources: claim → typed attach plans in the store, and back.

Prepare does the slow, fallible work ahead of the pod's sandbox: read the claim (by name, checked by UID),
plan it (netclaim.configure.plan: decode, merge, render, check), ask the installed plugins which CNI
versions they speak and settle one per chain, then persist one row per allocated device. RunPodSandbox
only carries out a stored plan. Both calls are idempotent; a claim's failure is that claim's only.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from netclaim import faults
from netclaim.adapters.cni import CniRunner
from netclaim.adapters.kube import KubeApi
from netclaim.adapters.kubeletplugin import PreparedDevice
from netclaim.api.cniconfig import plugin_types
from netclaim.configure.attach import Attacher
from netclaim.configure.plan import negotiate, plan_claim
from netclaim.configure.status import ClaimRef, Failure, StatusWriter
from netclaim.configure.store import Attachment, Store
from netclaim.errors import GoneError
from netclaim.publish.devices import DeviceCatalog

log = logging.getLogger(__name__)
UNPREPARE_SECONDS = 10.0


def _prepared(rows: list[Attachment]) -> list[PreparedDevice]:
    return [PreparedDevice(r.request, r.pool, r.device, r.share_id or None) for r in rows]


class Preparer:
    def __init__(
        self,
        *,
        driver: str,
        node: str,
        api: KubeApi,
        store: Store,
        catalog: DeviceCatalog,
        cni: CniRunner,
        attacher: Attacher,
        status: StatusWriter,
        ipam_data_dir: Path | None = None,
    ) -> None:
        self.driver = driver
        self.node = node
        self.api = api
        self.store = store
        self.catalog = catalog
        self.cni = cni
        self.attacher = attacher
        self.status = status
        self.ipam_data_dir = ipam_data_dir

    async def prepare(self, namespace: str, name: str, uid: str) -> list[PreparedDevice]:
        existing = self.store.for_claim(uid)
        if existing:  # idempotent: kubelet asks again after a restart or a lost answer
            return _prepared(existing)
        started = time.monotonic()
        claim = await self.api.get_claim(namespace, name)
        if claim.uid != uid:
            raise GoneError(
                f"claim {namespace}/{name} has UID {claim.uid}, kubelet asked for {uid}: "
                "it was deleted and recreated"
            )
        planned = plan_claim(
            claim,
            driver=self.driver,
            node=self.node,
            device=self.catalog.get,
            ipam_data_dir=self.ipam_data_dir,
        )
        kinds = {kind for p in planned for kind in plugin_types(p.plan.conflist)}
        versions = {kind: await self.cni.versions(kind) for kind in sorted(kinds)}
        rows = []
        for p in planned:
            conflist, lowered = negotiate(p.plan.conflist, versions)
            if lowered:
                log.info(
                    "CNI version lowered to what the installed plugins speak",
                    extra={"asked": p.plan.conflist["cniVersion"], "using": conflist["cniVersion"]},
                )
            rows.append(
                Attachment(
                    claim_uid=claim.uid,
                    pool=p.allocated.pool,
                    device=p.allocated.device,
                    share_id=p.allocated.share_id,
                    claim_namespace=claim.namespace,
                    claim_name=claim.name,
                    request=p.allocated.request,
                    pod_uid=claim.reserved_for[0].uid,
                    plan=p.plan.model_copy(update={"conflist": conflist}),
                )
            )
        self.store.put(*rows)
        faults.point("after-prepare")
        self.status.enqueue(ClaimRef(namespace, name, uid))
        elapsed_ms = round((time.monotonic() - started) * 1000, 1)
        devices = [r.device for r in rows]
        log.info("prepared", extra={"claim": f"{namespace}/{name}", "devices": devices, "ms": elapsed_ms})
        return _prepared(rows)

    async def report_failure(self, namespace: str, name: str, uid: str, message: str) -> None:
        """A claim whose config cannot work: Ready=False on its devices and a Warning Event on its pod."""
        claim = await self.api.get_claim(namespace, name)
        if claim.uid != uid:
            return
        devices = tuple(
            (r.pool, r.device, r.share_id)
            for r in claim.results
            if r.driver == self.driver and r.pool == self.node
        )
        self.status.fail(ClaimRef(namespace, name, uid), Failure(devices, "PrepareFailed", message))
        for pod in claim.reserved_for:
            await self.status.warn(namespace, pod.name, pod.uid, "NetclaimPrepareFailed", message)

    async def unprepare(self, namespace: str, name: str, uid: str) -> None:
        """Make sure every interface of the claim was DELeted (IPAM released), then forget the claim."""
        rows = self.store.for_claim(uid)
        faults.point("before-unprepare")
        problems = await self.attacher.release(rows, time.monotonic() + UNPREPARE_SECONDS)
        ref = ClaimRef(namespace, name, uid)
        self.status.forget(ref)
        if problems:  # the claim and its pod go all the same; the claim's status says what happened
            devices = tuple((r.pool, r.device, r.share_id) for r in rows)
            self.status.fail(ref, Failure(devices, "TeardownIncomplete", "; ".join(problems)))
            log.warning(
                "unprepared with problems", extra={"claim": f"{namespace}/{name}", "problems": problems}
            )
        log.info("unprepared", extra={"claim": f"{namespace}/{name}", "devices": [r.device for r in rows]})

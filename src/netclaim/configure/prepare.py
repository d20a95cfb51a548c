"""NodePrepareResources/NodeUnprepareResources: claim → typed attach plans in the store, and back.

Prepare does the slow, fallible work ahead of the pod's sandbox: read the claim (by name, checked by UID),
take its addresses from the IP pools it was allocated (netclaim.ipam.addresses: API calls, outside the
runtime's budget), plan it (netclaim.configure.plan: decode, merge, render, check), ask the installed
plugins which CNI versions they speak and settle one per chain, then persist one row per allocated
device. RunPodSandbox only carries out a stored plan. Both calls are idempotent; a claim's failure is that
claim's only, and leaves no address taken (but when its rows could not be written: the retry reuses them).

A claim netclaim can read only in part (its own opaque config nested too deep: netclaim.adapters.kube) is
the claim's ConfigError. Unprepare DELetes the interfaces, then releases the claim's pool addresses when
the claim ends with its pod (generated from a template) or is gone; a standalone claim keeps them for its
next pod, and so does a claim that cannot be read (the controller frees them once it is gone). It raises
only what kubelet should retry: any other failure of an interface is final for it (errors.py).

Reclaim is the way back when NodeUnprepareResources never comes for a claim that is gone (kubelet lost
its own record of it, or the pod was force-deleted while this node's agent was away): rows that no
running sandbox uses, still there one round later, are checked against the API, and a claim that no
longer exists is unprepared as kubelet would have. One claim failing never stops the round.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

from netclaim import faults, metrics
from netclaim.adapters.cni import CniRunner
from netclaim.adapters.kube import Claim, KubeApi
from netclaim.adapters.kubeletplugin import PreparedDevice
from netclaim.api.cniconfig import plugin_types
from netclaim.api.ippool import POOLS_POOL
from netclaim.api.tenancy import IPNetwork
from netclaim.configure.attach import Attacher, netns_exists
from netclaim.configure.gate import CdiGate
from netclaim.configure.plan import address_requests, needs_pools, negotiate, plan_claim
from netclaim.configure.status import ClaimRef, Failure, StatusWriter
from netclaim.configure.store import Attachment, State, Store
from netclaim.errors import ConfigError, GoneError, NetclaimError, TransientError
from netclaim.ipam.addresses import AddressBook, Grant
from netclaim.ipam.pools import read_pools
from netclaim.publish.devices import DeviceCatalog

log = logging.getLogger(__name__)
UNPREPARE_SECONDS = 10.0
# How often rows outside any running sandbox are looked at (kubelet's own DRA reconcile runs every 60 s).
RECLAIM_SECONDS = 60.0


def _prepared(rows: list[Attachment], cdi_ids: list[str]) -> list[PreparedDevice]:
    """The claim's devices for kubelet: the NICs carry the claim's fail-closed CDI device."""
    interfaces = [
        PreparedDevice(r.request, r.pool, r.device, r.share_id or None, tuple(cdi_ids)) for r in rows
    ]
    pools = [
        PreparedDevice(a.request, a.pool, a.device, a.share_id or None)
        for r in rows
        for a in r.plan.pool_addresses
    ]
    return interfaces + pools


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
        addresses: AddressBook,
        gate: CdiGate | None = None,
        ipam_data_dir: Path | None = None,
        reserved: tuple[IPNetwork, ...] = (),
    ) -> None:
        self.driver = driver
        self.node = node
        self.api = api
        self.store = store
        self.catalog = catalog
        self.cni = cni
        self.attacher = attacher
        self.status = status
        self.addresses = addresses
        self.gate = gate
        self.ipam_data_dir = ipam_data_dir
        self.reserved = reserved  # networks no claim's own IPAM may use: the cluster's
        self._idle_claims: set[str] = set()  # claims whose rows no running sandbox used last round

    async def prepare(self, namespace: str, name: str, uid: str) -> list[PreparedDevice]:
        existing = self.store.for_claim(uid)
        if existing:  # idempotent: kubelet asks again after a restart or a lost answer
            return _prepared(existing, self._write_gate(namespace, name, uid, existing))
        started = time.monotonic()
        claim = await self.api.get_claim(namespace, name)
        if claim.uid != uid:
            raise GoneError(
                f"claim {namespace}/{name} has UID {claim.uid}, kubelet asked for {uid}: "
                "it was deleted and recreated"
            )
        unreadable = [claim.unreadable] + [c.unreadable for c in claim.configs if c.driver == self.driver]
        if any(unreadable):
            raise ConfigError(f"claim {namespace}/{name}: {'; '.join(p for p in unreadable if p)}")
        requests = address_requests(claim, self.driver)
        try:
            grants = await self.addresses.allocate(claim, requests)
            faults.point("after-address")
            rows = await self._plan(claim, grants)
        except BaseException:
            if requests:  # nothing left behind: the retry takes them again
                await self._release(claim.uid)
            raise
        # a write that fails keeps the addresses: it may still land (netclaim.configure.store), and rows
        # naming addresses given back would hand them to this pod and another; kubelet's retry reuses them
        await self.store.put(*rows)
        cdi_ids = self._write_gate(namespace, name, uid, rows)
        faults.point("after-prepare")
        self.status.enqueue(ClaimRef(namespace, name, uid))
        elapsed_ms = round((time.monotonic() - started) * 1000, 1)
        devices = [r.device for r in rows]
        log.info("prepared", extra={"claim": f"{namespace}/{name}", "devices": devices, "ms": elapsed_ms})
        return _prepared(rows, cdi_ids)

    def _write_gate(self, namespace: str, name: str, uid: str, rows: list[Attachment]) -> list[str]:
        """The claim's CDI spec: its containers start only once its interfaces are in the pod."""
        if self.gate is None:
            return []
        return self.gate.write(f"{namespace}/{name}", uid, [r.plan.interface_name for r in rows])

    async def _plan(self, claim: Claim, grants: list[Grant]) -> list[Attachment]:
        # a claim's own IPAM is checked against every pool: none of their addresses is its to configure
        pools = read_pools(await self.api.list_ippools())[0] if needs_pools(claim, self.driver) else []
        planned = plan_claim(
            claim,
            driver=self.driver,
            node=self.node,
            device=self.catalog.get,
            grants=grants,
            host_local_dir=self.ipam_data_dir,
            pools=pools,
            reserved=self.reserved,
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
        return rows

    async def _addresses_end(self, namespace: str, name: str, uid: str) -> bool:
        """Whether the claim's pool addresses go now: it ends with its pod, or it is gone already."""
        try:
            claim = await self.api.get_claim(namespace, name)
        except GoneError:
            return True
        return claim.uid != uid or claim.owned_by_pod

    async def _release(self, claim_uid: str) -> None:
        try:
            await self.addresses.release(claim_uid)
        except NetclaimError as err:  # the retry reuses them; the reconciler frees them if the claim goes
            log.warning("could not release addresses", extra={"claim_uid": claim_uid, "error": str(err)})

    async def report_failure(self, namespace: str, name: str, uid: str, message: str) -> None:
        """A claim whose config cannot work: Ready=False on its devices and a Warning Event on its pod."""
        claim = await self.api.get_claim(namespace, name)
        if claim.uid != uid:
            return
        devices = tuple(
            (r.pool, r.device, r.share_id)
            for r in claim.results
            if r.driver == self.driver and r.pool in (self.node, POOLS_POOL)
        )
        self.status.fail(ClaimRef(namespace, name, uid), Failure(devices, "PrepareFailed", message))
        for pod in claim.reserved_for:
            await self.status.warn(namespace, pod.name, pod.uid, "NetclaimPrepareFailed", message)

    async def unprepare(self, namespace: str, name: str, uid: str) -> None:
        """Make sure every interface of the claim was DELeted (IPAM released), then forget the claim.
        Raises only a TransientError (kubelet calls again): what cannot be undone is cleaned up by hand and
        said on the claim (TeardownIncomplete); addresses whose end cannot be decided are kept (the
        controller frees them once the claim is gone)."""
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
        ref = ClaimRef(namespace, name, uid)
        self.status.forget(ref)
        if problems:  # the claim and its pod go all the same; the claim's status says what happened
            devices = tuple((r.pool, r.device, r.share_id) for r in rows)
            self.status.fail(ref, Failure(devices, "TeardownIncomplete", "; ".join(problems)))
            log.warning(
                "unprepared with problems", extra={"claim": f"{namespace}/{name}", "problems": problems}
            )
        try:
            if await self._addresses_end(namespace, name, uid):
                await self.addresses.release(uid)
        except TransientError:
            raise
        except Exception as err:  # kept: the controller frees them once the claim is gone
            where = {"claim": f"{namespace}/{name}", "error": str(err)}
            log.warning("addresses kept: cannot decide whether they end", extra=where, exc_info=_bug(err))
        elapsed_ms = round((time.monotonic() - started) * 1000, 1)
        released = [r.device for r in rows]
        log.info("unprepared", extra={"claim": f"{namespace}/{name}", "devices": released, "ms": elapsed_ms})

    async def reclaim(self) -> list[ClaimRef]:
        """Unprepare the claims that are gone from the API but still have rows here; returns them.

        A claim is looked up only when none of its rows was in a running sandbox in this round and the
        last one: a node whose pods all run reads nothing, and kubelet's own unprepare has a round to come.
        A claim that still exists but is no longer reserved for the pod its rows were planned for is over
        for that pod (a standalone claim outlives it): its rows go too, or its next pod would get them.
        A claim that fails (any error) is logged, counted and tried again next round; the others go on.
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
                log.warning("reclaim of a claim failed; next round retries", extra=where, exc_info=_bug(err))
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
        await self.unprepare(claim.namespace, claim.name, claim.uid)
        metrics.CLAIMS_RECLAIMED.inc()
        return True


def _bug(err: Exception) -> Exception | None:
    """The error to log with its traceback: a bug's (errors.py), not netclaim's own errors."""
    return None if isinstance(err, NetclaimError) else err


async def reclaim_loop(preparer: Preparer, seconds: float = RECLAIM_SECONDS) -> None:
    while True:
        await asyncio.sleep(seconds)
        try:
            await preparer.reclaim()
        except TransientError as err:
            log.info("reclaim postponed", extra={"error": str(err)})
        except NetclaimError as err:
            log.warning("reclaim failed; next round retries", extra={"error": str(err)})
        except Exception:
            log.exception("reclaim failed (a bug); next round retries")

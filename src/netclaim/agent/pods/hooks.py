"""NRI pod hooks: small, idempotent, inside the runtime's budget. Slow work was done in prepare.

Each hook has one shape: look up the pod's stored attachments, return at once if there are none, take
the pod's lock, act, enqueue the status. RunPodSandbox raises when it cannot attach (containerd then fails
the sandbox and kubelet retries); Stop/Remove never raise (errors.py has the table).
"""

from __future__ import annotations

import itertools
import logging
import time

from netclaim.agent.claims.metadata import DeviceMetadataFiles
from netclaim.agent.pods.attach import Attacher, PodLocks, netns_exists
from netclaim.agent.pods.policy import PolicyEnforcer
from netclaim.agent.status import ClaimRef, PodRef, StatusWriter
from netclaim.agent.store import Attachment, State, Store
from netclaim.core.events import EventReason
from netclaim.core.node import PodSandbox
from netclaim.errors import AttachError, HostNetworkPodError, NetclaimError, TransientError
from netclaim.runtime import faults
from netclaim.runtime.stopping import InFlight

log = logging.getLogger(__name__)
REPAIR_SECONDS = 10.0


def claim_of(row: Attachment) -> ClaimRef:
    return ClaimRef(row.claim_namespace, row.claim_name, row.claim_uid)


def pod_of(sandbox: PodSandbox) -> PodRef:
    return PodRef(sandbox.namespace, sandbox.name, sandbox.uid)


class PodHooks:
    def __init__(
        self,
        store: Store,
        attacher: Attacher,
        status: StatusWriter,
        locks: PodLocks,
        metadata: DeviceMetadataFiles | None = None,
        policies: PolicyEnforcer | None = None,
    ) -> None:
        self.store = store
        self.attacher = attacher
        self.status = status
        self.locks = locks
        self.metadata = metadata
        self.policies = policies
        self._at_work = InFlight()

    async def settle(self, seconds: float) -> bool:
        """Wait (at most `seconds`) until no hook is at work: an agent stopping (a rolling update, a deleted
        pod) lets an attach in flight finish rather than cut it short inside ADD, which would leave the next
        agent a half-made interface to undo under a pod that may already run. False if still busy."""
        return await self._at_work.settle(seconds)

    async def run_pod_sandbox(self, pod: PodSandbox, budget: float) -> None:
        with self._at_work.working():
            await self._attach_pod(pod, budget)

    async def _attach_pod(self, pod: PodSandbox, budget: float) -> None:
        rows = self.store.for_pod(pod.uid)
        if not rows:
            return
        faults.point("run-pod-sandbox")
        await faults.stall("stall-run-pod-sandbox")
        if not pod.netns:
            message = (
                f"pod {pod.namespace}/{pod.name} uses the host network: netclaim.dev claims "
                "attach interfaces to a pod's own network namespace"
            )
            self.status.warn_later(pod_of(pod), EventReason.ATTACH_FAILED, message)
            raise HostNetworkPodError(message)
        entered = time.monotonic()
        deadline = entered + budget
        async with self.locks(pod.uid, deadline):
            marks = [entered, time.monotonic()]  # the hook's parts, timed for its log line
            done: list[Attachment] = []
            try:
                now = [c for c in map(self.attacher.current, rows) if c is not None]  # as locked: now
                done = await self.attacher.attach_pod(now, pod, deadline)  # undoes its own on failure
                marks.append(time.monotonic())
                if self.policies is not None:  # before it answers: no container runs with the interface open
                    self.policies.seen(pod.uid, pod.namespace, pod.name, pod.labels)
                    await self.policies.enforce(pod.uid, deadline)
                marks.append(time.monotonic())
                if self.metadata is not None:  # before the containers are created, so they mount this one
                    self.metadata.attached(done)
                marks.append(time.monotonic())
            except Exception as err:  # whatever failed, and a bug too: all or nothing
                for attached in done:  # the retried sandbox starts from a clean slate
                    current = self.attacher.current(attached)
                    if current is not None:
                        await self.attacher.detach(current, deadline)
                failure = (
                    err
                    if isinstance(err, AttachError)
                    else AttachError(
                        f"internal error in the netclaim agent ({type(err).__name__}: {err}); see its log"
                    )
                )
                if failure is not err:
                    log.exception("pod sandbox hook failed (a bug); its interfaces undone")
                if not isinstance(failure.__cause__, TransientError):  # kubelet retries: not the user's
                    self.status.warn_later(pod_of(pod), EventReason.ATTACH_FAILED, str(failure))
                if failure is err:
                    raise
                raise failure from err
            finally:
                for row in rows:
                    self.status.enqueue(claim_of(row))
            self.status.enqueue(pod_of(pod))
        parts = [round((later - earlier) * 1000, 1) for earlier, later in itertools.pairwise(marks)]
        log.info(
            "pod sandbox hooked",
            extra={
                "pod": f"{pod.namespace}/{pod.name}",
                "ms": round((time.monotonic() - entered) * 1000, 1),
                **dict(zip(("lock_ms", "attach_ms", "policy_ms", "metadata_ms"), parts, strict=True)),
            },
        )

    async def stop_pod_sandbox(self, pod: PodSandbox, budget: float) -> None:
        await self._detach_pod(pod, budget)

    async def remove_pod_sandbox(self, pod: PodSandbox, budget: float) -> None:
        await self._detach_pod(pod, budget)

    async def _detach_pod(self, pod: PodSandbox, budget: float) -> None:
        """Never fails the runtime: what is not detached now, RemovePodSandbox and NodeUnprepare retry."""
        with self._at_work.working():
            await self._detach_rows(pod.uid, pod.id, budget)

    async def _detach_rows(self, pod_uid: str, sandbox_id: str, budget: float) -> None:
        """Only what is in this sandbox: kubelet removes a pod's old sandbox after its new one runs."""
        try:
            rows = [
                r
                for r in self.store.for_pod(pod_uid)
                if r.state in (State.ATTACHING, State.ATTACHED) and r.sandbox_id == sandbox_id
            ]
            if not rows:
                return
            faults.point("before-detach")
            deadline = time.monotonic() + budget
            async with self.locks(pod_uid, deadline):
                for row in rows:
                    try:
                        current = self.attacher.current(row)
                        if current is not None:
                            await self.attacher.detach(current, deadline)
                    except NetclaimError as err:
                        log.warning("detach failed", extra={"claim": row.claim_name, "error": str(err)})
                    self.status.enqueue(claim_of(row))
                if self.policies is not None:
                    self.policies.prune()
        except NetclaimError as err:
            log.warning("detach postponed", extra={"pod": pod_uid, "error": str(err)})
        except Exception:
            log.exception("detach failed (a bug); postponed", extra={"pod": pod_uid})

    async def synchronize(self, pods: list[PodSandbox]) -> None:
        """After (re)connecting: finish or undo what a crash or a missed event left behind."""
        with self._at_work.working():
            await self._repair_all(pods)

    async def _repair_all(self, pods: list[PodSandbox]) -> None:
        sandboxes = {pod.uid: pod for pod in pods}
        if self.policies is not None:  # their tables are made what the rules say once these are read
            self.policies.prune()
            for pod in pods:
                self.policies.seen(pod.uid, pod.namespace, pod.name, pod.labels, inherited=True)
            if any(self._to_attach(row, sandboxes.get(row.pod_uid)) for row in self.store.all()):
                await self.policies.read()  # a pod attached here gets its table before its containers
        for row in self.store.all():
            async with self.locks(row.pod_uid):
                current = self.attacher.current(row)
                if current is None:
                    continue
                listed = sandboxes.get(row.pod_uid)
                if (
                    current != row
                    and current.state in (State.ATTACHING, State.ATTACHED)
                    and (listed is None or current.sandbox_id != listed.id)
                ):
                    # a hook attached it while we waited for the pod's lock, into a sandbox newer than
                    # `pods` (a pod started after the reconnect): that hook knows better than our list
                    continue
                try:
                    await self._repair(current, listed)
                except NetclaimError as err:
                    log.warning("repair failed", extra={"claim": row.claim_name, "error": str(err)})
                self.status.enqueue(claim_of(row))
                if listed is not None:
                    self.status.enqueue(pod_of(listed))
        if self.policies is not None:
            await self.policies.follow()  # an older agent's tables, or none, made what the rules say

    @staticmethod
    def _to_attach(row: Attachment, sandbox: PodSandbox | None) -> bool:
        """Whether repairing the row attaches it into a running sandbox (rather than only undoing)."""
        return sandbox is not None and not (row.state == State.ATTACHED and row.sandbox_id == sandbox.id)

    async def _repair(self, row: Attachment, sandbox: PodSandbox | None) -> None:
        deadline = time.monotonic() + REPAIR_SECONDS
        if row.state == State.ATTACHING:
            row = await self.attacher.detach(row, deadline)  # a crash inside ADD: undo first
        if sandbox is None or not netns_exists(sandbox.netns):
            await self.attacher.detach(row, deadline)  # the sandbox went while we were away: release IPAM
            return
        if row.state == State.ATTACHED and row.sandbox_id != sandbox.id:
            row = await self.attacher.detach(row, deadline)
        if not await self.attacher.is_attached(row, sandbox):
            log.info(
                "attaching into a running sandbox (its RunPodSandbox was missed)",
                extra={"pod": f"{sandbox.namespace}/{sandbox.name}", "claim": row.claim_name},
            )
            row = await self.attacher.attach(row, sandbox, deadline)
            if self.policies is not None:  # seen again: a refresh meanwhile forgets pods not yet attached
                self.policies.seen(
                    sandbox.uid, sandbox.namespace, sandbox.name, sandbox.labels, inherited=True
                )
                try:
                    await self.policies.enforce(sandbox.uid, deadline)
                except AttachError:  # no table, no interface: the gate keeps its containers waiting
                    await self.attacher.detach(row, deadline)
                    raise
            if self.metadata is not None:  # the containers the gate held back mount it when created
                self.metadata.attached(self.store.for_claim(row.claim_uid))

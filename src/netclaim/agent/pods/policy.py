"""MultiNetworkPolicy enforced on the interfaces netclaim attached, inside each pod's namespace
(docs/services.md; the rules come from the controller, netclaim.controller.policy).

Fail closed:
- RunPodSandbox applies the pod's rules after its ADDs and before it answers: no container of a selected
  pod runs with the interface open. Until the agent has read the rules once (after a start), the hook
  waits, and fails the sandbox (kubelet retries) when its budget runs out.
- A pod whose rules the controller has not compiled yet (it was just created) but that some policy's guard
  selects is isolated in the guard's directions, allowing nothing, until its rules come.
- A ruleset nft refuses fails the sandbox (its interfaces are undone: all or nothing). For a running pod it
  is replaced by the same isolation with nothing allowed (a revoked allow never stays in force because
  its successor could not be applied), retried at the next change and at each resync, with a Warning
  Event on the pod naming the policies.
- One pod's failure, whatever it is, is that pod's: the others' tables are still brought up to date.
- After a restart, every running pod's table is made what the rules say once they are read (an older
  agent's table never stays), and a pod repaired at Synchronize is attached only once they are.
Pods without our interfaces, and every interface we did not attach, are never touched. A pod no policy
selects costs nothing on its start: no nft runs unless its namespace held a table before.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from netclaim.agent.status import PodRef
from netclaim.agent.store import Attachment, State, Store
from netclaim.core.events import EventReason
from netclaim.core.kubeapi import PolicyRulesApi
from netclaim.core.names import NETWORK
from netclaim.core.node import ApplyRuleset
from netclaim.core.policy import ruleset as rulesets
from netclaim.core.policy.distribution import GUARDS, Guard, node_label, read_guards, read_rules
from netclaim.core.policy.rules import Direction, NetworkRules
from netclaim.errors import AttachError, NetclaimError
from netclaim.runtime import metrics

log = logging.getLogger(__name__)
ENFORCE_SECONDS = 5.0  # a running pod's rules, when they change: how long nft may take
Warn = Callable[[PodRef, EventReason, str], None]  # a Warning Event on the pod: reason, message


def _no_warning(pod: PodRef, reason: EventReason, message: str) -> None:
    """Where nobody is told (the unit tests of other parts): the log and the metric still are."""


@dataclass(frozen=True)
class PolicyView:
    guards: tuple[Guard, ...] = ()
    rules: Mapping[str, Mapping[str, NetworkRules]] = field(default_factory=dict)  # pod UID → network → rules

    def for_pod(
        self, uid: str, namespace: str, labels: Mapping[str, str], network: str
    ) -> NetworkRules | None:
        """The pod's rules on `network`: compiled, else the guards' isolation, else none (open)."""
        if uid in self.rules:
            return self.rules[uid].get(network)
        selecting = [g for g in self.guards if network in g.networks and g.selects(namespace, labels)]
        if not selecting:
            return None
        names = tuple(sorted({f"{g.namespace}/{g.policy}" for g in selecting}))
        nothing = Direction((), names)
        return NetworkRules(
            ingress=nothing if any(g.ingress for g in selecting) else None,
            egress=nothing if any(g.egress for g in selecting) else None,
        )


def pod_interfaces(
    view: PolicyView, uid: str, namespace: str, labels: Mapping[str, str], rows: list[Attachment]
) -> dict[str, NetworkRules]:
    """Interface name → its rules, of the pod's attached interfaces some rule or guard isolates."""
    interfaces = {}
    for row in rows:
        network = row.plan.nic.attributes.get(NETWORK)
        if row.state != State.ATTACHED or not isinstance(network, str):
            continue
        rules = view.for_pod(uid, namespace, labels, network)
        if rules is not None:
            interfaces[row.plan.interface_name] = rules
    return interfaces


def nothing_allowed(interfaces: Mapping[str, NetworkRules]) -> dict[str, NetworkRules]:
    """The same interfaces isolated in the same directions, allowing nothing: what a pod holds when its own
    rules cannot be applied."""

    def closed(direction: Direction | None) -> Direction | None:
        return None if direction is None else Direction((), direction.policies)

    return {name: NetworkRules(closed(r.ingress), closed(r.egress)) for name, r in interfaces.items()}


def _policies(interfaces: Mapping[str, NetworkRules]) -> str:
    names = {p for r in interfaces.values() for d in (r.ingress, r.egress) if d for p in d.policies}
    return ", ".join(sorted(names)) or "none"


EMPTY = rulesets.ruleset({})


@dataclass(frozen=True)
class _Pod:
    namespace: str
    name: str
    labels: dict[str, str]


class PolicyEnforcer:
    def __init__(
        self,
        api: PolicyRulesApi,
        store: Store,
        node: str,
        apply: ApplyRuleset,
        warn: Warn = _no_warning,
    ) -> None:
        self.api = api
        self.store = store
        self.labels = [GUARDS, node_label(node)]
        self.apply = apply
        self.warn = warn
        self.view: PolicyView | None = None
        self._read = asyncio.Event()
        self.pods: dict[str, _Pod] = {}  # pod UID → who it is and the labels it started with
        self.applied: dict[str, dict[str, Any]] = {}  # pod UID → the ruleset its namespace holds
        self.programmed: dict[str, tuple[int, int]] = {}  # pod UID → its (allow rules, isolated directions)
        self.failing: dict[str, str] = {}  # pod UID → the error last reported on it
        # pods attached before this agent started: their namespace may hold an older agent's table, so
        # even "nothing" is applied to them once
        self.inherited: set[str] = set()

    async def refresh(self) -> None:
        """Read the rules (the guards and this node's), then make every attached pod's table follow."""
        found = await self.api.list_policy_rules(self.labels)
        self.view = PolicyView(
            guards=tuple(read_guards(found.get(GUARDS, []))),
            rules=read_rules(found.get(self.labels[1], [])),
        )
        self._read.set()
        await self.follow()

    async def follow(self) -> None:
        """Every attached pod's table made what the rules read last say, one pod at a time: a pod that fails
        is closed, told and retried at the next change; the rest go on."""
        if self.view is None:
            return
        self.prune()
        started = time.monotonic()
        for uid in sorted({row.pod_uid for row in self.store.all() if row.state == State.ATTACHED}):
            try:
                await self._enforce(uid, time.monotonic() + ENFORCE_SECONDS)
            except Exception as err:  # noqa: BLE001 - one pod's failure, whatever it is, is that pod's
                await self._closed_after(uid, err)
        metrics.POLICY_SYNC_SECONDS.observe(time.monotonic() - started)

    async def watch(self) -> None:
        await self.refresh()
        async for _ in self.api.policy_rules_changes(self.labels):
            await self.refresh()

    async def read(self) -> None:
        """Until the rules have been read once."""
        await self._read.wait()

    def seen(
        self, uid: str, namespace: str, name: str, labels: Mapping[str, str], *, inherited: bool = False
    ) -> None:
        self.pods[uid] = _Pod(namespace, name, dict(labels))
        if inherited:
            self.inherited.add(uid)

    def prune(self) -> None:
        """Forget the pods with no attached interface left, however their rows went (a sandbox's stop,
        kubelet's unprepare, the repair loop): what is kept per pod, and the rules shown, never outlive it."""
        attached = {row.pod_uid for row in self.store.all() if row.state == State.ATTACHED}
        kept = (self.pods, self.applied, self.programmed, self.failing)
        for uid in set().union(*kept) - attached:
            for table in kept:
                table.pop(uid, None)
            self.inherited.discard(uid)
        self._show()

    def _show(self) -> None:
        metrics.POLICY_RULES.labels("allow").set(sum(r for r, _ in self.programmed.values()))
        metrics.POLICY_RULES.labels("isolated").set(sum(i for _, i in self.programmed.values()))

    async def enforce(self, uid: str, deadline: float) -> None:
        """RunPodSandbox's: the pod's rules in place before it answers (AttachError when they cannot be)."""
        try:
            if not self._read.is_set():  # wait_for's task costs the hook a turn of a busy event loop
                await asyncio.wait_for(self._read.wait(), max(0.0, deadline - time.monotonic()))
        except TimeoutError:
            raise AttachError(
                "the network policies are not read yet (the agent just started): retried"
            ) from None
        try:
            await self._enforce(uid, deadline)
        except Exception as err:
            metrics.POLICY_FAILURES.labels("sandbox").inc()
            raise AttachError(f"network policy not applied: {err}") from err

    def _wanted(self, uid: str) -> tuple[dict[str, NetworkRules], list[Attachment]] | None:
        if self.view is None or uid not in self.pods:
            return None
        pod = self.pods[uid]
        rows = [r for r in self.store.for_pod(uid) if r.state == State.ATTACHED]
        if not rows:
            return None
        return pod_interfaces(self.view, uid, pod.namespace, pod.labels, rows), rows

    async def _enforce(self, uid: str, deadline: float) -> None:
        wanted = self._wanted(uid)
        if wanted is None:
            return
        interfaces, rows = wanted
        await self._put(uid, rows[0].netns, interfaces, deadline)
        if self.failing.pop(uid, None) is not None:
            log.info("policy rules applied again", extra={"pod_uid": uid})

    async def _put(
        self, uid: str, netns: str, interfaces: Mapping[str, NetworkRules], deadline: float
    ) -> None:
        ruleset = rulesets.ruleset(interfaces)
        holds = self.applied.get(uid, None if uid in self.inherited else EMPTY)
        if holds == ruleset:
            return
        self.applied.pop(uid, None)  # until it is known again: a failed apply may have left either
        await asyncio.wait_for(self.apply(netns, ruleset), max(0.1, deadline - time.monotonic()))
        self.applied[uid] = ruleset
        self.inherited.discard(uid)
        self.programmed[uid] = rulesets.counted(interfaces)
        self._show()

    async def _closed_after(self, uid: str, err: Exception) -> None:
        """A running pod whose rules could not be applied: isolated with nothing allowed instead, and told
        once per error (a Warning Event in its namespace, the policies' namespace)."""
        metrics.POLICY_FAILURES.labels("sync").inc()
        wanted = self._wanted(uid)
        pod = self.pods.get(uid)
        closed = "not closed"
        if wanted is not None:
            interfaces, rows = wanted
            try:
                await self._put(uid, rows[0].netns, nothing_allowed(interfaces), time.monotonic() + 1.0)
                closed = "isolated with nothing allowed until they can be"
            except Exception as again:  # noqa: BLE001 - logged below with the first error
                closed = f"not closed either: {again}"
        message = f"network policy rules not applied ({err}); {closed}"
        log.warning(
            "policy rules not applied; tried again at the next change",
            extra={"pod_uid": uid, "error": str(err), "closed": closed},
            exc_info=not isinstance(err, NetclaimError | TimeoutError),
        )
        if pod is not None and self.failing.get(uid) != message:
            self.failing[uid] = message
            policies = _policies(wanted[0]) if wanted else "none"
            self.warn(
                PodRef(pod.namespace, pod.name, uid),
                EventReason.POLICY_NOT_APPLIED,
                f"{message}; policies: {policies}",
            )

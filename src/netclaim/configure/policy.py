"""MultiNetworkPolicy enforced on the interfaces netclaim attached, inside each pod's namespace
(docs/services.md; the rules come from the controller, netclaim.netpolicy.distribute).

Fail closed:
- RunPodSandbox applies the pod's rules after its ADDs and before it answers: no container of a selected
  pod runs with the interface open. Until the agent has read the rules once (after a start), the hook
  waits, and fails the sandbox (kubelet retries) when its budget runs out.
- A pod whose rules the controller has not compiled yet (it was just created) but that some policy's guard
  selects is isolated in the guard's directions, allowing nothing, until its rules come.
- An nft error fails the sandbox (its interfaces are undone: all or nothing), or, for a running pod, is
  retried at the next change and at each resync.
Pods without our interfaces, and every interface we did not attach, are never touched. A pod no policy
selects costs nothing on its start: no nft runs unless its namespace held a table before.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field

from netclaim import metrics
from netclaim.adapters import nftables as nft
from netclaim.configure.store import Attachment, State, Store
from netclaim.errors import AttachError, NetclaimError
from netclaim.kubeapi import PolicyRulesApi
from netclaim.names import NETWORK
from netclaim.netpolicy import nftables
from netclaim.netpolicy.distribute import GUARDS, Guard, node_label, read_guards, read_rules
from netclaim.netpolicy.rules import Direction, NetworkRules

log = logging.getLogger(__name__)
Apply = Callable[[str, str], Awaitable[None]]


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


EMPTY = nftables.script({})


class PolicyEnforcer:
    def __init__(self, api: PolicyRulesApi, store: Store, node: str, apply: Apply = nft.apply) -> None:
        self.api = api
        self.store = store
        self.labels = [GUARDS, node_label(node)]
        self.apply = apply
        self.view: PolicyView | None = None
        self._read = asyncio.Event()
        self.pods: dict[str, tuple[str, dict[str, str]]] = {}  # pod UID → its namespace and labels
        self.applied: dict[str, str] = {}  # pod UID → the script its namespace holds
        self.programmed: dict[str, tuple[int, int]] = {}  # pod UID → its (allow rules, isolated directions)
        # pods attached before this agent started: their namespace may hold an older agent's table, so
        # even "nothing" is applied to them once
        self.inherited: set[str] = set()

    async def refresh(self) -> None:
        """Read the rules (the guards and this node's), then make every attached pod's table follow."""
        found = await self.api.list_policy_rules(self.labels)
        view = PolicyView(
            guards=tuple(read_guards(found[GUARDS])) if GUARDS in found else (),
            rules=read_rules(found[self.labels[1]]) if self.labels[1] in found else {},
        )
        self.view = view
        self._read.set()
        self.prune()
        started = time.monotonic()
        for uid in sorted({row.pod_uid for row in self.store.all() if row.state == State.ATTACHED}):
            try:
                await self._enforce(uid, time.monotonic() + nft.TIMEOUT_SECONDS)
            except NetclaimError as err:
                metrics.POLICY_FAILURES.labels("sync").inc()
                log.warning(
                    "policy rules not applied; tried again at the next change",
                    extra={"pod_uid": uid, "error": str(err)},
                )
        metrics.POLICY_SYNC_SECONDS.observe(time.monotonic() - started)

    async def watch(self) -> None:
        await self.refresh()
        async for _ in self.api.policy_rules_changes(self.labels):
            await self.refresh()

    def seen(self, uid: str, namespace: str, labels: Mapping[str, str], *, inherited: bool = False) -> None:
        self.pods[uid] = (namespace, dict(labels))
        if inherited:
            self.inherited.add(uid)

    def prune(self) -> None:
        """Forget the pods with no attached interface left, however their rows went (a sandbox's stop,
        kubelet's unprepare, the repair loop): what is kept per pod, and the rules shown, never outlive it."""
        attached = {row.pod_uid for row in self.store.all() if row.state == State.ATTACHED}
        for uid in (set(self.pods) | set(self.applied) | set(self.programmed)) - attached:
            self.pods.pop(uid, None)
            self.applied.pop(uid, None)
            self.inherited.discard(uid)
            self.programmed.pop(uid, None)
        self._show()

    def _show(self) -> None:
        metrics.POLICY_RULES.labels("allow").set(sum(r for r, _ in self.programmed.values()))
        metrics.POLICY_RULES.labels("isolated").set(sum(i for _, i in self.programmed.values()))

    async def enforce(self, uid: str, deadline: float) -> None:
        """RunPodSandbox's: the pod's rules in place before it answers (AttachError when they cannot be)."""
        try:
            await asyncio.wait_for(self._read.wait(), max(0.0, deadline - time.monotonic()))
        except TimeoutError:
            raise AttachError(
                "the network policies are not read yet (the agent just started): retried"
            ) from None
        try:
            await self._enforce(uid, deadline)
        except NetclaimError as err:
            metrics.POLICY_FAILURES.labels("sandbox").inc()
            raise AttachError(f"network policy not applied: {err}") from err

    async def _enforce(self, uid: str, deadline: float) -> None:
        if self.view is None or uid not in self.pods:
            return
        namespace, labels = self.pods[uid]
        rows = [r for r in self.store.for_pod(uid) if r.state == State.ATTACHED]
        if not rows:
            return
        interfaces = pod_interfaces(self.view, uid, namespace, labels, rows)
        script = nftables.script(interfaces)
        holds = self.applied.get(uid, None if uid in self.inherited else EMPTY)
        if holds == script:
            return
        await asyncio.wait_for(self.apply(rows[0].netns, script), max(0.1, deadline - time.monotonic()))
        self.applied[uid] = script
        self.inherited.discard(uid)
        self.programmed[uid] = nftables.counted(interfaces)
        self._show()

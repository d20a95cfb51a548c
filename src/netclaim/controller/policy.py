"""The controller's policy pass: every MultiNetworkPolicy compiled for the pods it selects, and handed to
the nodes' agents as netclaim.core.policy.distribution lays it out.

What a tenant writes bounds only that tenant: a policy naming no netclaim network (Multus's) is never
parsed; a namespace whose policies exceed NAMESPACE_BUDGET is not parsed either (its policies isolate its
selected pods, a Warning Event on each, netclaim_policy_namespaces_over_budget); a policy is parsed once
per resourceVersion; the compile runs in a thread, so /healthz, the IPAM pass and the Services' go on
meanwhile.

Nothing is listed per pass: policies, pods, namespaces, claims and the rules ConfigMaps written are the
informers'. A pass compiles what changed since the last (netclaim.core.policy.compiled) and writes the
ConfigMaps of the nodes it touched that differ from what is there; every `everything_seconds` it compiles
everything and compares every object. A ConfigMap that someone else changes is made again at the next
pass, alone; one that cannot be written, after a backoff of its own (KeyBackoff: 0.5 s doubling to 5 min;
at once when it changes meanwhile), while every other node's go on."""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field

from netclaim.controller.informer import Informer
from netclaim.core.events import EventReason
from netclaim.core.ipam.published import PublishedAddresses
from netclaim.core.kubeapi import NetworkPoliciesApi
from netclaim.core.objects import Claim, Pod
from netclaim.core.policy.compiled import Compiled, CompiledRules
from netclaim.core.policy.distribution import RulesMap, digest, pod_facts
from netclaim.core.policy.rules import NAMESPACE_BUDGET, PolicyObject, PolicySource, is_over, over_budget
from netclaim.core.policy.spec import malformed_networks
from netclaim.errors import ApiUnavailableError, NetclaimError, per_object, per_object_at_once
from netclaim.runtime import metrics
from netclaim.runtime.trigger import KeyBackoff

log = logging.getLogger(__name__)
WRITES_AT_ONCE = 8


class PolicySources:
    """The MultiNetworkPolicies as the informer keeps them, a namespace over its budget without its
    policies' spec text: they are not parsed then (they isolate), so what a tenant can make the controller
    hold is its budget of text (NAMESPACE_BUDGET, 1 MiB), not its object quota times the API's 1.5 MB per
    object. Counted as each policy changes, in constant time (a namespace's policies are gone over only
    when it crosses its budget); once the namespace is back within it, its policies are read again by
    namespace at the next pass (until then they isolate, as over budget)."""

    def __init__(self, informer: Informer[PolicySource], api: NetworkPoliciesApi) -> None:
        self.informer = informer
        self.api = api
        self.used: dict[str, dict[str, int]] = {}  # namespace → its netclaim policies' budget counts
        self.texts: dict[str, int] = {}  # namespace → policies kept with their text
        self.dropped: dict[str, int] = {}  # namespace → policies kept without it (PolicySource.dropped)
        self.reread: set[str] = set()  # namespaces back within budget, some policy of them without text
        informer.on_change(self.changed)

    def changed(self, before: PolicySource | None, after: PolicySource | None) -> None:
        for found, sign in ((before, -1), (after, 1)):
            if found is None:
                continue
            if found.networks:
                counted = self.used.setdefault(
                    found.namespace, dict.fromkeys((*NAMESPACE_BUDGET, "policies"), 0)
                )
                for name, value in (("rules", found.rules), ("peers", found.peers), ("bytes", found.size)):
                    counted[name] += sign * value
                counted["policies"] += sign
                if counted["policies"] <= 0:
                    del self.used[found.namespace]
            self._count(found, sign)
        changed = after or before
        if changed is None:
            return
        namespace = changed.namespace
        counts = self.used.get(namespace)
        if counts is not None and is_over(counts):
            self.reread.discard(namespace)
            if after is not None and after.spec and self.texts.get(namespace) == 1:
                self._drop([after])  # the others' let go already: this one alone
            elif self.texts.get(namespace):  # the namespace has just gone over: all of them
                self._drop(self.informer.indexed("namespace", namespace))
        elif self.dropped.get(namespace):
            self.reread.add(namespace)

    def _count(self, source: PolicySource, sign: int) -> None:
        for counter, counts in ((self.texts, bool(source.spec)), (self.dropped, source.dropped)):
            if counts:
                left = counter[source.namespace] = counter.get(source.namespace, 0) + sign
                if left <= 0:
                    del counter[source.namespace]

    def _restate(self, before: PolicySource, after: PolicySource) -> None:
        self.informer.restate(_key(after), after)
        self._count(before, -1)
        self._count(after, 1)

    def _drop(self, sources: list[PolicySource]) -> None:
        for source in sources:
            if source.spec:
                self._restate(source, source.without_text())

    async def current(self) -> list[PolicySource]:
        """Every policy kept, those of the namespaces back within budget read again first."""
        for namespace in sorted(self.reread):
            try:
                listed = await self.api.list_policies(namespace)
            except ApiUnavailableError:
                raise
            except NetclaimError as err:  # that namespace's policies isolate until the next pass reads them
                log.warning(
                    "MultiNetworkPolicies not read again; they isolate until the next pass reads them",
                    extra={"namespace": namespace, "error": str(err)},
                )
                continue
            counts = self.used.get(namespace)
            if counts is not None and is_over(counts):  # over again meanwhile: left as they are
                self.reread.discard(namespace)
                continue
            for found in listed:
                kept = self.informer.objects.get(_key(found))
                if kept is not None and kept.dropped and kept.version == found.version:
                    self._restate(kept, found)
            if not self.dropped.get(namespace):
                self.reread.discard(namespace)
        return list(self.informer.objects.values())


def _key(source: PolicySource) -> str:
    return f"{source.namespace}/{source.name}"


@dataclass
class PolicyReconciler:
    """One pass makes the rules ConfigMaps what the MultiNetworkPolicies say of the pods now. A policy that
    cannot be read isolates its namespace's pods on its networks (netclaim.core.policy.rules); that, and a
    policy-for naming no netclaim network there is, are told once per problem: a Warning Event on the
    policy, in its namespace."""

    api: NetworkPoliciesApi
    claims: Callable[[], Awaitable[list[Claim]]]  # every claim, as the IPAM pass has seen them
    pods: Callable[[], list[Pod]]  # every scheduled pod, as the informer keeps them
    namespaces: Callable[[], dict[str, Mapping[str, str]]]  # namespace → its labels, the informer's
    policies: Callable[[], Awaitable[list[PolicySource]]]  # every MultiNetworkPolicy (PolicySources)
    present: Callable[[], Mapping[str, RulesMap]]  # the rules ConfigMaps there are, the informer's
    driver: str
    published: Callable[[], Awaitable[PublishedAddresses]]  # what may be published, as of now
    # everything made and compared this often: a safety net, since the informers tell every change
    everything_seconds: float = 600.0
    warned: set[tuple[str, str]] = field(default_factory=set)  # (policy UID, problem) told
    namespaces_with_policies: set[str] = field(default_factory=set)
    # namespace/name → (its resourceVersion and its namespace's budget verdict, the policy as parsed)
    parsed: dict[str, tuple[str, PolicyObject]] = field(default_factory=dict)
    compiled: CompiledRules = field(default_factory=CompiledRules)
    written: dict[str, RulesMap] = field(default_factory=dict)  # what this term's passes wrote
    again: set[str] = field(default_factory=set)  # labels to make again: unwritten, or changed by another
    backoff: KeyBackoff = field(default_factory=KeyBackoff)  # labels whose writes failed
    retries: set[str] = field(default_factory=set)  # labels to make again only because a write failed
    last_full: float = -math.inf

    async def reconcile(self) -> None:
        await metrics.counted_pass(metrics.POLICY_PASSES, self.once, metrics.POLICY_PASS_SECONDS)

    async def once(self) -> None:
        try:
            await self._once()
        except BaseException:
            # what this pass compiled may not be written, and the policies it parsed not told: the next
            # pass compiles everything, compares it with what the informer says is there, tells everything
            self.last_full, self.parsed, self.written = -math.inf, {}, {}
            raise

    async def _once(self) -> None:
        sources = [source for source in await self.policies() if source.networks]
        policies, read = await asyncio.to_thread(self._read, sources)
        self.namespaces_with_policies = {p.namespace for p in policies}
        if read:
            await self._tell(read, await self.api.list_networks(self.driver))
        published, claims = await self.published(), await self.claims()
        full = time.monotonic() - self.last_full >= self.everything_seconds
        started = time.monotonic()
        # a label to make again only because its write failed waits for its backoff; one changed, not
        waiting = {label for label in self.again & self.retries if not self.backoff.due(label)}
        again, self.again, self.retries = self.again - waiting, set(waiting), set(waiting)
        compiled = await asyncio.to_thread(
            self._compiled, policies, self.pods(), claims, published, self.namespaces(), full, again
        )
        if compiled.full:
            self.last_full = started
        metrics.POLICY_COMPILED_PODS.labels("full" if compiled.full else "changed").inc(compiled.pods)
        await self._write(compiled)
        uids = {p.uid for p in policies}
        self.warned = {(uid, problem) for uid, problem in self.warned if uid in uids}

    def changed_by_another(self, before: RulesMap | None, after: RulesMap | None) -> bool:
        """Told each change of a rules ConfigMap: whether it is not what this term wrote there (edited or
        deleted by someone else), so that the next pass makes its label again."""
        found = after or before
        mine = self.written.get(found.name) if found is not None else None
        if mine is None or (after is not None and after.digest == mine.digest):
            return False
        del self.written[mine.name]  # what is there is now the informer's to tell
        self.again.add(mine.label)
        self.retries.discard(mine.label)
        return True

    def _compiled(
        self,
        policies: list[PolicyObject],
        pods: list[Pod],
        claims: list[Claim],
        published: PublishedAddresses,
        namespaces: Mapping[str, Mapping[str, str]],
        full: bool,
        again: set[str],
    ) -> Compiled:
        compiled = self.compiled.advance(policies, pod_facts(pods, claims, published), namespaces, full)
        if compiled.full or not again - compiled.labels:
            return compiled
        return self.compiled.made_again(compiled, again)

    async def _write(self, compiled: Compiled) -> None:
        """Each ConfigMap made that differs from what is there, and then each part of a label made that is
        no longer wanted deleted (every one not made, after a full compile): WRITES_AT_ONCE at a time, so
        a change touching many nodes costs about one round trip per WRITES_AT_ONCE of them. What is
        written is recorded before the write is sent: its own watch event may come before its answer, and
        must not read as another writer's."""
        present = {**self.present(), **self.written}
        applies: list[tuple[RulesMap, Awaitable[None]]] = []
        for name, (label, data) in sorted(compiled.maps.items()):
            made = self.written[name] = RulesMap(name, label, digest(data))
            if present.get(name) != made:
                applies.append((made, self.api.apply_rules_map(name, label, data)))
        failed: set[str] = set()
        applied = await per_object_at_once([(f"ConfigMap {m.name}", w) for m, w in applies], WRITES_AT_ONCE)
        for (made, _), written in zip(applies, applied, strict=True):
            if not written:
                self.written.pop(made.name, None)  # what is there: the informer's to tell
                failed.add(made.label)
        deletes = [
            (found, self.api.delete_rules_map(name))
            for name, found in sorted(present.items())
            if name not in compiled.maps and (compiled.full or found.label in compiled.labels)
        ]
        for found, _ in deletes:
            self.written.pop(found.name, None)
        deleted_each = await per_object_at_once(
            [(f"ConfigMap {f.name}", d) for f, d in deletes], WRITES_AT_ONCE
        )
        for (found, _), deleted in zip(deletes, deleted_each, strict=True):
            if not deleted:
                failed.add(found.label)
        for label in failed:
            self.backoff.failed(label)
        for label in {made.label for made, _ in applies} | {found.label for found, _ in deletes}:
            if label not in failed:
                self.backoff.succeeded(label)
        self.again |= failed
        self.retries |= failed

    def _read(self, sources: list[PolicySource]) -> tuple[list[PolicyObject], list[PolicyObject]]:
        """The netclaim policies, each parsed once per version, none of a namespace over its budget; and
        those parsed this time."""
        over = over_budget(sources)
        metrics.POLICY_NAMESPACES_OVER_BUDGET.set(len(over))
        kept: dict[str, tuple[str, PolicyObject]] = {}
        fresh = []
        for source in sources:
            key = f"{source.namespace}/{source.name}"
            version = f"{source.version}/{over.get(source.namespace, '')}"
            before = self.parsed.get(key)
            if before is not None and before[0] == version:
                kept[key] = before
                continue
            policy = source.read(over.get(source.namespace, ""))
            kept[key] = (version, policy)
            fresh.append(policy)
        self.parsed = kept
        return [policy for _, policy in kept.values()], fresh

    async def _tell(self, policies: list[PolicyObject], networks: set[str]) -> None:
        for policy in policies:
            problems = [policy.problem] if policy.problem else []
            unknown = [n for n in policy.networks if n not in networks]
            if unknown:
                malformed = set(malformed_networks(tuple(unknown)))
                problems.append(
                    "policy-for names "
                    + ", ".join(f"netclaim.dev/{n}" for n in unknown)
                    + ": no netclaim NIC of the cluster is on "
                    + ("that network" if len(unknown) == 1 else "those networks")
                    + (" (not a network name)" if malformed else "")
                    + "; it selects nothing there"
                )
            for problem in problems:
                if (policy.uid, problem) in self.warned:
                    continue
                self.warned.add((policy.uid, problem))
                where = f"{policy.namespace}/{policy.name}"
                isolating = problem == policy.problem
                log.warning(
                    "MultiNetworkPolicy cannot be read: it isolates its namespace's pods on its networks"
                    if isolating
                    else "MultiNetworkPolicy names an unknown netclaim network",
                    extra={"policy": where, "problem": problem},
                )
                reason = EventReason.POLICY_INVALID if isolating else EventReason.POLICY_UNKNOWN_NETWORK
                message = (
                    f"{problem} (until it can be read, every pod of its namespace on its networks is "
                    "isolated, allowing nothing)"
                    if isolating
                    else problem
                )
                event = self.api.create_policy_event(
                    policy.namespace, policy.name, policy.uid, reason, message
                )
                await per_object(f"event on MultiNetworkPolicy {where}", event)

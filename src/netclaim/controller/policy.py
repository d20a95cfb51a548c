"""The controller's policy pass: every MultiNetworkPolicy compiled for the pods it selects, and handed to
the nodes' agents as netclaim.core.policy.distribution lays it out.

What a tenant writes bounds only that tenant: a policy naming no netclaim network (Multus's) is never
parsed; a namespace whose policies exceed NAMESPACE_BUDGET is not parsed either (its policies isolate its
selected pods, a Warning Event on each, netclaim_policy_namespaces_over_budget); a policy is parsed once
per resourceVersion; the compile runs in a thread, so /healthz, the IPAM pass and the Services' go on
meanwhile."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from netclaim.core.ipam.published import PublishedAddresses
from netclaim.core.kubeapi import NetworkPoliciesApi
from netclaim.core.objects import Claim, Pod, as_object
from netclaim.core.policy.distribution import config_maps, pod_facts
from netclaim.core.policy.rules import PolicyObject, identity, over_budget
from netclaim.core.policy.spec import malformed_networks
from netclaim.errors import per_object
from netclaim.runtime import metrics

log = logging.getLogger(__name__)


@dataclass
class PolicyReconciler:
    """One pass makes the rules ConfigMaps what the MultiNetworkPolicies say of the pods now. A policy that
    cannot be read isolates its namespace's pods on its networks (netclaim.core.policy.rules); that, and a
    policy-for naming no netclaim network there is, are told once per problem: a Warning Event on the
    policy, in its namespace. A ConfigMap that cannot be written is tried again next pass."""

    api: NetworkPoliciesApi
    claims: Callable[[], Awaitable[list[Claim]]]  # every claim, as the IPAM pass has seen them
    pods: Callable[[], list[Pod]]  # every scheduled pod, as the informer keeps them
    namespaces: Callable[[], dict[str, Mapping[str, str]]]  # namespace → its labels, the informer's
    driver: str
    published: Callable[[], Awaitable[PublishedAddresses]]  # what may be published, as of now
    warned: set[tuple[str, str]] = field(default_factory=set)  # (policy UID, problem) told
    namespaces_with_policies: set[str] = field(default_factory=set)
    # namespace/name → (its resourceVersion and its namespace's budget verdict, the policy as parsed)
    parsed: dict[str, tuple[str, PolicyObject]] = field(default_factory=dict)

    async def reconcile(self) -> None:
        await metrics.counted_pass(metrics.POLICY_PASSES, self.once, metrics.POLICY_PASS_SECONDS)

    async def once(self) -> None:
        objects = [o for o in await self.api.list_network_policies() if identity(o)[3]]
        policies = await asyncio.to_thread(self._read, objects)
        self.namespaces_with_policies = {p.namespace for p in policies}
        present = await self.api.list_rules_maps()
        wanted: dict[str, tuple[str, dict[str, str]]] = {}
        if policies:
            await self._tell(policies, await self.api.list_networks(self.driver))
            published, claims = await self.published(), await self.claims()
            wanted = await asyncio.to_thread(
                _compiled, policies, self.pods(), claims, published, self.namespaces()
            )
        for name, (label, data) in wanted.items():
            if present.get(name) != data:
                await per_object(f"ConfigMap {name}", self.api.apply_rules_map(name, label, data))
        for name in sorted(set(present) - set(wanted)):
            await per_object(f"ConfigMap {name}", self.api.delete_rules_map(name))
        uids = {p.uid for p in policies}
        self.warned = {(uid, problem) for uid, problem in self.warned if uid in uids}

    def _read(self, objects: list[dict[str, Any]]) -> list[PolicyObject]:
        """The netclaim policies, each parsed once per version; none of a namespace over its budget."""
        over = over_budget(objects)
        metrics.POLICY_NAMESPACES_OVER_BUDGET.set(len(over))
        read: dict[str, tuple[str, PolicyObject]] = {}
        for data in objects:
            namespace, name, _, _ = identity(data)
            key = f"{namespace}/{name}"
            version = f"{as_object(data.get('metadata')).get('resourceVersion')}/{over.get(namespace, '')}"
            kept = self.parsed.get(key)
            policy = (
                kept[1]
                if kept is not None and kept[0] == version
                else PolicyObject.from_api(data, over.get(namespace, ""))
            )
            read[key] = (version, policy)
        self.parsed = read
        return [policy for _, policy in read.values()]

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
                reason = "NetworkPolicyInvalid" if isolating else "NetworkPolicyUnknownNetwork"
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


def _compiled(
    policies: list[PolicyObject],
    pods: list[Pod],
    claims: list[Claim],
    published: PublishedAddresses,
    namespaces: Mapping[str, Mapping[str, str]],
) -> dict[str, tuple[str, dict[str, str]]]:
    return config_maps(policies, pod_facts(pods, claims, published), namespaces)

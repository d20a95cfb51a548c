"""The policies as the controller keeps them (netclaim.controller.policy.PolicySources): a namespace over
its budget is held without its policies' text, whatever the tenant writes, and read again once back
within it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from netclaim.controller.informer import Informer
from netclaim.controller.policy import PolicySources
from netclaim.core.kubeapi import DELETED, Listed
from netclaim.core.policy.rules import NAMESPACE_BUDGET, PolicySource, is_over
from netclaim.errors import ApiRejectedError

MIB = NAMESPACE_BUDGET["bytes"]


def _policy(namespace: str, name: str, size: int, version: str = "1") -> dict[str, Any]:
    """A valid policy whose spec is about `size` bytes of JSON: ipBlock peers of 10 excepts each, 100 to a
    rule (the per-policy limits)."""
    peers = [
        {"ipBlock": {"cidr": "10.0.0.0/8", "except": [f"10.{i % 250}.{j}.0/24" for j in range(10)]}}
        for i in range(max(1, size // 230))
    ]
    return {
        "metadata": {
            "namespace": namespace,
            "name": name,
            "uid": f"{namespace}-{name}",
            "resourceVersion": version,
            "annotations": {"k8s.v1.cni.cncf.io/policy-for": "netclaim.dev/lan3"},
        },
        "spec": {
            "podSelector": {},
            "policyTypes": ["Ingress"],
            "ingress": [{"from": peers[i : i + 100]} for i in range(0, len(peers), 100)],
        },
    }


@dataclass
class Policies:
    """The MultiNetworkPolicies as the API serves them: listed, watched, and listed by namespace."""

    stored: dict[str, dict[str, Any]] = field(default_factory=dict)
    events: asyncio.Queue[tuple[str, PolicySource]] = field(default_factory=asyncio.Queue)
    listed_namespaces: list[str] = field(default_factory=list)

    def put(self, body: dict[str, Any]) -> None:
        key = f"{body['metadata']['namespace']}/{body['metadata']['name']}"
        kind = "MODIFIED" if key in self.stored else "ADDED"
        self.stored[key] = body
        self.events.put_nowait((kind, PolicySource.from_api(body)))

    def delete(self, key: str) -> None:
        self.events.put_nowait((DELETED, PolicySource.from_api(self.stored.pop(key))))

    async def listed(self) -> Listed[PolicySource]:
        return Listed([PolicySource.from_api(b) for b in self.stored.values()], "1")

    async def changes(self, since: str | None) -> AsyncIterator[tuple[str, PolicySource]]:
        while True:
            yield await self.events.get()
            self.events.task_done()  # asked for the next: this one was kept and told

    async def list_policies(self, namespace: str) -> list[PolicySource]:
        self.listed_namespaces.append(namespace)
        return [
            PolicySource.from_api(b) for b in self.stored.values() if b["metadata"]["namespace"] == namespace
        ]


async def _kept(api: Policies) -> tuple[Informer[PolicySource], PolicySources, asyncio.Task[None]]:
    informer = Informer(
        "policies", api, lambda p: f"{p.namespace}/{p.name}", {"namespace": lambda p: [p.namespace]}
    )
    sources = PolicySources(informer, api)  # type: ignore[arg-type]  # the two methods it calls
    task = asyncio.create_task(informer.run())
    await asyncio.wait_for(informer.synced.wait(), 5)
    return informer, sources, task


async def _settled(api: Policies) -> None:
    await asyncio.wait_for(api.events.join(), 5)


def _text_of(informer: Informer[PolicySource], namespace: str) -> int:
    return sum(len(p.spec) for p in informer.indexed("namespace", namespace))


async def test_a_namespace_over_its_budget_is_held_without_text_and_read_again_once_within_it() -> None:
    """Before, the informer kept every policy's text: a tenant's 1,000 policies of 1 MB each would have
    been 1 GB of the controller's memory, for policies it never parses."""
    api = Policies()
    api.put(_policy("team-b", "small", 2_000))
    informer, sources, task = await _kept(api)
    try:
        for i in range(3):  # 3 of 460 KB: over the 1 MiB of the namespace's budget
            api.put(_policy("team-a", f"big-{i}", 460_000))
        await _settled(api)
        assert _text_of(informer, "team-a") == 0 and _text_of(informer, "team-b") > 0
        read = {p.name: p.read() for p in await sources.current()}
        assert read["big-0"].spec is None and "being read again" in read["big-0"].problem
        assert read["small"].spec is not None
        api.delete("team-a/big-2")  # back within budget: read again, by namespace, at the next pass
        await _settled(api)
        assert sources.reread == {"team-a"}
        current = {p.name: p for p in await sources.current()}
        assert api.listed_namespaces == ["team-a"] and sources.reread == set()
        assert current["big-0"].read().spec is not None and not current["big-0"].dropped
        assert _text_of(informer, "team-a") > 0
    finally:
        task.cancel()


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(("team-a", "team-b")), st.integers(0, 3), st.sampled_from((0, 1_000, 460_000))
        ),
        min_size=1,
        max_size=10,
    )
)
def test_whatever_a_tenant_writes_the_text_kept_of_a_namespace_stays_within_its_budget(
    writes: list[tuple[str, int, int]],
) -> None:
    """Each write puts a policy of that size (0: deletes it); after each, the text held per namespace is at
    most its budget, and after a pass every policy of a namespace within budget has its text to parse."""

    async def run() -> None:
        api = Policies()
        informer, sources, task = await _kept(api)
        try:
            for step, (namespace, index, size) in enumerate(writes):
                key = f"{namespace}/p{index}"
                if size:
                    api.put(_policy(namespace, f"p{index}", size, str(step + 2)))
                elif key in api.stored:
                    api.delete(key)
                await _settled(api)
                for name in ("team-a", "team-b"):
                    assert _text_of(informer, name) <= MIB
                for source in await sources.current():
                    if not is_over(sources.used[source.namespace]):
                        assert not source.dropped and source.spec  # what a pass parses
        finally:
            task.cancel()

    asyncio.run(run())


async def test_a_namespace_whose_policies_cannot_be_read_again_stops_no_other() -> None:
    api = Policies()
    _, sources, task = await _kept(api)
    try:
        for i in range(3):
            api.put(_policy("team-a", f"big-{i}", 460_000))
        api.put(_policy("team-b", "small", 2_000))
        api.delete("team-a/big-2")
        await _settled(api)

        async def refused(namespace: str) -> list[PolicySource]:
            raise ApiRejectedError("multi-networkpolicies is forbidden")

        api.list_policies = refused  # type: ignore[method-assign]
        current = {p.name: p for p in await sources.current()}
        assert current["small"].read().spec is not None  # the other namespace's, as ever
        assert current["big-0"].read().spec is None and sources.reread == {"team-a"}  # isolating, pending
    finally:
        task.cancel()


async def test_a_tenants_policy_changes_cost_constant_time_however_many_it_has() -> None:
    """Going over a namespace's policies at each change made a tenant's n changes cost n² on the event
    loop that answers /healthz: they are gone over only when the namespace crosses its budget."""
    api = Policies()
    informer, sources, task = await _kept(api)
    scans: list[str] = []
    indexed = informer.indexed

    def counted(index: str, value: str) -> list[PolicySource]:
        scans.append(value)
        return indexed(index, value)

    informer.indexed = counted  # type: ignore[method-assign]
    try:
        for i in range(200):  # 200 small policies, then one that takes the namespace over its budget
            api.put(_policy("team-a", f"p{i}", 1_000))
        api.put(_policy("team-a", "big", 1_100_000))
        for i in range(200):  # and 200 more once over
            api.put(_policy("team-a", f"q{i}", 1_000))
        await _settled(api)
        assert scans == ["team-a"]  # once, when it went over
        assert _text_of(informer, "team-a") == 0 and sources.dropped == {"team-a": 401}
    finally:
        task.cancel()

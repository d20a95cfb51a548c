"""The agent's policy enforcer on a real store, the rules API and nft faked: what reaches a pod's namespace,
when, and that an unselected pod costs no nft at all (netclaim.agent.pods.policy)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import pytest

from netclaim.agent.pods.policy import PolicyEnforcer
from netclaim.agent.status import PodRef
from netclaim.agent.store import State, Store
from netclaim.core.policy import ruleset as rulesets
from netclaim.core.policy.distribution import Guard, GuardSelector
from netclaim.core.policy.rules import Allow, Direction, NetworkRules
from netclaim.errors import AttachError, KernelError
from netclaim.runtime.metrics import REGISTRY
from tests.unit.fakes import sample_device, sample_row

NODE = "node-1"


@dataclass
class FakeRules:
    maps: dict[str, str] = field(default_factory=dict)
    changes: asyncio.Queue[str] = field(default_factory=asyncio.Queue)

    async def list_policy_rules(self, labels: list[str]) -> dict[str, list[str]]:
        return {k: [v] for k, v in self.maps.items() if k in labels}

    async def policy_rules_changes(self, labels: list[str]) -> AsyncIterator[str]:
        while True:
            yield await self.changes.get()


@dataclass
class Recorder:
    applied: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    refuse: set[str] = field(default_factory=set)  # namespaces whose nft fails

    async def __call__(self, netns: str, ruleset: dict[str, Any]) -> None:
        if netns in self.refuse:
            raise KernelError(f"nft -j -f - in {netns}: exit 1: Error: Could not process rule")
        self.applied.append((netns, ruleset))


def _text(ruleset: dict[str, Any]) -> str:
    """The batch as one string, for what a test looks for in it."""
    return json.dumps(ruleset)


def _rules(ruleset: dict[str, Any], chain: str) -> list[list[dict[str, Any]]]:
    return [
        c["add"]["rule"]["expr"]
        for c in ruleset["nftables"]
        if "rule" in c.get("add", {}) and c["add"]["rule"]["chain"] == chain
    ]


DELETE_ONLY = rulesets.ruleset({})


async def _attached_store(tmp_path: Path) -> Store:
    store = Store(tmp_path)
    device = sample_device("enp1s0")
    device.attributes["netclaim.dev/network"] = "lan3"
    row = sample_row(device, pod_uid="pod-uid-1").with_state(
        State.ATTACHED, sandbox_id="s1", netns="/run/netns/p1"
    )
    await store.put(row)
    return store


def _guard(selector: dict[str, str]) -> str:
    guard = Guard("team-a", "p", GuardSelector(selector), ("lan3",), True, False)
    return msgspec.json.encode([guard]).decode()


async def test_an_unselected_pod_costs_no_nft_and_a_selected_one_is_isolated_before_the_hook_answers(
    tmp_path: Path,
) -> None:
    store = await _attached_store(tmp_path)
    rules, nft = FakeRules({"guards": _guard({"app": "db"})}), Recorder()
    enforcer = PolicyEnforcer(rules, store, NODE, nft)
    await enforcer.refresh()
    enforcer.seen("pod-uid-1", "team-a", "db", {"app": "web"})
    await enforcer.enforce("pod-uid-1", time.monotonic() + 2)
    assert nft.applied == []  # no guard selects it, nothing was there: no exec on its start
    enforcer.seen("pod-uid-1", "team-a", "db", {"app": "db"})
    await enforcer.enforce("pod-uid-1", time.monotonic() + 2)
    [(netns, ruleset)] = nft.applied
    assert netns == "/run/netns/p1" and _rules(ruleset, "input")[0][1] == {"jump": {"target": "in_0"}}
    assert _rules(ruleset, "in_0")[2:] == [[{"drop": None}]]  # past conntrack and ND: nothing allowed

    allow = NetworkRules(ingress=Direction((Allow(("10.3.0.20/32",)),), ("team-a/p",)))
    rules.maps["node-1"] = msgspec.json.encode({"pod-uid-1": {"lan3": allow}}).decode()
    await enforcer.refresh()  # the compiled rules replace the guard's isolation
    assert '"right": {"set": ["10.3.0.20"]}}}, {"accept": null}' in _text(nft.applied[-1][1])
    shown = {
        k: REGISTRY.get_sample_value("netclaim_policy_rules", {"kind": k}) for k in ("allow", "isolated")
    }
    assert shown == {"allow": 1, "isolated": 1}
    await enforcer.refresh()
    assert len(nft.applied) == 2  # unchanged: not applied again


async def test_a_hook_before_the_rules_are_read_fails_the_sandbox_and_an_inherited_pod_is_cleaned_once(
    tmp_path: Path,
) -> None:
    store = await _attached_store(tmp_path)
    nft = Recorder()
    enforcer = PolicyEnforcer(FakeRules(), store, NODE, nft)
    enforcer.seen("pod-uid-1", "team-a", "db", {}, inherited=True)
    with pytest.raises(AttachError, match="not read yet"):
        await enforcer.enforce("pod-uid-1", time.monotonic() + 0.05)
    await enforcer.refresh()
    [(_, ruleset)] = nft.applied  # an older agent may have left a table: "nothing" is applied once
    assert ruleset == DELETE_ONLY
    await enforcer.refresh()
    assert len(nft.applied) == 1


async def test_a_pod_relabelled_out_of_a_policy_is_opened_though_it_started_with_the_guards_labels(
    tmp_path: Path,
) -> None:
    """The agent knows a pod's labels from its sandbox, as they were when it started: once compiled, the
    controller's word (here: listed, selected by none) decides, not the guard on the old labels."""
    store = await _attached_store(tmp_path)
    rules, nft = FakeRules({"guards": _guard({"app": "db"})}), Recorder()
    enforcer = PolicyEnforcer(rules, store, NODE, nft)
    await enforcer.refresh()
    enforcer.seen("pod-uid-1", "team-a", "db", {"app": "db"})
    await enforcer.enforce("pod-uid-1", time.monotonic() + 2)
    assert "drop" in _text(nft.applied[-1][1])
    rules.maps["node-1"] = msgspec.json.encode({"pod-uid-1": {}}).decode()
    await enforcer.refresh()
    assert nft.applied[-1][1] == DELETE_ONLY
    assert REGISTRY.get_sample_value("netclaim_policy_rules", {"kind": "isolated"}) == 0


async def test_a_pod_whose_rows_went_by_any_path_is_forgotten_and_its_rules_no_longer_shown(
    tmp_path: Path,
) -> None:
    """Rows also go through kubelet's unprepare, which the hooks do not see: 108 isolated interfaces of
    gone pods were still shown after a 200-pod run before this."""
    store = await _attached_store(tmp_path)
    rules, nft = FakeRules({"guards": _guard({"app": "db"})}), Recorder()
    enforcer = PolicyEnforcer(rules, store, NODE, nft)
    await enforcer.refresh()
    enforcer.seen("pod-uid-1", "team-a", "db", {"app": "db"})
    await enforcer.enforce("pod-uid-1", time.monotonic() + 2)
    assert REGISTRY.get_sample_value("netclaim_policy_rules", {"kind": "isolated"}) == 1
    await store.delete(*store.all())  # not through the enforcer
    enforcer.prune()
    assert (enforcer.pods, enforcer.applied, enforcer.programmed) == ({}, {}, {})
    assert REGISTRY.get_sample_value("netclaim_policy_rules", {"kind": "isolated"}) == 0


async def _two_pods(tmp_path: Path) -> Store:
    store = Store(tmp_path)
    device = sample_device("enp1s0")
    device.attributes["netclaim.dev/network"] = "lan3"
    for index in (1, 2):
        row = sample_row(device, pod_uid=f"pod-uid-{index}", claim_uid=f"claim-uid-{index}")
        await store.put(row.with_state(State.ATTACHED, sandbox_id=f"s{index}", netns=f"/run/netns/p{index}"))
    return store


@dataclass
class Told:
    events: list[tuple[str, str, str]] = field(default_factory=list)

    def __call__(self, pod: PodRef, reason: str, message: str) -> None:
        self.events.append((pod.name, reason, message))


def _both_allowing_the_client() -> FakeRules:
    allow = NetworkRules(ingress=Direction((Allow(("10.3.0.20/32",)),), ("team-a/p",)))
    both = {"pod-uid-1": {"lan3": allow}, "pod-uid-2": {"lan3": allow}}
    return FakeRules({"node-1": msgspec.json.encode(both).decode()})


async def test_one_pods_rules_that_nft_refuses_close_that_pod_tell_it_and_never_stop_the_next(
    tmp_path: Path,
) -> None:
    """A tenant's rules that fail in nft once stopped the node's sync at that pod: pods after it kept a
    revoked allow. Now the failing pod is isolated with nothing allowed, told, and the next pod follows."""
    store, rules = await _two_pods(tmp_path), _both_allowing_the_client()
    nft, told = Recorder(refuse={"/run/netns/p1"}), Told()
    enforcer = PolicyEnforcer(rules, store, NODE, nft, warn=told)
    enforcer.seen("pod-uid-1", "team-a", "db-1", {})
    enforcer.seen("pod-uid-2", "team-a", "db-2", {})
    failures = REGISTRY.get_sample_value("netclaim_policy_failures_total", {"when": "sync"}) or 0.0
    await enforcer.refresh()
    assert [netns for netns, _ in nft.applied] == ["/run/netns/p2"]  # the next pod followed
    [(pod, reason, message)] = told.events
    assert (pod, reason) == ("db-1", "NetworkPolicyNotApplied") and "team-a/p" in message
    assert REGISTRY.get_sample_value("netclaim_policy_failures_total", {"when": "sync"}) == failures + 1
    await enforcer.refresh()
    assert len(told.events) == 1  # told once per error, not at every pass

    # nft takes the fallback but not the rules: the pod holds the isolation, nothing allowed
    async def only_the_fallback(netns: str, ruleset: dict[str, Any]) -> None:
        if "10.3.0.20" in _text(ruleset):
            raise KernelError("nft: refused")
        nft.applied.append((netns, ruleset))

    enforcer.apply = only_the_fallback
    await enforcer.refresh()
    netns, fallback = nft.applied[-1]
    assert netns == "/run/netns/p1" and _rules(fallback, "in_0")[2:] == [[{"drop": None}]]


async def test_a_bug_in_one_pods_rules_is_that_pods_and_the_others_follow(tmp_path: Path) -> None:
    store, rules = await _two_pods(tmp_path), _both_allowing_the_client()
    applied: list[str] = []

    async def buggy(netns: str, ruleset: dict[str, Any]) -> None:
        if netns == "/run/netns/p1" and "10.3.0.20" in _text(ruleset):
            raise ValueError("'10.1.2.3/16' has host bits set")  # what nft's caller once raised
        applied.append(netns)

    enforcer = PolicyEnforcer(rules, store, NODE, buggy, warn=Told())
    enforcer.seen("pod-uid-1", "team-a", "db-1", {})
    enforcer.seen("pod-uid-2", "team-a", "db-2", {})
    await enforcer.refresh()
    assert applied == ["/run/netns/p1", "/run/netns/p2"]  # p1 closed by the fallback, p2 its rules


async def test_after_a_restart_pods_seen_after_the_first_read_get_their_tables(tmp_path: Path) -> None:
    """The rules can be read before Synchronize lists the running pods: follow() then brings them up to
    date (an older agent's table never stays until some later change)."""
    store = await _attached_store(tmp_path)
    allow = NetworkRules(ingress=Direction((Allow(("10.3.0.20/32",)),), ("team-a/p",)))
    rules, nft = (
        FakeRules({"node-1": msgspec.json.encode({"pod-uid-1": {"lan3": allow}}).decode()}),
        Recorder(),
    )
    enforcer = PolicyEnforcer(rules, store, NODE, nft)
    await enforcer.refresh()
    assert nft.applied == []  # not listed yet
    enforcer.seen("pod-uid-1", "team-a", "db", {}, inherited=True)
    await enforcer.follow()
    [(_, ruleset)] = nft.applied
    assert "10.3.0.20" in _text(ruleset)

"""The agent's policy enforcer on a real store, the rules API and nft faked: what reaches a pod's namespace,
when, and that an unselected pod costs no nft at all (netclaim.configure.policy)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from netclaim.api.networkpolicy import LabelSelector
from netclaim.configure.policy import PolicyEnforcer
from netclaim.configure.store import State, Store
from netclaim.errors import AttachError
from netclaim.metrics import REGISTRY
from netclaim.netpolicy.distribute import GUARDS_JSON, RULES_JSON, Guard
from netclaim.netpolicy.rules import Allow, Direction, NetworkRules
from tests.unit.fakes import sample_device, sample_row

NODE = "node-1"


@dataclass
class FakeRules:
    maps: dict[str, str] = field(default_factory=dict)
    changes: asyncio.Queue[str] = field(default_factory=asyncio.Queue)

    async def list_policy_rules(self, labels: list[str]) -> dict[str, str]:
        return {k: v for k, v in self.maps.items() if k in labels}

    async def policy_rules_changes(self, labels: list[str]) -> AsyncIterator[str]:
        while True:
            yield await self.changes.get()


@dataclass
class Recorder:
    applied: list[tuple[str, str]] = field(default_factory=list)

    async def __call__(self, netns: str, script: str) -> None:
        self.applied.append((netns, script))


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
    guard = Guard(
        "team-a", "p", LabelSelector.model_validate({"matchLabels": selector}), ("lan3",), True, False
    )
    return GUARDS_JSON.dump_json([guard]).decode()


async def test_an_unselected_pod_costs_no_nft_and_a_selected_one_is_isolated_before_the_hook_answers(
    tmp_path: Path,
) -> None:
    store = await _attached_store(tmp_path)
    rules, nft = FakeRules({"guards": _guard({"app": "db"})}), Recorder()
    enforcer = PolicyEnforcer(rules, store, NODE, nft)
    await enforcer.refresh()
    enforcer.seen("pod-uid-1", "team-a", {"app": "web"})
    await enforcer.enforce("pod-uid-1", time.monotonic() + 2)
    assert nft.applied == []  # no guard selects it, nothing was there: no exec on its start
    enforcer.seen("pod-uid-1", "team-a", {"app": "db"})
    await enforcer.enforce("pod-uid-1", time.monotonic() + 2)
    [(netns, script)] = nft.applied
    assert netns == "/run/netns/p1" and 'iifname "net1" jump in_0' in script and "accept\n    drop" in script

    allow = NetworkRules(ingress=Direction((Allow(("10.3.0.20/32",)),), ("team-a/p",)))
    rules.maps["node-1"] = RULES_JSON.dump_json({"pod-uid-1": {"lan3": allow}}).decode()
    await enforcer.refresh()  # the compiled rules replace the guard's isolation
    assert "ip saddr { 10.3.0.20/32 } accept" in nft.applied[-1][1]
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
    enforcer.seen("pod-uid-1", "team-a", {}, inherited=True)
    with pytest.raises(AttachError, match="not read yet"):
        await enforcer.enforce("pod-uid-1", time.monotonic() + 0.05)
    await enforcer.refresh()
    [(_, script)] = nft.applied  # an older agent may have left a table: "nothing" is applied once
    assert script == "table inet netclaim\ndelete table inet netclaim\n"
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
    enforcer.seen("pod-uid-1", "team-a", {"app": "db"})
    await enforcer.enforce("pod-uid-1", time.monotonic() + 2)
    assert "drop" in nft.applied[-1][1]
    rules.maps["node-1"] = RULES_JSON.dump_json({"pod-uid-1": {}}).decode()
    await enforcer.refresh()
    assert nft.applied[-1][1] == "table inet netclaim\ndelete table inet netclaim\n"
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
    enforcer.seen("pod-uid-1", "team-a", {"app": "db"})
    await enforcer.enforce("pod-uid-1", time.monotonic() + 2)
    assert REGISTRY.get_sample_value("netclaim_policy_rules", {"kind": "isolated"}) == 1
    await store.delete(*store.all())  # not through the enforcer
    enforcer.prune()
    assert (enforcer.pods, enforcer.applied, enforcer.programmed) == ({}, {}, {})
    assert REGISTRY.get_sample_value("netclaim_policy_rules", {"kind": "isolated"}) == 0

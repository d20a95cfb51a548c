"""NodePrepareResources/NodeUnprepareResources behind the kubelet plugin: claim → stored plans (gather →
plan → persist), and back; reclaim."""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from netclaim.agent.claims import prepare as prepare_module
from netclaim.agent.status import ClaimRef
from netclaim.agent.store import State
from netclaim.core.node import PreparedDevice
from netclaim.core.objects import Claim, ConsumerRef
from netclaim.core.plan import ClaimInputs, NodeContext, PlannedDevice, plan_claim
from netclaim.errors import CniError, ConfigError, GoneError, StateStoreError
from tests.corpus import VALID_CONFIG
from tests.unit.fakes import (
    ConfigureRig,
    configure_rig,
    sample_allocation,
    sample_claim,
    sample_config,
    sample_device,
)

NIC = sample_device("enp1s0")
SECOND_NIC = sample_device("enp2s0")
SECOND_CONFIG = {**VALID_CONFIG, "interfaceName": "net2"}
CLAIM = sample_claim(
    (
        sample_allocation(NIC, "net", share_id="share-1", bandwidth="100M"),
        sample_allocation(SECOND_NIC, "net2"),
        sample_allocation(NIC, "gpu", driver="gpu.example.com"),
    ),
    (sample_config(VALID_CONFIG, requests=("net",)), sample_config(SECOND_CONFIG, requests=("net2",))),
)
REF = ClaimRef(CLAIM.namespace, CLAIM.name, CLAIM.uid)


@pytest.fixture
def rig(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ConfigureRig]:
    built = configure_rig(tmp_path)
    built.catalog.update([NIC, SECOND_NIC])
    built.api.add_claim(CLAIM)
    yield built
    built.store.close()


async def _prepare(rig: ConfigureRig, claim: Claim = CLAIM) -> list[PreparedDevice]:
    return await rig.preparer.prepare(claim.namespace, claim.name, claim.uid)


async def test_prepare_stores_one_plan_per_device_of_this_driver(rig: ConfigureRig) -> None:
    prepared = await _prepare(rig)
    assert prepared == [  # each request's first device also mounts its metadata file (test_metadata.py)
        PreparedDevice("net", "node-1", NIC.name, "share-1", ("netclaim.dev/metadata=claim-uid-1_net",)),
        PreparedDevice("net2", "node-1", SECOND_NIC.name, None, ("netclaim.dev/metadata=claim-uid-1_net2",)),
    ]
    rows = rig.store.for_claim(CLAIM.uid)
    assert [(r.device, r.share_id, r.request, r.pod_uid, r.state) for r in rows] == [
        (NIC.name, "share-1", "net", "pod-uid-1", State.PREPARED),
        (SECOND_NIC.name, "", "net2", "pod-uid-1", State.PREPARED),
    ]
    assert [(r.plan.interface_name, r.plan.bandwidth_bps) for r in rows] == [
        ("net1", 100_000_000),
        ("net2", None),
    ]
    assert rig.cni.version_queries == ["host-local", "macvlan"]  # once per plugin of all the chains
    await rig.settle()
    assert [e["conditions"][0]["reason"] for e in rig.entries(REF)] == ["WaitingForPodSandbox"] * 2


async def test_prepare_gathers_everything_then_plans_once_then_persists(
    rig: ConfigureRig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One claim, one way through: every API call and plugin exec first, then the one pure planning call
    (the CNI version settled inside it), then the store. Before, planning was entered three times with
    I/O between (plan, IP pools, plan, VERSION per plugin, negotiate per plan)."""
    seen: list[tuple[str, ...]] = []

    def planning(inputs: ClaimInputs, node: NodeContext) -> list[PlannedDevice]:
        seen.append((*rig.api.calls, *(f"VERSION {kind}" for kind in rig.cni.version_queries)))
        assert rig.store.all() == []  # nothing persisted before planning ends
        return plan_claim(inputs, node)

    monkeypatch.setattr(prepare_module, "plan_claim", planning)
    await _prepare(rig)
    # its own IPAM (host-local) is checked against the IP pools: they are read too, from the API server's
    # watch cache (a consistent list waits up to 100 ms for that cache on a busy cluster)
    assert seen == [("get_claim", "list_ippools (cached)", "VERSION host-local", "VERSION macvlan")]
    assert [r.plan.conflist["cniVersion"] for r in rig.store.for_claim(CLAIM.uid)] == ["1.0.0", "1.0.0"]


async def test_a_plugin_not_installed_here_is_refused_by_planning_naming_it(rig: ConfigureRig) -> None:
    rig.cni.missing = {"macvlan"}
    with pytest.raises(ConfigError, match="plugin type 'macvlan': no such plugin in"):
        await _prepare(rig)
    assert rig.store.all() == []


async def test_a_plugin_only_the_deviceclass_named_and_the_claim_replaced_need_not_be_installed(
    rig: ConfigureRig,
) -> None:
    """Versions are asked of every plugin the configs name, before they are merged: one that no chain
    ends up running is no reason to refuse the claim."""
    bridge = {**VALID_CONFIG, "config": {**VALID_CONFIG["config"], "plugins": [{"type": "bridge"}]}}
    claim = sample_claim(
        (sample_allocation(NIC, "net"),),
        (sample_config(bridge, source="FromClass"), sample_config(VALID_CONFIG)),
        name="claim-2",
        uid="u-2",
    )
    rig.api.add_claim(claim)
    rig.cni.missing = {"bridge"}
    await _prepare(rig, claim)
    [row] = rig.store.for_claim("u-2")
    assert [p["type"] for p in row.plan.conflist["plugins"]] == ["macvlan"]


async def test_a_second_prepare_answers_from_the_store_without_an_api_call(rig: ConfigureRig) -> None:
    first = await _prepare(rig)
    rig.api.calls.clear()
    assert await _prepare(rig) == first
    assert rig.api.calls == []


async def test_the_cni_version_is_lowered_to_what_the_installed_plugins_speak(rig: ConfigureRig) -> None:
    rig.cni.supported["macvlan"] = ["0.4.0"]
    await _prepare(rig)
    assert {r.plan.conflist["cniVersion"] for r in rig.store.for_claim(CLAIM.uid)} == {"0.4.0"}


async def test_a_claim_recreated_under_the_same_name_is_gone(rig: ConfigureRig) -> None:
    with pytest.raises(GoneError, match="has UID claim-uid-1, kubelet asked for old-uid"):
        await rig.preparer.prepare(CLAIM.namespace, CLAIM.name, "old-uid")
    assert rig.store.all() == []


@pytest.mark.parametrize(
    ("break_it", "error"),
    [
        ("config", ConfigError),
        ("plugin", CniError),
        ("version", ConfigError),
    ],
)
async def test_a_claim_that_cannot_work_stores_nothing(
    rig: ConfigureRig, break_it: str, error: type[Exception]
) -> None:
    if break_it == "config":
        rig.api.add_claim(sample_claim(CLAIM.results, (sample_config({**VALID_CONFIG, "bandwidth": "x"}),)))
    elif break_it == "plugin":
        rig.cni.fail_versions.append(CniError("macvlan", "VERSION", 999, "cannot run"))
    else:
        rig.cni.supported["macvlan"] = ["0.3.1"]
    with pytest.raises(error):
        await _prepare(rig)
    assert rig.store.all() == []


async def test_a_failure_is_reported_on_the_claims_devices_and_its_pod(rig: ConfigureRig) -> None:
    await rig.preparer.report_failure(CLAIM.namespace, CLAIM.name, CLAIM.uid, "config.plugins[0].master: no")
    assert [(e.pod, e.pod_uid, e.reason, e.message) for e in rig.api.events] == [
        ("pod-1", "pod-uid-1", "NetclaimPrepareFailed", "config.plugins[0].master: no")
    ]
    await rig.settle()
    assert [
        (e["device"], e.get("shareID"), e["conditions"][0]["status"], e["conditions"][0]["reason"])
        for e in rig.entries(REF)
    ] == [
        (NIC.name, "share-1", "False", "PrepareFailed"),  # the other driver's device is not ours to report
        (SECOND_NIC.name, None, "False", "PrepareFailed"),
    ]


async def test_a_failure_of_a_claim_replaced_meanwhile_is_not_reported(rig: ConfigureRig) -> None:
    await rig.preparer.report_failure(CLAIM.namespace, CLAIM.name, "old-uid", "no")
    await rig.settle()
    assert rig.api.events == []
    assert rig.entries(REF) == []


async def test_unprepare_releases_the_addresses_and_forgets_the_claim(rig: ConfigureRig) -> None:
    await _prepare(rig)
    await rig.hooks.run_pod_sandbox(rig.sandbox(), 30.0)
    assert len(rig.cni.leases) == 2
    await rig.settle()
    await rig.unpreparer.unprepare(CLAIM.namespace, CLAIM.name, CLAIM.uid)
    assert [c.command for c in rig.cni.calls] == ["ADD", "ADD", "DEL", "DEL"]
    assert rig.cni.leases == {}
    assert rig.store.all() == []
    await rig.settle()
    assert rig.entries(REF) == []
    await rig.unpreparer.unprepare(CLAIM.namespace, CLAIM.name, CLAIM.uid)  # kubelet asks again: fine
    assert [c.command for c in rig.cni.calls] == ["ADD", "ADD", "DEL", "DEL"]


async def test_unprepare_that_fails_for_a_moment_keeps_the_rows_for_kubelets_retry(rig: ConfigureRig) -> None:
    await _prepare(rig)
    await rig.hooks.run_pod_sandbox(rig.sandbox(), 30.0)
    rig.cni.fail_delete.append(StateStoreError("database is locked"))
    with pytest.raises(StateStoreError):
        await rig.unpreparer.unprepare(CLAIM.namespace, CLAIM.name, CLAIM.uid)
    assert len(rig.store.for_claim(CLAIM.uid)) == 2
    await rig.unpreparer.unprepare(CLAIM.namespace, CLAIM.name, CLAIM.uid)
    assert rig.store.all() == []
    assert rig.cni.leases == {}


async def test_unprepare_whose_del_can_never_succeed_still_lets_the_claim_go(rig: ConfigureRig) -> None:
    """A plugin that refuses its own config on DEL (or is gone, or no longer allowed) must not keep the
    claim and its pod for ever: the interface and the addresses are removed by hand, the rows forgotten,
    and the claim's status says what happened."""
    await _prepare(rig)
    sandbox = rig.sandbox()
    await rig.hooks.run_pod_sandbox(sandbox, 30.0)
    refused = CniError("macvlan", "DEL", 7, "invalid network config")
    rig.cni.fail_delete += [refused, refused]
    await rig.unpreparer.unprepare(CLAIM.namespace, CLAIM.name, CLAIM.uid)
    assert rig.store.all() == []
    assert rig.cni.leases == {}
    assert not [key for key in rig.netlink.interfaces if key[0] == sandbox.netns]
    await rig.settle()
    [entry, *_] = [d for d in rig.api.claims[(CLAIM.namespace, CLAIM.name)].devices_status]
    condition = entry["conditions"][0]
    assert (condition["status"], condition["reason"]) == ("False", "TeardownIncomplete")
    assert (
        "invalid network config" in condition["message"]
        and "released host-local addresses" in condition["message"]
    )


async def test_a_claim_of_another_pod_is_planned_for_its_own_pod(rig: ConfigureRig) -> None:
    other = sample_claim(
        (sample_allocation(NIC, share_id="share-2"),),
        (sample_config(VALID_CONFIG),),
        name="claim-2",
        uid="claim-uid-2",
        reserved_for=(ConsumerRef("pod-2", "pod-uid-2"),),
    )
    rig.api.add_claim(other)
    await _prepare(rig, other)
    assert [r.pod_uid for r in rig.store.for_claim("claim-uid-2")] == ["pod-uid-2"]
    assert rig.store.for_pod("pod-uid-1") == []


async def test_a_second_claim_of_the_pod_naming_an_interface_already_named_is_refused(
    rig: ConfigureRig,
) -> None:
    await _prepare(rig)  # net1 and net2 for pod-1
    clashing, distinct = (
        sample_claim(
            (sample_allocation(SECOND_NIC, "data"),),
            (sample_config({**VALID_CONFIG, "interfaceName": interface}, requests=("data",)),),
            name=f"claim-{interface}",
            uid=f"claim-uid-{interface}",
        )
        for interface in ("net2", "net3")
    )
    rig.api.add_claim(clashing)
    with pytest.raises(
        ConfigError,
        match=r"claim team-a/claim-net2: request data names interface net2, as claim "
        r"team-a/claim-1 of the same pod does; give one of them another interfaceName",
    ):
        await _prepare(rig, clashing)
    assert rig.store.for_claim(clashing.uid) == []
    rig.api.add_claim(distinct)
    await _prepare(rig, distinct)  # a third interface for the pod
    assert sorted(r.plan.interface_name for r in rig.store.for_pod("pod-uid-1")) == ["net1", "net2", "net3"]


async def test_reclaim_never_reads_the_claims_of_running_pods(rig: ConfigureRig) -> None:
    await _prepare(rig)
    await rig.hooks.run_pod_sandbox(rig.sandbox(), 30.0)
    rig.api.calls.clear()
    for _ in range(3):
        assert await rig.reclaimer.reclaim() == []
    assert rig.api.calls == []
    assert len(rig.store.for_claim(CLAIM.uid)) == 2


async def test_reclaim_unprepares_a_gone_claim_whose_unprepare_never_came(rig: ConfigureRig) -> None:
    """The pod went while the agent missed both StopPodSandbox and NodeUnprepareResources (kubelet lost
    its record, or the pod was force-deleted): its netns is gone, then its claim. One round to wait for
    kubelet, then the rows are unprepared as kubelet would have: DEL (host-local released), rows gone."""
    await _prepare(rig)
    sandbox = rig.sandbox()
    await rig.hooks.run_pod_sandbox(sandbox, 30.0)
    os.unlink(sandbox.netns)  # noqa: PTH108 - the sandbox's netns goes
    rig.api.calls.clear()
    assert await rig.reclaimer.reclaim() == []  # idle for the first time: kubelet's turn, nothing read
    assert rig.api.calls == []
    del rig.api.claims[(CLAIM.namespace, CLAIM.name)]
    assert await rig.reclaimer.reclaim() == [REF]
    assert [c.command for c in rig.cni.calls] == ["ADD", "ADD", "DEL", "DEL"]
    assert rig.cni.leases == {}
    assert rig.store.all() == []
    assert await rig.reclaimer.reclaim() == []


async def test_reclaim_keeps_an_idle_claim_that_exists_and_takes_one_recreated(rig: ConfigureRig) -> None:
    await _prepare(rig)  # prepared, its sandbox not started yet: idle, but the claim is there
    for _ in range(3):
        assert await rig.reclaimer.reclaim() == []
    assert len(rig.store.for_claim(CLAIM.uid)) == 2
    rig.api.add_claim(sample_claim(CLAIM.results, CLAIM.configs, uid="claim-uid-new"))
    assert await rig.reclaimer.reclaim() == [REF]
    assert rig.store.all() == []


async def test_reclaim_takes_the_rows_of_a_standalone_claim_whose_pod_is_gone(rig: ConfigureRig) -> None:
    """A claim that outlives its pod, reserved now for another pod (or none): the old pod's rows would be
    handed to the next pod by prepare's idempotent answer; they go."""
    await _prepare(rig)
    os.unlink(rig.sandbox().netns)  # noqa: PTH108 - a sandbox that never ran, or went
    assert await rig.reclaimer.reclaim() == []
    assert await rig.reclaimer.reclaim() == []  # still reserved for its pod: kept
    rig.api.add_claim(
        sample_claim(CLAIM.results, CLAIM.configs, reserved_for=(ConsumerRef("pod-2", "pod-uid-2"),))
    )
    assert await rig.reclaimer.reclaim() == [REF]
    assert rig.store.all() == []


async def test_a_claims_own_ipam_is_checked_against_every_pool_and_the_clusters_networks(
    rig: ConfigureRig,
) -> None:
    """VALID_CONFIG's host-local range (10.90.0.0/24) inside another's IPPool: refused naming the pool,
    with nothing taken; a claim naming no IPAM never lists the pools (a pod start costs no read more)."""
    rig.api.ippools["theirs"] = {
        "apiVersion": "netclaim.dev/v1alpha1",
        "kind": "IPPool",
        "metadata": {"name": "theirs"},
        "spec": {"ranges": [{"subnet": "10.90.0.0/16"}], "namespaces": ["team-b"]},
    }
    with pytest.raises(ConfigError, match=r"10\.90\.0\.0/24 overlaps 10\.90\.0\.0/16 \(IPPool theirs\)"):
        await _prepare(rig)
    assert "list_ippools (cached)" in rig.api.calls and rig.store.for_claim(CLAIM.uid) == []
    rig.preparer.node = replace(rig.preparer.node, reserved=(ipaddress.ip_network("10.90.0.0/20"),))
    rig.api.ippools.clear()
    with pytest.raises(
        ConfigError, match=r"overlaps 10\.90\.0\.0/20 \(the cluster's pod or Service network\)"
    ):
        await _prepare(rig)
    pool_only = dict(VALID_CONFIG)
    pool_only["config"] = {
        **VALID_CONFIG["config"],
        "plugins": [{"type": "macvlan", "master": "{{ device.ifName }}"}],
    }
    claim = sample_claim(
        (sample_allocation(NIC, "net"),),
        (sample_config(pool_only, requests=("net",)),),
        name="claim-2",
        uid="u-2",
    )
    rig.api.add_claim(claim)
    rig.api.calls.clear()
    await _prepare(rig, claim)
    assert [c for c in rig.api.calls if c.startswith("list_ippools")] == []

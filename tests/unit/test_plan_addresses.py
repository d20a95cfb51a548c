"""A claim's pool addresses in planning and in prepare/unprepare: which interface gets them, how, and when
they are released."""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import ipaddress
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from netclaim.agent.pods.guard import binding_of
from netclaim.agent.status import ClaimRef
from netclaim.core.devices.catalog import Device
from netclaim.core.ipam.addresses import Grant
from netclaim.core.ipam.ippool import ADDRESSES, POOLS_POOL, IPPool
from netclaim.core.node import PreparedDevice
from netclaim.core.objects import AllocatedDevice, Claim
from netclaim.core.plan import (
    POOL_IPAM,
    ClaimInputs,
    NodeContext,
    PlannedDevice,
    PoolAddresses,
    address_requests,
    claim_needs,
    plan_claim,
)
from netclaim.errors import (
    ApiUnavailableError,
    CniError,
    ConfigError,
    PoolExhaustedError,
    StateStoreError,
)
from tests.unit.fakes import (
    SAMPLE_CLUSTER,
    SAMPLE_DRIVER,
    SAMPLE_NODE,
    ConfigureRig,
    Recorder,
    configure_rig,
    every_version,
    recorded_guard,
    sample_allocation,
    sample_claim,
    sample_config,
    sample_device,
)

LAN3_SPEC: dict[str, Any] = {
    "network": "lan3",
    "ranges": [
        {"subnet": "10.10.3.0/24", "start": "10.10.3.10", "end": "10.10.3.250", "gateway": "10.10.3.1"},
        {"subnet": "fd00:10:3::/64"},
    ],
    "routes": [{"dst": "0.0.0.0/0", "gw": "10.10.3.1"}],
}
LAN3 = IPPool.from_api({"metadata": {"name": "lan3"}, "spec": LAN3_SPEC})


def _on_network(device: Device, network: str | None) -> Device:
    attributes = {k: v for k, v in device.attributes.items() if k != "netclaim.dev/network"}
    if network is not None:
        attributes["netclaim.dev/network"] = network
    return replace(device, attributes=attributes)


NIC = _on_network(sample_device("enp1s0"), "lan3")
SECOND_NIC = _on_network(sample_device("enp2s0"), "lan3")
POOL_DEVICE = AllocatedDevice("addr", SAMPLE_DRIVER, POOLS_POOL, "lan3", "share-a", {ADDRESSES: "1"})

CNI: dict[str, Any] = {  # a tenant's config leaving the addresses to the pool
    "apiVersion": "netclaim.dev/v1alpha1",
    "kind": "CNIConfig",
    "interfaceName": "net1",
    "config": {
        "cniVersion": "1.0.0",
        "name": "lan3",
        "plugins": [
            {"type": "macvlan", "master": "{{ device.ifName }}", "mode": "bridge"},
            {"type": "tuning", "mtu": 1400},
        ],
    },
}


def _cni(**changes: Any) -> dict[str, Any]:
    """CNI with fields of its first plugin changed."""
    config = copy.deepcopy(CNI)
    config["config"]["plugins"][0].update(changes)
    return config


def _addresses(**fields: Any) -> dict[str, Any]:
    return {"apiVersion": "netclaim.dev/v1alpha1", "kind": "AddressConfig", **fields}


def _claim(*configs: Any, results: tuple[AllocatedDevice, ...] | None = None, **options: Any) -> Claim:
    """A claim of NIC (request net) and lan3's device (request addr) with these configs (each a
    (parameters, requests) pair)."""
    found = results if results is not None else (sample_allocation(NIC, "net"), POOL_DEVICE)
    return sample_claim(found, tuple(sample_config(p, requests=r) for p, r in configs), **options)


DEFAULT_CONFIGS = ((CNI, ("net",)), (_addresses(), ("addr",)))


# --- address_requests ----------------------------------------------------------------------------------


def test_the_pool_addresses_go_to_the_claims_only_interface_request() -> None:
    [request] = address_requests(_claim(*DEFAULT_CONFIGS), SAMPLE_DRIVER)
    assert request.allocated == POOL_DEVICE
    assert request.interface_request == "net"
    assert request.static == {}


def test_a_pool_request_needs_no_address_config() -> None:
    [request] = address_requests(_claim((CNI, ("net",))), SAMPLE_DRIVER)
    assert (request.interface_request, request.static) == ("net", {})


def test_a_claim_without_pool_devices_asks_for_no_address() -> None:
    claim = _claim((CNI, ()), results=(sample_allocation(NIC, "net"),))
    assert address_requests(claim, SAMPLE_DRIVER) == []
    other_driver = replace(POOL_DEVICE, driver="gpu.example.com")
    claim = _claim((CNI, ()), results=(sample_allocation(NIC, "net"), other_driver))
    assert address_requests(claim, SAMPLE_DRIVER) == []


def test_static_addresses_are_collected_per_family() -> None:
    configs = ((CNI, ("net",)), (_addresses(addresses=["fd00:10:3::7", "10.10.3.17"]), ("addr",)))
    [request] = address_requests(_claim(*configs), SAMPLE_DRIVER)
    assert request.static == {4: ipaddress.ip_address("10.10.3.17"), 6: ipaddress.ip_address("fd00:10:3::7")}


def test_with_two_interface_requests_the_address_config_must_say_which() -> None:
    results = (sample_allocation(NIC, "net"), sample_allocation(SECOND_NIC, "net2"), POOL_DEVICE)
    with pytest.raises(ConfigError) as caught:
        address_requests(_claim(*DEFAULT_CONFIGS, results=results), SAMPLE_DRIVER)
    message = str(caught.value)
    assert message.startswith("claim team-a/claim-1: request addr takes addresses from IPPool lan3")
    assert "2 interface requests ['net', 'net2']" in message
    assert "interfaceRequest" in message
    chosen = ((CNI, ("net",)), (_addresses(interfaceRequest="net2"), ("addr",)))
    [request] = address_requests(_claim(*chosen, results=results), SAMPLE_DRIVER)
    assert request.interface_request == "net2"


def test_an_interface_request_that_is_no_interface_request_is_a_config_error() -> None:
    for target in ("nope", "addr"):  # "addr" is the pool request itself
        configs = ((CNI, ("net",)), (_addresses(interfaceRequest=target), ("addr",)))
        with pytest.raises(
            ConfigError,
            match=rf"AddressConfig.interfaceRequest '{target}' of request addr is not one of the claim's "
            r"interface requests \['net'\]",
        ):
            address_requests(_claim(*configs), SAMPLE_DRIVER)


def test_a_pool_request_alone_has_no_interface_to_configure() -> None:
    with pytest.raises(ConfigError, match=r"the claim has 0 interface requests \[\]"):
        address_requests(_claim((_addresses(), ()), results=(POOL_DEVICE,)), SAMPLE_DRIVER)


@pytest.mark.parametrize("request_name", ["addr", "addr/dual"])
def test_a_cni_config_aimed_at_the_pool_request_is_a_config_error(request_name: str) -> None:
    pool_device = replace(POOL_DEVICE, request=request_name)
    claim = _claim((CNI, ("net",)), (CNI, ("addr",)), results=(sample_allocation(NIC, "net"), pool_device))
    with pytest.raises(ConfigError) as caught:
        address_requests(claim, SAMPLE_DRIVER)
    assert str(caught.value) == (
        "claim team-a/claim-1 (allocation config[1]).opaque.parameters.kind: request "
        f"{request_name} takes addresses from IPPool lan3: its config is an AddressConfig, not a CNIConfig"
    )


def test_a_cni_config_for_every_request_is_not_the_pools() -> None:
    [request] = address_requests(_claim((CNI, ()), (_addresses(), ("addr",))), SAMPLE_DRIVER)
    assert request.interface_request == "net"


def test_a_claim_taking_pool_addresses_needs_the_pools_static_ipam() -> None:
    needs = claim_needs(_claim(*DEFAULT_CONFIGS), SAMPLE_DRIVER)
    assert [r.allocated.device for r in needs.addresses] == ["lan3"]
    assert POOL_IPAM in needs.plugin_types  # planning configures the granted addresses with it


# --- plan_claim with grants ----------------------------------------------------------------------------


def _grant(
    pool: IPPool = LAN3,
    addresses: tuple[str, ...] = ("10.10.3.17/24", "fd00:10:3::7/64"),
    target: str = "net",
) -> Grant:
    return Grant(POOL_DEVICE, pool, addresses, target)


def _plan(
    claim: Claim, grants: list[Grant], devices: tuple[Device, ...] = (NIC, SECOND_NIC)
) -> list[PlannedDevice]:
    published = {d.name: d for d in devices}
    node = NodeContext(SAMPLE_DRIVER, SAMPLE_NODE, published.get, reserved=SAMPLE_CLUSTER)
    return plan_claim(ClaimInputs(claim, every_version(claim), grants), node)


def test_the_granted_addresses_are_static_ipam_of_the_first_plugin() -> None:
    [planned] = _plan(_claim(*DEFAULT_CONFIGS), [_grant()])
    plugins = planned.plan.conflist["plugins"]
    assert plugins[0]["ipam"] == {
        "type": "static",
        "addresses": [
            {"address": "10.10.3.17/24", "gateway": "10.10.3.1"},
            {"address": "fd00:10:3::7/64"},  # its range names no gateway
        ],
        "routes": [{"dst": "0.0.0.0/0", "gw": "10.10.3.1"}],
    }
    assert plugins[0]["master"] == "enp1s0"
    assert plugins[1] == {"type": "tuning", "mtu": 1400}
    assert planned.plan.pool_addresses == (
        PoolAddresses(
            request="addr",
            pool=POOLS_POOL,
            device="lan3",
            share_id="share-a",
            ips=("10.10.3.17/24", "fd00:10:3::7/64"),
        ),
    )
    assert planned.allocated.request == "net"  # the pool's device has no plan of its own


def test_a_pool_without_routes_adds_none() -> None:
    pool = IPPool.from_api({"metadata": {"name": "lan3"}, "spec": {**LAN3_SPEC, "routes": []}})
    [planned] = _plan(_claim(*DEFAULT_CONFIGS), [_grant(pool, ("10.10.3.17/24",))])
    assert planned.plan.conflist["plugins"][0]["ipam"] == {
        "type": "static",
        "addresses": [{"address": "10.10.3.17/24", "gateway": "10.10.3.1"}],
    }


def test_without_grants_the_plan_is_as_before() -> None:
    [planned] = _plan(_claim(*DEFAULT_CONFIGS), [])
    assert "ipam" not in planned.plan.conflist["plugins"][0]
    assert planned.plan.pool_addresses == ()


def test_only_the_target_interface_gets_the_addresses() -> None:
    results = (sample_allocation(NIC, "net"), sample_allocation(SECOND_NIC, "net2"), POOL_DEVICE)
    configs = (
        (CNI, ("net",)),
        ({**CNI, "interfaceName": "net2", "config": {**CNI["config"], "name": "other"}}, ("net2",)),
    )
    planned = _plan(_claim(*configs, results=results), [_grant(target="net2")])
    by_request = {p.allocated.request: p.plan for p in planned}
    assert "ipam" not in by_request["net"].conflist["plugins"][0]
    assert by_request["net"].pool_addresses == ()
    assert by_request["net2"].conflist["plugins"][0]["ipam"]["type"] == "static"
    assert [p.ips for p in by_request["net2"].pool_addresses] == [("10.10.3.17/24", "fd00:10:3::7/64")]


@pytest.mark.parametrize(
    ("key", "refusal"),
    [
        ("ipam", r"config.plugins\[0\].ipam: the device's network is served by IPPool lan3"),
        ("IPAM", r"config.plugins\[0\].IPAM: write it 'ipam'"),
        ("Ipam", r"config.plugins\[0\].Ipam: write it 'ipam'"),
    ],
)
def test_a_first_plugin_with_its_own_ipam_is_a_config_error(key: str, refusal: str) -> None:
    own = {"type": "host-local", "ranges": [[{"subnet": "10.90.0.0/24"}]]}
    configs = ((_cni(**{key: own}), ("net",)), (_addresses(), ("addr",)))
    with pytest.raises(ConfigError, match=refusal):
        _plan(_claim(*configs), [_grant()])


def test_an_admin_ipam_beside_the_pools_addresses_is_a_config_error() -> None:
    own = {"type": "host-local", "ranges": [[{"subnet": "10.90.0.0/24"}]]}
    configs = ((_cni(ipam=own), ("net",)), (_addresses(), ("addr",)))
    claim = _claim(*configs)
    claim = dataclasses.replace(
        claim, configs=tuple(dataclasses.replace(c, source="FromClass") for c in claim.configs)
    )
    with pytest.raises(
        ConfigError,
        match=r"claim team-a/claim-1: request net: config.plugins\[0\].ipam: the claim takes its addresses "
        r"from IPPool lan3; leave ipam out",
    ):
        _plan(claim, [_grant()])


@pytest.mark.parametrize("network", ["lan4", None])
def test_a_pool_of_another_network_than_the_device_is_a_config_error(network: str | None) -> None:
    device = _on_network(NIC, network)
    with pytest.raises(
        ConfigError, match=rf"IPPool lan3 serves network 'lan3', device {NIC.name} is on {network!r}"
    ):
        _plan(_claim(*DEFAULT_CONFIGS), [_grant()], devices=(device,))


def test_a_pool_without_network_serves_any_device() -> None:
    pool = IPPool.from_api({"metadata": {"name": "lan3"}, "spec": {**LAN3_SPEC, "network": None}})
    [planned] = _plan(_claim(*DEFAULT_CONFIGS), [_grant(pool)], devices=(_on_network(NIC, None),))
    assert planned.plan.conflist["plugins"][0]["ipam"]["type"] == "static"


# --- Preparer: addresses taken at prepare, released when the claim ends --------------------------------

CLAIM = _claim(*DEFAULT_CONFIGS)
REF = ClaimRef(CLAIM.namespace, CLAIM.name, CLAIM.uid)


@pytest.fixture
def rig(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ConfigureRig]:
    built = configure_rig(tmp_path)
    built.catalog.update([NIC, SECOND_NIC])
    built.api.add_pool("lan3", LAN3_SPEC)
    built.api.add_claim(CLAIM)
    yield built
    built.store.close()


def _held(rig: ConfigureRig, uid: str = CLAIM.uid) -> list[str]:
    return sorted(a.address for a in rig.api.allocations.values() if a.claim_uid == uid)


async def _prepare(rig: ConfigureRig, claim: Claim = CLAIM) -> list[PreparedDevice]:
    return await rig.preparer.prepare(claim.namespace, claim.name, claim.uid)


async def test_prepare_takes_the_addresses_and_prepares_the_pools_device(rig: ConfigureRig) -> None:
    prepared = await _prepare(rig)
    assert prepared == [
        PreparedDevice("net", SAMPLE_NODE, NIC.name, None, (f"netclaim.dev/metadata={CLAIM.uid}_net",)),
        PreparedDevice("addr", POOLS_POOL, "lan3", "share-a", (f"netclaim.dev/metadata={CLAIM.uid}_addr",)),
    ]
    held = _held(rig)
    assert [ipaddress.ip_interface(a).version for a in held] == [4, 6]
    assert {a.node for a in rig.api.allocations.values()} == {SAMPLE_NODE}
    [row] = rig.store.for_claim(CLAIM.uid)
    ipam = row.plan.conflist["plugins"][0]["ipam"]
    assert sorted(a["address"] for a in ipam["addresses"]) == held
    assert [p.ips for p in row.plan.pool_addresses] == [tuple(held)]  # IPv4 first
    assert await _prepare(rig) == prepared  # kubelet asks again: from the store


async def test_the_claims_status_shows_its_addresses_from_prepare_on(rig: ConfigureRig) -> None:
    await _prepare(rig)
    await rig.settle()
    entries = {e["device"]: e for e in rig.entries(REF)}
    assert set(entries) == {NIC.name, "lan3"}
    entry = entries["lan3"]
    assert (entry["pool"], entry["shareID"]) == (POOLS_POOL, "share-a")
    [condition] = entry["conditions"]
    assert (condition["type"], condition["status"], condition["reason"]) == (
        "Ready",
        "True",
        "AddressAllocated",
    )
    assert entry["networkData"]["interfaceName"] == "net1"
    assert sorted(entry["networkData"]["ips"]) == _held(rig)


@pytest.mark.parametrize("break_it", ["own-ipam", "other-network"])
async def test_a_claim_that_fails_after_taking_addresses_leaves_none_behind(
    rig: ConfigureRig, break_it: str
) -> None:
    if break_it == "own-ipam":
        rig.api.add_claim(_claim((_cni(ipam={"type": "static"}), ("net",)), (_addresses(), ("addr",))))
    else:
        rig.catalog.update([_on_network(NIC, "lan4"), SECOND_NIC])
    with pytest.raises(ConfigError):
        await _prepare(rig)
    assert "create_ip_allocation" in rig.api.calls  # the addresses had been taken
    assert rig.api.allocations == {}
    assert rig.store.all() == []


async def test_a_plugin_that_cannot_run_fails_the_claim_before_any_address_is_taken(
    rig: ConfigureRig,
) -> None:
    """Addresses are the last thing gathered: the one step that takes something."""
    rig.cni.fail_versions.append(CniError("macvlan", "VERSION", 999, "cannot run"))
    with pytest.raises(CniError):
        await _prepare(rig)
    assert "create_ip_allocation" not in rig.api.calls
    assert rig.store.all() == []


async def test_a_release_that_fails_after_a_failed_prepare_keeps_the_first_error(
    rig: ConfigureRig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The API is away as the addresses are given back: the claim's own error is what kubelet sees; the
    retry reuses the addresses (or the reconciler frees them once the claim is gone)."""

    async def unreachable(claim_uid: str) -> list[str]:
        raise ApiUnavailableError("connection refused")

    monkeypatch.setattr(rig.preparer.gather.addresses, "release", unreachable)
    rig.catalog.update([_on_network(NIC, "lan4"), SECOND_NIC])  # planning refuses the claim
    with pytest.raises(ConfigError, match="IPPool lan3 serves network 'lan3'"):
        await _prepare(rig)
    held = _held(rig)
    assert len(held) == 2
    rig.catalog.update([NIC, SECOND_NIC])
    rig.api.calls.clear()
    await _prepare(rig)
    assert "create_ip_allocation" not in rig.api.calls
    assert _held(rig) == held


async def test_plans_the_disk_was_slow_to_take_keep_their_addresses_for_the_retry(rig: ConfigureRig) -> None:
    """The rows of a prepare that stopped waiting for the disk still land: had their addresses been given
    back, kubelet's retry would answer from those rows with addresses another claim may take."""
    rig.store.write_seconds = 0.0
    with pytest.raises(StateStoreError):
        await _prepare(rig)
    held = _held(rig)
    assert len(held) == 2
    rig.store.write_seconds = 5.0
    await rig.store.put()  # after the late write: a write of its kind, and those keep their order
    [row] = rig.store.for_claim(CLAIM.uid)
    assert sorted(ip for p in row.plan.pool_addresses for ip in p.ips) == held
    assert await _prepare(rig) == [
        PreparedDevice("net", SAMPLE_NODE, NIC.name, None),
        PreparedDevice("addr", POOLS_POOL, "lan3", "share-a"),
    ]


async def test_a_full_pool_fails_prepare_for_a_retry(rig: ConfigureRig) -> None:
    rig.api.add_pool("lan3", {**LAN3_SPEC, "ranges": [{"subnet": "10.10.3.0/32"}]})
    other = _claim(*DEFAULT_CONFIGS, name="claim-2", uid="claim-uid-2")
    rig.api.add_claim(other)
    await _prepare(rig, other)
    with pytest.raises(PoolExhaustedError):
        await _prepare(rig)
    assert _held(rig) == []
    assert _held(rig, "claim-uid-2") == ["10.10.3.0/32"]  # the other claim's address is not released


async def test_unprepare_of_a_standalone_claim_keeps_its_addresses_for_its_next_pod(
    rig: ConfigureRig,
) -> None:
    await _prepare(rig)
    held = _held(rig)
    await rig.unpreparer.unprepare(CLAIM.namespace, CLAIM.name, CLAIM.uid)
    assert rig.store.all() == []
    assert _held(rig) == held
    rig.api.calls.clear()
    await _prepare(rig)  # its next pod
    assert "create_ip_allocation" not in rig.api.calls
    assert _held(rig) == held


@pytest.mark.parametrize("how", ["ends with its pod", "deleted", "recreated"])
async def test_unprepare_leaves_a_pods_addresses_to_the_controllers_quarantine(
    rig: ConfigureRig, how: str
) -> None:
    """Other tenants' rules and Services named the addresses: another claim must not take them before
    those follow (netclaim.core.ipam.pools.Quarantine). The agent frees none at unprepare, and asks
    nothing."""
    if how == "ends with its pod":
        rig.api.add_claim(replace(CLAIM, owned_by_pod=True))
    await _prepare(rig)
    held = _held(rig)
    if how != "ends with its pod":
        del rig.api.claims[(CLAIM.namespace, CLAIM.name)]
    if how == "recreated":
        rig.api.add_claim(replace(CLAIM, uid="claim-uid-new"))
    rig.api.calls.clear()
    await rig.unpreparer.unprepare(CLAIM.namespace, CLAIM.name, CLAIM.uid)
    assert rig.api.calls == [] and _held(rig) == held and len(held) == 2
    assert rig.store.all() == []


async def test_prepare_writes_port_security_ahead_without_waiting_for_it(rig: ConfigureRig) -> None:
    """The child's binding is written while containerd makes the sandbox: NodePrepareResources does not
    wait for nft and tc (the attach does, if it comes first: tests/unit/test_attach.py)."""
    recorder, written = Recorder(), asyncio.Event()
    record = recorder.define

    async def slow(netns: str, script: str, *, check_only: bool = False) -> None:
        await written.wait()
        await record(netns, script)

    recorder.define = slow  # type: ignore[method-assign]
    rig.preparer.guard = recorded_guard(rig.store, recorder, rig.background)
    await _prepare(rig)  # answered with the write still waiting
    [row] = rig.store.for_claim(CLAIM.uid)
    assert recorder.sets == {} and not rig.preparer.guard.covers(row)
    written.set()
    await rig.background.settle()
    assert recorder.macs("netclaim-enp1s0") == {binding_of(row).mac}  # type: ignore[union-attr]
    assert rig.preparer.guard.covers(row)

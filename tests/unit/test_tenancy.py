"""A tenant's config can never reach the node: the allow-list, checked the way Go plugins read keys."""

from __future__ import annotations

import dataclasses
import ipaddress
from typing import Any, cast

import pytest

from netclaim.core.config.cniconfig import plugin_types
from netclaim.core.config.cnikeys import spelling_problems
from netclaim.core.config.tenancy import Target, tenant_problems
from netclaim.core.config.validate import ALLOWED_PLUGINS, problems
from netclaim.core.devices.catalog import Device
from netclaim.core.ipam.ippool import IPPool
from netclaim.core.objects import Claim, DeviceConfig
from netclaim.core.plan import ClaimInputs, NodeContext, plan_claim
from netclaim.errors import ConfigError
from tests.attacks import CORPUS_POOL, TENANT_RANGES, Attack, Nested, attacks, chain, macvlan, nested_value
from tests.unit.fakes import every_version, sample_allocation, sample_claim, sample_config

ATTACKS = attacks()
SHARED = Device(
    name="pci-0000-5e-00-0",
    if_name="enp0s10",
    shared=True,
    attributes={
        "netclaim.dev/ifName": "enp0s10",
        "netclaim.dev/kind": "physical",
        "netclaim.dev/childType": "macvlan",
    },
    tenant_ranges=TENANT_RANGES,
)
EXCLUSIVE = dataclasses.replace(SHARED, shared=False)
POOLS = (IPPool.from_api(CORPUS_POOL),)
CLUSTER = tuple(ipaddress.ip_network(n) for n in ("10.245.0.0/16", "10.96.0.0/16"))


def _deep(value: Any) -> Any:
    """`value` with every Nested placeholder of the corpus built for real (the planner reads JSON values)."""
    if isinstance(value, Nested):
        return nested_value()
    if isinstance(value, dict):
        return {k: _deep(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_deep(v) for v in value]
    return value


def _claim(
    config: dict[str, object], source: str, device: Device, extra: dict[str, object] | None = None
) -> Claim:
    parameters = {
        "apiVersion": "netclaim.dev/v1alpha1",
        "kind": "CNIConfig",
        "config": config,
        **(extra or {}),
    }
    return sample_claim((sample_allocation(device),), (sample_config(_deep(parameters), source),))


def _plan(
    config: dict[str, object], source: str, device: Device, extra: dict[str, object] | None = None
) -> None:
    claim = _claim(config, source, device, extra)
    node = NodeContext("netclaim.dev", "node-1", {device.name: device}.get, reserved=CLUSTER)
    plan_claim(ClaimInputs(claim, every_version(claim), pools=POOLS), node)


def test_the_attack_corpus_is_big_enough() -> None:
    print(f"attack corpus: {len(ATTACKS)} tenant configs")
    assert len(ATTACKS) >= 122  # 72 before the second round of tenant hardening, and 50 more
    assert len({a.name for a in ATTACKS}) == len(ATTACKS)


@pytest.mark.parametrize("attack", ATTACKS, ids=lambda a: a.name)
def test_every_attack_is_refused_at_prepare_naming_the_field(attack: Attack) -> None:
    with pytest.raises(ConfigError) as err:
        _plan(attack.config, "FromClaim", SHARED, attack.parameters)
    assert attack.field in str(err.value), str(err.value)


@pytest.mark.parametrize("attack", ATTACKS, ids=lambda a: a.name)
def test_the_same_config_from_the_admin_is_accepted_where_admins_may(attack: Attack) -> None:
    """The boundary is who writes the config: a DeviceClass's on an exclusive device may do all this."""
    if attack.parameters:  # the CNIConfig's own fields: decoded alike for both (names, nesting)
        return
    if attack.admin_may or attack.admin_refused_at_admission:
        _plan(attack.config, "FromClass", EXCLUSIVE)
        return
    misspelled = any(spelling_problems(attack.config))  # a key netclaim reads: for everyone
    if misspelled or not set(plugin_types(attack.config)) - ALLOWED_PLUGINS:  # the agent refuses it too
        with pytest.raises(ConfigError):
            _plan(attack.config, "FromClass", SHARED)


def test_a_valid_tenant_config_passes() -> None:
    tuning = {
        "type": "tuning",
        "mtu": 9000,
        "mac": "02:00:00:00:00:09",
        "sysctl": {"net.ipv4.conf.net1.arp_notify": "1"},
    }
    _plan(chain(macvlan(), tuning, {"type": "sbr"}), "FromClaim", SHARED)
    _plan(chain({"type": "host-device", "device": "{{ device.ifName }}"}), "FromClaim", EXCLUSIVE)


def test_host_device_on_a_shared_device_is_refused_even_for_the_admin() -> None:
    with pytest.raises(ConfigError, match="takes the whole NIC, but device pci-0000-5e-00-0 is shared"):
        _plan(chain({"type": "host-device", "device": "{{ device.ifName }}"}), "FromClass", SHARED)


def test_a_claim_writes_each_key_in_its_canonical_case_at_any_depth() -> None:
    value = chain(
        macvlan(master="enp0s10", ipam={"type": "host-local", "ranges": [[{"Subnet": "10.70.0.0/24"}]]})
    )
    value["Name"] = value.pop("name")
    assert sorted(tenant_problems(value, Target(if_name="enp0s10", shared=True))) == [
        "config.Name: write it 'name': a claim's keys must be in their canonical case",
        "config.plugins[0].ipam.ranges[0][0].Subnet: write it 'subnet': a claim's keys must be in their "
        "canonical case",
    ]


def test_checks_run_on_the_rendered_values() -> None:
    """A placeholder is no way around them: what is checked is what the plugin will read."""
    rendered = chain(macvlan(master="eth0"))
    problems = list(tenant_problems(rendered, Target(if_name="enp0s10", shared=True)))
    assert problems == [
        "config.plugins[0].master: 'eth0' is not the allocated device's interface 'enp0s10'; a claim "
        "may only name the device it was allocated (write {{ device.ifName }})"
    ]


def test_validate_applies_the_allow_list_offline_to_claims_not_to_device_classes() -> None:
    def manifest(kind: str, plugin: dict[str, object]) -> dict[str, object]:
        parameters = {"apiVersion": "netclaim.dev/v1alpha1", "kind": "CNIConfig", "config": chain(plugin)}
        config = [{"opaque": {"driver": "netclaim.dev", "parameters": parameters}}]
        spec = {"config": config} if kind == "DeviceClass" else {"devices": {"config": config}}
        return {"kind": kind, "metadata": {"name": "x"}, "spec": spec}

    uplink = macvlan(master="eth0", mtu="{{ device.mtu }}")
    assert [p.split(": ")[0] for p in problems(manifest("ResourceClaim", uplink))] == [
        "spec.devices.config[0].opaque.parameters.config.plugins[0].master"
    ]
    assert list(problems(manifest("ResourceClaim", macvlan(mtu="{{ device.mtu }}")))) == []
    assert list(problems(manifest("DeviceClass", uplink))) == []


ADMIN_IPAM = {"type": "host-local", "ranges": [[{"subnet": "10.10.1.0/24", "rangeStart": "10.10.1.100"}]]}


def _pinned_plan(pins: list[str], claim_parameters: dict[str, object]) -> dict[str, object]:
    """The planned conflist of a claim whose DeviceClass config pins `pins`."""
    admin = {
        "apiVersion": "netclaim.dev/v1alpha1",
        "kind": "CNIConfig",
        "pinned": pins,
        "config": chain({"type": "macvlan", "master": "{{ device.ifName }}", "ipam": ADMIN_IPAM}),
    }
    claim = dataclasses.replace(
        _claim({}, "FromClass", SHARED),
        configs=(
            DeviceConfig("FromClass", (), "netclaim.dev", admin),
            DeviceConfig(
                "FromClaim",
                (),
                "netclaim.dev",
                {"apiVersion": "netclaim.dev/v1alpha1", "kind": "CNIConfig", **claim_parameters},
            ),
        ),
    )
    node = NodeContext("netclaim.dev", "node-1", {SHARED.name: SHARED}.get, reserved=CLUSTER)
    [planned] = plan_claim(ClaimInputs(claim, every_version(claim)), node)
    return {"interface": planned.plan.interface_name, **planned.plan.conflist}


def test_a_claim_overriding_a_pinned_ipam_is_refused_naming_the_field() -> None:
    own_ipam = {"type": "host-local", "ranges": [[{"subnet": "10.10.1.0/24", "rangeStart": "10.10.1.1"}]]}
    with pytest.raises(ConfigError, match=r"config\.plugins\[0\]\.ipam: pinned by the DeviceClass"):
        _pinned_plan(["ipam"], {"config": chain(macvlan(ipam=own_ipam))})


def test_a_pinned_part_left_out_is_the_classs_and_may_be_restated() -> None:
    left_out = _pinned_plan(["ipam", "master"], {"config": chain({"type": "macvlan", "mode": "private"})})
    [plugin] = cast(list[dict[str, str]], left_out["plugins"])
    mac = plugin.pop("mac")  # chosen by netclaim: the NIC holds its children to it (configure.guard)
    assert plugin == {"type": "macvlan", "mode": "private", "ipam": ADMIN_IPAM, "master": "enp0s10"}
    assert int(mac.split(":")[0], 16) & 0x03 == 0x02  # locally administered unicast
    restated = _pinned_plan(["ipam"], {"config": chain(macvlan(ipam=ADMIN_IPAM))})
    assert restated["plugins"][0]["ipam"] == ADMIN_IPAM  # type: ignore[index]


def test_changing_the_interface_name_still_works_under_pins() -> None:
    assert _pinned_plan(["config", "ipam"], {"interfaceName": "data0"})["interface"] == "data0"


@pytest.mark.parametrize(
    ("pins", "claim_parameters", "field"),
    [
        (["config"], {"config": chain(macvlan())}, "config: the DeviceClass pinned its whole config"),
        (
            ["plugins"],
            {"config": chain(macvlan(), {"type": "tuning"})},
            "config.plugins: the DeviceClass pinned",
        ),
        (["interfaceName"], {"interfaceName": "data0"}, "interfaceName: pinned by the DeviceClass"),
        (["bandwidth"], {"bandwidth": "none"}, "bandwidth: pinned by the DeviceClass"),
        ([], {"pinned": ["ipam"]}, "pinned: only a DeviceClass config may pin"),
    ],
)
def test_other_pins_are_kept(pins: list[str], claim_parameters: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        _pinned_plan(pins, claim_parameters)


def test_validate_refuses_pins_outside_a_device_class() -> None:
    parameters = {"apiVersion": "netclaim.dev/v1alpha1", "kind": "CNIConfig", "pinned": ["ipam"]}
    claim = {
        "kind": "ResourceClaim",
        "metadata": {"name": "x"},
        "spec": {"devices": {"config": [{"opaque": {"driver": "netclaim.dev", "parameters": parameters}}]}},
    }
    assert list(problems(claim)) == [
        "spec.devices.config[0].opaque.parameters.pinned: "
        "only a DeviceClass config may pin parts of the config"
    ]

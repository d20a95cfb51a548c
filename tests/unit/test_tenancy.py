"""A tenant's config can never reach the node: the allow-list, checked the way Go plugins read keys."""

from __future__ import annotations

import dataclasses

import pytest

from netclaim.adapters.kube import AllocatedDevice, Claim, DeviceConfig, PodRef
from netclaim.api.tenancy import Target, case_duplicates, tenant_problems
from netclaim.api.validate import problems
from netclaim.configure.plan import plan_claim
from netclaim.errors import ConfigError
from netclaim.publish.devices import Device
from tests.attacks import Attack, attacks, chain, macvlan

ATTACKS = attacks()
SHARED = Device(
    name="pci-0000-5e-00-0",
    if_name="enp0s10",
    shared=True,
    attributes={"netclaim.dev/ifName": "enp0s10", "netclaim.dev/kind": "physical"},
)
EXCLUSIVE = dataclasses.replace(SHARED, shared=False)


def _claim(config: dict[str, object], source: str, device: Device) -> Claim:
    parameters = {"apiVersion": "netclaim.dev/v1alpha1", "kind": "CNIConfig", "config": config}
    return Claim(
        namespace="tenant",
        name="c",
        uid="uid-1",
        resource_version="1",
        allocated=True,
        results=(AllocatedDevice("net", "netclaim.dev", "node-1", device.name, "", {}),),
        configs=(DeviceConfig(source, (), "netclaim.dev", parameters),),
        reserved_for=(PodRef("p", "pod-uid"),),
        devices_status=(),
    )


def _plan(config: dict[str, object], source: str, device: Device) -> None:
    plan_claim(
        _claim(config, source, device), driver="netclaim.dev", node="node-1", device={device.name: device}.get
    )


def test_the_attack_corpus_is_big_enough() -> None:
    print(f"attack corpus: {len(ATTACKS)} tenant configs")
    assert len(ATTACKS) >= 60
    assert len({a.name for a in ATTACKS}) == len(ATTACKS)


@pytest.mark.parametrize("attack", ATTACKS, ids=lambda a: a.name)
def test_every_attack_is_refused_at_prepare_naming_the_field(attack: Attack) -> None:
    with pytest.raises(ConfigError) as err:
        _plan(attack.config, "FromClaim", SHARED)
    assert attack.field in str(err.value), str(err.value)


@pytest.mark.parametrize("attack", ATTACKS, ids=lambda a: a.name)
def test_the_same_config_from_the_admin_is_accepted_where_admins_may(attack: Attack) -> None:
    """The boundary is who writes the config: a DeviceClass's on an exclusive device may do all this."""
    if attack.admin_may:
        _plan(attack.config, "FromClass", EXCLUSIVE)
    else:
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


def test_case_duplicates_are_found_at_any_depth() -> None:
    value = {"a": [{"ipam": {"ranges": 1, "Ranges": 2}}], "A": 1}
    assert sorted(case_duplicates(value, "config")) == [
        "config.a[0].ipam: keys 'ranges' and 'Ranges' differ only in case; CNI plugins read them as one",
        "config: keys 'a' and 'A' differ only in case; CNI plugins read them as one",
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

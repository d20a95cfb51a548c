"""Policy decisions and the API's per-device limits."""

from __future__ import annotations

import logging
from dataclasses import replace

import msgspec
import pytest

from netclaim.core.config.publishpolicy import NO_POLICY, Bandwidth, Match, PublishPolicy, Rule
from netclaim.core.devices.catalog import ATTACHMENTS, BANDWIDTH, Capacity, DeviceCatalog, decide
from netclaim.core.devices.nic import NetworkInterface
from netclaim.core.devices.rules import load_policy, rule_problems
from netclaim.core.names import device_name, is_dns_label
from netclaim.core.plan import NicRecord

DRIVER = "netclaim.dev"


def nic(name: str, **facts: object) -> NetworkInterface:
    base: dict[str, object] = {
        "index": 2,
        "kind": "physical",
        "mac": "02:00:00:00:00:01",
        "mtu": 1500,
        "up": True,
        "virtual": False,
        "speed_bps": 10 * 2**30,
    }
    base.update(facts)
    return NetworkInterface(name=name, **base)  # type: ignore[arg-type]


def policy(*rules: Rule) -> PublishPolicy:
    return PublishPolicy(apiVersion="netclaim.dev/v1alpha1", kind="PublishPolicy", rules=list(rules))


def test_shared_nic_gets_bandwidth_and_attachments_with_request_policies() -> None:
    [decision] = decide([nic("enp0s10")], policy(Rule(bandwidth=Bandwidth(default="1Gi"))), DRIVER)
    assert decision.device is not None
    api = decision.device.to_api()
    assert api["allowMultipleAllocations"] is True
    assert api["capacity"][BANDWIDTH] == {
        "value": "10Gi",
        "requestPolicy": {"default": "1Gi", "validRange": {"min": "1Mi", "step": "1Mi"}},
    }
    assert api["capacity"][ATTACHMENTS]["value"] == "32"
    assert api["attributes"]["netclaim.dev/shared"] == {"bool": True}


def test_exclusive_nic_has_no_multiple_allocation_and_no_request_policy() -> None:
    [decision] = decide([nic("enp7s0")], policy(Rule(mode="exclusive")), DRIVER)
    assert decision.device is not None
    api = decision.device.to_api()
    assert "allowMultipleAllocations" not in api
    assert api["capacity"] == {BANDWIDTH: {"value": "10Gi"}}
    assert api["attributes"]["netclaim.dev/shared"] == {"bool": False}


def test_first_matching_rule_decides_and_unmatched_is_not_published() -> None:
    rules = policy(
        Rule(match=Match(names=["xcl*"]), mode="ignore"), Rule(match=Match(names=["enp*", "xcl*"]))
    )
    decisions = {
        d.interface.name: d for d in decide([nic("xcl0"), nic("enp1s0"), nic("eth9")], rules, DRIVER)
    }
    assert decisions["xcl0"].device is None and "ignores" in decisions["xcl0"].reason
    assert decisions["enp1s0"].device is not None
    assert decisions["eth9"].device is None and decisions["eth9"].reason == "no policy rule matches"


def test_never_published_interfaces_stay_out_whatever_the_rules() -> None:
    [decision] = decide(
        [nic("eth0", never_publish="carries the node's default route")], policy(Rule()), DRIVER
    )
    assert decision.device is None and "default route" in decision.reason


def test_pci_nics_are_named_by_bus_address_with_standard_topology_attributes() -> None:
    interface = nic("enp94s0", pci_address="0000:5e:00.0", pcie_root="pci0000:5d", numa_node=1)
    [decision] = decide([interface], policy(Rule()), DRIVER)
    assert decision.device is not None and decision.device.name == "pci-0000-5e-00-0"
    attributes = decision.device.attributes
    assert attributes["resource.kubernetes.io/pcieRoot"] == "pci0000:5d"
    assert attributes["resource.kubernetes.io/pciBusID"] == "0000:5e:00.0"
    assert attributes["netclaim.dev/numaNode"] == attributes["resource.kubernetes.io/numaNode"] == 1


@pytest.mark.parametrize("name", ["Hot_NIC.1", "ENP1", "a.b", "X" * 15, "-lead"])
def test_names_that_are_not_dns_labels_are_encoded(name: str) -> None:
    encoded = device_name(name)
    assert is_dns_label(encoded) and encoded != name
    assert device_name(name) == encoded  # stable


def test_values_over_the_limits_are_dropped_with_a_log_line(caplog: pytest.LogCaptureFixture) -> None:
    extras = {f"example.com/extra{i}": i for i in range(30)} | {"example.com/long": "x" * 65}
    rule = Rule(attributes=extras)
    with caplog.at_level(logging.WARNING):
        [decision] = decide([nic("enp1s0")], policy(rule), DRIVER)
    assert decision.device is not None
    assert len(decision.device.attributes) + len(decision.device.capacity) == 32
    assert "example.com/long" not in decision.device.attributes
    assert "netclaim.dev/ifName" in decision.device.attributes  # standard attributes come first
    assert any("example.com/long dropped" in r.getMessage() for r in caplog.records)


def test_admin_attributes_cannot_replace_standard_ones() -> None:
    problems = list(rule_problems(policy(Rule(attributes={"netclaim.dev/ifName": "x", "shared": False}))))
    assert problems == [
        "rules[0].attributes.netclaim.dev/ifName: is a standard attribute netclaim sets itself",
        "rules[0].attributes.shared: is a standard attribute netclaim sets itself",
    ]


def test_a_shared_nic_without_a_speed_gets_no_bandwidth_and_a_log_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="netclaim.core.devices.catalog"):
        [shared] = decide([nic("enp1s0", speed_bps=None)], policy(Rule()), DRIVER)
    assert shared.device is not None and set(shared.device.capacity) == {ATTACHMENTS}
    [record] = caplog.records
    assert record.getMessage() == (
        "interface enp1s0: no link speed and no bandwidth.total in the policy: no bandwidth published"
    )
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="netclaim.core.devices.catalog"):
        [exclusive] = decide([nic("enp1s0", speed_bps=None)], policy(Rule(mode="exclusive")), DRIVER)
    assert exclusive.device is not None and exclusive.device.capacity == {}
    assert caplog.records == [], "an exclusive NIC needs no bandwidth"


def test_the_policy_total_replaces_the_link_speed_and_caps_the_default() -> None:
    rule = Rule(bandwidth=Bandwidth(total="50Mi", default="100Mi", min="1Mi"))
    [decision] = decide([nic("enp1s0", speed_bps=None)], policy(rule), DRIVER)
    assert decision.device is not None
    assert decision.device.capacity[BANDWIDTH] == Capacity(50 * 2**20, 50 * 2**20, 2**20, 2**20)


def test_an_inventory_value_over_64_characters_is_dropped(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        [decision] = decide([nic("enp1s0", driver="d" * 65)], policy(Rule()), DRIVER)
    assert decision.device is not None and "netclaim.dev/driver" not in decision.device.attributes
    assert decision.device.attributes["netclaim.dev/ifName"] == "enp1s0"
    assert [r.getMessage() for r in caplog.records] == [
        "device enp1s0: attribute netclaim.dev/driver dropped: 65 characters > 64"
    ]


def test_two_interfaces_with_one_device_name_publish_only_the_first(caplog: pytest.LogCaptureFixture) -> None:
    first = nic("enp94s0", pci_address="0000:5e:00.0")
    renamed = nic("eth7", index=7, pci_address="0000:5e:00.0")  # e.g. a declared override gone wrong
    other = nic("enp95s0", pci_address="0000:5f:00.0")
    with caplog.at_level(logging.WARNING):
        decisions = decide([first, renamed, other], policy(Rule()), DRIVER)
    assert [d.device.name if d.device else None for d in decisions] == [
        "pci-0000-5e-00-0",
        None,
        "pci-0000-5f-00-0",
    ]
    assert decisions[1].reason == "device name pci-0000-5e-00-0 already taken"
    assert decisions[0].device is not None and decisions[0].device.if_name == "enp94s0"
    assert [r.getMessage() for r in caplog.records] == [
        "two interfaces map to device pci-0000-5e-00-0 (enp94s0, eth7); keeping the first"
    ]


@pytest.mark.parametrize("mode", ["shared", "exclusive"])
def test_a_nic_in_a_pod_is_published_from_its_plan_record_as_it_was(mode: str) -> None:
    """A whole NIC inside a pod is gone from the node: the agent publishes it from the stored plan's
    record, after a restart too, exactly as before (its tenant ranges, which only bound planning, are not
    kept)."""
    ranges = ["10.1.0.0/16"]
    attributes = {"example.com/rack": "r1", "example.com/tier": 2}
    rule = Rule(mode=mode, attributes=attributes, tenantRanges=ranges)  # type: ignore[arg-type]
    [decision] = decide([nic("enp1s0", pci_address="0000:5e:00.0")], policy(rule), DRIVER)
    assert decision.device is not None
    record = msgspec.json.encode(NicRecord.of(decision.device))  # the store keeps JSON
    stored = msgspec.json.decode(record, type=NicRecord)
    assert stored.published().to_api() == decision.device.to_api()
    assert stored.published() == replace(decision.device, tenant_ranges=())
    assert stored.pci_address == "0000:5e:00.0"


def test_the_catalog_holds_exactly_the_last_published_devices() -> None:
    catalog = DeviceCatalog()
    assert catalog.get("enp1s0") is None
    decisions = decide([nic("enp1s0"), nic("enp2s0")], policy(Rule()), DRIVER)
    catalog.update([d.device for d in decisions if d.device is not None])
    enp1s0 = catalog.get("enp1s0")
    assert enp1s0 is not None and enp1s0.if_name == "enp1s0"
    [enp2s0] = [d.device for d in decisions if d.device is not None and d.device.name == "enp2s0"]
    catalog.update([enp2s0])
    assert catalog.get("enp1s0") is None and catalog.get("enp2s0") is enp2s0


# --- policy.py: what test_policy.py leaves out -------------------------------------------------------


def test_without_a_policy_file_nothing_is_published_and_each_nic_says_why() -> None:
    assert load_policy(None) is NO_POLICY
    decisions = decide([nic("enp1s0"), nic("veth0", virtual=True)], load_policy(None), DRIVER)
    assert [(d.interface.name, d.device, d.reason) for d in decisions] == [
        ("enp1s0", None, "no policy rule matches"),
        ("veth0", None, "no policy rule matches"),
    ]


def test_rule_problems_name_unknown_match_attributes_and_kubernetes_own_domain() -> None:
    rules = policy(
        Rule(match=Match(attributes={"speed": 10000, "colour": "red", "rack": "r1"})),
        Rule(attributes={"resource.kubernetes.io/pcieRoot": "pci0000:00", "example.com/rack": "r1"}),
    )
    problems = list(rule_problems(rules))
    assert len(problems) == 2
    assert problems[0].startswith(
        "rules[0].match.attributes: unknown attributes ['colour', 'rack']; known: ["
    )
    assert "'speed'" in problems[0]
    assert problems[1] == (
        "rules[1].attributes.resource.kubernetes.io/pcieRoot: "
        "the resource.kubernetes.io domain is Kubernetes' own"
    )


def test_match_attributes_select_by_equality() -> None:
    rules = policy(Rule(match=Match(attributes={"speed": 25000})), Rule(mode="ignore"))
    fast, slow = nic("enp1s0", speed_bps=25 * 10**9), nic("enp2s0", speed_bps=10**10)
    decisions = decide([fast, slow], rules, DRIVER)
    assert decisions[0].reason == "policy rule 0: shared"
    assert decisions[1].reason == "policy rule 1 ignores it"

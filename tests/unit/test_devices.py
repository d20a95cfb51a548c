"""Policy decisions and the API's per-device limits."""

from __future__ import annotations

import logging

import pytest

from netclaim.api.publishpolicy import Bandwidth, Match, PublishPolicy, Rule
from netclaim.names import device_name, is_dns_label
from netclaim.publish.devices import ATTACHMENTS, BANDWIDTH, decide
from netclaim.publish.inventory import NetworkInterface
from netclaim.publish.policy import rule_problems

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
    assert attributes["netclaim.dev/numaNode"] == 1


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

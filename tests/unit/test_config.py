"""The netclaim.dev/v1alpha1 config API: strict decoding, merging, placeholders; errors name the field."""

from __future__ import annotations

from typing import Any

import pytest

from netclaim.core.config.cniconfig import CNIConfig, SourcedConfig, decode, merge
from netclaim.core.config.placeholders import ScalarValue, render
from netclaim.errors import ConfigError
from tests.corpus import DELETE, VALID_CONFIG, mutated

LOCATION = "claim default/c config[0].opaque.parameters"


def _with(path: list[str | int], value: Any) -> dict[str, Any]:
    return mutated(VALID_CONFIG, tuple(path), value)  # type: ignore[no-any-return]


def test_good_config_decodes() -> None:
    config = decode(VALID_CONFIG, LOCATION)
    assert isinstance(config, CNIConfig)
    assert config.interfaceName == "net1" and config.config is not None


@pytest.mark.parametrize(
    ("parameters", "expected"),
    [
        (_with(["apiVersion"], "netclaim.dev/v1"), f"{LOCATION}.apiVersion: 'netclaim.dev/v1' is not"),
        (
            _with(["kind"], "Macvlan"),
            f"{LOCATION}.kind: 'Macvlan' is not one of ['CNIConfig', 'AddressConfig']",
        ),
        (_with(["colour"], "red"), f"{LOCATION}.colour: unknown field"),
        (_with(["interfaceName"], "a/b"), f"{LOCATION}.interfaceName: 'a/b' is not a usable interface name"),
        (_with(["interfaceName"], "lo"), f"{LOCATION}.interfaceName: 'lo' is taken inside the pod"),
        (_with(["interfaceName"], "x" * 16), f"{LOCATION}.interfaceName"),
        (_with(["bandwidth"], "max"), f"{LOCATION}.bandwidth"),
        (
            _with(["config", "plugins", 0, "type"], "../bin/sh"),
            f"{LOCATION}.config.plugins[0].type: '../bin/sh'",
        ),
        (
            _with(["config", "plugins", 0, "type"], "/usr/lib/cni/macvlan"),
            f"{LOCATION}.config.plugins[0].type",
        ),
        (_with(["config", "plugins", 0, "ipam", "type"], "a/b"), f"{LOCATION}.config.plugins[0].ipam.type"),
        (
            _with(["config", "plugins", 0, "ipam", "ranges"], [[{"subnet": "10.10.1.0/33"}]]),
            f"{LOCATION}.config.plugins[0].ipam.ranges[0][0].subnet: '10.10.1.0/33' is not a CIDR",
        ),
        (
            _with(["config", "plugins", 0, "ipam", "ranges"], [[{"subnet": "10.10.1.0"}]]),
            f"{LOCATION}.config.plugins[0].ipam.ranges[0][0].subnet: '10.10.1.0' is not a CIDR",
        ),
        (
            _with(["config", "plugins", 0, "ipam", "routes"], [{"dst": "default"}]),
            f"{LOCATION}.config.plugins[0].ipam.routes[0].dst",
        ),
        (
            _with(["config", "plugins", 0, "master"], "{{ device.ifName"),
            f"{LOCATION}.config.plugins[0].master: malformed placeholder",
        ),
        (
            _with(["config", "plugins", 0, "master"], "{{ host.uplink }}"),
            f"{LOCATION}.config.plugins[0].master: unknown placeholder",
        ),
        (_with(["config", "plugins", 0, "runtimeConfig"], {}), f"{LOCATION}.config.plugins[0].runtimeConfig"),
        (_with(["config", "cniVersion"], "2.0.0"), f"{LOCATION}.config.cniVersion: '2.0.0'"),
        (_with(["config", "name"], DELETE), f"{LOCATION}.config.name: required"),
        (_with(["config", "plugins"], []), f"{LOCATION}.config.plugins: a non-empty list"),
        ("not an object", f"{LOCATION}: parameters must be an object"),
    ],
)
def test_bad_configs_name_the_field(parameters: Any, expected: str) -> None:
    with pytest.raises(ConfigError) as err:
        decode(parameters, LOCATION)
    assert expected in str(err.value), str(err.value)


def test_single_plugin_config_becomes_a_list() -> None:
    single = _with(
        ["config"],
        {"cniVersion": "1.0.0", "name": "x", "type": "host-device", "device": "{{ device.ifName }}"},
    )
    effective = merge([SourcedConfig(decode(single, LOCATION), "FromClaim", LOCATION)], "nic")
    assert effective.cni == {
        "cniVersion": "1.0.0",
        "name": "x",
        "plugins": [{"type": "host-device", "device": "{{ device.ifName }}"}],
    }


def test_claim_overrides_the_fields_it_sets_over_the_class() -> None:
    admin = decode(VALID_CONFIG, "class")
    user = decode(
        {"apiVersion": "netclaim.dev/v1alpha1", "kind": "CNIConfig", "interfaceName": "data0"}, "claim"
    )
    effective = merge(
        [SourcedConfig(admin, "FromClass", "class"), SourcedConfig(user, "FromClaim", "claim")], "nic"
    )
    assert effective.interface_name == "data0"
    assert effective.cni_from_admin is True and effective.bandwidth == "enforce"


def test_no_cni_config_anywhere_is_an_error_naming_the_request() -> None:
    user = decode({"apiVersion": "netclaim.dev/v1alpha1", "kind": "CNIConfig"}, "claim")
    with pytest.raises(ConfigError, match=r"request nic: no netclaim\.dev CNIConfig"):
        merge([SourcedConfig(user, "FromClaim", "claim")], "nic")


def test_placeholders_render_typed_and_name_missing_attributes() -> None:
    values: dict[str, ScalarValue] = {"device.ifName": "ens1f0", "consumed.bandwidth": 5 * 2**30}
    rendered = render(
        {"master": "{{device.ifName}}", "rate": "{{ consumed.bandwidth }}", "note": "on {{ device.ifName }}"},
        values,
    )
    assert rendered == {"master": "ens1f0", "rate": 5 * 2**30, "note": "on ens1f0"}
    with pytest.raises(
        ConfigError, match=r"plugins\[0\]\.master: the allocated device has no attribute 'vlan'"
    ):
        render({"plugins": [{"master": "{{ device.vlan }}"}]}, values)


def test_a_config_nested_two_thousand_deep_is_a_clear_error_naming_it() -> None:
    deep: object = "x"
    for _ in range(2000):
        deep = {"a": [deep]}
    parameters = {**VALID_CONFIG, "config": {**VALID_CONFIG["config"], "extra": deep}}
    with pytest.raises(
        ConfigError, match=r"^claim ns/c\.config\.extra\.a\[0\]\.a.*…: nested deeper than 32 levels$"
    ):
        decode(parameters, "claim ns/c")


@pytest.mark.parametrize("name", ["net1\n", "net1\r", "\nnet1", "net1\t"])
def test_names_are_matched_whole_a_trailing_newline_is_no_name(name: str) -> None:
    with pytest.raises(ConfigError, match=r"interfaceName: .* is not a usable interface name"):
        decode({**VALID_CONFIG, "interfaceName": name}, "claim ns/c")

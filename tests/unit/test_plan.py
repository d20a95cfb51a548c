"""Planning a claim: which devices, which config, what a user may reach on the host, and the CNI version."""

from __future__ import annotations

import copy
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from netclaim.core.devices.catalog import ATTACHMENTS, Capacity, Device
from netclaim.core.objects import Claim, ConsumerRef, DeviceConfig
from netclaim.core.plan import (
    AttachPlan,
    ClaimInputs,
    NicRecord,
    NodeContext,
    PlannedDevice,
    PluginVersions,
    claim_needs,
    negotiate,
    plan_claim,
    with_node_defaults,
)
from netclaim.errors import ConfigError
from tests.corpus import VALID_CONFIG
from tests.unit.fakes import (
    SAMPLE_CLUSTER,
    SAMPLE_DRIVER,
    SAMPLE_NODE,
    every_version,
    sample_allocation,
    sample_claim,
    sample_config,
    sample_device,
)

NIC = sample_device("enp1s0", mtu=9000, mac="52:54:00:aa:bb:cc")
OTHER_NIC = sample_device("enp2s0")


def _plan(
    claim: Claim, devices: tuple[Device, ...] = (NIC, OTHER_NIC), host_local_dir: Path | None = None
) -> list[PlannedDevice]:
    published = {d.name: d for d in devices}
    node = NodeContext(SAMPLE_DRIVER, SAMPLE_NODE, published.get, host_local_dir, SAMPLE_CLUSTER)
    return plan_claim(ClaimInputs(claim, every_version(claim)), node)


def _config(**changes: Any) -> dict[str, Any]:
    """VALID_CONFIG with top-level fields changed (None: removed)."""
    config = copy.deepcopy(VALID_CONFIG)
    for key, value in changes.items():
        if value is None:
            del config[key]
        else:
            config[key] = value
    return config


def _cni(plugin_changes: dict[str, Any] | None = None, **ipam_changes: Any) -> dict[str, Any]:
    """VALID_CONFIG's CNI config with its plugin's (and that plugin's ipam's) fields changed."""
    cni: dict[str, Any] = copy.deepcopy(VALID_CONFIG["config"])
    cni["plugins"][0].update(plugin_changes or {})
    cni["plugins"][0]["ipam"].update(ipam_changes)
    return cni


def _only_plan(claim: Claim, host_local_dir: Path | None = None) -> AttachPlan:
    [planned] = _plan(claim, host_local_dir=host_local_dir)
    return planned.plan


def test_a_claim_is_planned_from_its_config_and_the_published_device() -> None:
    claim = sample_claim((sample_allocation(NIC, bandwidth="250M"),), (sample_config(VALID_CONFIG),))
    [planned] = _plan(claim)
    assert planned.allocated == claim.results[0]
    plan = planned.plan
    assert plan.interface_name == "net1"
    assert plan.nic == NicRecord.of(NIC)
    assert plan.shared
    assert plan.bandwidth_bps == 250_000_000
    assert plan.conflist["plugins"][0]["master"] == "enp1s0"  # {{ device.ifName }}
    assert plan.conflist["name"] == "corpus-net"


@pytest.mark.parametrize(
    ("ipam", "ipv6"),
    [
        ({"ranges": [[{"subnet": "10.90.0.0/24", "gateway": "10.90.0.1"}]]}, False),
        ({"ranges": [[{"subnet": "10.90.0.0/24"}], [{"subnet": "fd00:79::/64"}]]}, True),
        ({"type": "static", "addresses": [{"address": "fd00::5/64"}]}, True),
        ({"routes": [{"dst": "::/0"}]}, True),
        ({"dataDir": "/var/lib/x:y", "range": "10.9.0.0/16"}, False),
    ],
)
def test_a_plan_may_get_ipv6_when_its_ipam_names_an_ipv6_address_or_network(
    ipam: dict[str, Any], ipv6: bool
) -> None:
    """What decides whether the ADD runs without duplicate address detection (docs/ipam.md)."""
    claim = sample_claim(
        (sample_allocation(NIC),), (sample_config(_config(config=_cni(**ipam)), "FromClass"),)
    )
    assert _only_plan(claim).may_get_ipv6 is ipv6


@pytest.mark.parametrize(
    ("plugins", "ipam", "together"),
    [
        (["macvlan"], {}, True),
        (["macvlan", "tuning"], {}, False),  # tuning is no interface maker: run alone
        (["macvlan", "sbr"], {}, False),  # the namespace's rules and routes, shared with siblings
        (["macvlan"], {"type": "dhcp"}, False),  # a daemon's leases
        (["macvlan"], {"type": "whereabouts"}, False),
        (["macvlan"], {"type": "static", "addresses": [{"address": "10.1.0.5/24"}]}, True),
        (["macvlan"], {"ranges": [[{"subnet": "fd00:1::/64"}]]}, False),  # DAD swapped around the ADD
    ],
)
def test_a_plan_runs_beside_its_siblings_only_when_its_chain_touches_nothing_they_share(
    plugins: list[str], ipam: dict[str, Any], together: bool
) -> None:
    cni: dict[str, Any] = copy.deepcopy(VALID_CONFIG["config"])
    first = cni["plugins"][0]
    if "type" in ipam:
        first["ipam"] = ipam
    else:
        first["ipam"].update(ipam)
    cni["plugins"] = [first, *({"type": kind} for kind in plugins[1:])]
    claim = sample_claim((sample_allocation(NIC),), (sample_config(_config(config=cni), "FromClass"),))
    assert _only_plan(claim).runs_beside_siblings is together


@pytest.mark.parametrize(
    ("bandwidth_mode", "source", "consumed", "expected"),
    [
        ("enforce", "FromClaim", "1G", 1_000_000_000),
        ("none", "FromClass", "1G", None),
        ("enforce", "FromClaim", None, None),
    ],
)
def test_bandwidth_is_shaped_only_when_enforced_and_consumed(
    bandwidth_mode: str, source: str, consumed: str | None, expected: int | None
) -> None:
    claim = sample_claim(
        (sample_allocation(NIC, bandwidth=consumed),),
        (sample_config(_config(bandwidth=bandwidth_mode), source),),
    )
    assert _only_plan(claim).bandwidth_bps == expected


def test_a_claim_cannot_turn_the_shaping_of_its_share_off() -> None:
    claim = sample_claim(
        (sample_allocation(NIC, bandwidth="1G"),), (sample_config(_config(bandwidth="none")),)
    )
    with pytest.raises(ConfigError, match=r"opaque\.parameters\.bandwidth: a claim cannot turn shaping off"):
        _plan(claim)


def test_only_this_drivers_devices_and_configs_are_planned() -> None:
    claim = sample_claim(
        (sample_allocation(NIC), sample_allocation(OTHER_NIC, "gpu", driver="gpu.example.com")),
        (sample_config(VALID_CONFIG), DeviceConfig("FromClaim", (), "gpu.example.com", {"not": "ours"})),
    )
    [planned] = _plan(claim)
    assert planned.allocated.device == NIC.name


def test_an_unallocated_claim_is_a_config_error() -> None:
    claim = sample_claim((), (), allocated=False)
    with pytest.raises(ConfigError, match="claim team-a/claim-1 is not allocated"):
        _plan(claim)


@pytest.mark.parametrize("pods", [0, 2])
def test_a_claim_must_be_reserved_for_exactly_one_pod(pods: int) -> None:
    reserved = tuple(ConsumerRef(f"pod-{i}", f"uid-{i}") for i in range(pods))
    claim = sample_claim((sample_allocation(NIC),), (sample_config(VALID_CONFIG),), reserved_for=reserved)
    with pytest.raises(ConfigError, match=f"reserved for {pods} pods.*ResourceClaimTemplate"):
        _plan(claim)


def test_a_device_of_another_node_is_a_config_error() -> None:
    claim = sample_claim((sample_allocation(NIC, pool="node-2"),), (sample_config(VALID_CONFIG),))
    with pytest.raises(ConfigError, match=f"device node-2/{NIC.name} is not on node {SAMPLE_NODE}"):
        _plan(claim)


def test_two_requests_naming_the_same_interface_are_a_config_error() -> None:
    claim = sample_claim(
        (sample_allocation(NIC, "first"), sample_allocation(OTHER_NIC, "second")),
        (sample_config(VALID_CONFIG),),
    )
    with pytest.raises(ConfigError, match="requests first and second both name interface net1"):
        _plan(claim)


def test_requests_with_their_own_interface_names_are_planned_each() -> None:
    claim = sample_claim(
        (sample_allocation(NIC, "first"), sample_allocation(OTHER_NIC, "second")),
        (
            sample_config(VALID_CONFIG),
            sample_config(_config(interfaceName="net2", config=None), requests=("second",)),
        ),
    )
    planned = _plan(claim)
    assert [(p.allocated.request, p.plan.interface_name) for p in planned] == [
        ("first", "net1"),
        ("second", "net2"),
    ]
    assert planned[1].plan.conflist["plugins"][0]["master"] == OTHER_NIC.if_name


def test_a_config_for_a_parent_request_applies_to_its_subrequests() -> None:
    claim = sample_claim(
        (sample_allocation(NIC, "net/fast"),),
        (
            sample_config(VALID_CONFIG),
            sample_config(_config(interfaceName="fast0", config=None), requests=("net",)),
            sample_config(_config(interfaceName="other0", config=None), requests=("other",)),
        ),
    )
    assert _only_plan(claim).interface_name == "fast0"


def test_a_device_the_node_no_longer_publishes_is_a_config_error() -> None:
    claim = sample_claim((sample_allocation(NIC),), (sample_config(VALID_CONFIG),))
    with pytest.raises(ConfigError, match=f"device {NIC.name} is not published by this node"):
        _plan(claim, devices=())


@pytest.mark.parametrize(
    ("cni", "field"),
    [
        (_cni({"master": "eth0"}), r"config\.plugins\[0\]\.master: 'eth0' is not the allocated device"),
        (_cni({"Master": "eth0"}), r"config\.plugins\[0\]\.Master: write it 'master'"),
        (_cni({"device": "enp2s0"}), r"config\.plugins\[0\]\.device: not a field a claim may set here"),
        (_cni(dataDir="/var/lib/mine"), r"config\.plugins\[0\]\.ipam\.dataDir: not a field a claim may set"),
        (_cni(datadir="/var/lib/mine"), r"config\.plugins\[0\]\.ipam\.datadir: write it 'dataDir'"),
    ],
)
def test_a_users_config_may_not_reach_other_host_interfaces_or_choose_ipam_state(
    cni: dict[str, Any], field: str
) -> None:
    claim = sample_claim((sample_allocation(NIC),), (sample_config(_config(config=cni)),))
    with pytest.raises(ConfigError, match=field):
        _plan(claim)


def test_the_admin_config_may_name_other_host_interfaces_and_ipam_state() -> None:
    admin = _config(config=_cni({"master": "bond0"}, dataDir="/var/lib/netclaim/ipam-admin"))
    user = _config(interfaceName="data0", config=None)  # the user only names the interface
    claim = sample_claim(
        (sample_allocation(NIC),), (sample_config(admin, "FromClass"), sample_config(user, "FromClaim"))
    )
    plan = _only_plan(claim, host_local_dir=Path("/var/lib/netclaim/ipam"))
    assert plan.interface_name == "data0"
    assert plan.conflist["plugins"][0]["master"] == "bond0"
    assert plan.conflist["plugins"][0]["ipam"]["dataDir"] == "/var/lib/netclaim/ipam-admin"


def test_a_users_config_replaces_the_admins_and_is_checked() -> None:
    admin = _config(config=_cni({"master": "bond0"}))
    claim = sample_claim(
        (sample_allocation(NIC),),
        (sample_config(admin, "FromClass"), sample_config(_config(config=_cni({"master": "bond0"})))),
    )
    with pytest.raises(ConfigError, match="master: 'bond0'"):
        _plan(claim)


def test_placeholders_are_filled_from_the_device_the_claim_and_the_consumed_bandwidth() -> None:
    cni = {
        "cniVersion": "1.0.0",
        "name": "net-{{ claim.namespace }}-{{ claim.name }}",
        "plugins": [
            {
                "type": "macvlan",
                "master": "{{ device.ifName }}",
                "mtu": "{{ device.mtu }}",
                "mac": "{{device.mac}}",
                "rate": "{{ consumed.bandwidth }}",
                "labels": [
                    "{{ claim.uid }}",
                    "{{ request }}",
                    "{{ node.name }}/{{ device.pool }}",
                    "{{ device.name }}",
                ],
            }
        ],
    }
    admin = sample_config(_config(config=cni), "FromClass")  # any keys: a tenant's are allow-listed
    claim = sample_claim((sample_allocation(NIC, bandwidth="2G"),), (admin,))
    plugin = _only_plan(claim).conflist["plugins"][0]
    assert _only_plan(claim).conflist["name"] == "net-team-a-claim-1"
    assert plugin["master"] == "enp1s0"
    assert plugin["mtu"] == 9000  # a whole placeholder keeps the attribute's type
    assert plugin["mac"] == "52:54:00:aa:bb:cc"
    assert plugin["rate"] == 2_000_000_000
    assert plugin["labels"] == ["claim-uid-1", "net", "node-1/node-1", NIC.name]


def test_a_placeholder_the_device_has_no_attribute_for_is_a_config_error() -> None:
    cni = _cni({"vlan": "{{ device.vlanId }}"})
    claim = sample_claim((sample_allocation(NIC),), (sample_config(_config(config=cni)),))
    with pytest.raises(
        ConfigError, match=r"config\.plugins\[0\]\.vlan: the allocated device has no attribute"
    ):
        _plan(claim)


def test_consumed_bandwidth_without_a_consumption_is_a_config_error() -> None:
    cni = _cni({"rate": "{{ consumed.bandwidth }}"})
    claim = sample_claim((sample_allocation(NIC),), (sample_config(_config(config=cni)),))
    with pytest.raises(ConfigError, match=r"\{\{ consumed.bandwidth \}\} has no value"):
        _plan(claim)


def test_a_claim_without_any_cni_config_is_a_config_error() -> None:
    claim = sample_claim((sample_allocation(NIC),), (sample_config(_config(config=None)),))
    with pytest.raises(ConfigError, match=r"request net: no netclaim\.dev CNIConfig with a `config`"):
        _plan(claim)


def test_a_malformed_config_names_its_source_and_field() -> None:
    claim = sample_claim((sample_allocation(NIC),), (sample_config(_config(bandwidth="fast")),))
    with pytest.raises(
        ConfigError, match=r"claim team-a/claim-1 \(allocation config\[0\]\)\.opaque\.parameters\.bandwidth"
    ):
        _plan(claim)
    from_class = sample_claim((sample_allocation(NIC),), (sample_config(_config(kind="Other"), "FromClass"),))
    with pytest.raises(
        ConfigError, match=r"^DeviceClass config \(allocation config\[0\]\)\.opaque\.parameters\.kind"
    ):
        _plan(from_class)


def test_node_defaults_put_host_local_state_in_the_agents_directory() -> None:
    conflist: dict[str, Any] = {
        "name": "lan",
        "plugins": [
            {"type": "macvlan", "ipam": {"type": "host-local", "ranges": []}},
            {"type": "bridge", "ipam": {"type": "host-local", "dataDir": "/admin/chose"}},
            {"type": "ptp", "ipam": {"type": "dhcp"}},
            {"type": "tuning"},
        ],
    }
    filled = with_node_defaults(conflist, Path("/var/lib/netclaim/ipam"))
    assert [p.get("ipam", {}).get("dataDir") for p in filled["plugins"]] == [
        "/var/lib/netclaim/ipam/admin",
        "/admin/chose",
        None,
        None,
    ]
    tenants = with_node_defaults(conflist, Path("/var/lib/netclaim/ipam"), tenant="team-a")
    assert tenants["plugins"][0]["ipam"]["dataDir"] == "/var/lib/netclaim/ipam/tenant/team-a"
    assert "dataDir" not in conflist["plugins"][0]["ipam"]  # the input is not changed
    assert with_node_defaults(conflist, None) == conflist


def _conflist(**versions: Any) -> dict[str, Any]:
    return {
        **versions,
        "name": "lan",
        "plugins": [{"type": "macvlan", "ipam": {"type": "host-local"}}, {"type": "tuning"}],
    }


ALL = ["0.3.1", "0.4.0", "1.0.0", "1.1.0"]


def test_planning_settles_each_chains_cni_version_with_what_the_plugins_speak() -> None:
    claim = sample_claim((sample_allocation(NIC),), (sample_config(VALID_CONFIG),))
    node = NodeContext(SAMPLE_DRIVER, SAMPLE_NODE, {NIC.name: NIC}.get, reserved=SAMPLE_CLUSTER)
    versions = PluginVersions({"macvlan": ["0.4.0", "1.0.0"], "host-local": ["0.4.0"]})
    [planned] = plan_claim(ClaimInputs(claim, versions), node)
    assert (planned.plan.conflist["cniVersion"], planned.lowered_from) == ("0.4.0", "1.0.0")
    unusable = PluginVersions({"host-local": ALL}, {"macvlan": "plugin type 'macvlan': not allowed here"})
    with pytest.raises(ConfigError, match="plugin type 'macvlan': not allowed here"):
        plan_claim(ClaimInputs(claim, unusable), node)


def test_what_a_claim_needs_is_read_from_the_claim_alone() -> None:
    """Every plugin its configs name, the DeviceClass's too, with their delegated IPAM; the IP pools when
    its own config names IPAM (test_plan_addresses: what it asks of the pools it was allocated)."""
    chain = {
        **VALID_CONFIG,
        "config": {**VALID_CONFIG["config"], "plugins": [{"type": "bridge"}, {"type": "x/y"}]},
    }
    claim = sample_claim(
        (sample_allocation(NIC),),
        (
            sample_config(chain, source="FromClass"),
            sample_config(VALID_CONFIG),
            DeviceConfig("FromClaim", (), "gpu.example.com", VALID_CONFIG),
        ),
    )
    needs = claim_needs(claim, SAMPLE_DRIVER)
    assert needs.plugin_types == {"bridge", "macvlan", "host-local"}  # x/y is not a name: decoding says so
    assert needs.pools and needs.addresses == []
    from_class_only = replace(claim, configs=claim.configs[:1])
    assert not claim_needs(from_class_only, SAMPLE_DRIVER).pools  # an admin's IPAM is not checked


def test_negotiate_keeps_the_asked_version_when_every_plugin_speaks_it() -> None:
    supported = {"macvlan": ALL, "host-local": ALL, "tuning": ALL}
    assert negotiate(_conflist(cniVersion="1.0.0"), supported) == (_conflist(cniVersion="1.0.0"), False)


def test_negotiate_lowers_a_lone_version_to_the_highest_every_plugin_speaks() -> None:
    # the delegated IPAM plugin counts: it is run with the same version
    supported = {
        "macvlan": ALL,
        "host-local": ["0.3.1", "0.4.0", "1.0.0"],
        "tuning": ["0.4.0", "1.0.0", "1.1.0"],
    }
    negotiated, lowered = negotiate(_conflist(cniVersion="1.1.0"), supported)
    assert (negotiated["cniVersion"], lowered) == ("1.0.0", True)


def test_negotiate_never_lowers_below_0_4_0() -> None:
    supported = {"macvlan": ["0.3.0", "0.3.1"], "host-local": ALL, "tuning": ALL}
    with pytest.raises(
        ConfigError, match=r"cniVersion: the config asks for \['1.0.0'\].*share only \['0.3.1'\]"
    ):
        negotiate(_conflist(cniVersion="1.0.0"), supported)


def test_negotiate_picks_the_highest_common_version_of_a_cni_versions_list() -> None:
    supported = {"macvlan": ALL, "host-local": ALL, "tuning": ["0.4.0", "1.0.0"]}
    negotiated, lowered = negotiate(_conflist(cniVersions=["0.4.0", "1.0.0", "1.1.0"]), supported)
    assert negotiated == _conflist(cniVersion="1.0.0")  # cniVersions is not passed on to the plugins
    assert not lowered


def test_negotiate_does_not_go_outside_a_cni_versions_list() -> None:
    supported = {"macvlan": ALL, "host-local": ALL, "tuning": ["0.4.0"]}
    with pytest.raises(ConfigError, match=r"asks for \['1.0.0', '1.1.0'\].*share only \['0.4.0'\]"):
        negotiate(_conflist(cniVersions=["1.0.0", "1.1.0"]), supported)


def test_negotiate_without_a_common_version_is_a_config_error() -> None:
    supported = {"macvlan": ["1.1.0"], "host-local": ["1.0.0"], "tuning": ALL}
    with pytest.raises(ConfigError, match=r"share only \[\]"):
        negotiate(_conflist(cniVersion="1.1.0"), supported)


def test_the_nic_record_says_the_published_name_mtu_mac_and_pci_address() -> None:
    nic = NicRecord.of(NIC)
    assert (nic.if_name, nic.mtu, nic.mac, nic.pci_address) == ("enp1s0", 9000, "52:54:00:aa:bb:cc", None)
    odd = Device(
        name="odd",
        if_name="eth9",
        shared=False,
        attributes={"netclaim.dev/mtu": True, "netclaim.dev/mac": 7, "netclaim.dev/pciAddress": 1},
    )
    odd_nic = NicRecord.of(odd)
    assert (odd_nic.mtu, odd_nic.mac, odd_nic.pci_address) == (None, None, None)  # of the wrong type: ignored


def test_a_claim_takes_no_more_attachments_of_a_nic_than_one_request_may() -> None:
    """validRange.max bounds each request: spread over two requests, two attachments of a NIC whose rule
    says one per claim are refused (the scheduler allocated them; the claim's pod never starts)."""
    capped = replace(
        NIC,
        capacity={**NIC.capacity, ATTACHMENTS: Capacity(32, default=1, minimum=1, step=1, maximum=1)},
    )
    one_each = {ATTACHMENTS: "1"}
    claim = sample_claim(
        (
            replace(sample_allocation(capped, "a", share_id="s1"), consumed_capacity=one_each),
            replace(sample_allocation(capped, "b", share_id="s2"), consumed_capacity=one_each),
        ),
        (
            sample_config(_config(interfaceName="neta"), requests=("a",)),
            sample_config(_config(interfaceName="netb"), requests=("b",)),
        ),
    )
    with pytest.raises(ConfigError, match=r"takes 2 attachments of device dev-enp1s0 over its requests"):
        _plan(claim, (capped,))
    _plan(replace(claim, results=claim.results[:1]), (capped,))


def test_the_network_name_is_checked_as_rendered() -> None:
    """`{{ request }}` of a subrequest renders to `nic/fast`: host-local would make a directory of it."""
    claim = sample_claim(
        (sample_allocation(NIC, "nic/fast"),),
        (sample_config(_config(config={**VALID_CONFIG["config"], "name": "{{ request }}"})),),
    )
    with pytest.raises(ConfigError, match=r"config\.name: 'nic/fast' is not a CNI network name"):
        _plan(claim)


def test_a_claims_own_ipam_waits_for_the_clusters_cidrs() -> None:
    """Fail closed: a node whose admin has not said the cluster's pod and Service CIDRs takes no claim's
    own addresses, whatever the tenant ranges say."""
    claim = sample_claim((sample_allocation(NIC),), (sample_config(VALID_CONFIG),))
    node = NodeContext(SAMPLE_DRIVER, SAMPLE_NODE, {NIC.name: NIC}.get)
    with pytest.raises(ConfigError, match=r"has not given netclaim the cluster's pod and Service CIDRs"):
        plan_claim(ClaimInputs(claim, every_version(claim)), node)

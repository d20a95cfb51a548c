"""netclaim migrate on the Multus example (examples/multus): every NAD shape mapped or listed with its
reason, per-pod requests restated, workloads patched, and the output passing validate."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from netclaim.cli import main as cli
from netclaim.cli.fit import evaluate, published_devices
from netclaim.cli.migrate import Migration, migrate, nad_networks, selections
from netclaim.core.config.validate import validate_files
from netclaim.errors import ConfigError

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "multus"


def _documents() -> list[dict[str, Any]]:
    return [d for f in sorted(EXAMPLES.glob("*.yaml")) for d in yaml.safe_load_all(f.read_text()) if d]


@pytest.fixture(scope="module")
def migration() -> Migration:
    return migrate(_documents())


def _of(migration: Migration, kind: str) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in migration.objects if o["kind"] == kind}


def _parameters(template: dict[str, Any]) -> dict[str, Any]:
    return dict(template["spec"]["spec"]["devices"]["config"][0]["opaque"]["parameters"])


def test_each_nad_shape_becomes_a_device_class_selecting_its_nic(migration: Migration) -> None:
    classes = _of(migration, "DeviceClass")
    assert sorted(classes) == [
        "shop-backplane", "shop-capture", "shop-cluster-wide", "shop-fast-vf", "shop-fixed", "shop-front",
        "shop-l3", "shop-published", "shop-storage",
    ]  # fmt: skip

    def selector(name: str) -> str:
        return str(classes[name]["spec"]["selectors"][0]["cel"]["expression"])

    def chain(name: str) -> dict[str, Any]:
        return dict(classes[name]["spec"]["config"][0]["opaque"]["parameters"]["config"])

    assert 'ifName == "enp0s10"' in selector("shop-storage") and "shared == true" in selector("shop-storage")
    assert chain("shop-storage")["plugins"][0]["master"] == "{{ device.ifName }}"
    assert chain("shop-storage")["plugins"][0]["ipam"]["rangeStart"] == "10.120.1.20"  # IPAM as it was
    assert 'ifName == "enp7s0"' in selector("shop-capture") and "shared == false" in selector("shop-capture")
    assert chain("shop-capture")["plugins"][0]["device"] == "{{ device.ifName }}"
    assert "isSriovVf" in selector("shop-fast-vf")
    assert 'ifName == "enp94s0"' in selector("shop-l3")  # ipvlan: mapped (this lab's kernel cannot run it)
    assert chain("shop-cluster-wide")["plugins"][0]["ipam"] == {
        "type": "whereabouts",
        "range": "10.120.6.0/24",
    }
    parameters = classes["shop-storage"]["spec"]["config"][0]["opaque"]["parameters"]
    assert parameters["bandwidth"] == "none"  # Multus never shaped traffic


def test_what_cannot_be_mapped_is_listed_with_the_reason(migration: Migration) -> None:
    unmapped = "\n".join(migration.unmapped)
    assert (
        "NetworkAttachmentDefinition/shop/on-the-nodes: no spec.config: Multus reads it from the nodes'"
        in unmapped
    )
    assert (
        "NetworkAttachmentDefinition/shop/overlay: plugins[0] (ovs): not a plugin netclaim runs" in unmapped
    )
    assert (
        "shop/published: plugins[1] (portmap): capability portMappings: DRA passes no runtimeConfig"
        in unmapped
    )
    assert "Deployment/shop/router: network shop/on-the-nodes: no migrated NAD of that name" in unmapped
    assert "Deployment/shop/router: network shop/overlay: no migrated NAD of that name" in unmapped
    notes = "\n".join(migration.notes)
    assert "resourceName intel.com/sriov_netdevice" in notes and "bridge 'br-back' is the node's" in notes


def test_pods_get_claims_named_after_their_nads_with_multus_interface_names(migration: Migration) -> None:
    deployments = _of(migration, "Deployment")
    worker = deployments["worker"]["spec"]["template"]
    assert "k8s.v1.cni.cncf.io/networks" not in worker["metadata"]["annotations"]
    assert worker["spec"]["resourceClaims"] == [
        {"name": "storage", "resourceClaimTemplateName": "storage-net1"},
        {"name": "backplane", "resourceClaimTemplateName": "backplane-back0"},
    ]
    assert worker["spec"]["containers"][0]["resources"]["claims"] == [
        {"name": "storage"},
        {"name": "backplane"},
    ]
    templates = _of(migration, "ResourceClaimTemplate")
    assert _parameters(templates["backplane-back0"])["interfaceName"] == "back0"
    assert "config" not in _parameters(templates["storage-net1"])  # the class's chain, untouched
    router = deployments["router"]["spec"]["template"]["spec"]["resourceClaims"]
    assert [c["resourceClaimTemplateName"] for c in router] == [
        "l3-net1",
        "cluster-wide-net2",
        "fast-vf-net3",
    ]


def test_per_pod_ips_mac_and_default_route_restate_the_chain(migration: Migration) -> None:
    templates = _of(migration, "ResourceClaimTemplate")
    ledger = _parameters(templates["deployment-ledger-fixed-fixed0"])
    assert ledger["interfaceName"] == "fixed0"
    assert ledger["config"]["plugins"][0]["ipam"] == {
        "type": "static",
        "addresses": [{"address": "10.120.2.10/24"}],
    }
    assert "capabilities" not in ledger["config"]["plugins"][0]
    web = _parameters(templates["deployment-web-front-net1"])["config"]["plugins"]
    assert web[1] == {"type": "tuning", "mac": "02:00:00:00:12:34"}
    assert web[0]["ipam"]["routes"] == [
        {"dst": "0.0.0.0/1", "gw": "10.120.8.1"},
        {"dst": "128.0.0.0/1", "gw": "10.120.8.1"},
    ]


def test_the_migrated_objects_pass_validate(migration: Migration, tmp_path: Path) -> None:
    path = tmp_path / "migrated.yaml"
    path.write_text(yaml.safe_dump_all(migration.objects))
    assert validate_files([path]).problems == []


@pytest.mark.parametrize(
    ("annotation", "expected"),
    [
        ("a", [{"name": "a"}]),
        ("ns/a@eth9, b", [{"namespace": "ns", "name": "a", "interface": "eth9"}, {"name": "b"}]),
        ('[{"name": "a", "ips": ["10.0.0.2/24"]}]', [{"name": "a", "ips": ["10.0.0.2/24"]}]),
    ],
)
def test_both_forms_of_the_networks_annotation_are_read(
    annotation: str, expected: list[dict[str, Any]]
) -> None:
    assert selections(annotation) == expected


def test_the_command_writes_the_objects_and_lists_the_rest(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "migrated.yaml"
    files = [str(f) for f in sorted(EXAMPLES.glob("*.yaml"))]
    assert cli.main(["migrate", *files, "--output-file", str(out)]) == 0
    assert len(list(yaml.safe_load_all(out.read_text()))) == len(migrate(_documents()).objects)
    err = capsys.readouterr().err
    assert "# not migrated: NetworkAttachmentDefinition/shop/overlay" in err and "# validate:" not in err


def test_no_migrated_selector_errs_on_an_ip_pool_device(migration: Migration) -> None:
    """The driver also publishes IP pools, without NIC attributes: a selector reading one there is a CEL
    error, and the scheduler then fails the whole allocation (every pod Pending)."""
    pool = {"name": "demo-net", "attributes": {"netclaim.dev/pool": {"string": "demo-net"}}}
    [device] = published_devices(
        [{"spec": {"driver": "netclaim.dev", "allNodes": True, "pool": {"name": "p"}, "devices": [pool]}}]
    )
    for name, klass in _of(migration, "DeviceClass").items():
        assert evaluate(klass["spec"]["selectors"][0]["cel"]["expression"], device) == (False, ""), name


def test_networks_and_workloads_of_one_name_never_share_a_template() -> None:
    def nad(namespace: str, subnet: str) -> dict[str, Any]:
        config = (
            '{"cniVersion": "1.0.0", "name": "foo", "type": "macvlan", "master": "eth1", '
            f'"ipam": {{"type": "host-local", "subnet": "{subnet}"}}}}'
        )
        return {
            "kind": "NetworkAttachmentDefinition",
            "metadata": {"name": "foo", "namespace": namespace},
            "spec": {"config": config},
        }

    def workload(kind: str, networks: str) -> dict[str, Any]:
        template = {
            "metadata": {"annotations": {"k8s.v1.cni.cncf.io/networks": networks}},
            "spec": {"containers": [{"name": "c"}]},
        }
        return {"kind": kind, "metadata": {"name": "web", "namespace": "app"}, "spec": {"template": template}}

    migration = migrate(
        [
            nad("app", "10.1.0.0/24"),
            nad("infra", "10.2.0.0/24"),
            workload(
                "Deployment",
                '[{"name": "foo", "ips": ["10.1.0.5/24"]}, '
                '{"name": "foo", "namespace": "infra", "interface": "net9"}]',
            ),
            workload("StatefulSet", '[{"name": "foo", "ips": ["10.1.0.6/24"]}]'),
        ]
    )
    templates = _of(migration, "ResourceClaimTemplate")
    assert sorted(templates) == ["deployment-web-foo-net1", "infra-foo-net9", "statefulset-web-foo-net1"]
    assert (
        templates["infra-foo-net9"]["spec"]["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"]
        == "infra-foo"
    )
    assert _parameters(templates["statefulset-web-foo-net1"])["config"]["plugins"][0]["ipam"][
        "addresses"
    ] == [{"address": "10.1.0.6/24"}]
    assert "ResourceQuota app-foo.deviceclass.resource.k8s.io/devices: 0" in "\n".join(migration.notes)


def _vf_nad(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "k8s.cni.cncf.io/v1",
        "kind": "NetworkAttachmentDefinition",
        "metadata": {
            "name": name,
            "namespace": "shop",
            "annotations": {"k8s.v1.cni.cncf.io/resourceName": "intel.com/sriov_netdevice"},
        },
        "spec": {"config": json.dumps({"cniVersion": "1.0.0", "name": name, "type": "host-device"})},
    }


def test_a_device_plugin_resource_becomes_the_classes_extended_resource_and_leaves_migrated_pods(
    tmp_path: Path,
) -> None:
    """Pods that only ask the resource keep working through the class (KEP-5004); a migrated pod claims the
    network instead and must not take a second device through its limit."""
    limits = {"intel.com/sriov_netdevice": "1", "cpu": "1"}
    workload = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "router", "namespace": "shop"},
        "spec": {
            "template": {
                "metadata": {"annotations": {"k8s.v1.cni.cncf.io/networks": "fast-vf"}},
                "spec": {"containers": [{"name": "main", "image": "x", "resources": {"limits": limits}}]},
            }
        },
    }
    migration = migrate([_vf_nad("fast-vf"), _vf_nad("fast-vf-2"), workload])
    classes = _of(migration, "DeviceClass")
    assert classes["shop-fast-vf"]["spec"]["extendedResourceName"] == "intel.com/sriov_netdevice"
    assert "extendedResourceName" not in classes["shop-fast-vf-2"]["spec"]  # one class per resource
    notes = "\n".join(migration.notes)
    assert "pods that ask intel.com/sriov_netdevice in their limits and name no network keep working" in notes
    assert "intel.com/sriov_netdevice is served by DeviceClass shop-fast-vf already" in notes
    [patched] = _of(migration, "Deployment").values()
    container = patched["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"]["limits"] == {"cpu": "1"}
    assert container["resources"]["claims"] == [{"name": "fast-vf"}]
    path = tmp_path / "migrated.yaml"
    path.write_text(yaml.safe_dump_all(migration.objects))
    assert validate_files([path]).problems == []


def test_a_policy_on_a_migrated_nad_also_names_its_netclaim_network_whose_nics_its_class_requires(
    migration: Migration,
) -> None:
    """The policy holds on both interfaces while workloads roll, and a migrated pod can only land on a NIC
    of the network the policy names (fail closed); the note tells the admin which attribute to publish."""
    [policy] = _of(migration, "MultiNetworkPolicy").values()
    assert policy["metadata"]["annotations"]["k8s.v1.cni.cncf.io/policy-for"] == (
        "shop/fixed, netclaim.dev/shop-fixed"
    )
    assert policy["spec"]["podSelector"] == {"matchLabels": {"app": "ledger"}}  # the rules as they were
    classes = _of(migration, "DeviceClass")
    fixed = classes["shop-fixed"]["spec"]["selectors"][0]["cel"]["expression"]
    assert fixed.endswith(
        '"network" in device.attributes["netclaim.dev"] && '
        'device.attributes["netclaim.dev"].network == "shop-fixed"'
    )
    assert "network" not in classes["shop-storage"]["spec"]["selectors"][0]["cel"]["expression"]
    assert any(
        "add `attributes: {netclaim.dev/network: shop-fixed}` to the publish rule" in note
        for note in migration.notes
    )
    # an IP pool's device has no network attribute: test_no_migrated_selector_errs_on_an_ip_pool_device


def test_an_admin_names_the_network_of_a_nad_and_unknown_names_are_listed() -> None:
    policies = [
        {
            "apiVersion": "k8s.cni.cncf.io/v1beta1",
            "kind": "MultiNetworkPolicy",
            "metadata": {
                "name": name,
                "namespace": "shop",
                "uid": "u",
                "resourceVersion": "7",
                "annotations": {"k8s.v1.cni.cncf.io/policy-for": policy_for},
            },
            "spec": {"podSelector": {}},
        }
        for name, policy_for in (
            ("both", "fixed ,  elsewhere/gone"),  # a name alone is the policy's namespace's
            ("ours", "netclaim.dev/lan1"),  # netclaim's already: nothing to do
        )
    ]
    documents = [*_documents(), *policies]
    migration = migrate(documents, {("shop", "fixed"): "lan1"})
    migrated = _of(migration, "MultiNetworkPolicy")
    assert sorted(migrated) == ["both", "ledger-ingress"]  # "ours" names no NAD: not in the output
    both = migrated["both"]
    assert both["metadata"]["annotations"]["k8s.v1.cni.cncf.io/policy-for"] == (
        "fixed, elsewhere/gone, netclaim.dev/lan1"
    )
    assert "uid" not in both["metadata"] and "resourceVersion" not in both["metadata"]
    assert (
        'network == "lan1"'
        in _of(migration, "DeviceClass")["shop-fixed"]["spec"]["selectors"][0]["cel"]["expression"]
    )
    assert "MultiNetworkPolicy/shop/both: policy-for elsewhere/gone: no migrated NAD of that name" in (
        migration.unmapped
    )


@pytest.mark.parametrize("pair", ["fixed=lan1", "shop/fixed=", "shop/fixed=-lan", "shop/=lan1"])
def test_a_network_option_that_cannot_be_one_is_refused_by_name(
    pair: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(ConfigError, match=f"--network {pair!r}: expected NAMESPACE/NAD=NETWORK"):
        nad_networks([pair])
    files = [str(f) for f in sorted(EXAMPLES.glob("*.yaml"))]
    assert cli.main(["migrate", *files, "--network", pair]) == 2
    assert f"--network {pair!r}" in capsys.readouterr().err


def test_two_nads_whose_default_networks_meet_must_be_named() -> None:
    """`b.c` and `b-c` of one namespace would both be network a-b-c: a policy of one would hold on the
    other's interfaces. Refused, naming both, unless the admin names them."""

    def nad(name: str) -> dict[str, Any]:
        config = '{"cniVersion": "1.0.0", "name": "x", "type": "macvlan", "master": "eth1"}'
        return {
            "kind": "NetworkAttachmentDefinition",
            "metadata": {"name": name, "namespace": "a"},
            "spec": {"config": config},
        }

    policy = {
        "kind": "MultiNetworkPolicy",
        "metadata": {
            "name": "p",
            "namespace": "a",
            "annotations": {"k8s.v1.cni.cncf.io/policy-for": "b.c, b-c"},
        },
        "spec": {"podSelector": {}},
    }
    documents = [nad("b.c"), nad("b-c"), policy]
    with pytest.raises(
        ConfigError, match=re.escape("NADs a/b-c, a/b.c would both become netclaim network a-b-c")
    ):
        migrate(documents)
    migration = migrate(documents, {("a", "b.c"): "one", ("a", "b-c"): "two"})
    [migrated] = _of(migration, "MultiNetworkPolicy").values()
    assert migrated["metadata"]["annotations"]["k8s.v1.cni.cncf.io/policy-for"] == (
        "b.c, b-c, netclaim.dev/one, netclaim.dev/two"
    )

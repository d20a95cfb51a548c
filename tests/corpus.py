"""The bad-input corpus: malformed netclaim configs and publish policies, generated from valid ones.

Each config case says where it must be caught: `admission` (the ValidatingAdmissionPolicy of
deploy/admission.yaml refuses it when the object is written) or `prepare` (only the agent can: placeholders,
details admission does not look at). The agent's decoder must refuse every case.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

VALID_CONFIG: dict[str, Any] = {
    "apiVersion": "netclaim.dev/v1alpha1",
    "kind": "CNIConfig",
    "interfaceName": "net1",
    "bandwidth": "enforce",
    "config": {
        "cniVersion": "1.0.0",
        "name": "corpus-net",
        "plugins": [
            {
                "type": "macvlan",
                "master": "{{ device.ifName }}",
                "mode": "bridge",
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": "10.90.0.0/24", "gateway": "10.90.0.1"}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                },
            }
        ],
    },
}


def single_plugin_form(parameters: dict[str, Any]) -> dict[str, Any]:
    """`parameters` with its one-plugin list written as a single plugin config (the list's cniVersion and
    name beside the plugin's own keys), as libcni reads a .conf file."""
    single = copy.deepcopy(parameters)
    config = single["config"]
    [plugin] = config.pop("plugins")
    single["config"] = {**config, **plugin}
    return single


VALID_POLICY = """apiVersion: netclaim.dev/v1alpha1
kind: PublishPolicy
rules:
- match: {names: ["enp*"], cel: 'device.attributes["netclaim.dev"].speed >= 10000'}
  mode: shared
  bandwidth: {total: 10Gi, default: 1Gi, min: 1Mi, step: 1Mi}
  attachments: 32
  attributes: {netclaim.dev/network: lan1}
"""


@dataclass(frozen=True)
class ConfigCase:
    name: str
    parameters: Any
    caught_at: str  # "admission" or "prepare"


@dataclass(frozen=True)
class PolicyCase:
    name: str
    text: str


DELETE = object()
WRONG_TYPES: tuple[Any, ...] = (7, 1.5, True, None, [], {}, ["x"])


def mutated(base: Any, path: tuple[Any, ...], value: Any) -> Any:
    """A deep copy of `base` with the value at `path` replaced, or deleted when `value` is DELETE."""
    changed = copy.deepcopy(base)
    target = changed
    for key in path[:-1]:
        target = target[key]
    if value is DELETE:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return changed


PLUGIN = ("config", "plugins", 0)
IPAM = (*PLUGIN, "ipam")


def _config_mutations() -> Iterator[tuple[str, tuple[Any, ...], Any, str]]:
    for value in ("netclaim.dev/v1", "v1alpha1", "", "NETCLAIM.DEV/V1ALPHA1", *WRONG_TYPES, DELETE):
        yield "apiVersion", ("apiVersion",), value, "admission"
    for value in ("Macvlan", "cniconfig", "", "CNIConfigs", *WRONG_TYPES, DELETE):
        yield "kind", ("kind",), value, "admission"
    for key in ("colour", "interface", "Config", "plugins", "ipam", "cniVersion", "spec", "master"):
        yield f"unknown field {key}", (key,), "x", "admission"
    for value in (
        "a/b",
        "../x",
        "net 1",
        "net:1",
        "net%1",
        "x" * 16,
        "é" * 8,  # 8 characters, 16 bytes: the kernel counts bytes
        "",
        "lo",
        "eth0",  # the pod's primary interface
        ".",
        "..",
        "\t",
        *WRONG_TYPES,
    ):
        yield "interfaceName", ("interfaceName",), value, "admission"
    for value in ("max", "Enforce", "", "on", 1, True, None):
        yield "bandwidth", ("bandwidth",), value, "admission"
    for value in ("macvlan", 3, ["a"], True):
        yield "config not an object", ("config",), value, "admission"
    yield "config without name", ("config", "name"), DELETE, "admission"
    yield "config without cniVersion", ("config", "cniVersion"), DELETE, "admission"
    for value in ("2.0.0", "1.0", "v1.0.0", "", "0.2.0", "1.0.0-rc1", 100):
        yield "cniVersion", ("config", "cniVersion"), value, "admission"
    for value in (
        [],
        "macvlan",
        5,
        {"type": "macvlan"},
        [{"type": "macvlan", "ipam": {"type": "host-local"}}] * 17,
    ):
        yield "plugins", ("config", "plugins"), value, "admission"
    for value in (
        "../macvlan",
        "/usr/lib/cni/macvlan",
        "mac vlan",
        "",
        "nosuchplugin",
        "MACVLAN",
        "sh",
        "a/b",
        "macvlan;rm",
        "-macvlan",
        7,
        None,
        ["macvlan"],
    ):
        yield "plugin type", (*PLUGIN, "type"), value, "admission"
    yield "plugin without type", (*PLUGIN, "type"), DELETE, "admission"
    for value in ("../host-local", "/bin/host-local", "host local", "", "dhcpd", 1, None):
        yield "ipam type", (*IPAM, "type"), value, "admission"
    for value in (
        "10.90.0.0/33",
        "10.90.0.0",
        "10.90.0.0/-1",
        "300.1.1.0/24",
        "10.90.0.0/24/1",
        "net",
        "",
        "2001:db8::/129",
        "::/",
        "10.90.0.0/ 24",
    ):
        yield "subnet", (*IPAM, "ranges", 0, 0, "subnet"), value, "admission"
    for value in ("default", "0.0.0.0", "0/0", "::/200", "10.0.0.0/8x"):
        yield "route dst", (*IPAM, "routes", 0, "dst"), value, "admission"
    for value in ("10.90.0.0/33", "host"):
        yield "ipam.subnet", (*IPAM, "subnet"), value, "admission"
    for value in ("host-local", 7, [], ["host-local"], True):
        yield "ipam not an object", IPAM, value, "admission"
    for value in ("x", 7, ["x"], [["x"]], [[7]], {}):
        yield "ranges shape", (*IPAM, "ranges"), value, "admission"
    for value in ("x", 7, ["x"], [7], {}):
        yield "routes shape", (*IPAM, "routes"), value, "admission"
    for value in ("x", 7, ["10.0.0.1/24"], {}):
        yield "addresses shape", (*IPAM, "addresses"), value, "admission"
    for value in ("10.90.0.1/33", "fe80::1/200", "10.90.0.1", "addr", "1.2.3.4/24/"):
        yield "static address", (*IPAM, "addresses"), [{"address": value}], "admission"
    for value in (
        "calico",
        "cilium-cni",
        "flannel",
        "multus",
        "whereabouts",
        "sriov",
        "ovs",
        "weave-net",
        "aws-cni",
        "kube-ovn",
        "bash",
        "python3",
        "nsenter",
    ):
        yield "plugin not allowed", (*PLUGIN, "type"), value, "admission"
    for value in ("whereabouts", "calico-ipam", "azure-vnet-ipam"):
        yield "ipam plugin not allowed", (*IPAM, "type"), value, "admission"
    for value in ("2001:db8::/129", "fe80::/", "::ffff:300.1.1.1/120", "10.1.1.1/8/8", "10.90.0.0/24 "):
        yield "subnet (more)", (*IPAM, "ranges", 0, 0, "subnet"), value, "admission"
    for key in ("runtimeconfig", "ARGS", "cni.dev/x"):
        yield f"unknown top field {key}", (key,), {}, "admission"
    # admission does not look at these: the agent refuses them when the claim is prepared (values it
    # cannot judge without the node, or that it checks only in their rendered form)
    for value in ("10.90.0.300", "gw", "10.90.0.1/24", ""):
        yield "gateway", (*IPAM, "ranges", 0, 0, "gateway"), value, "prepare"
    for value in (
        "{{ device.ifName",
        "{{ host.uplink }}",
        "{{}}",
        "{{ 1x }}",
        "}} x {{",
        "{{ claim.secret }}",
        "{{ pod.name }}",
        "{{ device. }}",
    ):
        yield "placeholder", (*PLUGIN, "master"), value, "prepare"
    for key in ("runtimeConfig", "args", "prevResult", "cni.dev/attachments"):  # not a claim's macvlan key
        yield f"reserved key {key}", (*PLUGIN, key), {}, "admission"
    for value in (["2.0.0"], ["1.0.0", "9"], ["x"], [], "1.0.0", [["1.0.0"]]):
        yield "cniVersions", ("config", "cniVersions"), value, "admission"
    yield "rangeStart", (*IPAM, "ranges", 0, 0, "rangeStart"), "10.90.0.x", "prepare"
    yield "route gw", (*IPAM, "routes", 0, "gw"), "gateway", "prepare"
    for value in ("/etc", "/var/lib/cni/networks", ""):
        yield "ipam dataDir (admin only)", (*IPAM, "dataDir"), value, "admission"
    yield "master (not the allocated NIC)", (*PLUGIN, "master"), "eth0", "prepare"


def config_cases() -> list[ConfigCase]:
    cases = []
    for index, (family, path, value, caught_at) in enumerate(_config_mutations()):
        shown = "deleted" if value is DELETE else repr(value)[:30]
        parameters = mutated(VALID_CONFIG, path, value)
        cases.append(ConfigCase(f"{index:03d} {family}: {shown}", parameters, caught_at))
    for value in ("not an object", 7, ["CNIConfig"], None):
        cases.append(ConfigCase(f"parameters {value!r}", value, "admission"))
    return cases


def _policy_mutations() -> Iterator[tuple[str, str]]:
    yield "yaml: unclosed flow", VALID_POLICY.replace('["enp*"]', '["enp*"')
    yield "yaml: bad indentation", VALID_POLICY.replace("  mode: shared", "   mode: shared")
    yield "yaml: tab", VALID_POLICY.replace("  mode:", "\tmode:")
    yield "yaml: not a mapping", "- just\n- a list\n"
    yield "yaml: a string", "policy"
    yield "empty file", ""
    for old, new in (
        ("kind: PublishPolicy", "kind: Policy"),
        ("kind: PublishPolicy", "kind: publishpolicy"),
        ("apiVersion: netclaim.dev/v1alpha1", "apiVersion: v1"),
        ("apiVersion: netclaim.dev/v1alpha1\n", ""),
    ):
        yield f"header {new!r}", VALID_POLICY.replace(old, new)
    for where, anchor in (
        ("top", "rules:"),
        ("rule", "  mode: shared"),
        ("bandwidth", "total: 10Gi"),
        ("match", 'names: ["enp*"]'),
    ):
        for key in ("colour", "Mode", "rule", "priority"):
            if where in ("top",):
                text = VALID_POLICY.replace(anchor, f"{key}: 1\n{anchor}")
            elif where == "rule":
                text = VALID_POLICY.replace(anchor, f"{anchor}\n  {key}: 1")
            else:
                text = VALID_POLICY.replace(anchor, f"{anchor}, {key}: 1")
            yield f"unknown {where} key {key}", text
    for value in ("'32'", "many", "-1", "0", "5000", "3.5", "true", "[]", "{}", "null"):
        yield f"attachments {value}", VALID_POLICY.replace("attachments: 32", f"attachments: {value}")
    for value in ("sharing", "Shared", "'true'", "1", "[]", "null"):
        yield f"mode {value}", VALID_POLICY.replace("mode: shared", f"mode: {value}")
    for field in ("total", "default", "min", "step"):
        for value in ("ten", "10 Gi", "10GB", "-1Gi", "[]", "1.2.3"):
            old = {"total": "total: 10Gi", "default": "default: 1Gi", "min": "min: 1Mi", "step": "step: 1Mi"}[
                field
            ]
            yield f"bandwidth.{field} {value}", VALID_POLICY.replace(old, f"{field}: {value}")
    yield "bandwidth.step zero", VALID_POLICY.replace("step: 1Mi", "step: '0'")
    yield "bandwidth.default below min", VALID_POLICY.replace("min: 1Mi", "min: 2Gi")
    for expression in (
        ">= 1",
        'device.attributes["netclaim.dev"].speed >=',
        "dev.speed > 1",
        "1 + 1",
        'device.attributes["netclaim.dev"].colour == "red"',
        'device.attributes["netclaim.dev"].ifName + 1',
        "device.attributes[",
        "'a'",
        "nosuchfn()",
        'device.attributes["netclaim.dev"].speed.size()',
        "true ? 1 : 2",
    ):
        yield (
            f"cel {expression[:30]}",
            VALID_POLICY.replace(
                "'device.attributes[\"netclaim.dev\"].speed >= 10000'", repr(expression).replace("\\\\", "\\")
            ),
        )
    for attribute in ("colour", "IfName", "pci", "speedMbps"):
        yield (
            f"match attribute {attribute}",
            VALID_POLICY.replace('names: ["enp*"]', f"attributes: {{{attribute}: 1}}"),
        )
    for name in (
        "'a b'",
        "'/x'",
        "'netclaim.dev/ifName'",
        "'resource.kubernetes.io/pcieRoot'",
        "'UPPER.dev/x'",
        "'x/' ",
    ):
        yield (
            f"extra attribute {name}",
            VALID_POLICY.replace(
                "netclaim.dev/network", name.strip("'") if " " not in name and name != "'x/' " else name
            ),
        )
    for value in ("[1, 2]", "{a: 1}", "null"):
        yield (
            f"extra attribute value {value}",
            VALID_POLICY.replace("netclaim.dev/network: lan1", f"netclaim.dev/network: {value}"),
        )
    for value in ("'enp*'", "[1]", "{}", "7"):
        yield f"names {value}", VALID_POLICY.replace('names: ["enp*"]', f"names: {value}")
    for value in ("[[enp]]", "null", "[enp*, 7]", "{a: 1}"):
        yield f"match.names {value}", VALID_POLICY.replace('names: ["enp*"]', f"names: {value}")
    cel = """cel: 'device.attributes["netclaim.dev"].speed >= 10000'"""
    for value in ("7", "[]", "{}", "true"):
        yield f"match.cel {value}", VALID_POLICY.replace(cel, f"cel: {value}")
    for value in ("[]", "x"):
        yield (
            f"match.attributes {value}",
            VALID_POLICY.replace("- match: {", f"- match: {{attributes: {value}, ", 1),
        )
    for field, value in (("names", '["ens*"]'), ("cel", "'true'")):
        yield (
            f"duplicate key match.{field}",
            VALID_POLICY.replace("- match: {", f"- match: {{{field}: {value}, ", 1),
        )
    yield "duplicate key mode", VALID_POLICY.replace("  mode: shared", "  mode: shared\n  mode: exclusive")
    yield "duplicate key rules", VALID_POLICY + "rules: []\n"
    for value in ("[]", "x", "7", "{total: [1]}", "{total: {a: 1}}", "{min: true}"):
        yield (
            f"bandwidth {value}",
            VALID_POLICY.replace(
                "bandwidth: {total: 10Gi, default: 1Gi, min: 1Mi, step: 1Mi}", f"bandwidth: {value}"
            ),
        )
    for value in ("[]", "x", "7", "{a: b}"):
        yield (
            f"match {value}",
            VALID_POLICY.replace(
                """match: {names: ["enp*"], cel: 'device.attributes["netclaim.dev"].speed >= 10000'}""",
                f"match: {value}",
            ),
        )
    for value in ("[]", "'x'", "7"):
        yield (
            f"attributes {value}",
            VALID_POLICY.replace("attributes: {netclaim.dev/network: lan1}", f"attributes: {value}"),
        )
    yield "rules not a list", VALID_POLICY.split("rules:")[0] + "rules: {mode: shared}\n"
    yield "rules missing", VALID_POLICY.split("rules:")[0]
    yield "rule not a mapping", VALID_POLICY.split("rules:")[0] + "rules: [shared]\n"


def policy_cases() -> list[PolicyCase]:
    cases = [
        PolicyCase(f"{index:03d} {name}", text) for index, (name, text) in enumerate(_policy_mutations())
    ]
    return [case for case in cases if case.text != VALID_POLICY]

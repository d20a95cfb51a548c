"""`netclaim validate`: the offline-checkable mistakes users make (issue 14's list), each refused naming
the field; what is valid passes; a file with nothing to check is said to be so; and every example in
docs/ and examples/ is accepted by what consumes it."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from netclaim.cli import main as cli
from netclaim.core.config.overrides import load_overrides
from netclaim.core.config.validate import validate_files
from netclaim.core.devices.rules import load_policy, sample_attributes
from netclaim.core.policy.rules import PolicyObject

ROOT = Path(__file__).resolve().parents[2]
KNOWN = frozenset(name for domain in sample_attributes().values() for name in domain) | {"network"}
ON_ENP0S10 = 'device.attributes["netclaim.dev"].ifName == "enp0s10"'


def cni(interface: str | None = None, **plugin: Any) -> dict[str, Any]:
    parameters: dict[str, Any] = {
        "apiVersion": "netclaim.dev/v1alpha1",
        "kind": "CNIConfig",
        "config": {
            "cniVersion": "1.0.0",
            "name": "n",
            "plugins": [{"type": "macvlan", "master": "{{ device.ifName }}", "mode": "bridge", **plugin}],
        },
    }
    if interface is not None:
        parameters["interfaceName"] = interface
    return parameters


def template(
    name: str, *configs: dict[str, Any], requests: tuple[str, ...] = ("nic",), pool: str = ""
) -> dict[str, Any]:
    listed = [
        {
            "name": r,
            "exactly": {
                "deviceClassName": "netclaim-shared",
                "selectors": [{"cel": {"expression": ON_ENP0S10}}],
            },
        }
        for r in requests
    ]
    if pool:
        selector = f'device.attributes["netclaim.dev"].pool == "{pool}"'
        listed.append(
            {
                "name": "ip",
                "exactly": {
                    "deviceClassName": "netclaim-address",
                    "selectors": [{"cel": {"expression": selector}}],
                },
            }
        )
    entries = [
        {
            "requests": [c.pop("_for")] if "_for" in c else list(requests),
            "opaque": {"driver": "netclaim.dev", "parameters": c},
        }
        for c in map(copy.deepcopy, configs)
    ]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name},
        "spec": {"spec": {"devices": {"requests": listed, "config": entries}}},
    }


def device_class(name: str, *configs: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": name},
        "spec": {"config": [{"opaque": {"driver": "netclaim.dev", "parameters": c}} for c in configs]},
    }


def pod(*templates: str, kind: str = "Pod") -> dict[str, Any]:
    spec = {
        "resourceClaims": [
            {"name": f"c{i}", "resourceClaimTemplateName": t} for i, t in enumerate(templates)
        ],
        "containers": [{"name": "main", "image": "busybox"}],
    }
    shapes = {
        "Pod": spec,
        "Deployment": {"selector": {}, "template": {"spec": spec}},
        "CronJob": {"schedule": "@hourly", "jobTemplate": {"spec": {"template": {"spec": spec}}}},
    }
    return {"apiVersion": "v1", "kind": kind, "metadata": {"name": "p"}, "spec": shapes[kind]}


def ippool(name: str, **range_fields: str) -> dict[str, Any]:
    return {
        "apiVersion": "netclaim.dev/v1alpha1",
        "kind": "IPPool",
        "metadata": {"name": name},
        "spec": {"ranges": [{"subnet": "10.10.3.0/24", **range_fields}, {"subnet": "fd00:10:3::/64"}]},
    }


def addresses(*values: str) -> dict[str, Any]:
    return {
        "apiVersion": "netclaim.dev/v1alpha1",
        "kind": "AddressConfig",
        "addresses": list(values),
        "_for": "ip",
    }


def with_class_config(interface: str) -> list[dict[str, Any]]:
    """Two templates of a DeviceClass whose config names the interface, in one pod."""
    klass = device_class("lan1", cni(interface))
    first, second = template("a"), template("b")
    for one in (first, second):
        one["spec"]["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] = "lan1"
        del one["spec"]["spec"]["devices"]["config"]
    return [klass, first, second, pod("a", "b")]


MISTAKES: list[tuple[str, list[dict[str, Any]], str]] = [
    (
        "interfaceName eth0 in a claim",
        [template("t", cni("eth0"))],
        "interfaceName: 'eth0' is taken inside the pod",
    ),
    (
        "interfaceName eth0 in a DeviceClass",
        [device_class("c", cni("eth0"))],
        "spec.config[0].opaque.parameters.interfaceName: 'eth0'",
    ),
    (
        "interfaceName of 16 characters",
        [template("t", cni("net1234567890abc"))],
        "interfaceName: 'net1234567890abc' is not a usable interface name: 1-15 of",
    ),
    (
        "interfaceName of 8 characters, 16 bytes",
        [template("t", cni("éééééééé"))],
        "interfaceName: 'éééééééé' is not a usable interface name: 1-15 of A-Z a-z 0-9",
    ),
    (
        "interfaceName with a slash",
        [template("t", cni("net/1"))],
        "interfaceName: 'net/1' is not a usable",
    ),
    ("interfaceName lo", [template("t", cni("lo"))], "interfaceName: 'lo' is taken inside the pod"),
    ("interfaceName ifb0", [template("t", cni("ifb0"))], "interfaceName: 'ifb0' is taken inside the pod"),
    (
        "tenant gateway outside the subnet",
        [
            template(
                "t",
                cni(
                    ipam={
                        "type": "host-local",
                        "ranges": [[{"subnet": "10.70.0.0/24", "gateway": "10.71.0.1"}]],
                    }
                ),
            )
        ],
        "ipam.ranges[0][0].gateway: 10.71.0.1 is outside the subnet 10.70.0.0/24",
    ),
    (
        "tenant rangeStart outside the subnet",
        [
            template(
                "t",
                cni(
                    ipam={
                        "type": "host-local",
                        "ranges": [[{"subnet": "10.70.0.0/24", "rangeStart": "10.80.0.5"}]],
                    }
                ),
            )
        ],
        "rangeStart: 10.80.0.5 is outside the subnet 10.70.0.0/24",
    ),
    (
        "tenant RangeEnd (Go reads keys in any case): only the canonical spelling",
        [
            template(
                "t",
                cni(
                    ipam={
                        "type": "host-local",
                        "ranges": [[{"subnet": "10.70.0.0/24", "RangeEnd": "10.80.0.5"}]],
                    }
                ),
            )
        ],
        "RangeEnd: write it 'rangeEnd'",
    ),
    (
        "static address outside its IPPool",
        [ippool("lan3"), template("t", cni(), addresses("10.10.4.50"), pool="lan3")],
        "config[1].opaque.parameters.addresses[0]: 10.10.4.50 is not in IPPool lan3 "
        "(10.10.3.0/24, fd00:10:3::/64)",
    ),
    (
        "static IPv6 address outside its IPPool",
        [ippool("lan3"), template("t", cni(), addresses("10.10.3.5", "fd00:99::5"), pool="lan3")],
        "addresses[1]: fd00:99::5 is not in IPPool lan3",
    ),
    (
        "static address with a prefix length",
        [template("t", cni(), addresses("10.10.3.50/24"), pool="lan3")],
        "config[1].opaque.parameters.addresses",
    ),
    (
        "IPPool start outside its subnet",
        [ippool("lan3", start="10.10.4.10")],
        "start: 10.10.4.10 is not in subnet 10.10.3.0/24",
    ),
    (
        "IPPool gateway outside its subnet",
        [ippool("lan3", gateway="10.10.4.1")],
        "gateway: 10.10.4.1 is not in subnet 10.10.3.0/24",
    ),
    (
        "placeholder naming an attribute in the wrong case",
        [template("t", cni(master="{{ device.ifname }}"))],
        "{{ device.ifname }}: netclaim publishes no attribute 'ifname'",
    ),
    (
        "placeholder naming an attribute netclaim does not publish",
        [template("t", cni(mtu="{{ device.speedMbps }}"))],
        "plugins[0].mtu: {{ device.speedMbps }}: netclaim publishes no attribute 'speedMbps'",
    ),
    (
        "placeholder naming nothing netclaim fills",
        [template("t", cni(master="{{ claim.label }}"))],
        "unknown placeholder {{ claim.label }}",
    ),
    ("malformed placeholder", [template("t", cni(master="{{ device.ifName }"))], "malformed placeholder"),
    (
        "two claims in a pod, both net1 by default",
        [template("a", cni()), template("b", cni()), pod("a", "b")],
        "spec.resourceClaims[1] (template b, request nic): interface net1 is also made by "
        "spec.resourceClaims[0] (template a, request nic)",
    ),
    (
        "two claims in a Deployment, both net2",
        [template("a", cni("net2")), template("b", cni("net2")), pod("a", "b", kind="Deployment")],
        "spec.template.spec.resourceClaims[1] (template b, request nic): interface net2 is also made by",
    ),
    (
        "two claims in a CronJob, both net1",
        [template("a"), template("b"), pod("a", "b", kind="CronJob")],
        "spec.jobTemplate.spec.template.spec.resourceClaims[1] (template b, request nic): interface net1",
    ),
    (
        "two requests of one claim, both net1",
        [template("t", requests=("nic", "nic2")), pod("t")],
        "spec.resourceClaims[0] (template t, request nic2): interface net1 is also made by "
        "spec.resourceClaims[0] (template t, request nic)",
    ),
    (
        "two claims whose DeviceClass names one interface",
        with_class_config("storage0"),
        "interface storage0 is also made by spec.resourceClaims[0] (template a, request nic)",
    ),
    (
        "a tenant's plugin the allow-list refuses",
        [
            template(
                "t",
                cni(ipam={"type": "host-local", "ranges": [[{"subnet": "10.70.0.0/24"}]], "dataDir": "/etc"}),
            )
        ],
        "ipam",
    ),
]


def _write(tmp_path: Path, documents: list[dict[str, Any]]) -> Path:
    path = tmp_path / "manifests.yaml"
    path.write_text(yaml.safe_dump_all(documents, allow_unicode=True))
    return path


def test_the_mistakes_corpus_covers_the_issue() -> None:
    assert len(MISTAKES) >= 20


@pytest.mark.parametrize(("name", "documents", "named"), MISTAKES, ids=[m[0] for m in MISTAKES])
def test_every_offline_mistake_is_refused_naming_the_field(
    tmp_path: Path, name: str, documents: list[dict[str, Any]], named: str
) -> None:
    report = validate_files([_write(tmp_path, documents)], KNOWN)
    assert any(named in problem for problem in report.problems), (name, report.problems)


def test_what_is_right_passes(tmp_path: Path) -> None:
    fine = [
        ippool("lan3"),
        template("a", cni("net1")),
        template("b", cni("net2"), addresses("10.10.3.50", "fd00:10:3::50"), pool="lan3"),
        template("c", cni("net1.data-0_x")),
        template("d", cni(master="{{ device.ifName }}", mtu="{{ device.mtu }}")),
        pod("a", "b"),
        pod("a", "elsewhere"),  # a template not in these files: prepare time decides
    ]
    report = validate_files([_write(tmp_path, fine)], KNOWN)
    assert report.problems == [] and report.unchecked == []


def test_a_file_with_nothing_to_check_is_said_to_be_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    service = tmp_path / "service.yaml"
    service.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"}}))
    claim = _write(tmp_path, [template("a", cni("net1"))])
    assert cli.main(["validate", str(service), str(claim)]) == 0
    out = capsys.readouterr().out
    assert f"{service}: nothing netclaim can check (no netclaim.dev config, IPPool or pod with claims)" in out
    assert "1 of 2 file(s) checked: no problems" in out


def test_a_policy_file_teaches_validate_its_own_attributes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    claim = _write(tmp_path, [template("a", cni(master="{{ device.rack }}"))])
    assert cli.main(["validate", str(claim)]) == 1
    assert "netclaim publishes no attribute 'rack'" in capsys.readouterr().out
    policy = tmp_path / "policy.yaml"
    policy.write_text(
        "apiVersion: netclaim.dev/v1alpha1\nkind: PublishPolicy\nrules:\n"
        "- match: {names: ['enp*']}\n  mode: shared\n  attributes: {netclaim.dev/rack: r1}\n"
    )
    assert cli.main(["validate", "--policy-file", str(policy), str(claim)]) == 0


def _docs_blocks() -> list[tuple[str, str]]:
    found = []
    for page in sorted([*(ROOT / "docs").glob("*.md"), ROOT / "README.md"]):
        for index, block in enumerate(re.findall(r"```yaml\n(.*?)```", page.read_text(), re.DOTALL)):
            found.append((f"{page.relative_to(ROOT)}#{index}", block))
    return found


def _as_manifests(block: str) -> list[dict[str, Any]] | None:
    """The block as whole manifests (a fragment wrapped in what it is a part of); None: CEL selectors only,
    which validate has nothing to check in."""
    documents = [d for d in yaml.safe_load_all(block) if d is not None]
    if all(isinstance(d, dict) and "kind" in d for d in documents):
        return documents
    [fragment] = documents
    if isinstance(fragment, dict) and set(fragment) == {"selectors"}:
        return None
    if isinstance(fragment, dict) and "config" in fragment:  # a DeviceClass's config
        return [
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "DeviceClass",
                "metadata": {"name": "x"},
                "spec": fragment,
            }
        ]
    entries = [{"opaque": {"driver": "netclaim.dev", **fragment}}] if isinstance(fragment, dict) else fragment
    wrapped = template("x")
    wrapped["spec"]["spec"]["devices"]["config"] = entries
    return [wrapped]


@pytest.mark.parametrize(("where", "block"), _docs_blocks(), ids=[b[0] for b in _docs_blocks()])
def test_every_yaml_example_in_the_docs_is_accepted(tmp_path: Path, where: str, block: str) -> None:
    documents = _as_manifests(block)
    if documents is None:
        return  # selectors alone: CEL the apiserver checks
    path = _write(tmp_path, documents)
    kinds = {d["kind"] for d in documents}
    if kinds <= {"PublishPolicy"}:
        load_policy(path)
    elif kinds <= {"NicOverrides"}:
        load_overrides(path)
    elif kinds <= {"MultiNetworkPolicy"}:
        read = [PolicyObject.from_api(d) for d in documents]
        assert [(p.problem, bool(p.networks)) for p in read] == [("", True)] * len(read), where
    else:
        report = validate_files([path], KNOWN)
        assert report.problems == [], (where, report)
        if any(word in block for word in ("opaque", "parameters", "resourceClaims")):  # ours: looked at
            assert report.unchecked == [], (where, report)


def test_the_docs_have_examples_to_check() -> None:
    assert len(_docs_blocks()) >= 10


@pytest.mark.parametrize("example", ["demo", "extended-resources", "multinet"])
def test_every_shipped_example_is_accepted(example: str) -> None:
    """What a user applies first: examples/<example> as a set (a pod and its claims' templates together)."""
    paths = sorted((ROOT / "examples" / example).glob("*.yaml"))
    report = validate_files([p for p in paths if p.name != "cluster.yaml"], KNOWN)
    assert report.problems == [], report


def test_a_claim_wide_config_does_not_make_another_drivers_request_an_interface(tmp_path: Path) -> None:
    claim = template("t", cni())
    claim["spec"]["spec"]["devices"]["requests"].append(
        {"name": "gpu", "exactly": {"deviceClassName": "gpu.example.com"}}
    )
    del claim["spec"]["spec"]["devices"]["config"][0]["requests"]  # applies to every request
    assert validate_files([_write(tmp_path, [claim, pod("t")])], KNOWN).problems == []

"""A bad policy stops the agent before it touches anything, naming the file and the field."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from netclaim.core.config.publishpolicy import AttributeValue
from netclaim.core.devices.rules import load_policy, matches
from netclaim.errors import ConfigError

GOOD = """apiVersion: netclaim.dev/v1alpha1
kind: PublishPolicy
rules:
- match: {names: ["enp*"], cel: 'device.attributes["netclaim.dev"].speed >= 10000'}
  mode: shared
  bandwidth: {total: 10Gi, default: 1Gi}
"""

BAD = {
    "yaml error": ("rules: [unclosed", "not valid YAML"),
    "unknown key": (
        GOOD.replace("mode: shared", "mode: shared\n  colour: red"),
        "rules[0].colour: unknown field",
    ),
    "wrong type": (GOOD.replace("mode: shared", "mode: shared\n  attachments: many"), "rules[0].attachments"),
    "number as string": (
        GOOD.replace("mode: shared", "mode: shared\n  attachments: '32'"),
        "rules[0].attachments",
    ),
    "bad mode": (GOOD.replace("mode: shared", "mode: sharing"), "rules[0].mode"),
    "cel syntax": (GOOD.replace(">= 10000", ">= "), "rules[0].match.cel: invalid CEL"),
    "cel unknown name": (
        GOOD.replace('device.attributes["netclaim.dev"].speed', "dev.speed"),
        "rules[0].match.cel: invalid CEL",
    ),
    "cel not bool": (
        GOOD.replace(">= 10000", ""),
        "rules[0].match.cel: invalid CEL: must evaluate to a bool",
    ),
    "cel type error": (GOOD.replace(">= 10000", '>= "fast"'), "rules[0].match.cel: invalid CEL"),
    "bad quantity": (GOOD.replace("total: 10Gi", "total: ten"), "rules[0].bandwidth.total"),
    "unknown attribute match": (
        GOOD.replace('names: ["enp*"]', "attributes: {colour: red}"),
        "rules[0].match.attributes: unknown attributes ['colour']",
    ),
    "bad extra attribute name": (
        GOOD.replace("mode: shared", "mode: shared\n  attributes: {'a b': x}"),
        "rules[0].attributes",
    ),
    "wrong kind": (
        GOOD.replace("kind: PublishPolicy", "kind: Policy"),
        "kind: Invalid enum value 'Policy'",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_policy_is_refused_with_file_and_field(tmp_path: Path, case: str) -> None:
    text, expected = BAD[case]
    path = tmp_path / "policy.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_policy(path)
    assert str(path) in str(err.value) and expected in str(err.value)


def test_agent_refuses_to_start_on_a_bad_policy(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(BAD["cel syntax"][0])
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "netclaim",
            "agent",
            "--node-name=n1",
            f"--policy-file={path}",
            f"--kubeconfig={tmp_path / 'none'}",
            f"--state-dir={tmp_path}",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert f"{path}: rules[0].match.cel: invalid CEL" in result.stderr


def test_rules_match_by_name_attributes_and_cel(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(GOOD)
    rule = load_policy(path).rules[0]
    fast: dict[str, dict[str, AttributeValue]] = {"netclaim.dev": {"speed": 25000}}
    assert matches(rule, "enp1s0", fast, "netclaim.dev")
    assert not matches(rule, "eth1", fast, "netclaim.dev")
    slow: dict[str, dict[str, AttributeValue]] = {"netclaim.dev": {"speed": 1000}}
    assert not matches(rule, "enp1s0", slow, "netclaim.dev")
    assert not matches(rule, "enp1s0", {"netclaim.dev": {}}, "netclaim.dev"), (
        "a missing attribute is no match"
    )

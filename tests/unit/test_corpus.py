"""Every malformed config and policy of the corpus is refused with a message naming the field; no crash.

Configs go through the agent's own planning (netclaim.core.plan.plan_claim on a claim that carries
them, then the CNI adapter's plugin lookup in a directory holding the admission allow-list's plugins):
what prepare does before any plugin runs.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from netclaim.adapters.cni import CniRunner
from netclaim.core.config.cniconfig import decode, plugin_types
from netclaim.core.config.validate import ALLOWED_PLUGINS
from netclaim.core.devices.catalog import Device
from netclaim.core.devices.rules import load_policy
from netclaim.core.objects import Claim
from netclaim.core.plan import ClaimInputs, NodeContext, plan_claim
from netclaim.errors import ConfigError
from tests.corpus import VALID_CONFIG, VALID_POLICY, ConfigCase, PolicyCase, config_cases, policy_cases
from tests.unit.fakes import SAMPLE_CLUSTER, every_version, sample_allocation, sample_claim, sample_config

LOCATION = "claim team-a/claim-1 (allocation config[0]).opaque.parameters"
CONFIGS = config_cases()
POLICIES = policy_cases()
DEVICE = Device(
    name="pci-0000-5e-00-0",
    if_name="enp0s10",
    shared=True,
    attributes={"netclaim.dev/ifName": "enp0s10", "netclaim.dev/mtu": 1500},
    tenant_ranges=("10.90.0.0/16",),  # VALID_CONFIG's range: the test cluster's policy gives tenants it too
)


def _claim(parameters: object) -> Claim:
    return sample_claim((sample_allocation(DEVICE, share_id="s1"),), (sample_config(parameters),))


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> CniRunner:
    """A plugin directory holding the plugins admission allows (empty executables: nothing runs here)."""
    bin_dir = tmp_path_factory.mktemp("cni-bin")
    for name in ALLOWED_PLUGINS:
        (bin_dir / name).write_text("#!/bin/sh\nexit 1\n")
        (bin_dir / name).chmod(0o755)
    return CniRunner([bin_dir])


def prepare_refusal(parameters: object, cni: CniRunner) -> str | None:
    """None when the agent's planning accepts `parameters` as a claim's config, else its error message."""
    try:
        claim = _claim(parameters)
        node = NodeContext("netclaim.dev", "node-1", {DEVICE.name: DEVICE}.get, reserved=SAMPLE_CLUSTER)
        [planned] = plan_claim(ClaimInputs(claim, every_version(claim)), node)
        for kind in plugin_types(planned.plan.conflist):
            cni.plugin_path(kind)
    except ConfigError as err:
        return str(err)
    return None


def named_fields(message: str) -> Iterator[str]:
    """The top-level field of the parameters each line of an error message names."""
    for line in message.splitlines():
        path = line.removeprefix(f"{LOCATION}.")
        if path.startswith(("config", "plugin type")):
            yield "config"
        else:
            yield re.split(r"[.\[:]", path, maxsplit=1)[0]


def test_the_corpus_is_big_enough() -> None:
    total = len(CONFIGS) + len(POLICIES)
    print(f"bad-input corpus: {len(CONFIGS)} configs + {len(POLICIES)} policies = {total}")
    assert len(CONFIGS) + len(POLICIES) >= 300
    assert len({c.name for c in CONFIGS}) == len(CONFIGS)


def test_the_valid_originals_pass(tmp_path: Path, installed: CniRunner) -> None:
    assert prepare_refusal(VALID_CONFIG, installed) is None
    path = tmp_path / "policy.yaml"
    path.write_text(VALID_POLICY)
    load_policy(path)


@pytest.mark.parametrize("case", CONFIGS, ids=lambda c: c.name)
def test_every_bad_config_is_refused_at_prepare_naming_where(case: ConfigCase, installed: CniRunner) -> None:
    """Whether or not admission catches it first (tests/cluster/test_admission.py), the agent does."""
    message = prepare_refusal(case.parameters, installed)
    assert message is not None, f"{case.name} was accepted"
    assert message.startswith((LOCATION, "config", "plugin type")), message


@pytest.mark.parametrize("case", POLICIES, ids=lambda c: c.name)
def test_every_bad_policy_is_refused_naming_the_file(case: PolicyCase, tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(case.text)
    with pytest.raises(ConfigError) as err:
        load_policy(path)
    assert str(path) in str(err.value)


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=5)
    ),
    max_leaves=25,
)


@settings(max_examples=400, deadline=None)
@given(JSON)
def test_arbitrary_parameters_are_refused_naming_the_location(
    installed: CniRunner, parameters: object
) -> None:
    """Random JSON is never a CNIConfig (its apiVersion alone is 21 characters): always a ConfigError
    that names where the parameters came from, never another exception."""
    message = prepare_refusal(parameters, installed)
    assert message is not None
    assert message.startswith(LOCATION), message


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(list(VALID_CONFIG)), JSON, max_size=5))
def test_a_mutation_is_refused_naming_a_changed_field_or_kept_as_sent(
    installed: CniRunner, fields: dict[str, object]
) -> None:
    """Starting from a valid config, any refusal must be about one of the fields the mutation changed;
    an accepted config must decode to exactly what was sent (strict: nothing coerced or dropped)."""
    parameters = json.loads(json.dumps({**VALID_CONFIG, **fields}))
    changed = {key for key, value in fields.items() if value != VALID_CONFIG[key]}
    message = prepare_refusal(parameters, installed)
    if message is None:
        assert msgspec.to_builtins(decode(parameters, LOCATION)) == parameters
    else:
        assert changed and set(named_fields(message)) <= changed, (message, changed)

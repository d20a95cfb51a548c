"""Every malformed config and policy of the corpus is refused with a message naming the field; no crash."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from netclaim.api.cniconfig import as_conflist, decode, plugin_types
from netclaim.api.placeholders import render
from netclaim.api.validate import ALLOWED_PLUGINS
from netclaim.configure.plan import check_host_reach
from netclaim.errors import ConfigError
from netclaim.publish.policy import load_policy
from tests.corpus import VALID_CONFIG, VALID_POLICY, ConfigCase, PolicyCase, config_cases, policy_cases

LOCATION = "claim ns/c (allocation config[0]).opaque.parameters"
CONFIGS = config_cases()
POLICIES = policy_cases()


def test_the_corpus_is_big_enough() -> None:
    total = len(CONFIGS) + len(POLICIES)
    print(f"bad-input corpus: {len(CONFIGS)} configs + {len(POLICIES)} policies = {total}")
    assert len(CONFIGS) + len(POLICIES) >= 300
    assert len({c.name for c in CONFIGS}) == len(CONFIGS)


def test_the_valid_originals_pass(tmp_path: Path) -> None:
    decode(VALID_CONFIG, LOCATION)
    path = tmp_path / "policy.yaml"
    path.write_text(VALID_POLICY)
    load_policy(path)


@pytest.mark.parametrize("case", CONFIGS, ids=lambda c: c.name)
def test_every_bad_config_is_refused_naming_where(case: ConfigCase) -> None:
    with pytest.raises(ConfigError) as err:
        _decode_and_render(case.parameters)
    message = str(err.value)
    assert message.startswith((LOCATION, "config", "plugin type")), message


def _decode_and_render(parameters: object) -> None:
    """What prepare does with parameters before any plugin runs; a plugin outside the allow-list stands for
    one that is not installed on the node."""
    config = decode(parameters, LOCATION)
    if config.config is not None:
        rendered = render(as_conflist(config.config), {"device.ifName": "enp0s10"}, "config")
        check_host_reach(rendered, "enp0s10")
        for kind in plugin_types(rendered):
            if kind not in ALLOWED_PLUGINS:
                raise ConfigError(f"plugin type {kind!r}: no such plugin in /opt/cni/bin")


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
def test_arbitrary_parameters_never_crash_the_decoder(parameters: object) -> None:
    with contextlib.suppress(ConfigError):
        _decode_and_render(parameters)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(list(VALID_CONFIG)), JSON, max_size=5))
def test_mutated_top_level_fields_never_crash(fields: dict[str, object]) -> None:
    parameters = {**VALID_CONFIG, **fields}
    with contextlib.suppress(ConfigError):
        _decode_and_render(json.loads(json.dumps(parameters)))

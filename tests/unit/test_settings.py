from __future__ import annotations

import argparse
from pathlib import Path

import msgspec
import pytest

from netclaim.cli.main import build_parser
from netclaim.core.config import strict
from netclaim.core.config.settings import (
    AgentSettings,
    ControllerSettings,
    load_settings,
    settings_of,
)
from netclaim.errors import ConfigError


def test_flags_beat_environment_beat_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "agent.yaml"
    config.write_text("node-name: from-file\ndriver_name: file.example.com\nmetrics_address: '0.0.0.0:1'\n")
    monkeypatch.setenv("NETCLAIM_DRIVER_NAME", "env.example.com")
    monkeypatch.setenv("NETCLAIM_REMOVE_SLICES_ON_EXIT", "true")
    settings = load_settings({"metrics_address": "127.0.0.1:2"}, config)
    assert settings.node_name == "from-file"
    assert settings.driver_name == "env.example.com"
    assert settings.metrics_address == "127.0.0.1:2"
    assert settings.remove_slices_on_exit is True


def test_node_name_from_downward_api_and_empty_socket_disables_nri(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NODE_NAME", "node-7")
    settings = load_settings({"nri_socket": ""}, None)
    assert settings.node_name == "node-7" and settings.nri_socket is None


def test_unknown_setting_is_refused(tmp_path: Path) -> None:
    config = tmp_path / "agent.yaml"
    config.write_text("node_name: n\nnri_sockett: /x\n")
    with pytest.raises(ConfigError, match="nri_sockett: unknown field"):
        load_settings({}, config)


def test_paths_are_read_as_paths_and_a_path_that_is_no_text_is_an_error(tmp_path: Path) -> None:
    settings = load_settings({"node_name": "n", "kubeconfig": tmp_path / "k"}, None)
    assert settings.kubeconfig == tmp_path / "k" and settings.state_dir == Path("/var/lib/netclaim")
    assert strict.decode(ControllerSettings, {"kubeconfig": "/k"}, "controller settings").kubeconfig == Path(
        "/k"
    )
    config = tmp_path / "agent.yaml"
    config.write_text("node_name: n\nstate_dir: 5\n")
    with pytest.raises(ConfigError, match="agent settings: state_dir: Expected a path, got 5"):
        load_settings({}, config)


def test_cni_plugins_are_searched_in_the_directories_given_and_a_relative_one_is_refused() -> None:
    assert load_settings({"node_name": "n"}, None).cni_bin_dirs == (
        Path("/opt/cni/bin"),
        Path("/usr/lib/cni"),
    )
    one = load_settings({"node_name": "n", "cni_bin_dir": "/var/lib/cni/bin"}, None)
    assert one.cni_bin_dirs == (Path("/var/lib/cni/bin"),)
    with pytest.raises(
        ConfigError, match="cni_bin_dir: '/opt/cni/bin:usr/lib/cni' is not a list of absolute"
    ):
        load_settings({"node_name": "n", "cni_bin_dir": "/opt/cni/bin:usr/lib/cni"}, None)


@pytest.mark.parametrize("typo", ["ture", "flase", "enabled", ""])
def test_a_boolean_variable_that_is_no_boolean_is_an_error_not_false(
    typo: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It read as false: NETCLAIM_DEVICE_METADATA=ture turned the device metadata off without a word."""
    monkeypatch.setenv("NETCLAIM_DEVICE_METADATA", typo)
    with pytest.raises(ConfigError, match=f"NETCLAIM_DEVICE_METADATA: '{typo}' is not a boolean"):
        load_settings({"node_name": "n"}, None)


def test_variables_are_read_as_their_settings_type(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NETCLAIM_CHECK_SECONDS", "60")
    monkeypatch.setenv("NETCLAIM_DEVICE_METADATA", "Off")
    settings = load_settings({"node_name": "n"}, None)
    assert settings.check_seconds == 60.0 and settings.device_metadata is False
    monkeypatch.setenv("NETCLAIM_CHECK_SECONDS", "a minute")
    with pytest.raises(ConfigError, match="NETCLAIM_CHECK_SECONDS: 'a minute' is not a number"):
        load_settings({"node_name": "n"}, None)
    monkeypatch.setenv("NETCLAIM_CHECK_SECONDS", "nan")
    with pytest.raises(ConfigError, match="NETCLAIM_CHECK_SECONDS: 'nan' is not a finite number"):
        load_settings({"node_name": "n"}, None)


@pytest.mark.parametrize(("command", "model"), [("agent", AgentSettings), ("controller", ControllerSettings)])
def test_every_setting_is_a_flag_of_its_command_and_no_flag_is_another(
    command: str, model: type[msgspec.Struct], capsys: pytest.CaptureFixture[str]
) -> None:
    """The flags are made from the settings: a new setting is a flag, with its description as help."""
    parser = build_parser()
    [commands] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    flags = {a.dest for a in commands.choices[command]._actions if a.dest not in {"help", "config"}}
    assert flags == {f.name for f in msgspec.structs.fields(model)}
    args = parser.parse_args([command, "--check-seconds", "5"] if command == "agent" else [command])
    assert (args.check_seconds == 5.0) if command == "agent" else args.driver_name is None  # None: not given
    with pytest.raises(SystemExit):  # read as its setting's type, at once
        parser.parse_args(
            [command, "--resync-seconds" if command == "controller" else "--check-seconds", "soon"]
        )
    for setting in settings_of(model):
        assert setting.description, "a setting without a description has a flag without help"

from __future__ import annotations

from pathlib import Path

import pytest

from netclaim.core.config.settings import load_settings
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

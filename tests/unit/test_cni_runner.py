"""The CNI runner's guard rails: plugins only from its directory, by name, never past their time."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from netclaim.adapters.cni import CniRunner, Invocation
from netclaim.configure.plan import with_node_defaults
from netclaim.errors import CniError, ConfigError

CONFLIST = {"cniVersion": "1.0.0", "name": "t", "plugins": [{"type": "sleepy"}]}
INVOCATION = Invocation("c1", "/proc/self/ns/net", "net1", "IgnoreUnknown=1")


def _plugin(directory: Path, name: str, body: str) -> Path:
    path = directory / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return path


def test_a_hanging_plugin_is_killed_at_the_deadline(tmp_path: Path) -> None:
    _plugin(tmp_path, "sleepy", "sleep 30")
    runner = CniRunner(tmp_path, timeout=5)
    started = time.monotonic()
    with pytest.raises(CniError, match="timed out") as err:
        asyncio.run(runner.add(CONFLIST, INVOCATION, time.monotonic() + 0.5))
    assert err.value.code == 11
    assert time.monotonic() - started < 3  # killed at its deadline, with whatever it started


def test_plugins_run_only_from_the_directory_by_name(tmp_path: Path) -> None:
    runner = CniRunner(tmp_path, allowed=frozenset({"macvlan", "escape"}))
    (tmp_path / "escape").symlink_to("/bin/sh")  # a link out of the directory is not a plugin
    for kind, reason in (
        ("../sh", "not a plugin name"),
        ("/bin/sh", "not a plugin name"),
        ("bridge", "not allowed on this node"),
        ("macvlan", "no such plugin"),
        ("escape", "no such plugin"),
    ):
        with pytest.raises(ConfigError, match=reason):
            runner.plugin_path(kind)


def test_the_environment_is_the_spec_s_and_no_shell_runs(tmp_path: Path) -> None:
    out = tmp_path / "env.txt"
    _plugin(tmp_path, "sleepy", f'env > {out}; cat >/dev/null; echo \'{{"cniVersion":"1.0.0"}}\'')
    asyncio.run(CniRunner(tmp_path).add(CONFLIST, INVOCATION, time.monotonic() + 5))
    env = dict(line.split("=", 1) for line in out.read_text().splitlines() if "=" in line)
    assert env["CNI_COMMAND"] == "ADD" and env["CNI_CONTAINERID"] == "c1" and env["CNI_IFNAME"] == "net1"
    assert env["CNI_PATH"] == str(tmp_path.resolve()) and env["CNI_ARGS"] == "IgnoreUnknown=1"
    assert not {k for k in env if k.startswith(("KUBE", "NETCLAIM", "PYTHON"))}  # nothing of ours leaks in


def test_host_local_without_a_data_dir_keeps_reservations_where_the_node_says(tmp_path: Path) -> None:
    chain = {
        "cniVersion": "1.0.0",
        "name": "t",
        "plugins": [
            {"type": "macvlan", "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.1.0.0/24"}]]}},
            {"type": "bridge", "ipam": {"type": "host-local", "dataDir": "/admin/chose"}},
            {"type": "host-device", "ipam": {"type": "static"}},
            {"type": "tuning"},
        ],
    }
    filled = with_node_defaults(chain, tmp_path / "ipam")
    assert [p.get("ipam", {}).get("dataDir") for p in filled["plugins"]] == [
        str(tmp_path / "ipam" / "admin"),
        "/admin/chose",
        None,
        None,
    ]
    assert "dataDir" not in chain["plugins"][0]["ipam"]  # type: ignore[index]  # the input is not changed
    assert with_node_defaults(chain, None) == chain  # no setting: the plugin's own default


def test_host_local_reservations_of_one_container_are_released_by_hand(tmp_path: Path) -> None:
    """When host-local's own DEL cannot run: its files hold the container ID on their first line."""
    network = tmp_path / "ipam" / "lan1"
    network.mkdir(parents=True)
    (network / "10.10.1.2").write_text("sandbox-1\r\nnet1")
    (network / "10.10.1.3").write_text("sandbox-2\r\nnet1")
    (network / "last_reserved_ip.0").write_text("10.10.1.3")
    (network / "lock").write_text("")
    conflist = {
        "cniVersion": "1.0.0",
        "name": "lan1",
        "plugins": [{"type": "macvlan", "ipam": {"type": "host-local", "dataDir": str(tmp_path / "ipam")}}],
    }
    runner = CniRunner(tmp_path)
    assert runner.release_host_local(conflist, "sandbox-1") == ["10.10.1.2"]
    assert sorted(p.name for p in network.iterdir()) == ["10.10.1.3", "last_reserved_ip.0", "lock"]
    assert runner.release_host_local(conflist, "") == []

"""The CNI runner's guard rails: plugins only from its directory, by name, never past their time."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from netclaim.adapters.cni import CniRunner
from netclaim.core.node import Invocation
from netclaim.core.plan import with_node_defaults
from netclaim.errors import CniError, CniNotReadyError, CniTryAgainError, ConfigError, TransientError

CONFLIST = {"cniVersion": "1.0.0", "name": "t", "plugins": [{"type": "sleepy"}]}
INVOCATION = Invocation("c1", "/proc/self/ns/net", "net1", "IgnoreUnknown=1")


def _plugin(directory: Path, name: str, body: str) -> Path:
    path = directory / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return path


def test_a_hanging_plugin_is_killed_at_the_deadline(tmp_path: Path) -> None:
    _plugin(tmp_path, "sleepy", "sleep 30")
    runner = CniRunner([tmp_path], timeout=5)
    started = time.monotonic()
    with pytest.raises(CniTryAgainError, match="timed out") as err:
        asyncio.run(runner.add(CONFLIST, INVOCATION, time.monotonic() + 0.5))
    assert err.value.code == 11 and isinstance(err.value, TransientError)  # kubelet retries
    assert time.monotonic() - started < 3  # killed at its deadline, with whatever it started


def test_plugins_run_only_from_the_directory_by_name(tmp_path: Path) -> None:
    runner = CniRunner([tmp_path], allowed=frozenset({"macvlan", "escape"}))
    (tmp_path / "escape").symlink_to("/bin/sh")  # a link out of the directory is not a plugin
    for kind, reason in (
        ("../sh", "not a plugin name"),
        ("/bin/sh", "not a plugin name"),
        ("bridge", "not allowed on this node"),
        ("macvlan", "no such plugin"),
        ("escape", "not an executable file of"),
    ):
        with pytest.raises(ConfigError, match=reason):
            runner.plugin_path(kind)


def test_plugins_are_searched_in_the_directories_order_and_a_link_never_leaves_its_own(
    tmp_path: Path,
) -> None:
    first, second = tmp_path / "opt-cni-bin", tmp_path / "usr-lib-cni"
    first.mkdir()
    second.mkdir()
    _plugin(second, "macvlan", "exit 0")
    _plugin(second, "bridge", "exit 0")
    _plugin(first, "bridge", "exit 0")
    _plugin(second, "host-local", "exit 0")
    (first / "host-device").symlink_to(second / "macvlan")  # into another searched directory: not its own
    (first / "host-local").symlink_to("/bin/sh")  # out of it, with a real one further on
    runner = CniRunner([first, second])
    assert runner.plugin_path("bridge") == first / "bridge"  # the first that has it
    assert runner.plugin_path("macvlan") == second / "macvlan"  # Debian's directory, when the first lacks it
    with pytest.raises(ConfigError, match=f"no such plugin in {first}, {second}"):
        runner.plugin_path("static")
    # CNI's lookup (a delegating plugin's, through CNI_PATH) would run the link: refused, not searched past
    for kind in ("host-device", "host-local"):
        with pytest.raises(ConfigError, match=f"{first / kind} is not an executable file of {first}"):
            runner.plugin_path(kind)


def test_the_environment_is_the_spec_s_and_no_shell_runs(tmp_path: Path) -> None:
    out = tmp_path / "env.txt"
    _plugin(tmp_path, "sleepy", f'env > {out}; cat >/dev/null; echo \'{{"cniVersion":"1.0.0"}}\'')
    asyncio.run(CniRunner([tmp_path]).add(CONFLIST, INVOCATION, time.monotonic() + 5))
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
    runner = CniRunner([tmp_path])
    assert runner.release_host_local(conflist, "sandbox-1") == ["10.10.1.2"]
    assert sorted(p.name for p in network.iterdir()) == ["10.10.1.3", "last_reserved_ip.0", "lock"]
    assert runner.release_host_local(conflist, "") == []


def test_a_plugin_that_cannot_be_spawned_is_a_cni_error_and_the_rest_of_the_chain_still_runs(
    tmp_path: Path,
) -> None:
    """An interface name with a NUL byte once raised ValueError out of DEL: every NodeUnprepareResources of
    the claim failed and its pod stayed Terminating. Spawning failures are the plugin's CniError now."""
    called = tmp_path / "called"
    _plugin(tmp_path, "first", f"echo first >> {called}; cat >/dev/null")
    _plugin(tmp_path, "sleepy", f"echo sleepy >> {called}; cat >/dev/null")
    chain = {"cniVersion": "1.0.0", "name": "t", "plugins": [{"type": "first"}, {"type": "sleepy"}]}
    runner = CniRunner([tmp_path])
    with pytest.raises(CniError, match=r"cannot run .*/first: embedded null byte") as err:
        asyncio.run(
            runner.add(chain, Invocation("c1", "/proc/self/ns/net", "net\0", ""), time.monotonic() + 5)
        )
    assert (err.value.command, err.value.code) == ("ADD", 999)
    with pytest.raises(CniError, match="embedded null byte"):
        asyncio.run(runner.delete(chain, Invocation("c1", "", "net\0", ""), None, time.monotonic() + 5))
    assert not called.exists()  # neither could run, and DEL tried both


def test_a_failing_plugins_answer_of_any_shape_is_its_cni_error(tmp_path: Path) -> None:
    deep = "[" * 5000 + "]" * 5000
    for answer, expected in (
        ('{"code": "seven", "msg": {"a": 1}, "details": [2]}', (999, "said so on stderr", "")),
        (deep, (999, deep[:500], "")),
        ('{"code": 7, "msg": "master down", "details": "enp1s0"}', (7, "master down", "enp1s0")),
    ):
        _plugin(tmp_path, "sleepy", f"cat >/dev/null; echo '{answer}'; echo said so on stderr >&2; exit 1")
        with pytest.raises(CniError) as err:
            asyncio.run(CniRunner([tmp_path]).add(CONFLIST, INVOCATION, time.monotonic() + 5))
        assert (err.value.code, err.value.message, err.value.details) == expected


def test_a_plugins_code_decides_whether_its_failure_is_transient(tmp_path: Path) -> None:
    """Code 11 is the spec's "try again later" (netclaim says it of a plugin out of time): retried, the
    user not blamed. Any other code is the config's or the node's, until they change."""
    for code, transient in ((11, True), (7, False), (999, False)):
        _plugin(tmp_path, "sleepy", f'cat >/dev/null; echo \'{{"code": {code}, "msg": "m"}}\'; exit 1')
        with pytest.raises(CniError) as err:
            asyncio.run(CniRunner([tmp_path]).add(CONFLIST, INVOCATION, time.monotonic() + 5))
        assert (err.value.code, isinstance(err.value, TransientError)) == (code, transient)


def test_status_is_asked_once_per_network_and_plugin_while_fresh_and_a_refusal_is_never_kept(
    tmp_path: Path,
) -> None:
    """A pool claim's static addresses make each claim's config its own: the answer is the network's."""
    calls, refuse = tmp_path / "calls", tmp_path / "refuse"
    _plugin(
        tmp_path,
        "macvlan",
        f'cat >/dev/null; echo "$CNI_COMMAND" >> {calls}; '
        f'if [ -e {refuse} ]; then echo \'{{"code":50,"msg":"not now"}}\'; exit 1; fi',
    )
    runner = CniRunner([tmp_path])

    def conflist(network: str, address: str) -> dict[str, object]:
        ipam = {"type": "static", "addresses": [{"address": address}]}
        return {"cniVersion": "1.1.0", "name": network, "plugins": [{"type": "macvlan", "ipam": ipam}]}

    for address in ("10.1.0.1/24", "10.1.0.2/24"):
        asyncio.run(runner.status(conflist("lan", address), time.monotonic() + 5))
    asyncio.run(runner.status(conflist("storage", "10.2.0.1/24"), time.monotonic() + 5))
    asyncio.run(
        runner.status({**conflist("old", "10.3.0.1/24"), "cniVersion": "1.0.0"}, time.monotonic() + 5)
    )
    assert calls.read_text().split() == ["STATUS", "STATUS"]  # lan once, storage once, 1.0.0 never
    refuse.touch()
    for _ in range(2):
        with pytest.raises(CniNotReadyError, match="not now"):
            asyncio.run(runner.status(conflist("backplane", "10.4.0.1/24"), time.monotonic() + 5))
    assert calls.read_text().split().count("STATUS") == 4


def test_a_list_that_disables_check_or_gc_is_neither_checked_nor_collected(tmp_path: Path) -> None:
    calls = tmp_path / "calls"
    _plugin(tmp_path, "macvlan", f'cat >/dev/null; echo "$CNI_COMMAND" >> {calls}')
    runner = CniRunner([tmp_path])
    listed = {"cniVersion": "1.1.0", "name": "lan", "plugins": [{"type": "macvlan"}]}
    for flags in ({"disableCheck": True, "disableGC": True}, {}):
        conflist = {**listed, **flags}
        asyncio.run(runner.check(conflist, INVOCATION, {"cniVersion": "1.1.0"}, time.monotonic() + 5))
        asyncio.run(runner.gc(conflist, [("c1", "net1")], time.monotonic() + 5))
    assert calls.read_text().split() == ["CHECK", "GC"]  # the second round only

"""The policy follows its ConfigMap without a restart: a changed file is read again (also when the
kubelet swaps the mounted `..data` symlink), a broken change keeps the last good policy."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from netclaim.agent.publish.loop import PolicyFile, watch_policy
from netclaim.errors import ConfigError
from netclaim.runtime.trigger import Trigger

SHARED = """apiVersion: netclaim.dev/v1alpha1
kind: PublishPolicy
rules:
- match: {names: ["enp*"]}
  mode: shared
"""
EXCLUSIVE = SHARED.replace("mode: shared", "mode: exclusive")


def _mounted(directory: Path, version: str, text: str) -> Path:
    """A ConfigMap volume as kubelet writes it: the file is a symlink through `..data` to a version dir."""
    (directory / version).mkdir()
    (directory / version / "policy.yaml").write_text(text)
    link = directory / "..data_tmp"
    link.symlink_to(version)
    link.replace(directory / "..data")
    path = directory / "policy.yaml"
    if not path.is_symlink():
        path.symlink_to("..data/policy.yaml")
    return path


def _mode(policy: PolicyFile) -> str:
    return str(policy.policy.rules[0].mode)


def test_an_unchanged_file_is_not_read_again(tmp_path: Path) -> None:
    policy = PolicyFile(_mounted(tmp_path, "v1", SHARED))
    assert not policy.changed() and _mode(policy) == "shared"


def test_a_configmap_update_gives_the_new_rules(tmp_path: Path) -> None:
    policy = PolicyFile(_mounted(tmp_path, "v1", SHARED))
    _mounted(tmp_path, "v2", EXCLUSIVE)
    assert policy.changed() and _mode(policy) == "exclusive"
    assert not policy.changed()


def test_no_file_publishes_nothing_until_the_configmap_is_created_and_again_once_it_is_deleted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "policy.yaml"
    policy = PolicyFile(path)
    assert policy.policy.rules == [] and not policy.changed()
    assert any("nothing is published until the admin creates it" in r.getMessage() for r in caplog.records)
    _mounted(tmp_path, "v1", SHARED)
    assert policy.changed() and _mode(policy) == "shared"
    for name in ("policy.yaml", "..data"):
        (tmp_path / name).unlink()
    assert policy.changed() and policy.policy.rules == []


def test_a_broken_update_keeps_the_last_good_policy(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    policy = PolicyFile(_mounted(tmp_path, "v1", SHARED))
    _mounted(tmp_path, "v2", SHARED.replace("mode: shared", "mode: sharing"))
    assert not policy.changed()
    assert _mode(policy) == "shared"
    [record] = [r for r in caplog.records if "keeping the last good one" in r.getMessage()]
    assert "rules[0].mode" in record.__dict__["error"]
    _mounted(tmp_path, "v3", EXCLUSIVE)  # fixed: taken
    assert policy.changed() and _mode(policy) == "exclusive"


def test_a_broken_policy_at_start_still_stops_the_agent(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"rules\[0\]\.mode"):
        PolicyFile(_mounted(tmp_path, "v1", SHARED.replace("mode: shared", "mode: sharing")))


def test_no_path_means_no_rule_and_never_a_change() -> None:
    policy = PolicyFile(None)
    assert not policy.changed() and policy.policy.rules == []


async def test_the_watch_wakes_the_publisher_once_per_change(tmp_path: Path) -> None:
    policy = PolicyFile(_mounted(tmp_path, "v1", SHARED))
    trigger = Trigger()
    task = asyncio.create_task(watch_policy(policy, trigger, seconds=0.01))
    try:
        await asyncio.sleep(0.05)
        assert not trigger._event.is_set()  # nothing changed: no pass
        _mounted(tmp_path, "v2", EXCLUSIVE)
        await asyncio.wait_for(trigger.wait(), 2)
        assert _mode(policy) == "exclusive"
    finally:
        task.cancel()

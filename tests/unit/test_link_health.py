"""Link health's damping: when a NIC counts as down, and when it has settled back."""

from __future__ import annotations

import datetime
from dataclasses import replace

from netclaim.agent.publish.health import LinkHealth
from netclaim.core.devices.nic import NetworkInterface

LOSS = datetime.datetime(2026, 12, 2, 22, 0, tzinfo=datetime.UTC)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def nic(carrier: bool, changes: int, name: str = "enp1s0") -> NetworkInterface:
    return NetworkInterface(
        name=name,
        index=2,
        kind="physical",
        mac="02:00:00:00:00:02",
        mtu=1500,
        up=True,
        virtual=False,
        carrier=carrier,
        carrier_changes=changes,
    )


def test_down_at_the_first_loss_and_up_once_back_for_a_second_without_a_loss() -> None:
    clock = Clock()
    health = LinkHealth(clock, lambda: LOSS)
    assert health.observe([nic(True, 0)]) is None and dict(health.down) == {}
    assert health.observe([nic(False, 1)]) is None
    assert dict(health.down) == {"enp1s0": LOSS}
    clock.now += 0.3
    assert health.observe([nic(True, 2)]) == 1.0  # back: settled in a second, if nothing happens
    clock.now += 0.6
    left = health.observe([nic(True, 2)])
    assert left is not None and abs(left - 0.4) < 1e-9 and dict(health.down) == {"enp1s0": LOSS}
    clock.now += 0.4
    assert health.observe([nic(True, 2)]) is None and dict(health.down) == {}


def test_a_loss_and_return_between_two_scans_starts_the_second_again() -> None:
    clock = Clock()
    health = LinkHealth(clock, lambda: LOSS)
    health.observe([nic(False, 1)])
    health.observe([nic(True, 2)])
    clock.now += 0.9
    assert health.observe([nic(True, 4)]) == 1.0, "the kernel counted a loss and a return meanwhile"
    clock.now += 0.9
    health.observe([nic(True, 4)])
    assert "enp1s0" in health.down


def test_a_hundred_flaps_in_ten_seconds_are_one_outage() -> None:
    clock = Clock()
    losses: list[datetime.datetime] = []

    def wall() -> datetime.datetime:
        losses.append(LOSS + datetime.timedelta(seconds=len(losses)))
        return losses[-1]

    health = LinkHealth(clock, wall)
    changes, seen = 0, []
    for _ in range(100):  # down 50 ms, up 50 ms, each state read by a scan
        changes += 1
        health.observe([nic(False, changes)])
        seen.append("enp1s0" in health.down)
        clock.now += 0.05
        changes += 1
        health.observe([nic(True, changes)])
        seen.append("enp1s0" in health.down)
        clock.now += 0.05
    assert all(seen) and losses == [LOSS], "down throughout, from the first loss"
    clock.now += 1.0
    assert health.observe([nic(True, changes)]) is None and dict(health.down) == {}


def test_a_nic_set_down_by_hand_or_handed_back_down_from_a_pod_is_not_a_dead_link() -> None:
    health = LinkHealth(Clock(), lambda: LOSS)
    admin_down = replace(nic(False, 1), up=False)
    assert health.observe([admin_down]) is None and dict(health.down) == {}


def test_a_nic_that_went_away_is_forgotten() -> None:
    health = LinkHealth(Clock(), lambda: LOSS)
    health.observe([nic(False, 1), nic(False, 1, name="enp2s0")])
    health.observe([nic(False, 1)])
    assert list(health.down) == ["enp1s0"]

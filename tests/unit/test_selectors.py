"""CEL selectors over a DRA device (netclaim.core.devices.selectors): what the policy and `netclaim explain`
run."""

from __future__ import annotations

import subprocess
import sys
from decimal import Decimal

from netclaim.core.devices.selectors import Verdict, evaluate

ATTRIBUTES = {"netclaim.dev": {"ifName": "enp0s10", "speed": 10000}}


def test_a_selector_sees_the_devices_attributes_capacity_and_sharing() -> None:
    shared_fast = (
        'device.attributes["netclaim.dev"].speed >= 10000 && device.allowMultipleAllocations'
        ' && device.capacity["netclaim.dev"].bandwidth > 0'
    )
    capacity = {"netclaim.dev/bandwidth": Decimal(10_000_000_000)}
    assert evaluate(shared_fast, "netclaim.dev", ATTRIBUTES, capacity, shared=True) == Verdict(True)
    assert evaluate('device.driver == "other"', "netclaim.dev", ATTRIBUTES) == Verdict(False)


def test_what_gives_no_answer_says_why() -> None:
    missing = evaluate('device.attributes["netclaim.dev"].vlan == 3', "netclaim.dev", ATTRIBUTES)
    assert (missing.selected, missing.missing, missing.why) == (
        False,
        True,
        "the device has no attribute 'vlan'",
    )
    assert evaluate("device.attributes[", "netclaim.dev", ATTRIBUTES).selected is None
    not_bool = evaluate('device.attributes["netclaim.dev"].speed', "netclaim.dev", ATTRIBUTES)
    assert not_bool == Verdict(None, "must evaluate to a bool, not int")


def test_the_cel_library_is_loaded_only_when_a_selector_runs() -> None:
    """Its package loads an interactive shell too: 12 MiB of an idle agent whose policy matches by name."""
    probe = "import sys, netclaim.agent.main, netclaim.core.devices.rules; print('cel' in sys.modules)"
    assert (
        subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
        == "False\n"
    )

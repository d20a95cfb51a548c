"""What netclaim writes into a claim's status.devices fits the API's limits, so the API never refuses the
write (which would leave the claim without Ready); what had to be left out is said in the condition."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import msgspec

from netclaim.agent.status import (
    MAX_DATA_BYTES,
    MAX_HARDWARE_ADDRESS,
    MAX_INTERFACE_NAME,
    MAX_IPS,
    address_entries,
    device_entry,
)
from netclaim.agent.store import Interface, Outcome, State
from netclaim.controller.ipam import Reconciler
from netclaim.core.objects import CONDITION_MESSAGE_BYTES
from netclaim.core.plan import PoolAddresses
from tests.unit.fakes import SAMPLE_DRIVER, FakeKubeApi, sample_row

ROW = sample_row()


def _attached(addresses: tuple[str, ...], cni_result: dict[str, Any] | None = None, **interface: str) -> Any:
    found = Interface(
        name=interface.get("name", "net1"),
        mac=interface.get("mac", "02:00:0a:5a:00:0a"),
        mtu=1500,
        addresses=addresses,
    )
    row = ROW.with_state(State.ATTACHED, outcome=Outcome(cni_result=cni_result, interface=found))
    return device_entry(SAMPLE_DRIVER, row)


def test_an_interface_with_17_addresses_reports_the_first_16_and_says_so() -> None:
    addresses = tuple(f"10.90.0.{n}/24" for n in range(10, 27))  # 17
    entry = _attached(("10.90.0.10/24", *addresses))  # the same one twice counts once
    ips = entry["networkData"]["ips"]
    assert len(ips) == MAX_IPS and ips == sorted(f"10.90.0.{n}/24" for n in range(10, 27))[:MAX_IPS]
    message = entry["conditions"][0]["message"]
    assert message == "net1 is configured in the pod; 17 addresses: networkData.ips has the first 16"


def test_sixteen_addresses_are_all_reported_without_a_word() -> None:
    entry = _attached(tuple(f"fd00::{n:x}/64" for n in range(16)))
    assert len(entry["networkData"]["ips"]) == 16
    assert entry["conditions"][0]["message"] == "net1 is configured in the pod"


def test_a_cni_result_over_10_kib_is_left_out_of_data_and_the_condition_says_so() -> None:
    big = {"cniVersion": "1.0.0", "dns": {"search": ["x" * 1000 for _ in range(20)]}}
    entry = _attached(("10.90.0.10/24",), big)
    assert "data" not in entry
    size = len(json.dumps(big, separators=(",", ":")))
    assert entry["conditions"][0]["message"] == (
        f"net1 is configured in the pod; the CNI result ({size} bytes) is left out of data: "
        f"the API takes {MAX_DATA_BYTES}"
    )
    small = {"cniVersion": "1.0.0", "ips": [{"address": "10.90.0.10/24"}]}
    assert _attached(("10.90.0.10/24",), small)["data"] == small


def test_a_cni_result_nested_too_deep_is_left_out_of_data() -> None:
    deep: list[Any] = []
    for _ in range(40):
        deep = [deep]
    entry = _attached(("10.90.0.10/24",), {"cniVersion": "1.0.0", "x": deep})
    assert "data" not in entry and "nested deeper than 32 levels" in entry["conditions"][0]["message"]


def test_names_and_messages_are_cut_to_what_the_api_takes() -> None:
    entry = _attached(("10.90.0.10/24",), name="n" * 300, mac="a" * 200)
    assert len(entry["networkData"]["interfaceName"]) == MAX_INTERFACE_NAME
    assert len(entry["networkData"]["hardwareAddress"]) == MAX_HARDWARE_ADDRESS
    failed = device_entry(SAMPLE_DRIVER, ROW.with_state(State.PREPARED, error="é" * 40_000))  # 2 bytes each
    message = failed["conditions"][0]["message"]
    assert len(message.encode()) <= CONDITION_MESSAGE_BYTES and message == "é" * (
        CONDITION_MESSAGE_BYTES // 2
    )


def test_a_pools_addresses_are_reported_in_canonical_form() -> None:
    granted = PoolAddresses(
        request="addr",
        pool="netclaim.dev/ip-pools",
        device="lan",
        share_id="",
        ips=("fd00:0::7/64", "10.10.3.7/24"),
    )
    row = replace(ROW, plan=msgspec.structs.replace(ROW.plan, pool_addresses=(granted,)))
    [entry] = address_entries(SAMPLE_DRIVER, row)
    assert entry["networkData"] == {"interfaceName": "net1", "ips": ["10.10.3.7/24", "fd00::7/64"]}


async def test_an_invalid_pools_condition_has_the_same_limit_as_a_claims() -> None:
    """The controller's conditions came from a helper of their own, cut at 1,024 characters."""
    api = FakeKubeApi()
    api.add_pool("bad", {"ranges": [{"subnet": "1" * 3000}]})  # a problem that quotes 3,000 characters
    await Reconciler(api, api, api, api, SAMPLE_DRIVER).once()
    [condition] = api.ippool_status["bad"]["conditions"]
    assert condition["reason"] == "Invalid" and 1024 < len(condition["message"]) <= CONDITION_MESSAGE_BYTES

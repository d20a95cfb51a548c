"""What the publisher writes, and how it recognises that nothing needs writing."""

from __future__ import annotations

from netclaim.publish.devices import Capacity, Device
from netclaim.publish.publisher import chunk, normalized_device


def _device(name: str) -> Device:
    return Device(
        name=name,
        if_name=name,
        shared=True,
        attributes={"netclaim.dev/ifName": name},
        capacity={"netclaim.dev/bandwidth": Capacity(10 * 2**30, default=2**30, minimum=2**20, step=2**20)},
    )


def test_devices_are_sorted_and_cut_into_slices_of_128() -> None:
    devices = [_device(f"nic{i:04d}") for i in reversed(range(300))]
    slices = chunk(devices)
    assert [len(s) for s in slices] == [128, 128, 44]
    assert slices[0][0].name == "nic0000" and slices[-1][-1].name == "nic0299"
    assert chunk([]) == [[]]  # an empty pool is still published: "this node has none"


def test_server_spelling_of_quantities_compares_equal() -> None:
    written = _device("nic0").to_api()
    read_back = {
        "name": "nic0",
        "attributes": {"netclaim.dev/ifName": {"string": "nic0", "int": None}},
        "capacity": {
            "netclaim.dev/bandwidth": {
                "value": "10240Mi",
                "requestPolicy": {"default": "1024Mi", "validRange": {"min": "1Mi", "step": "1Mi"}},
            }
        },
        "allowMultipleAllocations": True,
    }
    assert normalized_device(written) == normalized_device(read_back)
    read_back["capacity"]["netclaim.dev/bandwidth"]["value"] = "10G"  # type: ignore[index]
    assert normalized_device(written) != normalized_device(read_back)

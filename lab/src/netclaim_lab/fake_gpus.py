"""Fake GPUs for the lab's kubelet-less nodes (a cluster spec's `gpus`, published by the node keeper) as a
GPU driver publishes them: one ResourceSlice per node of driver gpu.lab.netclaim.dev, each device with the
standard topology attributes
(`resource.kubernetes.io/pcieRoot`, `resource.kubernetes.io/numaNode`) that netclaim publishes for NICs. A
claim can then ask a GPU and a NIC with `matchAttribute` and the real scheduler aligns them. Kubernetes'
example driver, which the benchmarks run on kubelet nodes, publishes no such attributes; on a kubelet-less
node nothing prepares a claim, so slices alone are the whole driver."""

from __future__ import annotations

from typing import Any

DRIVER = "gpu.lab.netclaim.dev"
CLASS = DRIVER
ROOT = "resource.kubernetes.io/pcieRoot"
NUMA = "resource.kubernetes.io/numaNode"


def device_class() -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": CLASS},
        "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]},
    }


def resource_slice(node: str, gpus: list[tuple[str, int]]) -> dict[str, Any]:
    """`node`'s GPUs, one per (PCIe root, NUMA node), named gpu-0, gpu-1…"""
    devices = [
        {"name": f"gpu-{index}", "attributes": {ROOT: {"string": root}, NUMA: {"int": numa}}}
        for index, (root, numa) in enumerate(gpus)
    ]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-{DRIVER}"},
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
        },
    }

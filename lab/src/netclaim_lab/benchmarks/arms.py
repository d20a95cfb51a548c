"""The scheduling arms of `make bench-scale`: the same pods with no claim, with a claim of a no-op DRA
driver, with a netclaim NIC share, and with a NIC share and an address of an IPPool. What the no-op driver
publishes is what Kubernetes' example driver (sigs.k8s.io/dra-example-driver v0.4.0, its gpu profile)
publishes per device: four attributes and two capacities, no request policy, a class selecting by driver
alone. So the netclaim arms' ratio to it says what netclaim's slice design (ten attributes per NIC,
consumable capacity with request policies, CEL in the classes, the all-nodes pool device, a matchAttribute
constraint) costs the scheduler beyond DRA's own work.

Which other drivers' devices a node has matters as much. For each node, the allocator goes through the
node's pools in no fixed order (a Go map) and evaluates the class's CEL on every device not already
taken, of every driver, until one fits: a claim walks past the other drivers' free devices. Shared NICs
are never taken, so a no-op claim walks past a node's 2-8 NICs when their pool comes first; a NIC share
walks past the no-op driver's 16 devices, all free in its arm. So the NIC arms run with the no-op
driver's slices removed (its arm keeps netclaim's, which is the fair way round: it pays for the NICs),
and one more arm, `netclaim_gpus`, runs the NIC shares with the 16 devices per node beside them (in the
first repeat only: it explains the NIC arms' figures, no goal is set on it, and it is the slowest arm).

`dra_shared` separates DRA's consumable capacity (KEP-5075) from the rest of netclaim's slice design: the
no-op driver publishes each node's NICs as netclaim does (2-8 devices of 25G, shared, bandwidth with
netclaim's default request policy) but with its own four attributes, one capacity and a class selecting by
driver alone, and each pod's claim asks the NIC arm's bandwidth. If it schedules as slowly as the NIC arm,
cheaper attributes or CEL cannot win the difference back: `sched_ratio_vs_dra_shared` is the NIC arm's
rate over its own, repeat by repeat.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable
from typing import Any, Literal

from netclaim.core.config.publishpolicy import Bandwidth
from netclaim.core.names import DRIVER_DOMAIN

NOOP_DRIVER = "gpu.example.com"  # the example driver's name and its chart's DeviceClass
# 16 per node: 5,000 exclusive claims take 62.5 % of them, as 5,000 NIC shares take 64 % of the bandwidth
NOOP_DEVICES_PER_NODE = 16
POOL = "scale-fabric"
NETWORK = "fabric"  # agents.VIRTUAL_POLICY puts the NICs on it
POOL_SUBNET = "10.128.0.0/17"  # 32,766 addresses: 5,000 claims hold 15 % of them
BANDWIDTH = f"{DRIVER_DOMAIN}/bandwidth"
NIC_SPEED = "25G"  # agents.synthetic_inventory's NICs


def noop_device_class() -> dict[str, Any]:
    """The example driver's chart's DeviceClass."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": NOOP_DRIVER},
        "spec": {"selectors": [{"cel": {"expression": f"device.driver == '{NOOP_DRIVER}'"}}]},
    }


def _noop_attributes(node: str, index: int) -> dict[str, Any]:
    return {
        "index": {"int": index},
        "uuid": {"string": f"gpu-{uuid.uuid5(uuid.NAMESPACE_DNS, f'{node}-{index}')}"},
        "model": {"string": "LATEST-GPU-MODEL"},
        "driverVersion": {"version": "1.0.0"},
    }


def noop_slice(node: str, shared_nics: int = 0) -> dict[str, Any]:
    """The slice the example driver's kubelet plugin publishes for `node` (gpu profile, no partitions),
    or, with `shared_nics`, that many NIC-like shared devices (`dra_shared`, the module's text says why)."""
    bandwidth = Bandwidth()
    shared = {
        "value": NIC_SPEED,
        "requestPolicy": {
            "default": bandwidth.default,
            "validRange": {"min": bandwidth.min, "step": bandwidth.step},
        },
    }
    devices = (
        [
            {
                "name": f"nic-{index}",
                "attributes": _noop_attributes(node, index),
                "allowMultipleAllocations": True,
                "capacity": {"bandwidth": shared},
            }
            for index in range(shared_nics)
        ]
        if shared_nics
        else [
            {
                "name": f"gpu-{index}",
                "attributes": _noop_attributes(node, index),
                "capacity": {"memory": {"value": "80Gi"}, "compute": {"value": "100"}},
            }
            for index in range(NOOP_DEVICES_PER_NODE)
        ]
    )
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-{NOOP_DRIVER}"},
        "spec": {
            "driver": NOOP_DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


def ip_pool() -> dict[str, Any]:
    return {
        "apiVersion": "netclaim.dev/v1alpha1",
        "kind": "IPPool",
        "metadata": {"name": POOL},
        "spec": {"network": NETWORK, "ranges": [{"subnet": POOL_SUBNET}]},
    }


def _claim(name: str, namespace: str, devices: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"devices": devices},
    }


def _nic(ask: str) -> dict[str, Any]:
    request = {"deviceClassName": "netclaim-shared", "capacity": {"requests": {BANDWIDTH: ask}}}
    return {"name": "nic", "exactly": request}


def noop_claim(name: str, namespace: str, ask: str) -> dict[str, Any]:
    """One device of the class, as the example driver's demo asks (`ask` is the NIC arms')."""
    del ask
    return _claim(
        name, namespace, {"requests": [{"name": "gpu", "exactly": {"deviceClassName": NOOP_DRIVER}}]}
    )


def noop_shared_claim(name: str, namespace: str, ask: str) -> dict[str, Any]:
    """`ask` of a no-op shared device's bandwidth, as the NIC arm asks of a NIC's."""
    request = {"deviceClassName": NOOP_DRIVER, "capacity": {"requests": {"bandwidth": ask}}}
    return _claim(name, namespace, {"requests": [{"name": "nic", "exactly": request}]})


def nic_claim(name: str, namespace: str, ask: str) -> dict[str, Any]:
    """A share of any NIC: `ask` of its bandwidth."""
    return _claim(name, namespace, {"requests": [_nic(ask)]})


def pool_claim(name: str, namespace: str, ask: str) -> dict[str, Any]:
    """A NIC share and an address of POOL on the NIC's network, as docs/ipam.md's claims ask."""
    address = {
        "name": "ip",
        "exactly": {
            "deviceClassName": "netclaim-address",
            "selectors": [{"cel": {"expression": f'device.attributes["{DRIVER_DOMAIN}"].pool == "{POOL}"'}}],
        },
    }
    return _claim(
        name,
        namespace,
        {
            "requests": [_nic(ask), address],
            "constraints": [{"requests": ["nic", "ip"], "matchAttribute": f"{DRIVER_DOMAIN}/network"}],
        },
    )


NoopDevices = Literal["gpus", "shared_nics"]


@dataclasses.dataclass(frozen=True)
class Arm:
    """Pods of one kind: `claim` makes each pod's claim (name, namespace, bandwidth ask), or none."""

    name: str
    what: str
    claim: Callable[[str, str, str], dict[str, Any]] | None
    netclaim: bool = False  # its results consume netclaim capacities (checked after)
    noop_devices: NoopDevices | None = None  # the no-op driver's slices published while it runs
    once: bool = False  # in the first repeat only: it answers a question beside the goals, for 10 min a run


NONE = Arm("none", "without claims", None)
NOOP = Arm("dra", f"with a claim of a no-op DRA driver ({NOOP_DRIVER})", noop_claim, noop_devices="gpus")
NOOP_SHARED = Arm(
    "dra_shared",
    f"with a bandwidth share of a no-op DRA driver's NIC-like device ({NOOP_DRIVER})",
    noop_shared_claim,
    noop_devices="shared_nics",
)
NIC = Arm("netclaim", "with a netclaim NIC share each", nic_claim, netclaim=True)
NIC_AND_POOL = Arm("netclaim_pool", "with a NIC share and a pool address each", pool_claim, netclaim=True)
NIC_BESIDE_GPUS = Arm(
    "netclaim_gpus",
    f"with a netclaim NIC share each, {NOOP_DEVICES_PER_NODE} devices of the no-op driver on every node",
    nic_claim,
    netclaim=True,
    noop_devices="gpus",
    once=True,
)
# the NIC arm last: the churn window that follows runs with its claims allocated
ARMS = (NONE, NOOP, NOOP_SHARED, NIC_BESIDE_GPUS, NIC_AND_POOL, NIC)

"""NICs aligned with another driver's GPUs: the real scheduler pairs a fake GPU and a netclaim NIC on one
PCIe root through `matchAttribute: resource.kubernetes.io/pcieRoot`, the standard attribute both
publish, and `netclaim explain` names the constraint when only unaligned devices are left.

Two kubelet-less nodes, each with two roots. Root A has 3 GPUs and an 8Gi NIC, root B 2 GPUs and a 12Gi NIC.
Pairs asking 4Gi fit twice on each root (A by its NIC, B by its GPUs): 8 pods. A ninth finds a free GPU on A
and room on B's NIC, never both on one root."""

from __future__ import annotations

import collections
import functools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from lightkube import Client
from lightkube.resources.core_v1 import Pod
from lightkube.resources.resource_v1 import ResourceClaim, ResourceSlice

from netclaim_lab import agents, fake_gpus, processes
from netclaim_lab.cluster import ClusterHandle
from tests.cluster.helpers import apply, kubectl_netclaim, node_slices, pod_claim_name, pod_spec
from tests.kube import wait_for

NODES = ("align-1", "align-2")
ROOT_A, ROOT_B = "pci0000:3a", "pci0000:d7"
NICS = (  # name, PCI address, root, NUMA node, speed
    ("ens3f0", "0000:3b:00.0", ROOT_A, 0, 8 * 2**30),  # binary units: the policy's 1Mi step rounds a
    ("ens4f0", "0000:d8:00.0", ROOT_B, 1, 12 * 2**30),  # decimal "4G" up to 3815Mi, and two would not fit
)
GPUS = [(ROOT_A, 0)] * 3 + [(ROOT_B, 1)] * 2


def _inventory(path: Path) -> None:
    interfaces = [
        {
            "name": name,
            "index": 10 + index,
            "kind": "physical",
            "mac": f"02:00:00:00:aa:{index:02x}",
            "mtu": 1500,
            "up": True,
            "virtual": False,
            "speed_bps": speed,
            "pci_address": pci,
            "pcie_root": root,
            "numa_node": numa,
        }
        for index, (name, pci, root, numa, speed) in enumerate(NICS)
    ]
    path.write_text(yaml.safe_dump(interfaces))


def _string(value: Any) -> str | None:
    """A string attribute's value, whether lightkube kept the attribute as a model or as its JSON."""
    found = value.get("string") if isinstance(value, dict) else getattr(value, "string", None)
    return str(found) if found is not None else None


def _roots_published(kube: Client, node: str) -> bool:
    roots = {
        _string((d.attributes or {})[fake_gpus.ROOT])
        for s in node_slices(kube, node)
        for d in s.spec.devices or []
        if fake_gpus.ROOT in (d.attributes or {})
    }
    return roots == {ROOT_A, ROOT_B}


def _gpus_published(kube: Client, node: str) -> bool:
    return any(
        s.spec.driver == fake_gpus.DRIVER for s in kube.list(ResourceSlice, fields={"spec.nodeName": node})
    )


@pytest.fixture
def aligned_nodes(cluster: ClusterHandle, kube: Client, ns: str, tmp_path: Path) -> Iterator[None]:
    """The cluster file's align-1 and align-2 (kept Ready, their GPUs published by the node keeper) with an
    agent each for their NICs. No kubelet confirms a deletion there: the test's pods are deleted at once."""
    declared = {
        n.name: [(g.pcieRoot, g.numaNode) for g in n.gpus for _ in range(g.count)] for n in cluster.spec.nodes
    }
    assert all(sorted(declared[node]) == sorted(GPUS) for node in NODES), declared
    started = []
    try:
        for node in NODES:
            wait_for(
                functools.partial(_gpus_published, kube, node), 60, f"{node}'s GPUs published by the keeper"
            )
            name, _ = agents.start_virtual_agent(cluster, node, tmp_path, len(NICS))
            started.append(name)
            _inventory(agents.virtual_agent_files(tmp_path, node) / "inventory.yaml")  # re-read on change
        for node in NODES:
            wait_for(
                functools.partial(_roots_published, kube, node), 60, f"{node}'s NICs with their PCIe roots"
            )
        yield
    finally:
        cluster.kubectl("delete", "pods", "--all", "-n", ns, "--grace-period=0", "--force", "--wait=false")
        for name in started:
            processes.stop(tmp_path, name)


def _pair_template() -> dict[str, Any]:
    nic = {"deviceClassName": "netclaim-shared", "capacity": {"requests": {"netclaim.dev/bandwidth": "4Gi"}}}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "pair"},
        "spec": {
            "spec": {
                "devices": {
                    "requests": [
                        {"name": "gpu", "exactly": {"deviceClassName": fake_gpus.CLASS}},
                        {"name": "nic", "exactly": nic},
                    ],
                    "constraints": [{"requests": ["gpu", "nic"], "matchAttribute": fake_gpus.ROOT}],
                }
            }
        },
    }


def _pod(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": pod_spec("pair", True)}


def _scheduled(kube: Client, namespace: str) -> int:
    return sum(1 for p in kube.list(Pod, namespace=namespace) if p.spec and p.spec.nodeName)


def _roots(kube: Client) -> dict[tuple[str, str, str], str]:
    """(driver, pool, device) → its PCIe root, from every slice of the two nodes."""
    found = {}
    for node in NODES:
        for item in kube.list(ResourceSlice, fields={"spec.nodeName": node}):
            for device in item.spec.devices or []:
                root = _string((device.attributes or {}).get(fake_gpus.ROOT))
                if root is not None:
                    found[(item.spec.driver, item.spec.pool.name, device.name)] = root
    return found


def test_gpu_and_nic_pairs_share_a_pcie_root_and_explain_names_the_constraint_when_none_can(
    cluster: ClusterHandle, kube: Client, ns: str, aligned_nodes: None
) -> None:
    apply(cluster, ns, _pair_template(), *(_pod(f"pair-{i}") for i in range(8)))
    wait_for(lambda: _scheduled(kube, ns) == 8, 120, "8 pairs scheduled")
    roots, per_root = _roots(kube), collections.Counter[tuple[str, str]]()
    for index in range(8):
        claim = kube.get(ResourceClaim, pod_claim_name(kube, ns, f"pair-{index}"), namespace=ns)
        assert claim.status and claim.status.allocation and claim.status.allocation.devices
        results = {r.request: r for r in claim.status.allocation.devices.results or []}
        gpu, nic = results["gpu"], results["nic"]
        assert gpu.pool == nic.pool, (gpu, nic)  # one node
        gpu_root, nic_root = (
            roots[(gpu.driver, gpu.pool, gpu.device)],
            roots[(nic.driver, nic.pool, nic.device)],
        )
        assert gpu_root == nic_root, (index, gpu, nic)
        per_root[(gpu.pool, gpu_root)] += 1
    assert per_root == {(node, root): 2 for node in NODES for root in (ROOT_A, ROOT_B)}

    apply(cluster, ns, _pod("pair-8"))
    shown = ""

    def told() -> bool:
        nonlocal shown
        shown = kubectl_netclaim(cluster, "explain", "pod/pair-8", "-n", ns)
        return "constraint matchAttribute resource.kubernetes.io/pcieRoot of requests gpu, nic" in shown

    wait_for(told, 60, "explain naming the pcieRoot constraint")
    assert _scheduled(kube, ns) == 8, shown  # the ninth stays Pending
    for node in NODES:
        assert f"node {node}: " in shown and f"gpu: {ROOT_A}; nic: {ROOT_B}" in shown, shown

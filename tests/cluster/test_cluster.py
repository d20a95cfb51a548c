"""Issue 2 acceptance: the local cluster is real (kubelet, containerd, runc, scheduler, DRA API)."""

from __future__ import annotations

import ipaddress
import json
import subprocess
import uuid
from collections.abc import Iterator

import pytest
from lightkube import Client
from lightkube.core.exceptions import ApiError
from lightkube.models.core_v1 import PodResourceClaim
from lightkube.resources.core_v1 import Node, Pod
from lightkube.resources.resource_v1 import DeviceClass, ResourceClaim, ResourceClaimTemplate, ResourceSlice

from netclaim_lab.cluster import ClusterHandle
from tests.cluster.helpers import sleeping_pod
from tests.kube import typed, wait_for


def _pod_ready(kube: Client, name: str, namespace: str = "default") -> bool:
    pod = kube.get(Pod, name, namespace=namespace)
    conditions = pod.status.conditions if pod.status and pod.status.conditions else []
    return any(c.type == "Ready" and c.status == "True" for c in conditions)


def test_busybox_pod_runs_with_exec_and_a_primary_ip_from_its_node(
    cluster: ClusterHandle, kube: Client
) -> None:
    name = f"bb-{uuid.uuid4().hex[:6]}"
    kube.create(sleeping_pod(name, "default", {"nodeName": "node-1"}))
    try:
        wait_for(lambda: _pod_ready(kube, name), 120, f"pod {name} Ready")
        assert (
            cluster.kubectl("exec", name, "--", "echo", "hello from busybox").strip() == "hello from busybox"
        )
        output = cluster.kubectl("exec", name, "--", "ip", "-4", "-o", "addr", "show", "eth0")
        address = ipaddress.ip_interface(output.split()[3])
        node_index = [n.name for n in cluster.spec.nodes].index("node-1")
        assert address.ip in cluster.spec.node_pod_cidr(node_index)
        pod = kube.get(Pod, name, namespace="default")
        assert pod.status is not None and pod.status.podIP == str(address.ip)
    finally:
        kube.delete(Pod, name, namespace="default", grace_period=0)


def test_kubelet_less_node_is_kept_ready(kube: Client) -> None:
    node = kube.get(Node, "virt-1")
    assert node.metadata is not None and node.metadata.labels is not None
    assert node.metadata.labels["netclaim.dev/kubelet"] == "false"
    assert node.status is not None and node.status.conditions is not None
    assert {c.type: c.status for c in node.status.conditions}["Ready"] == "True"
    taints = {t.key for t in (node.spec.taints or [])} if node.spec else set()
    assert "netclaim.dev/kubelet-less" in taints


def _slice(name: str, device: str, node: str, driver: str) -> ResourceSlice:
    return typed(
        ResourceSlice,
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": name},
            "spec": {
                "driver": driver,
                "nodeName": node,
                "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                "devices": [
                    {
                        "name": device,
                        "allowMultipleAllocations": True,
                        "attributes": {"ifName": {"string": "enp0s10"}},
                        "capacity": {
                            "bandwidth": {
                                "value": "10Gi",
                                "requestPolicy": {
                                    "default": "1Gi",
                                    "validRange": {"min": "1Gi", "step": "1Gi"},
                                },
                            }
                        },
                    }
                ],
            },
        },
    )


def test_apiserver_rejects_an_invalid_device_name(kube: Client) -> None:
    with pytest.raises(ApiError) as err:
        kube.create(_slice("invalid-name-test", "Not_A_DNS_Label", "node-2", "invalid.test.netclaim.dev"))
    assert err.value.status.code == 422
    assert "spec.devices[0].name" in str(err.value.status.message)


@pytest.fixture
def handwritten_slice(kube: Client) -> Iterator[str]:
    driver = "handwritten.test.netclaim.dev"
    name = f"handwritten-{uuid.uuid4().hex[:6]}"
    kube.create(_slice(name, "nic0", "node-2", driver))
    kube.create(
        typed(
            DeviceClass,
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "DeviceClass",
                "metadata": {"name": driver},
                "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{driver}"'}}]},
            },
        )
    )
    yield name
    kube.delete(ResourceSlice, name)
    kube.delete(DeviceClass, driver)


def test_slice_keeps_consumable_capacity_fields(kube: Client, handwritten_slice: str) -> None:
    stored = kube.get(ResourceSlice, handwritten_slice)
    assert stored.spec.devices is not None
    device = stored.spec.devices[0]
    assert device.allowMultipleAllocations is True
    bandwidth = device.capacity["bandwidth"]  # type: ignore[index]
    assert bandwidth["value"] == "10Gi"
    assert bandwidth["requestPolicy"] == {"default": "1Gi", "validRange": {"min": "1Gi", "step": "1Gi"}}


def test_scheduler_allocates_a_template_claim_with_consumed_capacity(
    kube: Client, handwritten_slice: str
) -> None:
    driver = "handwritten.test.netclaim.dev"
    suffix = uuid.uuid4().hex[:6]
    template, pod_name = f"bw-{suffix}", f"dra-{suffix}"
    kube.create(
        typed(
            ResourceClaimTemplate,
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaimTemplate",
                "metadata": {"name": template, "namespace": "default"},
                "spec": {
                    "spec": {
                        "devices": {
                            "requests": [
                                {
                                    "name": "nic",
                                    "exactly": {
                                        "deviceClassName": driver,
                                        "capacity": {"requests": {"bandwidth": "2Gi"}},
                                    },
                                }
                            ]
                        }
                    }
                },
            },
        )
    )
    pod = sleeping_pod(pod_name, "default", {})
    assert pod.spec is not None
    pod.spec.resourceClaims = [PodResourceClaim(name="nic", resourceClaimTemplateName=template)]
    kube.create(pod)
    try:

        def bound() -> bool:
            current = kube.get(Pod, pod_name, namespace="default")
            return bool(current.spec and current.spec.nodeName)

        wait_for(bound, 60, f"pod {pod_name} bound to a node")
        current = kube.get(Pod, pod_name, namespace="default")
        assert current.spec is not None and current.spec.nodeName == "node-2"
        assert current.status is not None and current.status.resourceClaimStatuses
        claim_name = current.status.resourceClaimStatuses[0].resourceClaimName
        assert claim_name is not None
        claim = kube.get(ResourceClaim, claim_name, namespace="default")
        assert claim.status is not None and claim.status.allocation is not None
        assert claim.status.allocation.devices is not None
        results = claim.status.allocation.devices.results or []
        assert [(r.driver, r.pool, r.device) for r in results] == [(driver, "node-2", "nic0")]
        assert results[0].consumedCapacity == {"bandwidth": "2Gi"}
        assert results[0].shareID and uuid.UUID(results[0].shareID)
    finally:
        kube.delete(Pod, pod_name, namespace="default", grace_period=0)
        kube.delete(ResourceClaimTemplate, template, namespace="default")
        wait_for(lambda: not _exists(kube, pod_name), 60, f"pod {pod_name} gone")


def _exists(kube: Client, pod: str) -> bool:
    try:
        kube.get(Pod, pod, namespace="default")
    except ApiError as err:
        if err.status.code == 404:
            return False
        raise
    return True


def test_cluster_status_reports_every_component(cluster: ClusterHandle) -> None:
    result = subprocess.run(
        [".venv/bin/netclaim-lab", "cluster", "status", cluster.spec.name],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["up"] is True
    assert all(report["controlPlane"].values())
    assert report["nodes"]["node-1"] == {"holder": True, "containerd": True, "kubelet": True}

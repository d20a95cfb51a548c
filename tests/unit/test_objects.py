"""The Kubernetes objects as netclaim reads them from the API's JSON (netclaim.core.objects)."""

from __future__ import annotations

from typing import Any

from netclaim.core.objects import Claim, Pod, PodClaim


def test_a_claim_is_read_from_the_apis_json() -> None:
    claim = Claim.from_api(
        {
            "metadata": {"namespace": "ns", "name": "c", "uid": "u", "resourceVersion": "7"},
            "status": {
                "allocation": {
                    "devices": {
                        "results": [
                            {
                                "request": "net",
                                "driver": "netclaim.dev",
                                "pool": "node-1",
                                "device": "pci-0000-5e-00-0",
                                "shareID": "s1",
                                "consumedCapacity": {"netclaim.dev/bandwidth": "5Gi"},
                            }
                        ],
                        "config": [
                            {
                                "source": "FromClass",
                                "opaque": {"driver": "netclaim.dev", "parameters": {"a": 1}},
                            },
                            {"source": "FromClaim", "requests": ["net"]},
                        ],
                    }
                },
                "reservedFor": [
                    {"resource": "pods", "name": "p", "uid": "pu"},
                    {"resource": "jobs", "name": "j", "uid": "ju"},
                ],
                "devices": [{"driver": "gpu.example.com", "pool": "node-1", "device": "gpu0"}],
            },
        }
    )
    assert (claim.namespace, claim.name, claim.uid, claim.resource_version, claim.allocated) == (
        "ns",
        "c",
        "u",
        "7",
        True,
    )
    [result] = claim.results
    assert (result.share_id, result.consumed_capacity) == ("s1", {"netclaim.dev/bandwidth": "5Gi"})
    assert [(c.source, c.parameters) for c in claim.configs] == [("FromClass", {"a": 1})]  # opaque only
    assert [p.name for p in claim.reserved_for] == ["p"]  # pods only
    assert claim.devices_status == ({"driver": "gpu.example.com", "pool": "node-1", "device": "gpu0"},)
    assert Claim.from_api({"metadata": {"name": "x"}}).allocated is False


def _pod(**status: Any) -> dict[str, Any]:
    return {
        "metadata": {
            "namespace": "ns",
            "name": "web-0",
            "uid": "pu",
            "resourceVersion": "9",
            "annotations": {"k8s.v1.cni.cncf.io/network-status": "[]"},
        },
        "spec": {
            "nodeName": "node-1",
            "resourceClaims": [
                {"name": "net", "resourceClaimTemplateName": "t"},
                {"name": "shared", "resourceClaimName": "standalone"},
                {"name": "later", "resourceClaimTemplateName": "t"},
            ],
            "nodeSelector": {"zone": "a"},
            "tolerations": [{"key": "dedicated", "operator": "Exists"}],
        },
        "status": {
            "phase": "Running",
            "resourceClaimStatuses": [
                {"name": "net", "resourceClaimName": "web-0-net-x1"},
                {"name": "later"},
            ],
            **status,
        },
    }


def test_a_pods_claims_are_read_from_its_spec_with_the_names_made_from_its_templates() -> None:
    pod = Pod.from_api(_pod())
    assert (pod.namespace, pod.name, pod.uid, pod.resource_version, pod.node, pod.phase) == (
        "ns",
        "web-0",
        "pu",
        "9",
        "node-1",
        "Running",
    )
    assert pod.claims == (
        PodClaim("net", "web-0-net-x1", "t"),
        PodClaim("shared", "standalone"),
        PodClaim("later", "", "t"),  # not made yet
    )
    assert pod.claim_names() == ["web-0-net-x1", "standalone"]
    assert pod.annotations == {"k8s.v1.cni.cncf.io/network-status": "[]"}
    assert (pod.node_selector, pod.tolerations) == (
        {"zone": "a"},
        ({"key": "dedicated", "operator": "Exists"},),
    )


def test_a_pod_says_whether_the_scheduler_found_no_place_for_it_and_whether_it_is_ready() -> None:
    unschedulable = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/3"}
    waiting = Pod.from_api(_pod(conditions=[unschedulable]))
    assert waiting.unschedulable and not waiting.ready
    scheduled = waiting.condition_of("PodScheduled")
    assert scheduled is not None and scheduled.message == "0/3"
    ready = Pod.from_api(_pod(conditions=[{"type": "Ready", "status": "True"}]))
    assert ready.ready and not ready.unschedulable
    assert Pod.from_api({}).claims == () and Pod.from_api({}).condition_of("Ready") is None


def test_the_claim_made_for_a_pods_extended_resources_is_one_of_its_claims() -> None:
    pod = Pod.from_api(
        {
            "metadata": {"namespace": "team-a", "name": "p", "uid": "u"},
            "spec": {"resourceClaims": [{"name": "net", "resourceClaimName": "p-net"}]},
            "status": {
                "extendedResourceClaimStatus": {
                    "resourceClaimName": "p-extended-resources-x2k9",
                    "requestMappings": [{"containerName": "c", "resourceName": "netclaim.dev/fabric"}],
                }
            },
        }
    )
    assert pod.claim_names() == ["p-net", "p-extended-resources-x2k9"]
    assert pod.claims[-1] == PodClaim("extended-resources", "p-extended-resources-x2k9")

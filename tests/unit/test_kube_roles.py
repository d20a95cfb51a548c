"""Each program's roles of the Kubernetes API (netclaim.core.kubeapi) hold only what its RBAC lets it do
(deploy/rbac.yaml, rendered from the chart), and the adapter plays them in classes of a readable size."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import pytest
import yaml

from netclaim.adapters.kube.addresses import KubeAddresses
from netclaim.adapters.kube.claims import KubeClaims
from netclaim.adapters.kube.policies import KubePolicies
from netclaim.adapters.kube.preflight import KubePreflight
from netclaim.adapters.kube.reader import KubeClusterReader
from netclaim.adapters.kube.services import KubeServices
from netclaim.adapters.kube.slices import KubeSlices
from netclaim.core import kubeapi
from netclaim.runtime.election import LeaseApi

RBAC = Path(__file__).parents[2] / "deploy" / "rbac.yaml"
ROLES = {
    "netclaim-agent": [
        kubeapi.ClaimsApi,
        kubeapi.NodeSlicesApi,
        kubeapi.AddressesApi,
        kubeapi.PolicyRulesApi,
        kubeapi.PreflightApi,
    ],
    "netclaim-controller": [
        kubeapi.ClusterClaimsApi,
        kubeapi.PoolSlicesApi,
        kubeapi.IPPoolsApi,
        kubeapi.PoolParamsApi,
        kubeapi.NetworkServicesApi,
        kubeapi.NetworkPoliciesApi,
        LeaseApi,
    ],
}
# Roles a chart value turns on, with their RBAC (tests/test_helm_chart.py renders it): none by default.
OPTIONAL_ROLES = {"netclaim-agent": [kubeapi.PodAnnotationsApi]}
# what each call of a role asks of the API server: (API group, resource, verb)
ASKS = {
    "get_claim": ("resource.k8s.io", "resourceclaims", "get"),
    "write_claim_devices": ("resource.k8s.io", "resourceclaims/status", "patch"),
    "list_claims": ("resource.k8s.io", "resourceclaims", "list"),
    "listed_claims": ("resource.k8s.io", "resourceclaims", "list"),
    "claim_changes": ("resource.k8s.io", "resourceclaims", "watch"),
    "get_pod": ("", "pods", "get"),
    "write_pod_annotation": ("", "pods", "patch"),
    "unschedulable_pods": ("", "pods", "list"),
    "create_pod_event": ("", "events", "create"),
    "list_slices": ("resource.k8s.io", "resourceslices", "list"),
    "apply_slice": ("resource.k8s.io", "resourceslices", "patch"),
    "delete_slice": ("resource.k8s.io", "resourceslices", "delete"),
    "slice_changes": ("resource.k8s.io", "resourceslices", "watch"),
    "node_uid": ("", "nodes", "get"),
    "create_node_event": ("", "events", "create"),
    "set_node_condition": ("", "nodes/status", "patch"),
    "crd_uid": ("apiextensions.k8s.io", "customresourcedefinitions", "get"),
    "device_class_exists": ("resource.k8s.io", "deviceclasses", "get"),
    "get_ippool": ("netclaim.dev", "ippools", "get"),
    "list_ippools": ("netclaim.dev", "ippools", "list"),
    "write_ippool_status": ("netclaim.dev", "ippools/status", "patch"),
    "ippool_changes": ("netclaim.dev", "ippools", "watch"),
    "get_ip_allocation": ("netclaim.dev", "ipallocations", "get"),
    "list_ip_allocations": ("netclaim.dev", "ipallocations", "list"),
    "listed_ip_allocations": ("netclaim.dev", "ipallocations", "list"),
    "held_ip_allocations": ("netclaim.dev", "ipallocations", "list"),
    "create_ip_allocation": ("netclaim.dev", "ipallocations", "create"),
    "delete_ip_allocation": ("netclaim.dev", "ipallocations", "delete"),
    "ip_allocation_changes": ("netclaim.dev", "ipallocations", "watch"),
    "list_pool_params": ("", "configmaps", "list"),
    "apply_pool_params": ("", "configmaps", "patch"),
    "delete_pool_params": ("", "configmaps", "delete"),
    "apply_endpoint_slice": ("discovery.k8s.io", "endpointslices", "patch"),
    "delete_endpoint_slice": ("discovery.k8s.io", "endpointslices", "delete"),
    "create_service_event": ("", "events", "create"),
    "list_policy_rules": ("", "configmaps", "list"),
    "policy_rules_changes": ("", "configmaps", "watch"),
    "list_networks": ("resource.k8s.io", "resourceslices", "list"),
    "list_policies": ("k8s.cni.cncf.io", "multi-networkpolicies", "list"),
    "mark_released": ("netclaim.dev", "ipallocations", "patch"),
    "create_policy_event": ("", "events", "create"),
    "apply_rules_map": ("", "configmaps", "patch"),
    "delete_rules_map": ("", "configmaps", "delete"),
    "identity": ("authentication.k8s.io", "selfsubjectreviews", "create"),
    "dry_run_slice": ("resource.k8s.io", "resourceslices", "create"),
    "get_lease": ("coordination.k8s.io", "leases", "get"),
    "create_lease": ("coordination.k8s.io", "leases", "create"),
    "update_lease": ("coordination.k8s.io", "leases", "update"),
}


def _members(role: type) -> set[str]:
    return {name for name in dir(role) if not name.startswith("_")}


def _granted(rules: list[dict[str, Any]], group: str, resource: str, verb: str) -> bool:
    return any(
        group in rule["apiGroups"] and resource in rule["resources"] and verb in rule["verbs"]
        for rule in rules
    )


@pytest.mark.parametrize("program", sorted(ROLES))
def test_a_programs_roles_ask_only_what_its_rbac_grants(program: str) -> None:
    """Before, one ClaimsApi served both programs: the agent depended on listing every claim of the
    cluster and on the pending pods, which its RBAC forbids (and the controller on writing claims' status)."""
    rules = [  # its ClusterRole's, and its Role's in its own namespace
        rule
        for doc in yaml.safe_load_all(RBAC.read_text())
        if doc and doc["kind"] in ("ClusterRole", "Role") and doc["metadata"]["name"] == program
        for rule in doc["rules"]
    ]
    for role in ROLES[program]:
        for member in sorted(_members(role)):
            assert member in ASKS, f"{role.__name__}.{member}: say above what it asks of the API"
            assert _granted(rules, *ASKS[member]), (
                f"{program} may not {ASKS[member]}: {role.__name__}.{member}"
            )
    for role in OPTIONAL_ROLES.get(program, []):
        for member in sorted(_members(role)):
            assert not _granted(rules, *ASKS[member]), f"{program} may {ASKS[member]} by default"


def test_every_call_is_some_programs() -> None:
    roles = [role for program in (ROLES, OPTIONAL_ROLES) for listed in program.values() for role in listed]
    used = set().union(*(_members(role) for role in roles))
    assert used == set(ASKS)


@pytest.mark.parametrize(
    "adapter",
    [KubeClaims, KubeSlices, KubeAddresses, KubeClusterReader, KubeServices, KubePolicies, KubePreflight],
)
def test_an_adapter_class_stays_small(adapter: type) -> None:
    public = [name for name, _ in inspect.getmembers(adapter, inspect.isfunction) if not name.startswith("_")]
    assert len(public) <= 12, public

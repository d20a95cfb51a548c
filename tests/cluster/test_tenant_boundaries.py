"""Issue 23: a pool serves only its namespaces, before the scheduler allocates anything; capacity counts
allocation results; and a node's own token stays on its node (what a compromised agent could write)."""

from __future__ import annotations

import json
import subprocess
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from lightkube import Client, KubeConfig
from lightkube.core.exceptions import ApiError
from lightkube.resources.core_v1 import Pod
from lightkube.resources.resource_v1 import ResourceClaim, ResourceClaimStatus, ResourceSlice
from lightkube.types import PatchType

from netclaim_lab import agents
from netclaim_lab.cluster import ClusterHandle
from tests.attacks import pool_device_class
from tests.cluster.conftest import fresh_namespace
from tests.cluster.helpers import (
    DRIVER,
    apiserver_away,
    apply,
    claim_template,
    cni_config,
    controller_log,
    controller_metrics,
    interface_in_pod,
    kubectl_json,
    macvlan,
    name_of,
    pod_claim_conditions,
    pod_manifest,
    running,
)
from tests.cluster.ipam import allocations, ip_allocation, ip_pool, pool_template, spread
from tests.kube import typed, wait_for

POOLS_POOL = "netclaim.dev/ip-pools"
ON_ENP0S10 = 'device.attributes["netclaim.dev"].ifName == "enp0s10"'
RECONCILED = 'netclaim_reconcile_total{result="ok"}'
RECONCILE_FAILED = 'netclaim_reconcile_total{result="error"}'


@pytest.fixture
def team_a(kube: Client) -> Iterator[str]:
    """The namespace a restricted pool serves."""
    yield from fresh_namespace(kube, "a")


@pytest.fixture
def pool_objects(cluster: ClusterHandle) -> Iterator[list[dict[str, Any]]]:
    """IPPools and DeviceClasses a test creates, deleted after it."""
    created: list[dict[str, Any]] = []
    yield created
    listing = {"apiVersion": "v1", "kind": "List", "items": created}
    cluster.kubectl("delete", "--ignore-not-found", "-f", "-", input_text=json.dumps(listing))


def _create(cluster: ClusterHandle, created: list[dict[str, Any]], *documents: dict[str, Any]) -> None:
    created.extend(documents)
    cluster.kubectl(
        "apply",
        "-f",
        "-",
        input_text=json.dumps({"apiVersion": "v1", "kind": "List", "items": list(documents)}),
    )


def _through_class(template: dict[str, Any], device_class: str) -> dict[str, Any]:
    template["spec"]["spec"]["devices"]["requests"][1]["exactly"]["deviceClassName"] = device_class
    return template


def _pool_results(cluster: ClusterHandle, pool: str) -> int:
    """Allocation results on the pool's device, over every claim of the cluster: what the scheduler
    subtracts from the pool's capacity."""
    claims = kubectl_json(cluster, "get", "resourceclaims", "-A")["items"]
    return sum(
        1
        for claim in claims
        for result in (((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}).get(
            "results"
        )
        or []
        if result["pool"] == POOLS_POOL and result["device"] == pool
    )


def _published_capacity(cluster: ClusterHandle, pool: str) -> int | None:
    """The capacity the pool's device publishes; None while it is not published."""
    for item in kubectl_json(cluster, "get", "resourceslices")["items"]:
        if item["spec"]["pool"]["name"] == POOLS_POOL:
            for device in item["spec"].get("devices") or []:
                if device["name"] == pool:
                    return int(device["capacity"]["netclaim.dev/addresses"]["value"])
    return None


def _restricted_pool(
    cluster: ClusterHandle, pool_objects: list[dict[str, Any]], pool: str, subnet: str, namespace: str
) -> None:
    """A pool of 6 addresses serving `namespace` only, with its DeviceClass, once published."""
    _create(
        cluster,
        pool_objects,
        ip_pool(pool, {"subnet": subnet}, namespaces=[namespace]),
        pool_device_class(pool),
    )
    wait_for(lambda: _published_capacity(cluster, pool) == 6, 60, "the restricted pool published")


def test_the_pool_policy_outlives_an_apiserver_restart(
    cluster: ClusterHandle, kube: Client, ns: str, team_a: str, pool_objects: list[dict[str, Any]]
) -> None:
    """Before, the policy's parameters were the IPPools, a CRD as paramKind: from kube-apiserver's restart
    on, it refused every ResourceClaim and template of the cluster, of any driver ("failed to find resource
    referenced by paramKind", for the 20 minutes CI went on; kubernetes#122658). Its parameters are now
    ConfigMaps the controller keeps."""
    pool = "only-a-restart"
    _restricted_pool(cluster, pool_objects, pool, "10.62.1.0/29", team_a)
    with apiserver_away(cluster, kube):
        pass
    refusals: list[str] = []

    def admitted(template: dict[str, Any]) -> bool:
        try:
            apply(cluster, ns, template)
        except subprocess.CalledProcessError as err:
            refusals.append(str(err.stderr))
            return False
        return True

    # a template of another driver's class, in a namespace no pool serves: none of our business
    other = claim_template("other-driver", "gpu.example.com", "true", None)
    wait_for(
        lambda: admitted(other), 60, "another driver's template admitted after the restart", interval=0.2
    )
    print(f"\napiserver restarted: {len(refusals)} refusals before another driver's template was admitted")
    assert not [r for r in refusals if "paramKind" in r], refusals
    # the pool's own rule still holds
    with pytest.raises(subprocess.CalledProcessError) as refused:
        apply(cluster, ns, _through_class(pool_template("t", pool), f"netclaim-pool-{pool}"))
    assert f"serves namespaces {team_a} only, not {ns}" in str(refused.value.stderr), refused.value.stderr
    apply(cluster, team_a, _through_class(pool_template("t", pool), f"netclaim-pool-{pool}"))


def test_a_restricted_pool_refuses_other_namespaces_beforeip_allocation(
    cluster: ClusterHandle, kube: Client, ns: str, team_a: str, pool_objects: list[dict[str, Any]]
) -> None:
    pool = "only-a"
    _restricted_pool(cluster, pool_objects, pool, "10.62.0.0/29", team_a)
    # another namespace, through the pool's class: refused when written
    with pytest.raises(subprocess.CalledProcessError) as refused:
        apply(cluster, ns, _through_class(pool_template("t", pool), f"netclaim-pool-{pool}"))
    message = str(refused.value.stderr)
    assert (
        "netclaim-pool-namespaces" in message and f"serves namespaces {team_a} only, not {ns}" in message
    ), message
    assert "spec.spec.devices.requests[1]: DeviceClass netclaim-pool-only-a" in message, message
    # through the general class: it selects no restricted pool, the pod waits and nothing is consumed
    apply(cluster, ns, pool_template("t", pool), *spread("b", "t", 2))
    wait_for(
        lambda: all(
            any(c.type == "PodScheduled" and c.reason == "Unschedulable" for c in (p.status.conditions or []))
            for p in kube.list(Pod, namespace=ns)
            if p.status
        ),
        60,
        "the other namespace's pods unschedulable",
    )
    assert _pool_results(cluster, pool) == 0 and not allocations(cluster, pool)
    # its own namespace, through the pool's class: runs, with an address of the pool
    apply(
        cluster,
        team_a,
        _through_class(pool_template("t", pool), f"netclaim-pool-{pool}"),
        *spread("a", "t", 2),
    )
    wait_for(lambda: len(running(kube, team_a)) == 2, 180, "team A's pods running")
    wait_for(lambda: len(allocations(cluster, pool)) == 2, 60, "team A's addresses held")
    held = time.monotonic()

    status: dict[str, Any] = {}

    def counted() -> bool:
        status.clear()
        status.update(kubectl_json(cluster, "get", "ippool", pool)["status"])
        return (status["capacity"], status["allocatedClaims"], status["free"]) == (6, 2, 4)

    # the status is the controller's next pass after the allocations: within its resync period (30 s)
    deadline = held + 45
    while not counted():
        assert time.monotonic() < deadline, (
            f"the pool's status does not count team A's 2 claims after 45 s: {status}\n"
            f"controller:\n{controller_log(cluster)}"
        )
        time.sleep(0.5)
    print(f"\npool status counted the claims {time.monotonic() - held:.1f} s after their addresses were held")


def test_two_requests_on_one_pool_are_refused_and_capacity_counts_allocation_results(
    cluster: ClusterHandle, kube: Client, ns: str, pool_objects: list[dict[str, Any]]
) -> None:
    pool = "burst"
    _create(cluster, pool_objects, ip_pool(pool, {"subnet": "10.66.0.0/24"}))
    wait_for(lambda: _published_capacity(cluster, pool) == 254, 60, "the pool published")
    greedy = pool_template("greedy", pool)
    second = json.loads(json.dumps(greedy["spec"]["spec"]["devices"]["requests"][1]))
    second["name"] = "ip2"
    greedy["spec"]["spec"]["devices"]["requests"].append(second)
    greedy["spec"]["spec"]["devices"]["constraints"][0]["requests"].append("ip2")
    apply(cluster, ns, greedy, *spread("g", "greedy", 1))

    def refused() -> str:
        return next(
            (c["message"] for c in pod_claim_conditions(kube, ns, "g-0") if c["reason"] == "PrepareFailed"),
            "",
        )

    wait_for(lambda: bool(refused()), 120, "the claim with two requests on one pool refused")
    assert "take addresses from IPPool burst" in refused(), refused()
    # a burst of 40 claims: the pool's free count is what the scheduler sees
    apply(cluster, ns, pool_template("t", pool), *spread("p", "t", 40))
    wait_for(lambda: len(running(kube, ns)) == 40, 600, "40 pods running")

    def agree() -> bool:
        status = kubectl_json(cluster, "get", "ippool", pool).get("status") or {}
        seen_by_scheduler = (_published_capacity(cluster, pool) or 0) - _pool_results(cluster, pool)
        return status.get("free") == seen_by_scheduler and status.get("allocatedClaims") == _pool_results(
            cluster, pool
        )

    wait_for(agree, 60, "the pool's free count equal to the published capacity less its allocation results")
    status = kubectl_json(cluster, "get", "ippool", pool)["status"]
    print(
        f"\n40-claim burst (and one claim with two requests): {status['allocatedClaims']} results on the "
        f"pool, free {status['free']} of {status['capacity']}, as the scheduler sees it"
    )
    assert status["allocatedClaims"] == 42  # the greedy claim's two results count two


# --- a node's token stays on its node -------------------------------------------------------------------
def _as_agent(cluster: ClusterHandle, node: str, *args: str, document: dict[str, Any] | None = None) -> str:
    path = agents.pod_token_kubeconfig(cluster, node)
    text = json.dumps(document) if document is not None else None
    return cluster.kubectl(f"--kubeconfig={path}", *args, input_text=text)


def _standalone_claim(
    cluster: ClusterHandle, kube: Client, namespace: str, name: str
) -> tuple[str, str, str]:
    """A claim no pod uses (never allocated): what it holds is neither an orphan's nor beyond its
    allocation, so the controller leaves it be."""
    request = {"name": "nic", "exactly": {"deviceClassName": "netclaim-shared"}}
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {"devices": {"requests": [request]}},
    }
    apply(cluster, namespace, claim)
    found = kube.get(ResourceClaim, name, namespace=namespace)
    assert found.metadata is not None and found.metadata.uid is not None
    return namespace, name, found.metadata.uid


@pytest.mark.parametrize(
    ("name", "address", "refusal"),
    [
        ("probe.10.250.0.1", "not-an-ip", "spec.address"),
        ("probe.10.250.0.1", "10.250.0.1", "spec.address"),  # no prefix length
        ("probe.10.250.0.1", "10.250.0.1/0", "spec.address"),
        ("probe.10.250.0.9", "10.250.0.1/24", "metadata.name must be <spec.pool>.<the address"),
        ("other.10.250.0.1", "10.250.0.1/24", "metadata.name must be <spec.pool>.<the address"),
    ],
)
def test_an_agent_token_cannot_create_a_malformed_ipallocation(
    cluster: ClusterHandle, name: str, address: str, refusal: str
) -> None:
    with pytest.raises(subprocess.CalledProcessError) as refused:
        _as_agent(
            cluster,
            "node-1",
            "create",
            "--dry-run=server",
            "-f",
            "-",
            document=ip_allocation(name, address, "node-1"),
        )
    assert "Invalid" in str(refused.value.stderr) and refusal in str(refused.value.stderr), (
        refused.value.stderr
    )


def test_an_agent_token_releases_only_its_own_nodes_addresses(
    cluster: ClusterHandle, kube: Client, ns: str
) -> None:
    claim = _standalone_claim(cluster, kube, ns, "holder")
    held = ip_allocation("probe.10.250.0.2", "10.250.0.2/24", "node-2", claim=claim)
    cluster.kubectl("create", "-f", "-", input_text=json.dumps(held))
    try:
        _as_agent(cluster, "node-2", "delete", "--dry-run=server", "ipallocation", "probe.10.250.0.2")
        with pytest.raises(subprocess.CalledProcessError) as refused:
            _as_agent(cluster, "node-1", "delete", "ipallocation", "probe.10.250.0.2")
        assert "may only release addresses of its own node, not of node-2" in str(refused.value.stderr)
    finally:
        cluster.kubectl("delete", "ipallocation", "probe.10.250.0.2", "--ignore-not-found")


@pytest.mark.parametrize("pool", ["node-2", POOLS_POOL])
def test_an_agent_token_publishes_only_its_own_pool(cluster: ClusterHandle, pool: str) -> None:
    config = KubeConfig.from_file(agents.pod_token_kubeconfig(cluster, "node-1"))
    body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": "probe-pool"},
        "spec": {
            "driver": "netclaim.dev",
            "nodeName": "node-1",
            "pool": {"name": pool, "generation": 2**62, "resourceSliceCount": 1},
            "devices": [],
        },
    }
    with Client(config, field_manager="netclaim.dev") as agent, pytest.raises(ApiError) as refused:
        agent.create(typed(ResourceSlice, body), dry_run=True)
    assert refused.value.status.code == 403
    assert f"may only publish its own pool (spec.pool.name node-1), not {pool}" in str(
        refused.value.status.message
    )


def test_an_agent_token_never_writes_a_claims_allocation_or_reservation(
    cluster: ClusterHandle, kube: Client, ns: str
) -> None:
    _standalone_claim(cluster, kube, ns, "unallocated")
    allocate = [
        {
            "op": "add",
            "path": "/status",
            "value": {
                "allocation": {
                    "devices": {
                        "results": [
                            {
                                "request": "nic",
                                "driver": "netclaim.dev",
                                "pool": "node-1",
                                "device": "pci-0000-5e-00-0",
                            }
                        ]
                    }
                },
                "reservedFor": [{"resource": "pods", "name": "thief", "uid": str(uuid.uuid4())}],
            },
        }
    ]
    config = KubeConfig.from_file(agents.pod_token_kubeconfig(cluster, "node-1"))
    with Client(config, field_manager="netclaim.dev") as agent, pytest.raises(ApiError) as refused:
        agent.patch(
            ResourceClaimStatus,
            "unallocated",
            allocate,
            namespace=ns,
            patch_type=PatchType.JSON,
            dry_run=True,
        )
    # 1.37 refuses it itself (422: resourceclaims/binding); before it, netclaim-claim-status-own-node (403)
    message = str(refused.value.status.message)
    assert (refused.value.status.code, "resourceclaims/binding" in message) == (422, True) or (
        refused.value.status.code == 403 and "never status.allocation or status.reservedFor" in message
    ), refused.value.status
    found = kube.get(ResourceClaim, "unallocated", namespace=ns)
    assert found.status is None or found.status.allocation is None


def test_an_address_a_nodes_token_takes_for_a_claim_elsewhere_is_freed(
    cluster: ClusterHandle, kube: Client, ns: str, pool_objects: list[dict[str, Any]]
) -> None:
    """A node's token may create IPAllocations in its own name only, but for any claim: the controller
    frees what a claim holds beyond its allocation (a second address of a pool, here made by node-1's
    token for a claim allocated on node-2), and keeps the claim's own."""
    pool = "forgery"
    _create(cluster, pool_objects, ip_pool(pool, {"subnet": "10.67.0.0/24"}))
    apply(cluster, ns, pool_template("t", pool), *spread("p", "t", 1, nodes=("node-2",)))
    wait_for(lambda: len(running(kube, ns)) == 1, 180, "the pod running")
    [own] = allocations(cluster, pool)
    claim_ns, claim_name = own.claim.split("/")
    forged = ip_allocation(
        f"{pool}.10.67.0.250",
        "10.67.0.250/24",
        "node-1",
        pool=pool,
        claim=(claim_ns, claim_name, own.claim_uid),
    )
    _as_agent(cluster, "node-1", "create", "-f", "-", document=forged)
    wait_for(
        lambda: [a.name for a in allocations(cluster, pool)] == [own.name], 60, "the forged address freed"
    )
    reasons = controller_log(cluster, lines=-1)
    assert "address held beyond the claim's allocation freed" in reasons


def test_a_claim_nested_deep_in_another_drivers_config_wedges_nothing(
    cluster: ClusterHandle, kube: Client, ns: str
) -> None:
    """Another driver's opaque config passes netclaim's admission as it is; nested 1,500 deep it once made
    the controller's claim list fail, every reconcile. Now the controller keeps reconciling, and a pod
    whose claim carries it next to a netclaim NIC gets its interface (that config is not netclaim's)."""
    before = controller_metrics(cluster)
    parameters = "[" * 1_500 + '"x"' + "]" * 1_500
    config = cni_config([macvlan("10.68.0.0/24")], name="beside-deep")
    template = claim_template("t", "netclaim-shared", ON_ENP0S10, config)
    text = json.dumps(template).replace(
        '"config": [',
        '"config": [{"requests": ["nic"], "opaque": {"driver": "gpu.example.com", "parameters": '
        f'{{"deep": {parameters}}}}}}}, ',
        1,
    )
    cluster.kubectl("create", "-n", ns, "-f", "-", input_text=text)
    apply(cluster, ns, pod_manifest("p", "t"))

    def ready_and_running() -> bool:
        # Python's parsers give up 1,500 levels down (lightkube's too); kubectl reads it, as the agent does.
        text = cluster.kubectl("get", "resourceclaims", "-n", ns, "-o", "jsonpath={.items[*].status.devices}")
        entries = [e for e in json.loads(text or "[]") if e["driver"] == DRIVER]
        ready = any(c["type"] == "Ready" and c["status"] == "True" for e in entries for c in e["conditions"])
        return ready and any(name_of(p) == "p" for p in running(kube, ns))

    wait_for(ready_and_running, 180, "the pod running with its interface")
    assert interface_in_pod(cluster, ns, "p", "net1")[1] == ["10.68.0.2/24"]

    def reconciled_since() -> bool:
        after = controller_metrics(cluster)
        return after[RECONCILED] >= before[RECONCILED] + 2

    wait_for(reconciled_since, 120, "two reconciles since the deep claim was made")
    assert controller_metrics(cluster).get(RECONCILE_FAILED, 0.0) == before.get(RECONCILE_FAILED, 0.0)

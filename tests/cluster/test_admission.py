"""Issue 6: early rejection by the admission policy, agreeing with the agent on one corpus; what only the
agent can catch is caught at prepare and leaves nothing behind; least privilege for the agent."""

from __future__ import annotations

import contextlib
import copy
import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import yaml
from lightkube import Client, KubeConfig
from lightkube.core.exceptions import ApiError
from lightkube.resources.core_v1 import Node, Pod, Secret
from lightkube.resources.discovery_v1 import EndpointSlice
from lightkube.resources.resource_v1 import DeviceClass, ResourceClaim, ResourceClaimStatus, ResourceSlice
from lightkube.types import PatchType

from netclaim_lab import agents
from netclaim_lab.cluster import ClusterHandle
from netclaim_lab.images import BUSYBOX_IMAGE
from netclaim_lab.layout import REPO_ROOT
from tests.cluster.helpers import (
    NETWORK_STATUS,
    admin_device_class,
    apply,
    claim_devices,
    claim_template,
    cni_config,
    configured_and_running,
    in_node,
    interface_in_pod,
    ipam_reservations,
    kubectl_netclaim,
    macvlan,
    pod_claim_conditions,
    pod_claim_name,
    pod_manifest,
    ready_entry,
    refused_in_dry_run,
    store_rows,
)
from tests.cluster.ipam import ip_allocation
from tests.corpus import VALID_CONFIG, config_cases, single_plugin_form
from tests.kube import delete, typed, wait_for

CASES = config_cases()
ON_ENP0S10 = 'device.attributes["netclaim.dev"].ifName == "enp0s10"'


def _claim(parameters: Any, name: str = "corpus") -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {
            "devices": {
                "requests": [{"name": "nic", "exactly": {"deviceClassName": "netclaim-shared"}}],
                "config": [
                    {"requests": ["nic"], "opaque": {"driver": "netclaim.dev", "parameters": parameters}}
                ],
            }
        },
    }


def test_admission_and_the_agent_agree_on_the_corpus(cluster: ClusterHandle) -> None:
    assert refused_in_dry_run(cluster, _claim(VALID_CONFIG)) is None
    disagreements = []
    for case in CASES:
        message = refused_in_dry_run(cluster, _claim(case.parameters))
        verdict = "prepare" if message is None else "admission"
        if verdict != case.caught_at:
            disagreements.append(f"{case.name}: expected {case.caught_at}, admission said {message!r}")
        elif (
            message is not None
            and "spec.devices.config[0].opaque.parameters" not in message
            and "ValidatingAdmissionPolicy" in message
        ):
            disagreements.append(f"{case.name}: the message does not name the field: {message}")
    admitted = sum(1 for c in CASES if c.caught_at == "admission")
    print(f"corpus: {admitted} of {len(CASES)} configs refused at admission, the rest at prepare")
    assert disagreements == []


PROBED = {"netclaim.dev/match-probe": "yes"}


def _probed(manifest: dict[str, Any]) -> dict[str, Any]:
    """`manifest` with the label the match probe selects."""
    return {**manifest, "metadata": {**manifest["metadata"], "labels": PROBED}}


@contextlib.contextmanager
def _matching_probe(cluster: ClusterHandle, policy: str) -> Iterator[str]:
    """`policy`'s own match (constraints and conditions, from deploy/admission.yaml) in a policy that
    refuses everything it matches: what is refused is exactly what the real policy evaluates. (The
    apiserver counts a policy's denials only, so the real one cannot show what it skipped.) Yields the
    probe's message."""
    documents = yaml.safe_load_all((REPO_ROOT / "deploy" / "admission.yaml").read_text())
    [real] = [
        d
        for d in documents
        if d and d["kind"] == "ValidatingAdmissionPolicy" and d["metadata"]["name"] == policy
    ]
    name, message = f"{policy}-match-probe", f"matched by {policy}"
    # only objects with the probe's label: the apiserver keeps enforcing a deleted policy for a while,
    # and the suite's other tests must never meet it
    constraints = {**real["spec"]["matchConstraints"], "objectSelector": {"matchLabels": PROBED}}
    probe = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": constraints,
            "matchConditions": real["spec"]["matchConditions"],
            "validations": [{"expression": "false", "message": message}],
        },
    }
    binding = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name},
        "spec": {"policyName": name, "validationActions": ["Deny"]},
    }
    for document in (probe, binding):
        cluster.kubectl("apply", "-f", "-", input_text=json.dumps(document))
    try:
        yield message
    finally:
        for kind in ("validatingadmissionpolicybinding", "validatingadmissionpolicy"):
            cluster.kubectl("delete", kind, name, "--ignore-not-found")


def test_the_single_plugin_form_is_admitted_and_other_drivers_objects_are_never_evaluated(
    cluster: ClusterHandle,
) -> None:
    single = single_plugin_form(VALID_CONFIG)
    assert "plugins" not in single["config"] and single["config"]["type"] == "macvlan"
    assert refused_in_dry_run(cluster, _claim(single)) is None
    refused = copy.deepcopy(single)
    refused["config"]["runtimeConfig"] = {}  # a key no claim may set, in the single form too
    message = refused_in_dry_run(cluster, _claim(refused))
    assert message is not None and "spec.devices.config[0].opaque.parameters" in message, message
    assert "runtimeConfig" in message, message

    # the match condition: objects without a netclaim.dev config (another driver's GPU claim, template,
    # class) are not evaluated, so netclaim's failurePolicy: Fail can never refuse them; ours are
    gpu = _claim({"driverSpecific": "anything"})
    gpu["spec"]["devices"]["config"][0]["opaque"]["driver"] = "gpu.example.com"
    gpu["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] = "gpu.example.com"
    plain = _claim(VALID_CONFIG)
    del plain["spec"]["devices"]["config"]  # a netclaim request with nothing to check
    template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "gpu"},
        "spec": {"spec": gpu["spec"]},
    }
    gpu_class = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": "gpu-probe"},
        "spec": {"config": [{"opaque": gpu["spec"]["devices"]["config"][0]["opaque"]}]},
    }
    ours_template = {**template, "spec": {"spec": _claim(single)["spec"]}}
    ours = _probed(_claim(VALID_CONFIG))
    with _matching_probe(cluster, "netclaim-config") as matched:
        wait_for(
            lambda: matched in (refused_in_dry_run(cluster, ours) or ""),
            30,
            "the probe policy in force",
        )
        assert matched in (refused_in_dry_run(cluster, _probed(ours_template)) or "")
        for other in (gpu, plain, template, gpu_class):
            assert refused_in_dry_run(cluster, _probed(other)) is None, other
    wait_for(lambda: refused_in_dry_run(cluster, ours) is None, 60, "the probe policy gone")


def _status_refused(cluster: ClusterHandle, claim: dict[str, Any], driver: str) -> str | None:
    """None when the apiserver accepts, in a server dry run, `claim` (created before) allocated to `driver`
    and reserved for a second pod, as the scheduler writes it; else its message."""
    name = claim["metadata"]["name"]
    current = json.loads(cluster.kubectl("get", "resourceclaim", "-n", "default", name, "-o", "json"))
    current["status"] = {
        "allocation": {
            "devices": {"results": [{"request": "nic", "driver": driver, "pool": "node-1", "device": "d0"}]}
        },
        "reservedFor": [
            {"resource": "pods", "name": name, "uid": uid}
            for name, uid in (
                ("first", "00000000-0000-4000-8000-000000000001"),
                ("second", "00000000-0000-4000-8000-000000000002"),
            )
        ],
    }
    return refused_in_dry_run(cluster, current, action=("replace", "--subresource=status"))


def test_other_drivers_claims_never_meet_the_pool_and_one_pod_policies(cluster: ClusterHandle) -> None:
    """netclaim-pool-namespaces evaluates only claims naming a restricted pool's class (netclaim-pool-*),
    netclaim-one-pod-per-claim only netclaim.dev allocations: another driver's claims are not evaluated by
    either (failurePolicy: Fail could otherwise refuse them), whatever they ask."""
    gpu = _claim({"driverSpecific": "anything"}, name="gpu-probe")
    del gpu["spec"]["devices"]["config"]
    gpu["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] = "gpu.example.com"
    pool = copy.deepcopy(gpu)
    pool["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] = "netclaim-pool-team-a"
    among = copy.deepcopy(gpu)
    among["spec"]["devices"]["requests"] = [
        {
            "name": "nic",
            "firstAvailable": [
                {"name": "gpu", "deviceClassName": "gpu.example.com"},
                {"name": "pool", "deviceClassName": "netclaim-pool-team-a"},
            ],
        }
    ]
    with _matching_probe(cluster, "netclaim-pool-namespaces") as matched:
        wait_for(
            lambda: matched in (refused_in_dry_run(cluster, _probed(pool)) or ""),
            30,
            "the probe policy in force",
        )
        assert matched in (refused_in_dry_run(cluster, _probed(among)) or "")
        assert refused_in_dry_run(cluster, _probed(gpu)) is None

    # netclaim-one-pod-per-claim refuses all it matches (validation "false"): it is its own probe, and a
    # second probe beside it could not show (the apiserver reports one refusal, in no fixed order)
    claim = gpu
    cluster.kubectl("create", "-n", "default", "-f", "-", input_text=json.dumps(claim))
    try:
        refused = _status_refused(cluster, claim, "netclaim.dev")
        assert refused is not None and "already reserved for pod first" in refused, refused
        assert _status_refused(cluster, claim, "gpu.example.com") is None
    finally:
        cluster.kubectl("delete", "resourceclaim", "-n", "default", "gpu-probe", "--ignore-not-found")


@pytest.mark.parametrize("kind", ["DeviceClass", "ResourceClaimTemplate"])
def test_the_other_kinds_are_checked_too(cluster: ClusterHandle, kind: str) -> None:
    bad = copy.deepcopy(VALID_CONFIG)
    bad["interfaceName"] = "a/b"
    config = [{"opaque": {"driver": "netclaim.dev", "parameters": bad}}]
    if kind == "DeviceClass":
        obj: dict[str, Any] = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": "corpus"},
            "spec": {"config": config},
        }
        path = "spec.config[0]"
    else:
        obj = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": "corpus"},
            "spec": {
                "spec": {
                    "devices": {
                        "requests": [{"name": "nic", "exactly": {"deviceClassName": "x"}}],
                        "config": config,
                    }
                }
            },
        }
        path = "spec.spec.devices.config[0]"
    message = refused_in_dry_run(cluster, obj)
    assert message is not None and f"{path}.opaque.parameters.interfaceName" in message


def test_prepare_catches_the_rest_and_leaves_nothing(cluster: ClusterHandle, kube: Client, ns: str) -> None:
    prepare_cases = [c for c in CASES if c.caught_at == "prepare"]
    documents: list[dict[str, Any]] = []
    for index, case in enumerate(prepare_cases):
        spec = claim_template(f"c{index}", "netclaim-shared", ON_ENP0S10, case.parameters)
        documents += [spec, pod_manifest(f"p{index}", f"c{index}")]
    apply(cluster, ns, *documents)

    def refused(index: int) -> bool:
        return any(
            c["status"] == "False" and c["reason"] == "PrepareFailed"
            for c in pod_claim_conditions(kube, ns, f"p{index}")
        )

    wait_for(
        lambda: all(refused(i) for i in range(len(prepare_cases))),
        180,
        f"all {len(prepare_cases)} prepare-time cases refused with Ready=False",
    )
    for index, case in enumerate(prepare_cases):
        entries = claim_devices(kube, ns, pod_claim_name(kube, ns, f"p{index}"))
        message = entries[0]["conditions"][0]["message"]
        assert "opaque.parameters" in message or "config" in message, f"{case.name}: {message}"
        current = kube.get(Pod, f"p{index}", namespace=ns)
        assert current.status is not None and current.status.phase == "Pending", case.name
    print(f"{len(prepare_cases)} configs refused at prepare; pods kept out")
    assert ipam_reservations(cluster, "corpus-net") == set()
    assert not [r for n in ("node-1", "node-2") for r in store_rows(cluster, n) if r["claim_namespace"] == ns]
    assert all(
        "macvlan" not in in_node(cluster, n, "ip", "-d", "-o", "link", "show") for n in ("node-1", "node-2")
    )


def test_netclaim_validate_checks_manifests_offline(tmp_path: Path) -> None:
    examples = REPO_ROOT / "examples" / "demo"
    good = subprocess.run(
        [
            sys.executable,
            "-m",
            "netclaim",
            "validate",
            str(examples / "pod-a.yaml"),
            str(examples / "deployment-b.yaml"),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert good.returncode == 0, good.stdout + good.stderr
    bad = copy.deepcopy(VALID_CONFIG)
    bad["config"]["plugins"][0]["type"] = "/bin/sh"
    path = tmp_path / "claim.yaml"
    path.write_text(yaml.safe_dump(_claim(bad)))
    result = subprocess.run(
        [sys.executable, "-m", "netclaim", "validate", str(path)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 1
    assert (
        "ResourceClaim/corpus: spec.devices.config[0].opaque.parameters.config.plugins[0].type"
        in result.stdout
    )


# --- least privilege ----------------------------------------------------------------------------------------
def test_an_agent_token_cannot_write_another_nodes_slices(cluster: ClusterHandle) -> None:
    config = KubeConfig.from_file(agents.pod_token_kubeconfig(cluster, "node-1"))
    with Client(config, field_manager="netclaim.dev") as agent:

        def slice_for(node: str, driver: str = "netclaim.dev") -> ResourceSlice:
            return typed(
                ResourceSlice,
                {
                    "apiVersion": "resource.k8s.io/v1",
                    "kind": "ResourceSlice",
                    "metadata": {"name": f"probe-{node}"},
                    "spec": {
                        "driver": driver,
                        "nodeName": node,
                        "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                        "devices": [],
                    },
                },
            )

        agent.create(slice_for("node-1"), dry_run=True)  # its own node: allowed
        with pytest.raises(ApiError) as err:
            agent.create(slice_for("node-2"), dry_run=True)
        assert "may only write ResourceSlices of its own node, not of node-2" in str(err.value.status.message)
        with pytest.raises(ApiError) as err:
            agent.create(slice_for("node-1", "gpu.example.com"), dry_run=True)
        assert err.value.status.code == 403
        assert "of driver netclaim.dev, not of gpu.example.com" in str(err.value.status.message)
        for forbidden in (
            lambda: list(agent.list(Secret, namespace="kube-system")),
            lambda: agent.delete(ResourceClaim, "anything", namespace="default"),
            lambda: list(agent.list(Pod, namespace="default")),
            lambda: list(agent.list(ResourceClaim, namespace="default")),  # it GETs the claim kubelet names
        ):
            with pytest.raises(ApiError) as denied:
                forbidden()
            assert denied.value.status.code == 403


def _has_dropped_condition(kube: Client, node: str) -> bool:
    return _dropped_condition(kube, node) != []


def _dropped_condition(kube: Client, node: str) -> list[tuple[str, str]]:
    """The node's NetclaimSliceFieldsDropped condition as (status, reason); [] while it has none."""
    status = kube.get(Node, node).status
    listed = (status.conditions if status else None) or []
    return [(c.status, c.reason or "") for c in listed if c.type == "NetclaimSliceFieldsDropped"]


def test_an_agent_token_sets_only_its_own_nodes_condition(cluster: ClusterHandle, kube: Client) -> None:
    """The agents of the session cluster said their slices are kept whole (False); a node's token may set
    only that condition of its own node (nodes/status patch: RBAC cannot narrow it)."""
    for node in ("node-1", "node-2"):  # set after the agent's first write, which may still be under way
        wait_for(partial(_has_dropped_condition, kube, node), 60, f"{node}'s NetclaimSliceFieldsDropped")
        assert _dropped_condition(kube, node) == [("False", "AllFieldsKept")], _dropped_condition(kube, node)

    def condition(kind: str, status: str) -> dict[str, Any]:
        return {"type": kind, "status": status, "reason": "Probe", "message": "a probe"}

    def patch_as(token_node: str, node: str, body: dict[str, Any]) -> None:
        agent_config = KubeConfig.from_file(agents.pod_token_kubeconfig(cluster, token_node))
        with Client(agent_config, field_manager="netclaim.dev") as agent:
            agent.patch(Node.Status, node, body, patch_type=PatchType.STRATEGIC, dry_run=True)

    def refused(token_node: str, node: str, body: dict[str, Any]) -> str:
        with pytest.raises(ApiError) as denied:
            patch_as(token_node, node, body)
        assert denied.value.status.code == 403, denied.value.status
        return str(denied.value.status.message)

    ours = {"status": {"conditions": [condition("NetclaimSliceFieldsDropped", "False")]}}
    patch_as("node-1", "node-1", ours)  # its own node, its own condition: allowed
    assert "may only set conditions of its own node, not of node-2" in refused("node-1", "node-2", ours)
    only = "may change only its node's NetclaimSliceFieldsDropped condition"
    assert only in refused("node-1", "node-1", {"status": {"conditions": [condition("Ready", "False")]}})
    assert only in refused("node-1", "node-1", {"status": {"capacity": {"pods": "1000"}}})
    assert only in refused("node-1", "node-1", {"metadata": {"labels": {"example.com/hijacked": "yes"}}})


def test_an_agent_token_takes_addresses_only_for_its_own_node(cluster: ClusterHandle) -> None:
    def allocation(node: str) -> dict[str, Any]:
        return ip_allocation(f"probe.10.250.0.{node[-1]}", f"10.250.0.{node[-1]}/24", node)

    def create_as(agent_node: str, node: str) -> None:
        path = agents.pod_token_kubeconfig(cluster, agent_node)
        cluster.kubectl(
            f"--kubeconfig={path}",
            "create",
            "--dry-run=server",
            "-f",
            "-",
            input_text=json.dumps(allocation(node)),
        )

    create_as("node-1", "node-1")  # its own node: allowed
    with pytest.raises(subprocess.CalledProcessError) as denied:
        create_as("node-1", "node-2")
    assert "may only take addresses of its own node, not of node-2" in str(denied.value.stderr)


def test_an_agent_token_cannot_write_the_status_of_another_nodes_claim(
    cluster: ClusterHandle, kube: Client, ns: str
) -> None:
    config = cni_config([macvlan("10.93.0.0/24")], name="status-net")
    manifest = pod_manifest("p", "t")
    manifest["spec"]["nodeSelector"] = {"kubernetes.io/hostname": "node-2"}
    apply(cluster, ns, claim_template("t", "netclaim-shared", ON_ENP0S10, config), manifest)
    wait_for(lambda: ready_entry(kube, ns, "p") is not None, 120, "the claim on node-2 configured")
    claim = pod_claim_name(kube, ns, "p")
    tamper = [{"op": "replace", "path": "/status/devices/0/conditions/0/message", "value": "tampered"}]
    touch = [{"op": "test", "path": "/metadata/name", "value": claim}]  # an UPDATE that changes nothing

    def patch_as(node: str, patch: list[dict[str, Any]]) -> None:
        agent_config = KubeConfig.from_file(agents.pod_token_kubeconfig(cluster, node))
        with Client(agent_config, field_manager="netclaim.dev") as agent:
            agent.patch(
                ResourceClaimStatus, claim, patch, namespace=ns, patch_type=PatchType.JSON, dry_run=True
            )

    patch_as("node-2", tamper)  # the claim's own node: allowed
    patch_as("node-2", touch)
    # status.devices: kube-apiserver 1.37's own check (resourceclaims/driver, associated-node verbs)
    with pytest.raises(ApiError) as denied:
        patch_as("node-1", tamper)
    assert denied.value.status.code in (403, 422), denied.value.status
    assert 'requires resource="resourceclaims/driver"' in str(denied.value.status.message)
    # the rest of the status, and every version: the netclaim-claim-status-own-node policy
    with pytest.raises(ApiError) as denied:
        patch_as("node-1", touch)
    assert denied.value.status.code == 403, denied.value.status
    assert "may only write the status of claims allocated on its own node" in str(denied.value.status.message)


def test_user_config_cannot_reach_for_another_host_interface(
    cluster: ClusterHandle, kube: Client, ns: str
) -> None:
    uplink = {
        "type": "macvlan",
        "master": "eth0",
        "mode": "bridge",
        "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.91.0.0/24"}]]},
    }
    apply(
        cluster,
        ns,
        claim_template("grab", "netclaim-shared", ON_ENP0S10, cni_config([uplink], name="grab-net")),
        pod_manifest("greedy", "grab"),
    )

    def refused() -> bool:
        return any(
            "'eth0' is not the allocated device's interface" in c.get("message", "")
            for c in pod_claim_conditions(kube, ns, "greedy")
        )

    wait_for(refused, 60, "the user's master: eth0 refused")
    told = kubectl_netclaim(cluster, "explain", "pod/greedy", "-n", ns)  # what the pod's owner is told
    assert "PrepareFailed: " in told and "'eth0' is not the allocated device's interface" in told, told
    assert "fix: fix the config of claim" in told, told
    assert ipam_reservations(cluster, "grab-net") == set()


def test_an_admin_class_config_may_name_another_interface(
    cluster: ClusterHandle, kube: Client, ns: str
) -> None:
    """The admin picks ens1f0 for pods that were allocated node-1's enp0s10 share (e.g. a bonded pair)."""
    class_name = f"admin-master-{ns}"
    admin = cni_config([{**macvlan("10.92.0.0/24"), "master": "ens1f0"}], name="admin-master")
    kube.create(admin_device_class(class_name, ON_ENP0S10, admin))
    try:
        manifest = pod_manifest("admin-pod", "plain")
        manifest["spec"]["nodeSelector"] = {"kubernetes.io/hostname": "node-1"}
        apply(cluster, ns, claim_template("plain", class_name, "true", None), manifest)
        wait_for(lambda: configured_and_running(kube, ns, "admin-pod"), 120, "the pod configured on ens1f0")
        assert interface_in_pod(cluster, ns, "admin-pod", "net1")[1][0].startswith("10.92.0.")
    finally:
        delete(kube, Pod, "admin-pod", ns)
        wait_for(lambda: not list(kube.list(Pod, namespace=ns)), 120, "admin-pod gone")
        delete(kube, DeviceClass, class_name)


def test_sockets_and_state_are_private(cluster: ClusterHandle) -> None:
    layout = cluster.node("node-1").layout
    mode = {
        path: oct(path.stat().st_mode & 0o777)
        for path in (
            layout.kubelet_dir / "plugins_registry" / "netclaim.dev-reg.sock",
            layout.kubelet_dir / "plugins" / "netclaim.dev" / "dra.sock",
            layout.root / "netclaim",
            layout.root / "netclaim" / "netclaim.db",
        )
    }
    assert list(mode.values()) == ["0o600", "0o600", "0o700", "0o600"], mode


def test_an_agent_token_may_only_write_network_status_on_pods_of_its_own_node(
    cluster: ClusterHandle, kube: Client, ns: str
) -> None:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "plain", "labels": {"app": "plain"}, "annotations": {"example.com/audit": "on"}},
        "spec": {
            "nodeName": "node-2",
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "main",
                    "image": BUSYBOX_IMAGE,
                    "imagePullPolicy": "Never",
                    "command": ["sleep", "3600"],
                }
            ],
        },
    }
    apply(cluster, ns, pod)
    status = json.dumps([{"name": f"{ns}/net", "interface": "net1", "ips": ["10.0.0.2"]}])

    def patch_as(node: str, metadata: dict[str, Any], spec: dict[str, Any] | None = None) -> None:
        agent_config = KubeConfig.from_file(agents.pod_token_kubeconfig(cluster, node))
        body: dict[str, Any] = {"metadata": metadata, **({"spec": spec} if spec else {})}
        with Client(agent_config, field_manager="netclaim.dev") as agent:
            agent.patch(Pod, "plain", body, namespace=ns, patch_type=PatchType.STRATEGIC, dry_run=True)

    def refused(node: str, metadata: dict[str, Any], spec: dict[str, Any] | None = None) -> str:
        with pytest.raises(ApiError) as denied:
            patch_as(node, metadata, spec)
        assert denied.value.status.code == 403, denied.value.status
        return str(denied.value.status.message)

    patch_as("node-2", {"annotations": {NETWORK_STATUS: status}})  # its own node, that annotation: allowed
    assert "may only annotate pods bound to its own node" in refused(
        "node-1", {"annotations": {NETWORK_STATUS: status}}
    )
    only = "may change only a pod's k8s.v1.cni.cncf.io/network-status annotation"
    assert only in refused("node-2", {"labels": {"app": "hijacked"}})  # a Service's selector would follow
    assert only in refused("node-2", {"annotations": {"example.com/other": "x", NETWORK_STATUS: status}})
    assert only in refused("node-2", {"finalizers": ["example.com/never-deleted"]})
    assert only in refused("node-2", {"annotations": {"example.com/audit": None}})  # removing one
    owner = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "name": "x",
        "uid": "00000000-0000-0000-0000-000000000001",
    }
    assert only in refused("node-2", {"ownerReferences": [owner]})  # the garbage collector would follow
    image = {
        "containers": [{"name": "main", "image": "netclaim.local/pause:1"}]
    }  # the one spec change pods allow
    assert only in refused("node-2", {}, image)


def _slice(name: str, labels: dict[str, str], owner: str = "svc") -> dict[str, Any]:
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": name,
            "namespace": "default",
            "labels": labels,
            "ownerReferences": [
                {
                    "apiVersion": "v1",
                    "kind": "Service",
                    "name": owner,
                    "uid": "00000000-0000-0000-0000-000000000001",
                }
            ],
        },
        "addressType": "IPv4",
        "endpoints": [{"addresses": ["10.0.0.9"]}],
        "ports": [],
    }


def test_the_controller_token_writes_only_the_endpointslices_it_manages(
    cluster: ClusterHandle, kube: Client, tmp_path: Path
) -> None:
    """RBAC lets the controller write any EndpointSlice; admission (netclaim-controller-endpointslices)
    keeps a token taken from its pod to the slices of Services over a netclaim network."""
    path = tmp_path / "controller.kubeconfig"
    agents.controller_kubeconfig(cluster, path)
    ours = {
        "endpointslice.kubernetes.io/managed-by": "netclaim.dev",
        "kubernetes.io/service-name": "svc",
        "netclaim.dev/network": "lan3",
    }
    theirs = {**ours, "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io"}
    others = _slice("kubes", {**theirs, "kubernetes.io/service-name": "kubes"})
    del others["metadata"]["ownerReferences"]  # no such Service: the garbage collector would take it
    kube.create(typed(EndpointSlice, others))  # as another controller would have made it
    with Client(KubeConfig.from_file(path)) as controller:

        def refused(call: Callable[[], object]) -> str:
            """The API's refusal of what the controller's token asks ("" when it is allowed)."""
            try:
                call()
            except ApiError as err:
                return str(err.status.message)
            return ""

        def created(body: dict[str, Any]) -> str:
            return refused(partial(controller.create, typed(EndpointSlice, body), dry_run=True))

        assert created(_slice("svc-netclaim-ipv4", ours)) == ""
        without_network = {k: v for k, v in ours.items() if k != "netclaim.dev/network"}
        taken_over = {"metadata": {"labels": {**ours, "kubernetes.io/service-name": "kubes"}}}
        refusals = {
            "another manager": created(_slice("svc-1", theirs)),
            "no network": created(_slice("svc-2", without_network)),
            "another owner": created(_slice("svc-3", ours, owner="other")),
            "taking over": refused(
                partial(
                    controller.patch,
                    EndpointSlice,
                    "kubes",
                    taken_over,
                    namespace="default",
                    patch_type=PatchType.MERGE,
                    dry_run=True,
                )
            ),
            "deleting theirs": refused(
                partial(controller.delete, EndpointSlice, "kubes", namespace="default", dry_run=True)
            ),
        }
    kube.delete(EndpointSlice, "kubes", namespace="default")
    assert all("netclaim-controller-endpointslices" in said for said in refusals.values()), refusals

"""README's "Install into an existing cluster", run literally: each shell block of that section as written,
in order, against a fresh local cluster (the demo's topology) whose Pod Security default is `baseline`.
The kubectl path, its uninstall, then the Helm path with the talks' demo on it, and its uninstall. The
cluster runs Multus' multi-networkpolicy before either: its CRD and a tenant's policy outlive both."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest

from netclaim_lab import agents, demo, processes
from netclaim_lab.cluster import ClusterHandle
from netclaim_lab.layout import REPO_ROOT
from netclaim_lab.processes import CommandFailed
from tests.cluster.helpers import demo_topology_cluster, refused_in_dry_run
from tests.kube import wait_for

SECTION = "## Install into an existing cluster"
POLICIES_CRD = "multi-networkpolicies.k8s.cni.cncf.io"
MULTUS_LABEL = ("app", "multi-networkpolicy")
# The kind as another project installs it: its own label, a schema that keeps whatever it is given
MULTUS_CRD: dict[str, Any] = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": POLICIES_CRD, "labels": dict([MULTUS_LABEL])},
    "spec": {
        "group": "k8s.cni.cncf.io",
        "scope": "Namespaced",
        "names": {
            "kind": "MultiNetworkPolicy",
            "plural": "multi-networkpolicies",
            "singular": "multi-networkpolicy",
        },
        "versions": [
            {
                "name": "v1beta1",
                "served": True,
                "storage": True,
                "schema": {
                    "openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
                },
            }
        ],
    },
}
MULTUS_POLICY: dict[str, Any] = {
    "apiVersion": "k8s.cni.cncf.io/v1beta1",
    "kind": "MultiNetworkPolicy",
    "metadata": {
        "name": "tenant-db",
        "namespace": "default",
        "annotations": {"k8s.v1.cni.cncf.io/policy-for": "default/macvlan-conf"},
    },
    "spec": {"podSelector": {"matchLabels": {"app": "db"}}, "policyTypes": ["Ingress"], "ingress": []},
}
OURS = {
    "customresourcedefinitions": "netclaim.dev",
    "deviceclasses": "netclaim-",
    "clusterroles": "netclaim",
    "clusterrolebindings": "netclaim",
    "validatingadmissionpolicies": "netclaim",
    "validatingadmissionpolicybindings": "netclaim",
}


def readme_blocks() -> dict[str, str]:
    """The section's ```sh blocks, by the comment on their first line ("# with kubectl" → "with kubectl")."""
    text = (REPO_ROOT / "README.md").read_text()
    section = text[text.index(SECTION) : text.index("\n## ", text.index(SECTION) + 1)]
    blocks = {}
    for body in re.findall(r"```sh\n(.*?)```", section, re.DOTALL):
        lines = [line.strip() for line in body.strip().splitlines()]
        assert lines[0].startswith("# "), f"a block of {SECTION!r} must say where it runs: {lines[0]!r}"
        blocks[lines[0][2:]] = "\n".join(lines[1:])
    return blocks


@pytest.fixture(scope="module")
def fresh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterHandle]:
    with demo_topology_cluster(tmp_path_factory.mktemp("ncinst"), "ncinst", 205, 18) as handle:
        yield handle


def _run(handle: ClusterHandle, block: str, *, node: str | None = None) -> str:
    """One README block through `sh -e` with the cluster's kubeconfig and programs, as a user's shell: what
    it printed."""
    env = {
        **os.environ,
        "KUBECONFIG": str(handle.kubeconfig),
        "PATH": f"{handle.bin_dir}:{os.environ['PATH']}",
    }
    command = ["sh", "-ec", block]
    if node is not None:  # entering the node's mount namespace resets the directory: the archive is here
        command = [*handle.node(node).enter(), "sh", "-ec", f"cd {REPO_ROOT}\n{block}"]
    result = subprocess.run(
        command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=900, check=False
    )
    assert result.returncode == 0, (
        f"README block failed on {node or 'the machine'}:\n{block}\n{result.stderr}"
    )
    return result.stdout


def _assert_running_as_deployed(handle: ClusterHandle, namespace: str) -> str:
    nodes = agents.kubelet_nodes(handle)
    wanted = len(nodes)
    agents.wait_ready(handle, nodes)

    def counts() -> tuple[int, int]:
        ds = json.loads(handle.kubectl("get", "ds", "netclaim-agent", "-n", namespace, "-o", "json"))
        return ds["status"].get("desiredNumberScheduled", 0), ds["status"].get("numberReady", 0)

    wait_for(lambda: counts() == (wanted, wanted), 60, f"the DaemonSet's status: {wanted} desired, ready")
    crashed = {
        node: agents.agent_log(handle, node, namespace)[-3000:]
        for node in nodes
        if agents.restarts(handle, node, namespace)
    }
    assert not crashed, crashed
    pod = agents.agent_pod(handle, agents.kubelet_nodes(handle)[0], namespace)
    assert pod is not None
    projected = [
        source["serviceAccountToken"]
        for volume in pod["spec"]["volumes"]
        for source in volume.get("projected", {}).get("sources", [])
        if "serviceAccountToken" in source
    ]
    assert projected, "the agent's token must be the one kubelet projects into its pod"
    assert pod["spec"]["serviceAccountName"] == "netclaim-agent"
    slices = json.loads(handle.kubectl("get", "resourceslices", "-o", "json"))["items"]
    published = {s["spec"].get("nodeName") for s in slices if s["spec"]["driver"] == "netclaim.dev"}
    assert set(agents.kubelet_nodes(handle)) <= published, published
    return f"{wanted}/{wanted} agents ready in {namespace}"


def _own_node_policies_hold(handle: ClusterHandle, namespace: str) -> None:
    """An agent's own token (its pod's, in `namespace`) may write its node's slice, not another node's:
    the admission policies name the installed ServiceAccount, wherever it was installed."""
    first, second = agents.kubelet_nodes(handle)[:2]
    kubeconfig = agents.pod_token_kubeconfig(handle, first, namespace)

    def slice_for(node: str) -> dict[str, Any]:
        return {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": f"probe-{node}"},
            "spec": {
                "driver": "netclaim.dev",
                "nodeName": node,
                "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                "devices": [],
            },
        }

    assert refused_in_dry_run(handle, slice_for(first), kubeconfig) is None
    refused = refused_in_dry_run(handle, slice_for(second), kubeconfig)
    assert (
        refused is not None and f"may only write ResourceSlices of its own node, not of {second}" in refused
    )


def _multus_installed(handle: ClusterHandle) -> None:
    handle.kubectl("create", "-f", "-", input_text=json.dumps(MULTUS_CRD))
    handle.kubectl("wait", "--for=condition=Established", "--timeout=60s", f"crd/{POLICIES_CRD}")
    wait_for(lambda: _created(handle, MULTUS_POLICY), 30, "the Multus policy created (its CRD served)")


def _created(handle: ClusterHandle, manifest: dict[str, Any]) -> bool:
    try:
        handle.kubectl("create", "-f", "-", input_text=json.dumps(manifest))
    except CommandFailed as err:
        if "no matches for kind" in str(err):  # a CRD just Established may not be served for a moment
            return False
        raise
    return True


def _multus_intact(handle: ClusterHandle, after: str) -> None:
    """Multus' CRD as Multus made it (its label, its schema, no Helm release's claim on it) and its
    tenant's policy as written."""
    crd = json.loads(handle.kubectl("get", "crd", POLICIES_CRD, "-o", "json"))
    key, value = MULTUS_LABEL
    assert crd["metadata"].get("labels", {}).get(key) == value, f"after {after}: {crd['metadata']}"
    assert not any(a.startswith("meta.helm.sh/") for a in crd["metadata"].get("annotations", {})), after
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    assert schema == MULTUS_CRD["spec"]["versions"][0]["schema"]["openAPIV3Schema"], f"after {after}"
    policy = json.loads(
        handle.kubectl("get", "multi-networkpolicy", "tenant-db", "-n", "default", "-o", "json")
    )
    assert policy["spec"] == MULTUS_POLICY["spec"], f"after {after}: {policy['spec']}"


def _upgrade_without_the_policy_keeps_it(handle: ClusterHandle, namespace: str) -> None:
    """`helm upgrade` without --set-file policy (nor --reuse-values): the policy ConfigMap stays as it
    was, and so does every node's slice."""

    def policy() -> str:
        configmap = handle.kubectl("get", "configmap", "netclaim-policy", "-n", namespace, "-o", "json")
        return str(json.loads(configmap)["data"]["policy.yaml"])

    before = policy()
    helm = [str(handle.bin_dir / "helm"), "--kubeconfig", str(handle.kubeconfig)]
    processes.run(
        [
            *helm,
            "upgrade",
            "netclaim",
            str(REPO_ROOT / "charts" / "netclaim"),
            "--namespace",
            namespace,
            "--set",
            "namespace.create=false",
            "--wait",
            "--timeout",
            "5m",
        ],
        timeout=330,
    )
    assert policy() == before
    _assert_running_as_deployed(handle, namespace)


def _leftovers(handle: ClusterHandle, namespace: str) -> list[str]:
    found = []
    for kind, prefix in OURS.items():
        names = handle.kubectl("get", kind, "-o", "name").split()
        found += [n for n in names if n.split("/", 1)[1].startswith(prefix) or n.endswith(prefix)]
    if handle.kubectl("get", "namespace", namespace, "--ignore-not-found", "-o", "name").strip():
        found.append(f"namespace/{namespace}")
    slices = json.loads(handle.kubectl("get", "resourceslices", "-o", "json"))["items"]
    found += [
        f"resourceslice/{s['metadata']['name']}" for s in slices if s["spec"]["driver"] == "netclaim.dev"
    ]
    return found


def _uninstalled(handle: ClusterHandle, block: str, namespace: str) -> float:
    started = time.monotonic()
    _run(handle, block)
    # kubelet wipes a gone driver's slices of its node after 30 s
    wait_for(
        lambda: not _leftovers(handle, namespace),
        120,
        f"nothing of netclaim's left: {_leftovers(handle, namespace)}",
    )
    return time.monotonic() - started


def test_the_readme_install_steps_work_as_written_with_kubectl_and_with_helm(fresh: ClusterHandle) -> None:
    blocks = readme_blocks()
    assert set(blocks) >= {
        "on the machine with the checkout",
        "on every node, without a registry",
        "with kubectl",
        "with helm",
        "uninstall, with kubectl",
        "uninstall, with helm",
    }, sorted(blocks)
    _multus_installed(fresh)
    _run(fresh, blocks["on the machine with the checkout"])
    for node in agents.kubelet_nodes(fresh):
        _run(fresh, blocks["on every node, without a registry"], node=node)

    preflight = _run(fresh, blocks["with kubectl"])
    # the block's last line prints every agent's preflight: each node passed all its checks
    nodes = agents.kubelet_nodes(fresh)
    assert preflight.count("preflight: every check passed") == len(nodes), preflight
    applied = _assert_running_as_deployed(fresh, agents.NAMESPACE)
    _own_node_policies_hold(fresh, agents.NAMESPACE)
    _multus_intact(fresh, "the kubectl install")
    kubectl_gone = _uninstalled(fresh, blocks["uninstall, with kubectl"], agents.NAMESPACE)
    _multus_intact(fresh, "the kubectl uninstall")

    # Helm into a namespace of the user's choosing: the own-node policies follow it
    helm_namespace = re.search(r"helm install netclaim \S+ --namespace (\S+)", blocks["with helm"])
    assert helm_namespace is not None and helm_namespace[1] != agents.NAMESPACE, blocks["with helm"]
    _run(fresh, blocks["with helm"])
    installed = _assert_running_as_deployed(fresh, helm_namespace[1])
    _own_node_policies_hold(fresh, helm_namespace[1])
    outcome = demo.run(fresh)
    assert outcome.problems == []
    claims = json.loads(fresh.kubectl("get", "resourceclaims", "-n", demo.NAMESPACE, "-o", "json"))["items"]
    entries = sum(len(c.get("status", {}).get("devices") or []) for c in claims)
    # a node's persisted state, read in its agent's pod (docs/troubleshooting.md): each demo pod there
    persisted = []
    for node in agents.kubelet_nodes(fresh):
        pod = agents.agent_pod(fresh, node, helm_namespace[1])
        assert pod is not None
        told = fresh.kubectl(
            *("exec", "-n", helm_namespace[1], pod["metadata"]["name"], "-c", "agent", "--"),
            *("netclaim", "state", "-o", "json"),
        )
        persisted += [r for r in json.loads(told) if r["claim"].startswith(f"{demo.NAMESPACE}/")]
    attached = {r["claim"] for r in persisted if r["state"] == "attached" and r["ips"]}
    reported = {
        f"{demo.NAMESPACE}/{c['metadata']['name']}" for c in claims if c.get("status", {}).get("devices")
    }
    assert attached == reported and len(attached) >= 3, persisted  # Pod-A and two replicas of B
    _multus_intact(fresh, "the helm install")
    _upgrade_without_the_policy_keeps_it(fresh, helm_namespace[1])
    helm_gone = _uninstalled(fresh, blocks["uninstall, with helm"], helm_namespace[1])
    _multus_intact(fresh, "the helm uninstall")
    claims = json.loads(fresh.kubectl("get", "resourceclaims", "-n", demo.NAMESPACE, "-o", "json"))["items"]
    kept = sum(len(c.get("status", {}).get("devices") or []) for c in claims)
    print(
        f"\nREADME install, Pod Security baseline default: kubectl: {applied}, uninstalled in "
        f"{kubectl_gone:.0f} s; helm: {installed}, demo passed, uninstalled in {helm_gone:.0f} s; "
        f"status entries of the demo's claims: {entries} before, {kept} kept after uninstall "
        "(their pods still run with their interfaces); Multus' MultiNetworkPolicy CRD and policy intact"
    )
    assert kept == entries

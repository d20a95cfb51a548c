"""Helpers shared by the cluster tests: manifests, allocations, running commands in nodes and pods."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml
from lightkube import Client
from lightkube.core.exceptions import ApiError
from lightkube.resources.core_v1 import Namespace, Pod, ServiceAccount
from lightkube.resources.resource_v1 import DeviceClass, ResourceClaim, ResourceClaimTemplate, ResourceSlice

from netclaim_lab import agents, processes
from netclaim_lab import cluster as local_cluster
from netclaim_lab.cluster import ClusterHandle
from netclaim_lab.controlplane import ControlPlane
from netclaim_lab.images import BUSYBOX_IMAGE
from netclaim_lab.layout import REPO_ROOT
from tests.conftest import require_root_prerequisites
from tests.kube import delete, typed, wait_for

DRIVER = "netclaim.dev"
NS = "default"


def node_slices(kube: Client, node: str) -> list[ResourceSlice]:
    return list(kube.list(ResourceSlice, fields={"spec.nodeName": node, "spec.driver": DRIVER}))


def published(kube: Client, node: str) -> dict[str, dict[str, Any]]:
    """ifName -> device (as a dict) in the node's current pool."""
    devices = {}
    for item in node_slices(kube, node):
        for device in item.spec.devices or []:
            data = device.to_dict()
            devices[data["attributes"]["netclaim.dev/ifName"]["string"]] = data
    return devices


def template(
    name: str,
    requests: list[dict[str, Any]],
    constraints: list[dict[str, Any]] | None = None,
) -> ResourceClaimTemplate:
    devices: dict[str, Any] = {"requests": requests}
    if constraints:
        devices["constraints"] = constraints
    return typed(
        ResourceClaimTemplate,
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": name, "namespace": NS},
            "spec": {"spec": {"devices": devices}},
        },
    )


def nic_request(
    name: str,
    cel: str,
    bandwidth: str | None = None,
    device_class: str = "netclaim-shared",
) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": device_class, "selectors": [{"cel": {"expression": cel}}]}
    if bandwidth:
        exactly["capacity"] = {"requests": {"netclaim.dev/bandwidth": bandwidth}}
    return {"name": name, "exactly": exactly}


def pod_spec(claim_template: str, tolerate_kubelet_less: bool = False) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "terminationGracePeriodSeconds": 0,
        "resourceClaims": [{"name": "net", "resourceClaimTemplateName": claim_template}],
        "containers": [
            {
                "name": "main",
                "image": BUSYBOX_IMAGE,
                "imagePullPolicy": "Never",
                "command": ["sleep", "3600"],
                "resources": {"claims": [{"name": "net"}]},
            }
        ],
    }
    if tolerate_kubelet_less:
        spec["tolerations"] = [
            {"key": "netclaim.dev/kubelet-less", "operator": "Exists", "effect": "NoSchedule"}
        ]
    return spec


def pod(name: str, claim_template: str, **kwargs: bool) -> Pod:
    return typed(
        Pod,
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": NS},
            "spec": pod_spec(claim_template, **kwargs),
        },
    )


def allocation(kube: Client, pod_name: str) -> list[Any]:
    """The allocation results of the pod's claim ([] while it has none)."""
    current = kube.get(Pod, pod_name, namespace=NS)
    statuses = current.status.resourceClaimStatuses if current.status else None
    if not statuses or not statuses[0].resourceClaimName:
        return []
    claim = kube.get(ResourceClaim, statuses[0].resourceClaimName, namespace=NS)
    if claim.status is None or claim.status.allocation is None or claim.status.allocation.devices is None:
        return []
    return list(claim.status.allocation.devices.results or [])


def node_of(kube: Client, pod_name: str) -> str | None:
    current = kube.get(Pod, pod_name, namespace=NS)
    return current.spec.nodeName if current.spec else None


def gone(kube: Client, kind: type[Pod], name: str) -> bool:
    try:
        kube.get(kind, name, namespace=NS)
    except ApiError as err:
        return err.status.code == 404
    return False


def in_node(cluster: ClusterHandle, node: str, *command: str) -> str:
    return processes.run([*cluster.node(node).enter(), *command])


def kubectl_json(cluster: ClusterHandle, *args: str) -> Any:
    return json.loads(cluster.kubectl(*args, "-o", "json"))


def sandbox_netns(cluster: ClusterHandle, node: str, pod_uid: str) -> str:
    """The network namespace path of a pod's sandbox, from the node's containerd (crictl)."""
    crictl = cluster.node(node).crictl()
    sandbox = processes.run(
        [*crictl, "pods", "--state", "ready", "--label", f"io.kubernetes.pod.uid={pod_uid}", "-q"]
    ).split()[0]
    info = json.loads(processes.run([*crictl, "inspectp", sandbox]))
    namespaces = info["info"]["runtimeSpec"]["linux"]["namespaces"]
    return str(next(ns["path"] for ns in namespaces if ns["type"] == "network"))


def in_pod_netns(cluster: ClusterHandle, node: str, netns: str, *command: str, timeout: float = 60) -> str:
    """Run a node program (iperf3, ip) inside a pod's network namespace."""
    return processes.run(
        [*cluster.node(node).enter(), "nsenter", f"--net={netns}", *command], timeout=timeout
    )


def store_rows(cluster: ClusterHandle, node: str) -> list[dict[str, Any]]:
    """The agent's durable state on a node, read-only."""
    path = cluster.node(node).layout.state_dir / "netclaim.db"
    if not path.exists():
        return []
    with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
        db.row_factory = sqlite3.Row
        return [dict(row) for row in db.execute("SELECT * FROM attachments")]


def host_local_dir(cluster: ClusterHandle, node: str, network: str, namespace: str | None = None) -> Path:
    """Where the agent's host-local keeps a network's reservations on `node`: a claim's own config's
    (`namespace`) or a DeviceClass's."""
    base = cluster.node(node).layout.claims_host_local_dir
    return (base / "tenant" / namespace if namespace else base / "admin") / network


def ipam_reservations(cluster: ClusterHandle, network: str) -> set[str]:
    """host-local reservations of a network on every node (each node keeps its own directory), a claim's
    own (of any namespace) and a DeviceClass's."""
    found = set()
    for node in (n.name for n in cluster.spec.nodes if n.kubelet):
        base = cluster.node(node).layout.claims_host_local_dir
        for directory in [base / "admin" / network, *base.glob(f"tenant/*/{network}")]:
            if directory.is_dir():
                found |= {
                    f"{node}/{p.name}"
                    for p in directory.iterdir()
                    if p.name not in {"lock"} and not p.name.startswith("last_reserved")
                }
    return found


def claim_devices(kube: Client, namespace: str, name: str) -> list[dict[str, Any]]:
    """Our status entries of the claim; none once it is gone."""
    try:
        claim = kube.get(ResourceClaim, name, namespace=namespace)
    except ApiError as err:
        if err.status.code == 404:
            return []
        raise
    return [d.to_dict() for d in (claim.status.devices if claim.status else None) or [] if d.driver == DRIVER]


def pod_claim_name(kube: Client, namespace: str, pod_name: str) -> str:
    current = kube.get(Pod, pod_name, namespace=namespace)
    statuses = current.status.resourceClaimStatuses if current.status else None
    assert statuses and statuses[0].resourceClaimName, f"pod {pod_name} has no claim yet"
    return str(statuses[0].resourceClaimName)


def running(kube: Client, namespace: str, app: str | None = None) -> list[Pod]:
    pods = kube.list(Pod, namespace=namespace, labels={"app": app} if app else None)
    return [
        p
        for p in pods
        if p.status
        and p.status.phase == "Running"
        and p.metadata
        and not p.metadata.deletionTimestamp
        and any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or [])
    ]


def name_of(pod: Pod) -> str:
    assert pod.metadata is not None and pod.metadata.name is not None
    return pod.metadata.name


def node_name(pod: Pod) -> str:
    assert pod.spec is not None and pod.spec.nodeName is not None
    return pod.spec.nodeName


def interface_in_pod(
    cluster: ClusterHandle, namespace: str, pod: str, interface: str
) -> tuple[str, list[str], int]:
    """(MAC, IPv4 CIDRs, MTU) of an interface, as `ip` inside the pod's container prints them."""
    link = cluster.kubectl("exec", "-n", namespace, pod, "--", "ip", "-o", "link", "show", interface)
    mac = re.search(r"link/ether ([0-9a-f:]{17})", link)
    mtu = re.search(r"mtu (\d+)", link)
    assert mac and mtu, link
    addresses = cluster.kubectl(
        "exec", "-n", namespace, pod, "--", "ip", "-o", "-4", "addr", "show", interface
    )
    return mac.group(1), re.findall(r"inet (\S+)", addresses), int(mtu.group(1))


def pod_claim_entries(kube: Client, namespace: str, pod: str) -> list[dict[str, Any]]:
    """Our status entries of the pod's claim; none while the claim is not created yet."""
    try:
        claim = pod_claim_name(kube, namespace, pod)
    except AssertionError:
        return []
    return claim_devices(kube, namespace, claim)


def pod_claim_conditions(kube: Client, namespace: str, pod: str) -> list[dict[str, Any]]:
    return [c for e in pod_claim_entries(kube, namespace, pod) for c in e.get("conditions", [])]


def ready_entry(kube: Client, namespace: str, pod: str) -> dict[str, Any] | None:
    """Our status entry of the pod's claim once it says Ready=True."""
    for entry in pod_claim_entries(kube, namespace, pod):
        if any(c["type"] == "Ready" and c["status"] == "True" for c in entry.get("conditions", [])):
            return entry
    return None


def configured_and_running(kube: Client, namespace: str, pod: str) -> bool:
    """The claim says Ready and the pod's container runs (the claim is Ready once the sandbox has its
    interface, a moment before the container starts: only then can a test exec into it)."""
    return ready_entry(kube, namespace, pod) is not None and any(
        name_of(p) == pod for p in running(kube, namespace)
    )


def ping(cluster: ClusterHandle, namespace: str, pod: str, address: str, interface: str = "net1") -> None:
    output = cluster.kubectl(
        "exec", "-n", namespace, pod, "--", "ping", "-c", "2", "-W", "3", "-I", interface, address, timeout=30
    )
    assert " 0% packet loss" in output, output


def claim_template(
    name: str, device_class: str, cel: str, config: dict[str, Any] | None, bandwidth: str | None = None
) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": device_class, "selectors": [{"cel": {"expression": cel}}]}
    if bandwidth:
        exactly["capacity"] = {"requests": {"netclaim.dev/bandwidth": bandwidth}}
    devices: dict[str, Any] = {"requests": [{"name": "nic", "exactly": exactly}]}
    if config is not None:
        devices["config"] = [
            {"requests": ["nic"], "opaque": {"driver": "netclaim.dev", "parameters": config}}
        ]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name},
        "spec": {"spec": {"devices": devices}},
    }


def cni_config(plugins: list[dict[str, Any]], interface: str = "net1", name: str = "t-net") -> dict[str, Any]:
    return {
        "apiVersion": "netclaim.dev/v1alpha1",
        "kind": "CNIConfig",
        "interfaceName": interface,
        "config": {"cniVersion": "1.0.0", "name": name, "plugins": plugins},
    }


def macvlan(subnet: str) -> dict[str, Any]:
    return {
        "type": "macvlan",
        "master": "{{ device.ifName }}",
        "mode": "bridge",
        "ipam": {"type": "host-local", "ranges": [[{"subnet": subnet}]]},
    }


def apply(cluster: ClusterHandle, namespace: str, *documents: dict[str, Any]) -> None:
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input_text=yaml.safe_dump_all(documents))


def example_documents(example: str, name: str, replacements: dict[str, str]) -> list[dict[str, Any]]:
    """A file of examples/<example> as shipped, with each text of `replacements` replaced (the example's
    network names by the test cluster's, tests/cluster/policy.yaml)."""
    text = (REPO_ROOT / "examples" / example / name).read_text()
    for old, new in replacements.items():
        assert old in text, f"examples/{example}/{name} no longer says {old!r}"
        text = text.replace(old, new)
    return [d for d in yaml.safe_load_all(text) if d]


def runnable_here(pod: dict[str, Any]) -> dict[str, Any]:
    """An example's pod as the test cluster runs it: the lab's preloaded busybox, no grace period."""
    for container in pod["spec"]["containers"]:
        container.update(image=BUSYBOX_IMAGE, imagePullPolicy="Never", command=["sleep", "3600"])
    pod["spec"]["terminationGracePeriodSeconds"] = 0
    return pod


# A container that checks its own net1: NET1-PRESENT or NET1-MISSING as it starts, then NET1-LOST if the
# interface goes while it runs (tests/cluster/test_upgrade.py, test_release_upgrade.py)
WATCH = (
    "trap 'exit 0' TERM; "
    "if ip link show net1 >/dev/null 2>&1; then echo NET1-PRESENT; else echo NET1-MISSING; fi; "
    "while ip link show net1 >/dev/null 2>&1; do sleep 0.2; done; "
    'echo NET1-LOST; echo "LOST-AT $(date +%s)"; '
    "while true; do sleep 1; done"
)


def read_watches(cluster: ClusterHandle, kube: Client, namespace: str) -> tuple[list[str], list[str]]:
    """What every pod of `namespace` running WATCH printed (its words) and which of them lost net1."""
    words: list[str] = []
    lost: list[str] = []
    for pod in kube.list(Pod, namespace=namespace):
        assert pod.metadata is not None and pod.metadata.name is not None
        printed = cluster.kubectl("logs", "-n", namespace, pod.metadata.name)
        words += printed.split()
        if "NET1-LOST" in printed:
            lost.append(f"{pod.metadata.name} on {pod.spec.nodeName if pod.spec else '?'}: {printed!r}")
    return words, lost


@contextlib.contextmanager
def demo_topology_cluster(
    directory: Path, name: str, subnet: int, port_prefix: int
) -> Iterator[ClusterHandle]:
    """A fresh cluster of the demo's topology beside the session's: its own name, management network
    10.<subnet>.0.0/24, pod network 10.<subnet + 43>.0.0/16 and ports <port_prefix>443/379/380; down at
    the end unless NETCLAIM_KEEP_CLUSTER is set."""
    spec = yaml.safe_load((REPO_ROOT / "examples" / "demo" / "cluster.yaml").read_text())
    spec.update(
        name=name,
        managementCIDR=f"10.{subnet}.0.0/24",
        podCIDR=f"10.{subnet + 43}.0.0/16",
        ports={
            "apiserver": port_prefix * 1000 + 443,
            "etcdClient": port_prefix * 1000 + 379,
            "etcdPeer": port_prefix * 1000 + 380,
        },
    )
    path = directory / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    with own_cluster(path) as handle:
        yield handle


@contextlib.contextmanager
def own_cluster(spec_file: Path) -> Iterator[ClusterHandle]:
    """A cluster of a test's own, from `spec_file`; down at the end unless NETCLAIM_KEEP_CLUSTER is set."""
    require_root_prerequisites()
    handle = local_cluster.up(spec_file, log=sys.stderr)
    try:
        yield handle
    finally:
        if not os.environ.get("NETCLAIM_KEEP_CLUSTER"):
            local_cluster.down(handle.spec.name)


def deployment(name: str, replicas: int, claim_template: str) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}}, "spec": pod_spec(claim_template)},
        },
    }


def admin_device_class(name: str, device_cel: str, parameters: dict[str, Any]) -> DeviceClass:
    """A DeviceClass of our devices matching `device_cel`, carrying the admin's netclaim config."""
    return typed(
        DeviceClass,
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": name},
            "spec": {
                "selectors": [{"cel": {"expression": f'device.driver == "netclaim.dev" && {device_cel}'}}],
                "config": [{"opaque": {"driver": "netclaim.dev", "parameters": parameters}}],
            },
        },
    )


def pod_manifest(name: str, claim_template: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": pod_spec(claim_template)}


def exists(kube: Client, kind: Any, name: str, namespace: str) -> bool:
    try:
        kube.get(kind, name, namespace=namespace)
    except ApiError:
        return False
    return True


NETWORK_STATUS = "k8s.v1.cni.cncf.io/network-status"


def network_status(kube: Client, namespace: str, pod: str) -> list[dict[str, Any]]:
    """The pod's k8s.v1.cni.cncf.io/network-status annotation (Multus's schema); [] while it has none."""
    found = kube.get(Pod, pod, namespace=namespace)
    annotations = (found.metadata.annotations if found.metadata else None) or {}
    return list(json.loads(annotations.get(NETWORK_STATUS, "[]")))


def run_kubectl_netclaim(cluster: ClusterHandle, *args: str) -> subprocess.CompletedProcess[str]:
    """`kubectl netclaim ARGS` as a user runs it: kubectl finds the kubectl-netclaim plugin on PATH."""
    plugin_dir = Path(sys.executable).parent  # the venv's bin, where kubectl-netclaim is installed
    if not (plugin_dir / "kubectl-netclaim").exists():
        raise AssertionError(f"kubectl-netclaim is not installed in {plugin_dir}: run `make deps`")
    env = {
        **os.environ,
        "PATH": f"{plugin_dir}:{cluster.bin_dir}:{os.environ.get('PATH', '')}",
        "KUBECONFIG": str(cluster.kubeconfig),
        "NO_COLOR": "1",
    }
    return subprocess.run(
        [str(cluster.bin_dir / "kubectl"), "netclaim", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def kubectl_netclaim(cluster: ClusterHandle, *args: str) -> str:
    """The standard output of `kubectl netclaim ARGS`, which must succeed."""
    done = run_kubectl_netclaim(cluster, *args)
    assert done.returncode == 0, f"kubectl netclaim {' '.join(args)}: {done.stderr}"
    return done.stdout


def run_quick(module: str, out: Path) -> str:
    """`python -m <module> --quick --out <out>` (into a scratch copy of docs/): its last line."""
    shutil.copytree(REPO_ROOT / "docs", out / "docs", dirs_exist_ok=True)
    run = subprocess.run(
        [sys.executable, "-m", module, "--quick", "--out", str(out)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=1200,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-4000:]
    return run.stdout.strip().splitlines()[-1]


def controller_log(cluster: ClusterHandle, lines: int = 40) -> str:
    """The controller's last log lines: what a test that waited on the controller in vain reports."""
    return cluster.kubectl(
        "logs", "-n", "netclaim-system", "-l", "app.kubernetes.io/name=netclaim-controller", f"--tail={lines}"
    )


def controller_metrics(cluster: ClusterHandle) -> dict[str, float]:
    """The controller's /metrics (through the API server's pod proxy): `name{labels}` -> value."""
    return _pod_metrics(cluster, agents.controller_pod(cluster)["metadata"]["name"], 9178)


def agent_metrics(cluster: ClusterHandle, node: str) -> dict[str, float]:
    """The node's agent's /metrics, as controller_metrics reads the controller's."""
    pods = kubectl_json(
        cluster,
        *("get", "pods", "-n", "netclaim-system", "-l", "app.kubernetes.io/name=netclaim-agent"),
        f"--field-selector=spec.nodeName={node}",
    )["items"]
    return _pod_metrics(cluster, pods[0]["metadata"]["name"], 9177)


def _pod_metrics(cluster: ClusterHandle, pod: str, port: int) -> dict[str, float]:
    text = cluster.kubectl(
        "get", "--raw", f"/api/v1/namespaces/netclaim-system/pods/{pod}:{port}/proxy/metrics"
    )
    found = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            found[name] = float(value)
    return found


METADATA_DIR = "/var/lib/kubelet/plugins/netclaim.dev/dra-device-metadata"  # the agent's, on the node


def metadata_on_node(cluster: ClusterHandle, node: str, namespace: str, claim: str, uid: str) -> list[str]:
    """What the node keeps of a claim's device metadata: "files" (its directory of metadata files) and
    "cdi" (a device of the claim in the node's metadata CDI spec)."""
    directories = in_node(cluster, node, "sh", "-c", f"ls {METADATA_DIR} 2>/dev/null; true").split()
    specs = in_node(cluster, node, "sh", "-c", "cat /run/cdi/netclaim.dev_metadata* 2>/dev/null; true")
    return [
        what
        for what, kept in (("files", f"{namespace}_{claim}" in directories), ("cdi", uid in specs))
        if kept
    ]


def metadata_devices(
    cluster: ClusterHandle, namespace: str, pod: str, where: str, container: str | None = None
) -> list[dict[str, Any]]:
    """The devices of a claim's request as a container of the pod (its first unless named) reads them
    (KEP-5304): `where` is resourceclaims/<claim>/<request> or resourceclaimtemplates/<pod's name for the
    claim>/<request>; the first object of the stream, the newest version."""
    path = f"/var/run/kubernetes.io/dra-device-attributes/{where}/netclaim.dev-metadata.json"
    chosen = ["-c", container] if container else []
    text = cluster.kubectl("exec", "-n", namespace, pod, *chosen, "--", "cat", path)
    first, _ = json.JSONDecoder().raw_decode(text)
    assert first["apiVersion"] == "metadata.resource.k8s.io/v1beta1", first
    return [d for r in first["requests"] for d in r["devices"]]


def refused_in_dry_run(
    cluster: ClusterHandle,
    manifest: dict[str, Any],
    kubeconfig: Path | None = None,
    action: tuple[str, ...] = ("create",),
) -> str | None:
    """None when the apiserver (its admission policies included) accepts `action` (creating, by default)
    of `manifest` in a server dry run as `kubeconfig`'s user (default: the admin), else its message. Raw
    JSON through kubectl: typed clients cannot even express some malformed parameters (a string)."""
    result = subprocess.run(
        [
            str(cluster.bin_dir / "kubectl"),
            f"--kubeconfig={kubeconfig or cluster.kubeconfig}",
            *(*action, "--dry-run=server", "-n", "default", "-f", "-"),
        ],
        input=json.dumps(manifest),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    return None if result.returncode == 0 else result.stderr.strip()


@contextlib.contextmanager
def apiserver_away(cluster: ClusterHandle, kube: Client, *, grace: float = 10.0) -> Iterator[None]:
    """kube-apiserver stopped for the block (SIGKILL after `grace` s), then started, ready, and the shared
    cluster handed on working, whatever the block did."""
    pids = cluster.layout.pids
    processes.stop(pids, "kube-apiserver", grace=grace)
    try:
        yield
    finally:
        processes.start_recorded(pids, "kube-apiserver")
        control_plane = ControlPlane(cluster.spec, cluster.layout, cluster.bin_dir)
        control_plane.wait_healthy("kube-apiserver", f"{control_plane.server}/readyz")
        _wait_for_the_cluster_back(kube, [node.name for node in cluster.spec.nodes if node.kubelet])


def _wait_for_the_cluster_back(kube: Client, nodes: list[str]) -> None:
    """Every client of the apiserver lost its watches; client-go's reflectors retry them after a growing,
    jittered backoff (a CI run's next test timed out waiting 60 s for its namespace's default
    ServiceAccount, another's pod was not torn down in 120 s). Hand the shared cluster on working: a
    namespace gets its ServiceAccount (kube-controller-manager), a pod on each node is scheduled
    (kube-scheduler), runs and goes again (kubelet)."""
    name = f"back-{uuid.uuid4().hex[:6]}"
    kube.create(typed(Namespace, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}))
    try:
        wait_for(lambda: exists(kube, ServiceAccount, "default", name), 180, "the controller-manager back")
        for node in nodes:
            kube.create(sleeping_pod(node, name, {"nodeSelector": {"kubernetes.io/hostname": node}}))
        wait_for(lambda: len(running(kube, name)) == len(nodes), 180, "the scheduler and kubelets back")
        for node in nodes:
            delete(kube, Pod, node, name)
        wait_for(lambda: not list(kube.list(Pod, namespace=name)), 180, "the kubelets tearing pods down")
    finally:
        delete(kube, Namespace, name)


def sleeping_pod(name: str, namespace: str, placement: dict[str, Any]) -> Pod:
    """A busybox pod that sleeps, placed by `placement` (nodeName, nodeSelector), gone at once deleted."""
    spec = {
        **placement,
        "terminationGracePeriodSeconds": 0,
        "containers": [
            {"name": "main", "image": BUSYBOX_IMAGE, "imagePullPolicy": "Never", "command": ["sleep", "3600"]}
        ],
    }
    manifest = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace}}
    return typed(Pod, {**manifest, "spec": spec})

"""Deploy netclaim into the local cluster as users do: the manifests of `deploy/`, the agents as the pods
of deploy/'s DaemonSet, running the image `make image` builds (imported into every node's containerd, as
a registry pull would), with the ServiceAccount token kubelet projects into them.

The controller runs as deploy/'s Deployment, in the pod network. The lab sets the image reference and
digest in both and adds one thing to the DaemonSet: a fault file the tests write (NETCLAIM_FAULTS_FILE,
netclaim.runtime.faults). The NIC properties veths lack are each node's /etc/netclaim/nic-overrides.yaml, as
on a real node whose NICs do not report them.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from netclaim.errors import TransientError
from netclaim_lab import agent_image, processes
from netclaim_lab.cluster import ClusterHandle
from netclaim_lab.controlplane import SERVICE_CIDR, write_kubeconfig
from netclaim_lab.layout import REPO_ROOT
from netclaim_lab.manifests import on_disk, render
from netclaim_lab.node import DEBIAN_CNI_DIR

METRICS_PORT = 9177
NAMESPACE = "netclaim-system"
SERVICE_ACCOUNT = "netclaim-agent"
DEPLOY_DIR = REPO_ROOT / "deploy"
CLUSTER_MANIFESTS = (
    "00-namespace.yaml",
    "crds.yaml",
    "multinetworkpolicy/crd.yaml",  # as README's kubectl block: where no other project created it
    "rbac.yaml",
    "deviceclasses.yaml",
    "admission.yaml",
)
DAEMONSET = "daemonset.yaml"
CONTROLLER = "controller.yaml"
CRDS = {
    "crds.yaml": ("ippools.netclaim.dev", "ipallocations.netclaim.dev"),
    "multinetworkpolicy/crd.yaml": ("multi-networkpolicies.k8s.cni.cncf.io",),
}
AGENT_LABEL = "app.kubernetes.io/name=netclaim-agent"
DISABLED_LABEL = "netclaim.dev/agent"  # =disabled takes the agent off a node (deploy/daemonset.yaml)
FAULTS_FILE = "faults"  # in the node's /var/lib/netclaim (NodeLayout.state_dir), the DaemonSet's hostPath


def manifests(handle: ClusterHandle, values: Mapping[str, str] | None = None) -> dict[str, str]:
    """deploy/'s files by name; with `values`, the chart rendered with them instead, as an admin's
    `helm install --set` would (choices deploy/'s defaults do not make)."""
    if values:
        return render(handle.bin_dir / "helm", values)
    return on_disk()


def apply_manifests(
    handle: ClusterHandle, names: tuple[str, ...] = CLUSTER_MANIFESTS, texts: Mapping[str, str] | None = None
) -> None:
    for name in names:
        text = texts[name] if texts is not None else (DEPLOY_DIR / name).read_text()
        handle.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input_text=text)
        for crd in CRDS.get(name, ()):
            handle.kubectl("wait", "--for=condition=Established", "--timeout=60s", f"crd/{crd}")


def set_policy(handle: ClusterHandle, policy: Path) -> None:
    """Replace the publish policy in the netclaim-policy ConfigMap (the agents reload it, no restart)."""
    configmap = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "netclaim-policy", "namespace": NAMESPACE},
        "data": {"policy.yaml": policy.read_text()},
    }
    handle.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input_text=json.dumps(configmap))


def pod_token_kubeconfig(handle: ClusterHandle, node: str, namespace: str = NAMESPACE) -> Path:
    """A kubeconfig with the token kubelet projected into the agent pod of `node` (its ServiceAccount
    volume, read on the node): what the agent itself authenticates with."""
    pod = agent_pod(handle, node, namespace)
    if pod is None:
        raise TransientError(f"no agent pod on {node}")
    volume = next(v["name"] for v in pod["spec"]["volumes"] if v["name"].startswith("kube-api-access-"))
    token_file = (
        f"/var/lib/kubelet/pods/{pod['metadata']['uid']}/volumes/kubernetes.io~projected/{volume}/token"
    )
    token = processes.run([*handle.node(node).enter(), "cat", token_file]).strip()
    path = handle.node(node).layout.root / "agent-pod.kubeconfig"
    write_kubeconfig(path, _server(handle), handle.layout.pki / "ca.crt", SERVICE_ACCOUNT, {"token": token})
    return path


def agent_kubeconfig(handle: ClusterHandle, node: str, path: Path, server: str | None = None) -> None:
    """A token bound to a Node object, for agents run by hand (on kubelet-less nodes), for `server`
    (default: the cluster's API server)."""
    bound = ("--bound-object-kind=Node", f"--bound-object-name={node}")
    token = handle.kubectl("create", "token", SERVICE_ACCOUNT, "-n", NAMESPACE, "--duration=48h", *bound)
    write_kubeconfig(
        path,
        server or _server(handle),
        handle.layout.pki / "ca.crt",
        SERVICE_ACCOUNT,
        {"token": token.strip()},
    )


CONTROLLER_LABEL = "app.kubernetes.io/name=netclaim-controller"


CONTROLLER_LEASE = "netclaim.dev-controller"


def controller_holder(handle: ClusterHandle, namespace: str = NAMESPACE) -> str:
    """The identity holding the controllers' Lease, `<pod name>_<random>` (netclaim.controller.main; a
    restarted container stands with a new one): "" when none does."""
    found = json.loads(
        handle.kubectl("get", "lease", "-n", namespace, CONTROLLER_LEASE, "-o", "json", check=False) or "{}"
    )
    return str(found.get("spec", {}).get("holderIdentity") or "")


def controller_leader(handle: ClusterHandle, namespace: str = NAMESPACE) -> str:
    """The name of the controller pod holding the Lease ("" when none does)."""
    return controller_holder(handle, namespace).rpartition("_")[0]


def pools_reserve_before_binding(handle: ClusterHandle) -> bool:
    """Whether the published IP pools' devices carry binding conditions (the controller reserves each
    claim's address before its pod binds); False while no pool is published."""
    found = json.loads(handle.kubectl("get", "resourceslices", "-o", "json"))["items"]
    pools = [s for s in found if s["spec"].get("pool", {}).get("name") == "netclaim.dev/ip-pools"]
    devices = [d for s in pools for d in s["spec"].get("devices") or []]
    return bool(devices) and all(d.get("bindingConditions") for d in devices)


def set_address_reservation(handle: ClusterHandle, mode: str, namespace: str = NAMESPACE) -> None:
    """The controller's --address-reservation (`before-binding` or `at-prepare`; a later flag overrides an
    earlier, and a redeploy puts the chart's back), rolled out, and the pools' devices published for it."""
    flag = {
        "op": "add",
        "path": "/spec/template/spec/containers/0/args/-",
        "value": f"--address-reservation={mode}",
    }
    deployment = ("-n", namespace, "deployment/netclaim-controller")
    handle.kubectl("patch", *deployment, "--type=json", f"-p={json.dumps([flag])}")
    handle.kubectl("rollout", "status", *deployment, "--timeout=180s")
    wanted, deadline = mode == "before-binding", time.monotonic() + 120
    while pools_reserve_before_binding(handle) != wanted:
        if time.monotonic() > deadline:
            raise TransientError(f"the IP pools' devices not published for {mode} within 120 s")
        time.sleep(1)


def controller_pods(handle: ClusterHandle, namespace: str = NAMESPACE) -> list[dict[str, Any]]:
    found = json.loads(handle.kubectl("get", "pods", "-n", namespace, "-l", CONTROLLER_LABEL, "-o", "json"))
    return [dict(pod) for pod in found["items"]]


def controller_pod(handle: ClusterHandle, namespace: str = NAMESPACE) -> dict[str, Any]:
    """The leading controller's pod, as the API has it (the first replica's while none leads)."""
    pods = controller_pods(handle, namespace)
    leader = controller_leader(handle, namespace)
    return next((pod for pod in pods if pod["metadata"]["name"] == leader), pods[0])


def token_kubeconfig(handle: ClusterHandle, namespace: str, account: str, path: Path) -> None:
    """A kubeconfig with a token of ServiceAccount `namespace`/`account` (an hour long)."""
    token = handle.kubectl("create", "token", account, "-n", namespace, "--duration=1h")
    write_kubeconfig(path, _server(handle), handle.layout.pki / "ca.crt", account, {"token": token.strip()})


def controller_kubeconfig(handle: ClusterHandle, path: Path) -> None:
    """A token of the controller's ServiceAccount, as its pod authenticates with."""
    token_kubeconfig(handle, NAMESPACE, "netclaim-controller", path)


def _server(handle: ClusterHandle) -> str:
    return f"https://{handle.spec.management_gateway().ip}:{handle.spec.ports.apiserver}"


def lab_manifest(
    name: str, archive: agent_image.ImageArchive, reserved: tuple[str, ...] = (), text: str | None = None
) -> dict[str, Any]:
    """deploy/'s DaemonSet or Deployment (or `text`, the chart's rendering of it) with the lab's additions
    (the module's docstring). The image's digest is an annotation of the pod template, so that a rebuilt
    image rolls the pods, as a new tag would. `reserved`: the cluster's pod and Service CIDRs, as an admin
    sets agent.reservedCIDRs."""
    manifest: dict[str, Any] = yaml.safe_load(text if text is not None else (DEPLOY_DIR / name).read_text())
    template = manifest["spec"]["template"]
    template["metadata"].setdefault("annotations", {})["netclaim.dev/image-digest"] = archive.digest
    for each in [*template["spec"].get("initContainers", []), *template["spec"]["containers"]]:
        each["image"] = archive.reference
    container = template["spec"]["containers"][0]
    if name == DAEMONSET:
        container["env"].append({"name": "NETCLAIM_FAULTS_FILE", "value": f"/var/lib/netclaim/{FAULTS_FILE}"})
        if reserved:
            container["args"].append(f"--reserved-cidrs={','.join(reserved)}")
    return manifest


def import_image(handle: ClusterHandle, archive: agent_image.ImageArchive) -> None:
    for node in kubelet_nodes(handle):
        handle.node(node).import_images({archive.reference: archive.path})


def deploy(
    handle: ClusterHandle,
    policy: Path,
    values: Mapping[str, str] | None = None,
    image: agent_image.ImageArchive | None = None,
) -> None:
    """Everything in deploy/ with `image` (default: `make image`'s): the manifests, the publish policy's
    ConfigMap from `policy` (deploy/ has none: an admin writes it), the controller's Deployment, the
    agents' DaemonSet (values: chart values an admin sets, else deploy/'s defaults); waits until the
    controller and every agent are ready."""
    archive = image or agent_image.ensure()
    import_image(handle, archive)
    texts = manifests(handle, values)
    apply_manifests(handle, texts=texts)
    set_policy(handle, policy)
    reserved = (handle.spec.podCIDR, SERVICE_CIDR)
    for name in (CONTROLLER, DAEMONSET):
        text = json.dumps(lab_manifest(name, archive, reserved, texts[name]))
        handle.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input_text=text)
    rollout = ("rollout", "status", "-n", NAMESPACE, "--timeout=300s")
    handle.kubectl(*rollout, "daemonset/netclaim-agent", timeout=310)
    handle.kubectl(*rollout, "deployment/netclaim-controller", timeout=310)
    wait_ready(handle, kubelet_nodes(handle))


def kubelet_nodes(handle: ClusterHandle) -> list[str]:
    return [n.name for n in handle.spec.nodes if n.kubelet]


# --- one node's agent: its DaemonSet pod ---------------------------------------------------------------
def _agent_pods(handle: ClusterHandle, node: str, namespace: str = NAMESPACE) -> list[dict[str, Any]]:
    """The agent's pods on `node`, those being deleted included (`namespace`: where it was installed)."""
    return list(
        json.loads(
            handle.kubectl(
                *("get", "pods", "-n", namespace, "-l", AGENT_LABEL),
                *("--field-selector", f"spec.nodeName={node}", "-o", "json"),
            )
        )["items"]
    )


def agent_pod(handle: ClusterHandle, node: str, namespace: str = NAMESPACE) -> dict[str, Any] | None:
    """The agent's pod on `node` that is not being deleted, if any."""
    live = [p for p in _agent_pods(handle, node, namespace) if not p["metadata"].get("deletionTimestamp")]
    return live[0] if live else None


def restarts(handle: ClusterHandle, node: str, namespace: str = NAMESPACE) -> int:
    """How often kubelet restarted the agent container of `node`'s current pod (crashes, kill -9)."""
    pod = agent_pod(handle, node, namespace)
    statuses = (pod or {}).get("status", {}).get("containerStatuses") or [{}]
    return int(statuses[0].get("restartCount", 0))


def set_faults(handle: ClusterHandle, node: str, faults: str) -> None:
    """The fault points (netclaim.runtime.faults) the next agent process on `node` reads at its start."""
    path = handle.node(node).layout.state_dir / FAULTS_FILE
    if faults:
        path.write_text(faults)
    else:
        path.unlink(missing_ok=True)


def stop_agent(handle: ClusterHandle, node: str) -> None:
    """Take the agent off `node` as an admin would (the node label of deploy/daemonset.yaml) and wait
    until its pod is gone."""
    handle.kubectl("label", "node", node, f"{DISABLED_LABEL}=disabled", "--overwrite")
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if not _agent_pods(handle, node):
            return
        time.sleep(0.2)
    raise TransientError(f"the agent pod of {node} is still there 90 s after the node was labelled")


def start_agent(handle: ClusterHandle, node: str, faults: str = "", *, wait: bool = True) -> None:
    """Let the DaemonSet run its pod on `node` again (with `faults` set) and wait until it is ready."""
    set_faults(handle, node, faults)
    handle.kubectl("label", "node", node, f"{DISABLED_LABEL}-")
    if wait:
        wait_ready(handle, [node])


def restart_agent(handle: ClusterHandle, node: str, faults: str = "") -> None:
    """`kubectl delete pod` of the agent on `node`: the DaemonSet makes a new one (reading `faults`)."""
    set_faults(handle, node, faults)
    pod = agent_pod(handle, node)
    if pod is not None:
        handle.kubectl("delete", "pod", "-n", NAMESPACE, pod["metadata"]["name"], "--wait=true", timeout=120)
    wait_ready(handle, [node])


def agent_container(handle: ClusterHandle, node: str) -> tuple[str, int] | None:
    """(container ID, its init's pid) of the running agent container on `node`."""
    return _container(handle, node, "agent")


def _container(handle: ClusterHandle, node: str, name: str, pod: str = "") -> tuple[str, int] | None:
    """(container ID, its init's pid) of our running container `name` on `node` (of pod `pod`)."""
    crictl = handle.node(node).crictl()
    labels = ["--label", f"io.kubernetes.pod.namespace={NAMESPACE}"]
    labels += ["--label", f"io.kubernetes.pod.name={pod}"] if pod else []
    ids = processes.run([*crictl, "ps", "--state", "running", *labels, "-q"]).split()
    for container in ids:
        info = json.loads(processes.run([*crictl, "inspect", container]))
        if info["status"]["metadata"]["name"] == name:
            return container, int(info["info"]["pid"])
    return None


def agent_pid(handle: ClusterHandle, node: str) -> int | None:
    """The agent's process on `node` as the machine sees it, while its container runs."""
    return _program(agent_container(handle, node))


def _program(found: tuple[str, int] | None) -> int | None:
    """The program in a container: the only child of its init (tini, crictl inspect's pid)."""
    if found is None:
        return None
    init = found[1]
    try:
        children = Path(f"/proc/{init}/task/{init}/children").read_text().split()
    except FileNotFoundError:  # the container ended meanwhile
        return None
    return int(children[0]) if children else None


def kill_controller(handle: ClusterHandle, pod: str) -> None:
    """SIGKILL the controller of pod `pod`: it gives nothing up (its Lease stays until it expires);
    kubelet restarts the container, which stands again under a new identity."""
    node = json.loads(handle.kubectl("get", "pod", "-n", NAMESPACE, pod, "-o", "json"))["spec"]["nodeName"]
    pid = _program(_container(handle, node, "controller", pod))
    if pid is None:
        raise TransientError(f"no running controller container of {pod} on {node}")
    os.kill(pid, signal.SIGKILL)


def kill_agent(handle: ClusterHandle, node: str) -> None:
    """SIGKILL the agent's process, as a crash or the OOM killer would; kubelet restarts the container."""
    pid = agent_pid(handle, node)
    if pid is None:
        raise TransientError(f"no running agent container on {node}")
    os.kill(pid, signal.SIGKILL)


def agent_running(handle: ClusterHandle, node: str) -> bool:
    return agent_pid(handle, node) is not None


def agent_log(handle: ClusterHandle, node: str, namespace: str = NAMESPACE) -> str:
    """What the agent of `node` wrote, every container of its newest pod in order: kubelet's CRI log files,
    read from the node's disk (so also while the apiserver is away), each line's timestamp, stream and tag
    taken off, partial lines joined."""
    pods = handle.node(node).layout.pod_logs.glob(f"{namespace}_netclaim-agent-*/agent")
    newest = max(
        pods, key=lambda d: max((f.stat().st_mtime for f in d.glob("*.log")), default=0), default=None
    )
    if newest is None:
        return ""
    files = sorted(newest.glob("*.log"), key=lambda p: int(p.stem) if p.stem.isdigit() else -1)
    text: list[str] = []
    for path in files:
        for line in path.read_text(errors="replace").splitlines():
            parts = line.split(" ", 3)
            if len(parts) == 4:
                text.append(parts[3] + ("\n" if parts[2] == "F" else ""))
    return "".join(text)


def readiness(handle: ClusterHandle, node_name: str) -> dict[str, bool] | None:
    """The agent's /readyz report (None while it does not answer)."""
    url = f"http://{handle.node(node_name).address.ip}:{METRICS_PORT}/readyz"
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return dict(json.loads(response.read()))
    except urllib.error.HTTPError as err:
        return dict(json.loads(err.read()))
    except (OSError, ValueError):
        return None


def wait_ready(handle: ClusterHandle, nodes: list[str], timeout: float = 60) -> None:
    """Every agent published its slices, is registered with kubelet and configured by containerd."""
    deadline = time.monotonic() + timeout
    waiting = set(nodes)
    while waiting and time.monotonic() < deadline:
        for name in sorted(waiting):
            report = readiness(handle, name)
            if report and all(report.values()):
                waiting.discard(name)
        if waiting:
            time.sleep(0.2)
    if waiting:
        reports = {name: (readiness(handle, name), _pod_state(handle, name)) for name in sorted(waiting)}
        raise TransientError(f"netclaim agents not ready after {timeout:.0f} s: {reports}")


def _pod_state(handle: ClusterHandle, node: str) -> object:
    pod = agent_pod(handle, node)
    if pod is None:
        return "no agent pod"
    return pod.get("status", {}).get("containerStatuses") or pod.get("status", {}).get("conditions")


# what start_virtual_agent's agents publish by (the scale benchmark publishes other nodes by it too)
VIRTUAL_POLICY = (  # on one network, so that IPPool addresses can be asked for beside a NIC share
    "apiVersion: netclaim.dev/v1alpha1\nkind: PublishPolicy\n"
    "rules: [{mode: shared, attachments: 32, attributes: {netclaim.dev/network: fabric}}]\n"
)


def synthetic_inventory(path: Path, count: int, mtu: int = 1500) -> None:
    """An inventory file of `count` physical-looking 25G NICs, for an agent of a kubelet-less node."""
    interfaces = [
        {
            "name": f"syn{i:04d}",
            "index": 100 + i,
            "kind": "physical",
            "mac": f"02:00:00:00:{i // 256:02x}:{i % 256:02x}",
            "mtu": mtu,
            "up": True,
            "virtual": False,
            "speed_bps": 25_000_000_000,
            "numa_node": i % 2,
        }
        for i in range(count)
    ]
    path.write_text(yaml.safe_dump(interfaces))


def virtual_agent_files(work: Path, node: str) -> Path:
    """Where start_virtual_agent keeps the agent's files: inventory.yaml (rewrite it to change its NICs),
    policy.yaml, kubeconfig, its state and kubelet plugin directories."""
    return work / node


def start_virtual_agent(
    handle: ClusterHandle,
    node: str,
    work: Path,
    nics: int,
    *,
    server: str | None = None,
    kubelet_plugin: bool = False,
) -> tuple[str, float]:
    """An agent for the kubelet-less node `node`, run beside the cluster (no NRI; no kubelet plugin unless
    `kubelet_plugin`, whose socket no kubelet then calls) with `nics` synthetic NICs shared by one rule
    (VIRTUAL_POLICY), talking to `server` (default: the cluster's API server); it removes its slices when
    stopped. Returns its process name (processes.stop(work, name)) and when it was started (time.time())."""
    files = virtual_agent_files(work, node)
    files.mkdir(parents=True, exist_ok=True)
    inventory, policy, kubeconfig = files / "inventory.yaml", files / "policy.yaml", files / "kubeconfig"
    synthetic_inventory(inventory, nics)
    policy.write_text(VIRTUAL_POLICY)
    agent_kubeconfig(handle, node, kubeconfig, server)
    configure = (
        [
            "--kubelet-plugin=true",
            f"--kubelet-root-dir={files / 'kubelet'}",
            f"--cdi-spec-dir={files / 'cdi'}",
            f"--cni-bin-dir={DEBIAN_CNI_DIR}",  # prepare checks the plugins a claim names are there
        ]
        if kubelet_plugin
        else ["--kubelet-plugin=false"]
    )
    name = f"{node}-agent"
    started = time.time()
    processes.start(
        name,
        [
            sys.executable,
            "-m",
            "netclaim",
            "agent",
            f"--node-name={node}",
            f"--kubeconfig={kubeconfig}",
            f"--inventory-file={inventory}",
            f"--policy-file={policy}",
            *configure,
            "--nri-socket=",
            "--metrics-address=",
            "--remove-slices-on-exit=true",
            f"--state-dir={files / 'state'}",
        ],
        pid_dir=work,
        log_dir=handle.layout.logs,
    )
    return name, started

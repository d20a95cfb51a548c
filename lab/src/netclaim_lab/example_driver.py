"""Kubernetes' example DRA driver (sigs.k8s.io/dra-example-driver), installed as its users install it: its
own Helm chart, from the module the Go proxy served, with the kubelet plugin built by `make bins` into an
image of this lab's (the binary alone: it is static). It publishes fake GPUs (driver gpu.example.com,
DeviceClass gpu.example.com) and prepares a claim by writing a CDI spec: what any DRA driver costs at the
least. make bench starts pods with its claims beside netclaim's, so that a ratio says what netclaim adds
over DRA itself rather than over a pod with no claim at all.
"""

from __future__ import annotations

import json
from pathlib import Path

from netclaim.errors import PrerequisiteError
from netclaim_lab import agents, images, processes
from netclaim_lab.binaries import module_source, pinned_version, tools_dir
from netclaim_lab.cluster import ClusterHandle

MODULE = "sigs.k8s.io/dra-example-driver"
DRIVER = "gpu.example.com"
GPU_CLASS = "gpu.example.com"  # its chart's
NAMESPACE = "dra-example-driver"
RELEASE = "dra-example-driver"
PROGRAM = "dra-example-kubeletplugin"
REPOSITORY = "netclaim.local/dra-example-driver"


def version() -> str:
    return pinned_version(tools_dir() / "dra-example-driver" / "go.mod", MODULE)


def chart_dir() -> Path:
    """The Helm chart inside the pinned module, as the Go module proxy served it (go.sum checks it)."""
    chart = module_source("dra-example-driver", MODULE) / "deployments" / "helm" / "dra-example-driver"
    if not (chart / "Chart.yaml").is_file():
        raise PrerequisiteError(f"{chart}: no Helm chart in {MODULE} {version()}")
    return chart


def image(handle: ClusterHandle) -> tuple[str, Path]:
    """(reference, OCI archive) of the kubelet plugin's image, written once per binary."""
    binary = handle.bin_dir / PROGRAM
    if not binary.is_file():
        raise PrerequisiteError(f"{binary} is missing: run `make bins`")
    reference = f"{REPOSITORY}:{version()}"
    layer = images.Layer(directories=images.base_directories())
    layer.files[f"usr/bin/{PROGRAM}"] = (binary.read_bytes(), 0o755)
    path = handle.layout.root / "images" / f"dra-example-driver-{version()}-{images.layer_digest(layer)}.tar"
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        images.write_oci_archive(path, reference, layer, [PROGRAM])
    return reference, path


def install(handle: ClusterHandle, devices_per_node: int) -> None:
    """helm upgrade --install its chart with the lab's image and `devices_per_node` fake GPUs per node;
    returns once every kubelet node's slice has them."""
    reference, archive = image(handle)
    for node in agents.kubelet_nodes(handle):
        handle.node(node).import_images({reference: archive})
    repository, tag = reference.rsplit(":", 1)
    # its kubelet plugin is privileged with host paths, as every DRA driver's: its namespace says so, as
    # the driver's own install guide has it (the lab enforces the baseline Pod Security level elsewhere)
    namespace = {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": NAMESPACE, "labels": {"pod-security.kubernetes.io/enforce": "privileged"}},
    }
    handle.kubectl("apply", "-f", "-", input_text=json.dumps(namespace))
    processes.run(
        [
            str(handle.bin_dir / "helm"),
            f"--kubeconfig={handle.kubeconfig}",
            *("upgrade", "--install", RELEASE, str(chart_dir())),
            *("--namespace", NAMESPACE, "--wait", "--timeout", "300s"),
            *("--set", f"image.repository={repository}", "--set", f"image.tag={tag}"),
            *("--set", "image.pullPolicy=Never"),
            *("--set", f"kubeletPlugin.numDevices={devices_per_node}"),
        ],
        timeout=330,
    )
    nodes = set(agents.kubelet_nodes(handle))

    def published() -> dict[str, int]:
        slices = json.loads(handle.kubectl("get", "resourceslices", "-o", "json"))["items"]
        return {
            s["spec"].get("nodeName", ""): len(s["spec"].get("devices", []))
            for s in slices
            if s["spec"]["driver"] == DRIVER
        }

    processes.wait_until(
        lambda: all(published().get(n, 0) == devices_per_node for n in nodes),
        120,
        f"{devices_per_node} {DRIVER} devices published on {', '.join(sorted(nodes))}",
    )


def claim_template(name: str, namespace: str) -> dict[str, object]:
    """One fake GPU per pod, as the driver's own demo asks for one."""
    request = {"name": "gpu", "exactly": {"deviceClassName": GPU_CLASS}}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"spec": {"devices": {"requests": [request]}}},
    }

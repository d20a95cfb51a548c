"""A first look at a fresh cluster: one busybox pod per kubelet node, its primary IP, `kubectl exec`."""

from __future__ import annotations

import sys
from pathlib import Path

from netclaim.cluster.cluster import handle_for
from netclaim.cluster.images import BUSYBOX_IMAGE
from netclaim.cluster.spec import load_cluster_spec


def main(cluster_file: Path) -> int:
    handle = handle_for(load_cluster_spec(cluster_file).name)
    for node in (n for n in handle.spec.nodes if n.kubelet):
        name = f"smoke-{node.name}"
        handle.kubectl("delete", "pod", name, "--ignore-not-found", "--wait=true")
        handle.kubectl(
            "run",
            name,
            f"--image={BUSYBOX_IMAGE}",
            "--image-pull-policy=Never",
            "--restart=Never",
            f'--overrides={{"spec": {{"nodeName": "{node.name}"}}}}',
            "--command",
            "--",
            "sleep",
            "3600",
        )
    for node in (n for n in handle.spec.nodes if n.kubelet):
        name = f"smoke-{node.name}"
        handle.kubectl("wait", "--for=condition=Ready", f"pod/{name}", "--timeout=120s", timeout=130)
        print(f"--- {name} on {node.name}: ip -4 addr show eth0")
        print(handle.kubectl("exec", name, "--", "ip", "-4", "addr", "show", "eth0"))
        handle.kubectl("delete", "pod", name, "--wait=false")
    print(f"export KUBECONFIG={handle.kubeconfig} PATH={handle.bin_dir}:$PATH")
    print("tear down with: make demo-down")
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))

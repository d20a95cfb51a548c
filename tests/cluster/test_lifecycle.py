"""`cluster up`/`down` are repeatable and `down` leaves nothing behind on the machine."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from lightkube import Client, KubeConfig

from netclaim_lab import agents
from netclaim_lab import cluster as local_cluster
from netclaim_lab.images import BUSYBOX_IMAGE
from netclaim_lab.spec import load_cluster_spec
from tests.cluster.helpers import (
    apply,
    claim_template,
    cni_config,
    ipam_reservations,
    macvlan,
    pod_manifest,
    ready_entry,
)
from tests.kube import wait_for

SPEC = """
apiVersion: netclaim.dev/v1alpha1
kind: LocalCluster
name: ncdown
managementCIDR: 10.203.0.0/24
podCIDR: 10.246.0.0/16
ports: {apiserver: 26443, etcdClient: 22379, etcdPeer: 22380}
segments: [{name: lan0}]
nodes:
- name: alpha
  nics: [{name: enp0s10, segment: lan0}]
- name: beta
  nics: [{name: enp0s10, segment: lan0}]
- name: gamma
  kubelet: false
"""


def _processes(owner: str) -> set[str]:
    """The processes of cluster `owner`: naming it, or in one of its nodes' cgroups (a pod's `sleep`)."""
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
            cgroups = (entry / "cgroup").read_text()
        except (OSError, ValueError):
            continue  # the process exited between listing /proc and reading it: nothing left to count
        if cmdline and (owner in cmdline or f"netclaim-{owner}-" in cgroups):
            found.add(f"{entry.name} {cmdline}")
    return found


def _machine_state(owner: str, link_prefix: str) -> dict[str, set[str]]:
    """Everything of cluster `owner` that `down` must take away. Only what is attributable to it: the
    session cluster, the other side clusters and the kernel tests run beside this test (`make test` runs
    two workers) and come and go meanwhile."""
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, check=True).stdout
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    mounts = Path("/proc/self/mountinfo").read_text().splitlines()
    cgroups = {str(p) for p in Path("/sys/fs/cgroup").glob("*/*") if p.is_dir()}
    cgroups |= {str(p) for p in Path("/sys/fs/cgroup").glob("*/*/*") if p.is_dir()}
    link_names = {line.split(":")[1].strip().split("@")[0] for line in links.splitlines()}
    return {
        "processes": _processes(owner),
        "links": {name for name in link_names if name.startswith(link_prefix)},
        "netns": {line.split()[0] for line in netns.splitlines() if owner in line},
        "mounts": {line.split(" - ")[0].split(" ", 4)[4] for line in mounts if owner in line},
        "cgroups": {c for c in cgroups if owner in c},
    }


def test_down_leaves_nothing_and_up_down_are_repeatable(tmp_path: Path) -> None:
    spec_file = tmp_path / "ncdown.yaml"
    spec_file.write_text(SPEC)
    prefix = load_cluster_spec(spec_file).link_prefix
    before = _machine_state("ncdown", prefix)
    handle = local_cluster.up(spec_file, log=sys.stderr)
    try:
        again = local_cluster.up(spec_file, log=sys.stderr)  # the same definition: a no-op
        assert again.layout == handle.layout
        during = _machine_state("ncdown", prefix)
        assert any(n.startswith("nc-ncdown-") for n in during["netns"])
        assert any(link.startswith(handle.spec.link_prefix) for link in during["links"])
        # a pod makes the runtime create its own netns, mounts, cgroups and shim processes
        handle.kubectl(
            "run",
            "leak-probe",
            f"--image={BUSYBOX_IMAGE}",
            "--image-pull-policy=Never",
            "--restart=Never",
            '--overrides={"spec":{"nodeName":"alpha"}}',
            "--command",
            "--",
            "sleep",
            "3600",
        )
        handle.kubectl("wait", "--for=condition=Ready", "pod/leak-probe", "--timeout=120s", timeout=130)
        pod_cgroups = Path("/sys/fs/cgroup/pids/netclaim-ncdown-alpha/kubepods")
        assert any(p.is_dir() for p in pod_cgroups.rglob("pod*")), "the pod should have cgroups to clean up"
        counted = _machine_state("ncdown", prefix)["processes"]
        assert any(p.endswith(" sleep 3600") for p in counted), "the pod's process counts as the cluster's"
        # and a netclaim interface, whose address lives in the cluster's state
        agents.deploy(handle, Path(__file__).with_name("policy.yaml"))
        config = cni_config([macvlan("10.85.0.0/24")], name="down-net")
        apply(
            handle, "default", claim_template("t", "netclaim-shared", "true", config), pod_manifest("p", "t")
        )
        with Client(KubeConfig.from_file(handle.kubeconfig)) as kube:
            wait_for(lambda: ready_entry(kube, "default", "p") is not None, 120, "net1 attached")
        assert ipam_reservations(handle, "down-net")
    finally:
        local_cluster.down("ncdown")
    local_cluster.down("ncdown")  # twice is safe

    def leaked() -> dict[str, list[str]]:
        after = _machine_state("ncdown", prefix)
        found = {}
        for kind in before:
            extra = after[kind] - before[kind]
            if extra:
                found[kind] = sorted(extra)
        return found

    # the kernel tears a namespace's links down asynchronously after its last process is gone
    try:
        wait_for(lambda: not leaked(), 30, "nothing left behind by cluster down", interval=0.1)
    finally:
        assert not leaked(), f"left behind by cluster down: {leaked()}"
    assert not Path("/var/lib/netclaim-cluster/ncdown").exists(), "state (IPAM reservations too) left behind"

"""The session-scoped real cluster every `cluster` test shares (kept up with NETCLAIM_KEEP_CLUSTER=1)."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest
import yaml
from lightkube import Client, KubeConfig
from lightkube.resources.core_v1 import Namespace, Pod, ServiceAccount

from netclaim_lab import agents
from netclaim_lab import cluster as local_cluster
from netclaim_lab.cluster import ClusterHandle
from tests.cluster.helpers import exists
from tests.conftest import require_root_prerequisites
from tests.kube import delete, typed, wait_for

CLUSTER_FILE = Path(__file__).with_name("cluster.yaml")
POLICY_FILE = Path(__file__).with_name("policy.yaml")
# The session cluster is installed as a Multus user moving to netclaim installs it
# (docs/migrating-from-multus.md): the pods' network-status annotation on, for the tests of what reads it
# (the demo's, the migration's, the agent token's limits). deploy/'s default, off, runs on the benchmarks'
# cluster and the side clusters.
CHART_VALUES = {"agent.networkStatusAnnotation": "true"}


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """A failed test's namespace as it was (pods, claims' status, events) and the agents' last lines, in
    the report: a CI log is all there is to read after a flake."""
    report: pytest.TestReport = yield
    funcargs = getattr(item, "funcargs", {})
    handle, namespace = funcargs.get("cluster"), funcargs.get("ns")
    if (
        report.when == "call"
        and report.failed
        and isinstance(handle, ClusterHandle)
        and isinstance(namespace, str)
    ):
        shown = []
        for args in (
            ("get", "pods,resourceclaims,services,endpointslices", "-o", "wide", "-n", namespace),
            (
                "get",
                "resourceclaims",
                "-n",
                namespace,
                "-o",
                'jsonpath={range .items[*]}{.metadata.name}: {.status.devices}{"\\n"}{end}',
            ),
            ("get", "events", "-n", namespace, "--sort-by=.lastTimestamp"),
            ("logs", "-n", agents.NAMESPACE, "-l", agents.AGENT_LABEL, "--tail=30", "--prefix"),
        ):
            try:
                output = handle.kubectl(*args, check=False, timeout=20)
            except subprocess.TimeoutExpired:
                output = "(no answer in 20 s)"
            shown.append(f"$ kubectl {' '.join(args)}\n{output}")
        for component in ("kube-controller-manager", "kube-scheduler"):
            shown.append(f"$ {component}'s last errors and warnings\n{_last_complaints(handle, component)}")
        report.sections.append(("cluster at the failure", "\n".join(shown)))
    return report


def _last_complaints(handle: ClusterHandle, component: str, count: int = 15) -> str:
    """The last error and warning lines of a control-plane component's log (klog: E… and W… lines)."""
    try:
        lines = (handle.layout.logs / f"{component}.log").read_text(errors="replace").splitlines()
    except OSError as err:
        return f"(not read: {err})"
    return "\n".join([line[:400] for line in lines if line[:1] in "EW"][-count:]) or "(none)"


# make test's second worker runs its share on a session cluster of its own (tests/conftest.py)
SECOND_CLUSTER: dict[str, object] = {
    "name": "nctest2",
    "managementCIDR": "10.212.0.0/24",
    "podCIDR": "10.255.0.0/16",
    "ports": {"apiserver": 24443, "etcdClient": 24379, "etcdPeer": 24380},
}


def _cluster_file(tmp: Path) -> Path:
    """cluster.yaml (a second worker's as SECOND_CLUSTER names and places it), with the nodes' CNI plugin
    set NETCLAIM_TEST_CNI_PLUGINS names (`make test-debian-cni`: the suite on Debian's 1.0-level plugins)
    instead of its default (the reference set), the Kubernetes and containerd minor versions
    NETCLAIM_TEST_KUBERNETES and NETCLAIM_TEST_CONTAINERD name (`make test-matrix`) instead of the pinned
    1.37 and 2.4, and the runtime NETCLAIM_TEST_RUNTIME names (`crio`: CRI-O 1.36, make test-matrix)
    instead of containerd."""
    chosen: dict[str, object] = {
        key: os.environ[variable]
        for key, variable in (
            ("cniPlugins", "NETCLAIM_TEST_CNI_PLUGINS"),
            ("kubernetes", "NETCLAIM_TEST_KUBERNETES"),
            ("containerd", "NETCLAIM_TEST_CONTAINERD"),
            ("runtime", "NETCLAIM_TEST_RUNTIME"),
        )
        if os.environ.get(variable)
    }
    if os.environ.get("PYTEST_XDIST_WORKER", "gw0") != "gw0":
        chosen.update(SECOND_CLUSTER)
    if not chosen:
        return CLUSTER_FILE
    spec = {**yaml.safe_load(CLUSTER_FILE.read_text()), **chosen}
    path = tmp / "cluster.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterHandle]:
    require_root_prerequisites()
    handle = local_cluster.up(_cluster_file(tmp_path_factory.mktemp("spec")), log=sys.stderr)
    agents.deploy(handle, POLICY_FILE, CHART_VALUES)
    yield handle
    if not os.environ.get("NETCLAIM_KEEP_CLUSTER"):
        local_cluster.down(handle.spec.name)


@pytest.fixture(scope="session")
def kube(cluster: ClusterHandle) -> Iterator[Client]:
    """An admin client of the session cluster (lightkube, typed resource.k8s.io/v1 models)."""
    with Client(KubeConfig.from_file(cluster.kubeconfig), field_manager="netclaim-tests") as client:
        yield client


def fresh_namespace(kube: Client, prefix: str) -> Iterator[str]:
    """A namespace of its own for a test, deleted at its end (every teardown path runs), its pods gone."""
    name = f"{prefix}-{uuid.uuid4().hex[:6]}"
    kube.create(typed(Namespace, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}))
    wait_for(lambda: exists(kube, ServiceAccount, "default", name), 60, "the default ServiceAccount")
    yield name
    delete(kube, Namespace, name)
    wait_for(lambda: not list(kube.list(Pod, namespace=name)), 180, f"pods of {name} gone")


@pytest.fixture
def ns(kube: Client) -> Iterator[str]:
    """A fresh namespace per test."""
    yield from fresh_namespace(kube, "t")


@pytest.fixture
def other_tenant(kube: Client) -> Iterator[str]:
    """The control tenant: a namespace of its own, beside the attacker's."""
    yield from fresh_namespace(kube, "c")

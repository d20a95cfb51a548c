"""Issue 5: the talks' demo as `make demo` runs it, on the test cluster; and the deploy/ manifests."""

from __future__ import annotations

import io
from collections.abc import Iterator

import pytest
from lightkube import Client
from lightkube.resources.core_v1 import Namespace, Pod

from netclaim.cluster import demo
from netclaim.cluster.cluster import ClusterHandle
from netclaim.cluster.layout import REPO_ROOT
from netclaim.errors import ExpectationError
from tests.kube import delete, wait_for

DEPLOY = REPO_ROOT / "deploy"


@pytest.fixture
def demo_namespace(kube: Client) -> Iterator[None]:
    yield
    delete(kube, Namespace, demo.NAMESPACE)
    wait_for(lambda: not list(kube.list(Pod, namespace=demo.NAMESPACE)), 180, "demo pods gone")


def test_the_demo_report_shows_every_expectation_met(cluster: ClusterHandle, demo_namespace: None) -> None:
    report = io.StringIO()
    outcome = demo.run(cluster, out=report)
    text = report.getvalue()
    assert outcome.problems == []
    for section in (
        "== NICs and bandwidth",
        "== Pods",
        "== Pending",
        "== Pod-A: `ip a show net1`",
        "== Ping",
    ):
        assert section in text
    assert "cannot allocate all claims" in text and " 0% packet loss" in text
    used = {
        node: (total, used)
        for node, _, if_name, total, used in demo.nic_table(outcome)
        if if_name == "enp0s10"
    }
    assert sorted(used.values()) == [(10 * 2**30, 10 * 2**30), (10 * 2**30, 10 * 2**30)]


def test_a_broken_expectation_fails_the_demo(cluster: ClusterHandle, demo_namespace: None) -> None:
    """Deployment-B asking 6Gi: only one replica fits beside nothing on the second NIC; the demo says so."""
    with pytest.raises(ExpectationError) as err:
        demo.run(cluster, out=io.StringIO(), b_request="6Gi")
    assert "expected two B replicas sharing the other NIC" in str(err.value)
    assert "expected exactly one Pending B replica" in str(err.value)


def test_deploy_manifests_pass_a_server_side_dry_run(cluster: ClusterHandle) -> None:
    output = cluster.kubectl("apply", "--dry-run=server", "-f", str(DEPLOY))
    for kind in (
        "daemonset.apps/netclaim-agent",
        "clusterrole.rbac.authorization.k8s.io/netclaim-agent",
        "deviceclass.resource.k8s.io/netclaim-shared",
        "configmap/netclaim-policy",
    ):
        assert kind in output, output

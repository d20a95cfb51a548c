"""An upgrade from the last release and a rollback to it, as a user runs them, under churn (`make
test-matrix`, not `make test`: it builds the release's image from its git tag). A fresh cluster of the
demo's topology gets the release's chart and image (`helm install` from the tag's own tree, its image
built by that tree's own recipe); then, while a Deployment with claims scales 0 → N → 0, `helm upgrade
--reuse-values` to this checkout's chart and image (README's advice) and `helm rollback` to the release;
and the same with kubectl, applying the release's deploy/, this checkout's, then the release's again. Every
container checks its interface for itself (tests/cluster/test_upgrade.py's watch); the test counts starts
without it and interfaces lost, and that every claim goes once the Deployment is gone."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml
from lightkube import Client, KubeConfig
from lightkube.resources.core_v1 import Pod

from netclaim_lab import agent_image, agents, processes
from netclaim_lab.cluster import ClusterHandle
from netclaim_lab.layout import REPO_ROOT
from tests.cluster.helpers import WATCH, apply, demo_topology_cluster, deployment, read_watches, running
from tests.kube import wait_for

pytestmark = pytest.mark.release

RELEASE = "v0.1.0"
RELEASE_IMAGE = "registry.example.com/netclaim:0.1.0-release"
HELM_NAMESPACE = "network-system"  # README's Helm install
REPLICAS = 9  # on the two nodes with an enp0s10
BANDWIDTH = "netclaim.dev/bandwidth"
CYCLES = 3


@pytest.fixture(scope="module")
def release_tree(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The release's tree, from its tag in this checkout (a clone has its tags)."""
    tree = tmp_path_factory.mktemp("release") / RELEASE
    processes.run(["git", "-C", str(REPO_ROOT), "worktree", "add", "--detach", str(tree), RELEASE])
    try:
        yield tree
    finally:
        processes.run(["git", "-C", str(REPO_ROOT), "worktree", "remove", "--force", str(tree)])


@pytest.fixture(scope="module")
def release_image(release_tree: Path) -> agent_image.ImageArchive:
    """The release's image, by the release's own recipe and lock (its lab run from its tree)."""
    output = release_tree / "build" / "release-image.tar"
    paths = f"{release_tree / 'lab' / 'src'}:{release_tree / 'src'}"
    command = [sys.executable, "-m", "netclaim_lab", "cluster", "image", "--tag", RELEASE_IMAGE]
    subprocess.run(
        [*command, "--output", str(output)],
        cwd=release_tree,
        env={**os.environ, "PYTHONPATH": paths},
        check=True,
        timeout=900,
    )
    return agent_image.describe(output)


@pytest.fixture
def head(fresh: ClusterHandle, release_image: agent_image.ImageArchive) -> agent_image.ImageArchive:
    """This checkout's image; it and the release's imported on every node of `fresh`."""
    image = agent_image.ensure()
    for archive in (release_image, image):
        agents.import_image(fresh, archive)
    return image


@pytest.fixture
def fresh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterHandle]:
    with demo_topology_cluster(tmp_path_factory.mktemp("ncrel"), "ncrel", 206, 19) as handle:
        yield handle


def _helm(handle: ClusterHandle, *args: str) -> str:
    command = [str(handle.bin_dir / "helm"), "--kubeconfig", str(handle.kubeconfig), *args]
    return processes.run(command, timeout=600)


def _agent_images(handle: ClusterHandle, namespace: str) -> set[str]:
    """The images the agents' pods run (those being replaced too)."""
    pods = handle.kubectl(
        *("get", "pods", "-n", namespace, "-l", "app.kubernetes.io/name=netclaim-agent"),
        *("-o", "jsonpath={range .items[*]}{.spec.containers[0].image}{'\\n'}{end}"),
    )
    return set(pods.split())


def _churn_under(fresh: ClusterHandle, steps: list[tuple[str, Callable[[], object]]]) -> list[str]:
    """The demo's claims (a 1Gi share of enp0s10 and a pool address each) in a Deployment scaled 0 → N → 0
    CYCLES times while `steps` run one after the other, the last wave after they are done; what each took.
    Asserts every container started with its interface and none lost it, and that the claims go."""
    ns = "churn"
    fresh.kubectl("create", "namespace", ns)
    fresh.kubectl("apply", "-f", str(REPO_ROOT / "examples" / "demo" / "ippool.yaml"))
    [template, _] = yaml.safe_load_all((REPO_ROOT / "examples" / "demo" / "deployment-b.yaml").read_text())
    template["spec"]["spec"]["devices"]["requests"][0]["exactly"]["capacity"]["requests"][BANDWIDTH] = "1Gi"
    churn = deployment("churn", 0, template["metadata"]["name"])
    churn["spec"]["template"]["spec"]["containers"][0]["command"] = ["sh", "-c", WATCH]
    apply(fresh, ns, template, churn)

    took: list[str] = []
    failures: list[BaseException] = []

    def run_steps() -> None:
        try:
            for what, step in steps:
                started = time.monotonic()
                step()
                took.append(f"{what} in {time.monotonic() - started:.0f} s")
        except BaseException as err:
            failures.append(err)

    starts: list[str] = []
    lost: list[str] = []
    with Client(KubeConfig.from_file(fresh.kubeconfig), field_manager="netclaim-tests") as kube:
        roller = threading.Thread(target=run_steps, daemon=True)
        roller.start()
        for cycle in range(CYCLES):
            if cycle == CYCLES - 1:  # the last wave after the steps: on the release again
                roller.join(timeout=900)
            fresh.kubectl("scale", "-n", ns, "deployment/churn", f"--replicas={REPLICAS}")
            wait_for(lambda: len(running(kube, ns)) == REPLICAS, 300, f"wave {cycle + 1}: pods running")
            time.sleep(2)  # each container's watch loop runs a few rounds
            words, lost_now = read_watches(fresh, kube, ns)
            starts += words
            lost += lost_now
            fresh.kubectl("scale", "-n", ns, "deployment/churn", "--replicas=0")
            wait_for(lambda: not list(kube.list(Pod, namespace=ns)), 300, f"wave {cycle + 1}: pods gone")
        roller.join(timeout=900)
    assert not failures, failures
    assert len(took) == len(steps), took
    counts = {word: starts.count(word) for word in ("NET1-PRESENT", "NET1-MISSING", "NET1-LOST")}
    print(f"\n{CYCLES} waves of {REPLICAS} pods, {took}, container starts {counts}")
    assert counts["NET1-PRESENT"] == CYCLES * REPLICAS and counts["NET1-MISSING"] == 0, counts
    assert lost == []
    wait_for(
        lambda: not fresh.kubectl("get", "resourceclaims", "-n", ns, "-o", "name").strip(),
        120,
        "every claim of the churn gone",
    )
    return took


def test_helm_upgrade_from_the_release_and_rollback_under_churn_keep_every_interface(
    fresh: ClusterHandle,
    release_tree: Path,
    release_image: agent_image.ImageArchive,
    head: agent_image.ImageArchive,
) -> None:
    fresh.kubectl("create", "namespace", HELM_NAMESPACE)
    fresh.kubectl("label", "namespace", HELM_NAMESPACE, "pod-security.kubernetes.io/enforce=privileged")
    _helm(
        fresh,
        *("install", "netclaim", str(release_tree / "charts" / "netclaim"), "--namespace", HELM_NAMESPACE),
        *("--set", "namespace.create=false", "--set", f"image.tag={_tag(release_image)}"),
        *("--set-file", f"policy={REPO_ROOT / 'examples' / 'demo' / 'policy.yaml'}"),
        *("--wait", "--timeout", "5m"),
    )
    assert _agent_images(fresh, HELM_NAMESPACE) == {release_image.reference}
    chart = str(REPO_ROOT / "charts" / "netclaim")
    wait = ("--namespace", HELM_NAMESPACE, "--wait", "--timeout", "5m")
    upgrade = ("upgrade", "netclaim", chart, "--reuse-values", "--set", f"image.tag={_tag(head)}", *wait)
    _churn_under(
        fresh,
        [
            ("helm upgrade", lambda: _rolled(fresh, HELM_NAMESPACE, head, lambda: _helm(fresh, *upgrade))),
            (
                "helm rollback",
                lambda: _rolled(
                    fresh,
                    HELM_NAMESPACE,
                    release_image,
                    lambda: _helm(fresh, "rollback", "netclaim", "1", *wait),
                ),
            ),
        ],
    )
    assert _agent_images(fresh, HELM_NAMESPACE) == {release_image.reference}  # back on the release
    history = yaml.safe_load(_helm(fresh, "history", "netclaim", "--namespace", HELM_NAMESPACE, "-o", "yaml"))
    assert [(r["revision"], r["status"]) for r in history] == [
        (1, "superseded"),
        (2, "superseded"),
        (3, "deployed"),
    ]


def test_kubectl_applying_the_next_deploy_and_the_release_s_again_under_churn_keep_every_interface(
    fresh: ClusterHandle,
    release_tree: Path,
    release_image: agent_image.ImageArchive,
    head: agent_image.ImageArchive,
) -> None:

    def apply_deploy(tree: Path, image: agent_image.ImageArchive) -> None:
        """`kubectl apply -f deploy/` of `tree`, its image reference set to `image`'s (a user's registry)."""
        texts = [p.read_text() for p in sorted((tree / "deploy").glob("*.yaml"))]
        text = "\n---\n".join(texts).replace(agent_image.DEFAULT_REF, image.reference)
        fresh.kubectl("apply", "-f", "-", input_text=text)
        for workload in ("daemonset/netclaim-agent", "deployment/netclaim-controller"):
            fresh.kubectl(
                "rollout", "status", "-n", agents.NAMESPACE, workload, "--timeout=300s", timeout=310
            )

    apply_deploy(release_tree, release_image)
    policy = f"--from-file=policy.yaml={REPO_ROOT / 'examples' / 'demo' / 'policy.yaml'}"
    fresh.kubectl("-n", agents.NAMESPACE, "create", "configmap", "netclaim-policy", policy)
    agents.wait_ready(fresh, agents.kubelet_nodes(fresh))
    assert _agent_images(fresh, agents.NAMESPACE) == {release_image.reference}
    _churn_under(
        fresh,
        [
            (
                "kubectl apply of this deploy/",
                lambda: _rolled(fresh, agents.NAMESPACE, head, lambda: apply_deploy(REPO_ROOT, head)),
            ),
            (
                "kubectl apply of the release's deploy/",
                lambda: _rolled(
                    fresh, agents.NAMESPACE, release_image, lambda: apply_deploy(release_tree, release_image)
                ),
            ),
        ],
    )
    assert _agent_images(fresh, agents.NAMESPACE) == {release_image.reference}


def _tag(image: agent_image.ImageArchive) -> str:
    return image.reference.rsplit(":", 1)[1]


def _rolled(
    fresh: ClusterHandle, namespace: str, image: agent_image.ImageArchive, step: Callable[[], object]
) -> None:
    """`step`, after which every agent runs `image` (the rollout done, none of the old ones left)."""
    step()
    wait_for(
        lambda: _agent_images(fresh, namespace) == {image.reference}, 120, f"the agents on {image.reference}"
    )

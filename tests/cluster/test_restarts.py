"""Issue 4 acceptance: kill -9 the agent at the worst moments, restart containerd; every pod ends running
with its interface and Ready=True, or cleaned up, and is never Ready=True without its interface."""

from __future__ import annotations

import fcntl
import functools
import json
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from lightkube import Client
from lightkube.core.client import FieldSelector
from lightkube.core.exceptions import ApiError
from lightkube.resources.core_v1 import Event, Pod

from netclaim_lab import agents, processes
from netclaim_lab.cluster import ClusterHandle
from tests.cluster.helpers import (
    apiserver_away,
    apply,
    claim_devices,
    claim_template,
    cni_config,
    deployment,
    host_local_dir,
    in_pod_netns,
    ipam_reservations,
    macvlan,
    name_of,
    node_name,
    pod_manifest,
    ready_entry,
    running,
    sandbox_netns,
    store_rows,
)
from tests.kube import delete, wait_for

POLICY = Path(__file__).with_name("policy.yaml")
ON_ENP0S10 = 'device.attributes["netclaim.dev"].ifName == "enp0s10"'


class ReadyWatch:
    """Samples every pod of a namespace: a claim saying Ready=True while net1 is missing is a violation."""

    def __init__(self, cluster: ClusterHandle, kube: Client, namespace: str) -> None:
        self.cluster, self.kube, self.namespace = cluster, kube, namespace
        self.violations: list[str] = []
        self.samples = 0  # Ready pods whose namespace was looked into
        self.unobservable = 0  # pods that went (or had no sandbox yet) between the list and the look
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> ReadyWatch:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            for pod in running_or_starting(self.kube, self.namespace):
                try:
                    self._check(pod)
                except (ApiError, subprocess.CalledProcessError, IndexError):
                    self.unobservable += 1

    def wait_sampled(self) -> None:
        """Until at least one Ready pod was looked into: a watch that saw nothing proves nothing."""
        wait_for(lambda: self.samples > 0, 60, "the watch to sample a Ready pod")

    def assert_clean(self) -> None:
        print(f"ready watch: {self.samples} samples, {self.unobservable} unobservable, {self.violations}")
        assert self.samples > 0 and self.violations == []

    def _check(self, pod: Pod) -> None:
        assert pod.metadata is not None and pod.metadata.name is not None and pod.metadata.uid is not None
        statuses = pod.status.resourceClaimStatuses if pod.status else None
        if not statuses or not statuses[0].resourceClaimName:
            return  # no claim yet: it cannot be Ready either
        claim = statuses[0].resourceClaimName
        ready = any(
            c["status"] == "True"
            for e in claim_devices(self.kube, self.namespace, claim)
            for c in e.get("conditions", [])
        )
        if not ready:
            return
        netns = sandbox_netns(self.cluster, node_name(pod), pod.metadata.uid)
        links = in_pod_netns(self.cluster, node_name(pod), netns, "ip", "-o", "link", "show")
        self.samples += 1
        if " net1" not in links:
            self.violations.append(f"{pod.metadata.name}: claim Ready=True, no net1 in its namespace")


def running_or_starting(kube: Client, namespace: str) -> list[Pod]:
    return [
        p
        for p in kube.list(Pod, namespace=namespace)
        if p.status and p.status.phase == "Running" and p.metadata and not p.metadata.deletionTimestamp
    ]


def has_net1(cluster: ClusterHandle, pod: Pod) -> bool:
    assert pod.metadata is not None and pod.metadata.uid is not None
    netns = sandbox_netns(cluster, node_name(pod), pod.metadata.uid)
    return " net1" in in_pod_netns(cluster, node_name(pod), netns, "ip", "-o", "link", "show")


@pytest.fixture
def agent_on_node_2(cluster: ClusterHandle) -> Iterator[Any]:
    """Restart node-2's agent with fault points; afterwards it runs normally again."""

    def restart(faults: str = "") -> None:
        agents.restart_agent(cluster, "node-2", faults)

    yield restart
    restart()


def _on_node_2(name: str, claim_template: str) -> dict[str, Any]:
    manifest = pod_manifest(name, claim_template)
    manifest["spec"]["nodeSelector"] = {"kubernetes.io/hostname": "node-2"}
    return manifest


def _config(subnet: str, network: str) -> dict[str, Any]:
    return cni_config([macvlan(subnet)], name=network)


def _wait_agent_dead(cluster: ClusterHandle) -> None:
    wait_for(lambda: agents.restarts(cluster, "node-2") > 0, 60, "the agent killed at its fault point")


@pytest.mark.parametrize(
    ("point", "version"),
    [
        ("after-prepare", "1.0.0"),
        ("run-pod-sandbox", "1.0.0"),
        ("inside-add", "1.0.0"),
        # the record of the ADD under way is not fsync'd for a chain its network's GC reaches: kill -9 keeps
        # it all the same (the kernel has it)
        ("inside-add", "1.1.0"),
        ("before-status", "1.0.0"),
    ],
)
def test_agent_killed_while_a_pod_starts(
    cluster: ClusterHandle, kube: Client, ns: str, agent_on_node_2: Any, point: str, version: str
) -> None:
    network = f"crash-{point}-{version.replace('.', '')}"
    agent_on_node_2(point)
    config = cni_config([macvlan("10.80.0.0/24")], name=network)
    config["config"]["cniVersion"] = version
    with ReadyWatch(cluster, kube, ns) as watch:
        apply(cluster, ns, claim_template("t", "netclaim-shared", ON_ENP0S10, config), _on_node_2("p", "t"))
        _wait_agent_dead(cluster)
        agent_on_node_2()  # back, without faults
        wait_for(
            lambda: ready_entry(kube, ns, "p") is not None and bool(running(kube, ns)),
            120,
            "the pod running and Ready after the agent's restart",
        )
        assert has_net1(cluster, kube.get(Pod, "p", namespace=ns))
        watch.wait_sampled()
    watch.assert_clean()
    assert len(ipam_reservations(cluster, network)) == 1, "a crash inside ADD must not leak an address"
    delete(kube, Pod, "p", ns)
    wait_for(lambda: ipam_reservations(cluster, network) == set(), 60, "the address released")


ON_ENP94S0 = 'device.attributes["netclaim.dev"].ifName == "enp94s0"'


def test_agent_killed_when_the_first_of_a_pods_adds_at_once_ends(
    cluster: ClusterHandle, kube: Client, ns: str, agent_on_node_2: Any
) -> None:
    """Two claims on two NICs: their ADDs run at the same time, and the agent dies (kill -9 at its fault
    point) as soon as one has ended, the other's plugin maybe still at work. Back, it undoes both and attaches
    both: one address held per network, none once the pod has gone."""
    networks = {
        "net1": ("crash-together-a", "10.81.0.0/24", ON_ENP0S10),
        "net2": ("crash-together-b", "10.82.0.0/24", ON_ENP94S0),
    }
    agent_on_node_2("inside-add")
    manifest = _on_node_2("p", "net1")
    manifest["spec"]["resourceClaims"] = [{"name": i, "resourceClaimTemplateName": i} for i in networks]
    manifest["spec"]["containers"][0]["resources"]["claims"] = [{"name": i} for i in networks]
    apply(
        cluster,
        ns,
        *(
            claim_template(
                i, "netclaim-shared", cel, cni_config([macvlan(subnet)], interface=i, name=network)
            )
            for i, (network, subnet, cel) in networks.items()
        ),
        manifest,
    )
    _wait_agent_dead(cluster)
    agent_on_node_2()  # back, without faults

    def both_in_the_running_pod() -> bool:
        pod = kube.get(Pod, "p", namespace=ns)
        claims = [
            c.resourceClaimName for c in (pod.status.resourceClaimStatuses if pod.status else None) or []
        ]
        ready = [e for c in claims if c for e in claim_devices(kube, ns, c) if _ready(e)]
        if not running(kube, ns) or len(ready) < len(networks):
            return False
        assert pod.metadata is not None and pod.metadata.uid is not None
        netns = sandbox_netns(cluster, node_name(pod), pod.metadata.uid)
        links = in_pod_netns(cluster, node_name(pod), netns, "ip", "-o", "link", "show")
        return " net1@" in links and " net2@" in links

    wait_for(both_in_the_running_pod, 120, "the pod running with net1 and net2 after the agent's restart")
    for network, _, _ in networks.values():
        assert len(ipam_reservations(cluster, network)) == 1, f"{network}: a crash beside an ADD leaked"
    delete(kube, Pod, "p", ns)
    for network, _, _ in networks.values():
        wait_for(functools.partial(_released, cluster, network), 60, f"{network}: released")


def _released(cluster: ClusterHandle, network: str) -> bool:
    return ipam_reservations(cluster, network) == set()


def _ready(entry: dict[str, Any]) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in entry.get("conditions", []))


@pytest.mark.parametrize("point", ["before-detach", "before-unprepare"])
def test_agent_killed_while_a_pod_goes(
    cluster: ClusterHandle, kube: Client, ns: str, agent_on_node_2: Any, point: str
) -> None:
    network = f"crash-{point}"
    apply(
        cluster,
        ns,
        claim_template(
            "t", "netclaim-shared", ON_ENP0S10, cni_config([macvlan("10.81.0.0/24")], name=network)
        ),
        _on_node_2("p", "t"),
    )
    wait_for(lambda: ready_entry(kube, ns, "p") is not None, 120, "the pod configured")
    agent_on_node_2(point)
    delete(kube, Pod, "p", ns)
    _wait_agent_dead(cluster)
    agent_on_node_2()
    wait_for(
        lambda: (
            ipam_reservations(cluster, network) == set()
            and not [r for r in store_rows(cluster, "node-2") if r["claim_namespace"] == ns]
        ),
        120,
        "address released and state rows dropped after the restart",
    )


def test_containerd_restart_under_load(cluster: ClusterHandle, kube: Client, ns: str) -> None:
    network = "load-net"
    apply(
        cluster,
        ns,
        claim_template(
            "t", "netclaim-shared", ON_ENP0S10, cni_config([macvlan("10.82.0.0/24")], name=network), "1Gi"
        ),
        deployment("load", 8, "t"),
    )
    node = cluster.node("node-1")
    with ReadyWatch(cluster, kube, ns) as watch:
        wait_for(
            lambda: sum(1 for p in kube.list(Pod, namespace=ns) if p.spec and p.spec.nodeName) >= 4,
            60,
            "replicas bound to nodes: their sandboxes are being created while containerd restarts",
        )
        processes.stop(node.pid_dir, "containerd", grace=5)
        processes.start_recorded(node.pid_dir, "containerd")

        def settled() -> bool:
            pods = running(kube, ns, "load")
            return len(pods) == 8 and all(ready_entry(kube, ns, name_of(p)) is not None for p in pods)

        wait_for(settled, 240, "all 8 replicas running and Ready after containerd's restart")
        assert all(has_net1(cluster, p) for p in running(kube, ns, "load"))
        watch.wait_sampled()
    watch.assert_clean()
    assert len(ipam_reservations(cluster, network)) == 8


def _attach_during_outage(cluster: ClusterHandle, kube: Client, ns: str, attempt: int) -> bool:
    """One try: False when the sandbox attached before the apiserver could be stopped."""
    name = f"p{attempt}"
    template = claim_template(
        f"t{attempt}",
        "netclaim-shared",
        ON_ENP0S10,
        _config(f"10.83.{attempt}.0/24", f"no-apiserver-{attempt}"),
    )
    apply(cluster, ns, template, _on_node_2(name, f"t{attempt}"))

    def rows() -> list[dict[str, Any]]:
        return [
            r
            for r in store_rows(cluster, "node-2")
            if r["claim_namespace"] == ns and r["claim_name"].startswith(f"{name}-")
        ]

    offset = len(agents.agent_log(cluster, "node-2"))
    wait_for(lambda: bool(rows()), 60, "the claim prepared", interval=0.02)
    with apiserver_away(cluster, kube, grace=0):  # at once: the sandbox is a few 100 ms away
        if rows()[0]["state"] != "prepared":
            return False
        wait_for(lambda: rows()[0]["state"] == "attached", 25, "attached while the apiserver is away")

        def status_write_retried() -> bool:
            entries = [
                json.loads(line)
                for line in agents.agent_log(cluster, "node-2")[offset:].splitlines()
                if line.startswith("{")
            ]
            return any(
                e["msg"] == "status write postponed; retrying" and e.get("of", "").startswith(f"{ns}/{name}")
                for e in entries
            )

        wait_for(status_write_retried, 60, "the agent retrying the status while the apiserver is away")
    try:
        wait_for(lambda: ready_entry(kube, ns, name) is not None, 120, "the status written after the outage")
    except pytest.fail.Exception:
        log = agents.agent_log(cluster, "node-2")[offset:].splitlines()
        said = "\n".join(line for line in log if f"{ns}/{name}" in line)
        raise AssertionError(f"no Ready status after the outage; the agent said:\n{said}") from None
    assert has_net1(cluster, kube.get(Pod, name, namespace=ns))
    return True


def test_pods_attach_while_the_apiserver_is_away(cluster: ClusterHandle, kube: Client, ns: str) -> None:
    """Attach needs only the stored plan: stop the apiserver right after prepare, the interface still comes;
    the claim's status is written once the apiserver is back."""
    assert any(_attach_during_outage(cluster, kube, ns, attempt) for attempt in range(3)), (
        "the sandbox always started before the apiserver could be stopped (3 attempts)"
    )


def test_a_hanging_plugin_fails_the_sandbox_instead_of_timing_out(
    cluster: ClusterHandle, kube: Client, ns: str
) -> None:
    """host-local waits for its network's lock: while the test holds it, ADD hangs. The hook must give up
    inside containerd's 2 s budget with an error (the sandbox fails, kubelet retries), never time out (the
    pod would start without net1). Released, the retried sandbox gets its interface."""
    network = "hanging-ipam"
    lock_dir = host_local_dir(cluster, "node-2", network, ns)
    lock_dir.mkdir(parents=True, exist_ok=True)
    offset = len(agents.agent_log(cluster, "node-2"))
    with (lock_dir / "lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        with ReadyWatch(cluster, kube, ns) as watch:
            apply(
                cluster,
                ns,
                claim_template("t", "netclaim-shared", ON_ENP0S10, _config("10.84.0.0/24", network)),
                _on_node_2("p", "t"),
            )
            selector: FieldSelector = {"involvedObject.name": "p", "reason": "FailedCreatePodSandBox"}
            wait_for(
                lambda: any(
                    "NRI" in (e.message or "") and "timed out" in (e.message or "")
                    for e in kube.list(Event, namespace=ns, fields=selector)
                ),
                60,
                "the sandbox failed by our error",
            )
            assert not running(kube, ns), "no pod may run without its interface"
            fcntl.flock(lock, fcntl.LOCK_UN)
            wait_for(lambda: ready_entry(kube, ns, "p") is not None, 180, "the retried sandbox configured")
            assert has_net1(cluster, kube.get(Pod, "p", namespace=ns))
            watch.wait_sampled()
    watch.assert_clean()
    # containerd never dropped the plugin for a timeout: the agent's NRI connection stayed up throughout
    assert "NRI connection lost" not in agents.agent_log(cluster, "node-2")[offset:]

"""A NIC whose link goes down, on the real cluster: node-2's enp94s0 (lan1, shared) loses its carrier when
the switch side of its veth goes down, as a pulled cable or a dead switch port does. Its device is tainted
in the node's slice, kubelet shows it Unhealthy in the pods' status (the DRAResourceHealth stream), their
claims say LinkDown=True, their pods get an Event, and a new pod asking for that NIC stays Pending; the
link back, all of it clears and the new pod runs. A link flapping 100 times in 10 s costs a handful of
slice generations."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from lightkube import Client
from lightkube.core.exceptions import ApiError
from lightkube.resources.core_v1 import Event, Pod

from netclaim_lab import agents
from netclaim_lab.cluster import ClusterHandle
from tests.cluster.helpers import (
    agent_metrics,
    apply,
    claim_devices,
    claim_template,
    cni_config,
    configured_and_running,
    kubectl_netclaim,
    macvlan,
    node_slices,
    pod_claim_name,
    published,
    runnable_here,
)
from tests.kube import wait_for

NODE, NIC = "node-2", "enp94s0"
LINK_DOWN = "netclaim.dev/link-down"
ON_THE_NIC = f'device.attributes["netclaim.dev"].ifName == "{NIC}"'


def _switch_side(cluster: ClusterHandle) -> str:
    """The host end of the NIC's veth: what the NIC's carrier follows."""
    node = cluster.node(NODE)
    [index] = [i for i, nic in enumerate(node.node.nics) if nic.name == NIC]
    return node.nic_peer(index)


def _set_link(peer: str, state: str) -> None:
    subprocess.run(["ip", "link", "set", peer, state], check=True)


@pytest.fixture
def link(cluster: ClusterHandle) -> Iterator[Callable[[str], None]]:
    """Sets the NIC's link "down" or "up"; up again whatever the test did."""
    peer = _switch_side(cluster)
    yield lambda state: _set_link(peer, state)
    _set_link(peer, "up")


def _documents(names: list[str]) -> list[dict[str, Any]]:
    """The claim template of a share of node-2's enp94s0 (its address from a tenant range of the test
    policy), and a pod per name using it."""
    template = claim_template(
        "on-enp94s0", "netclaim-shared", ON_THE_NIC, cni_config([macvlan("10.33.7.0/24")])
    )
    pods = [
        runnable_here(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": name},
                "spec": {
                    "terminationGracePeriodSeconds": 0,
                    "resourceClaims": [{"name": "net", "resourceClaimTemplateName": "on-enp94s0"}],
                    "containers": [
                        {
                            "name": "main",
                            "image": "busybox",
                            "command": ["sleep", "3600"],
                            "resources": {"claims": [{"name": "net"}]},
                        }
                    ],
                },
            }
        )
        for name in names
    ]
    return [template, *pods]


def _taints(kube: Client) -> list[dict[str, Any]]:
    return list(published(kube, NODE)[NIC].get("taints") or [])


def _device_health(kube: Client, ns: str, pod: str) -> list[str]:
    """What kubelet shows of the pod's claim devices: their `health`, from the pod's status."""
    found = kube.get(Pod, pod, namespace=ns)
    statuses = (found.status.containerStatuses if found.status else None) or []
    return [
        str(resource.health)
        for status in statuses
        for entry in status.allocatedResourcesStatus or []
        if entry.name == "claim:net"
        for resource in entry.resources or []
    ]


def _link_down(kube: Client, ns: str, pod: str) -> str | None:
    """The status of the LinkDown condition on the pod's claim device, or None while there is none."""
    for entry in claim_devices(kube, ns, pod_claim_name(kube, ns, pod)):
        for condition in entry.get("conditions") or []:
            if condition["type"] == "LinkDown":
                return str(condition["status"])
    return None


def _reasons(kube: Client, ns: str, pod: str) -> list[str]:
    return [str(e.reason) for e in kube.list(Event, namespace=ns, fields={"involvedObject.name": pod})]


def _pending_unschedulable(kube: Client, ns: str, pod: str) -> bool:
    found = kube.get(Pod, pod, namespace=ns)
    conditions = (found.status.conditions if found.status else None) or []
    return any(
        c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable" for c in conditions
    )


def test_a_nic_that_loses_its_link_is_tainted_shown_unhealthy_and_cleared_when_back(
    cluster: ClusterHandle, kube: Client, ns: str, link: Callable[[str], None], figures: Callable[[str], None]
) -> None:
    apply(cluster, ns, *_documents(["user-a", "user-b"]))
    for pod in ("user-a", "user-b"):
        wait_for(partial(configured_and_running, kube, ns, pod), 120, f"{pod} running with net1")
    assert _taints(kube) == []
    wait_for(
        lambda: all(_device_health(kube, ns, p) == ["Healthy"] for p in ("user-a", "user-b")),
        60,
        "kubelet showing both pods' NIC Healthy",
    )
    assert {_link_down(kube, ns, p) for p in ("user-a", "user-b")} == {"False"}

    lost = time.monotonic()
    link("down")
    wait_for(lambda: _taints(kube) != [], 30, "the link-down taint in node-2's slice")
    figures(f"taint in the slice {time.monotonic() - lost:.2f} s after the carrier went")
    [taint] = _taints(kube)
    assert (taint["key"], taint["effect"]) == (LINK_DOWN, "NoSchedule") and taint["timeAdded"]
    wait_for(
        lambda: all(_device_health(kube, ns, p) == ["Unhealthy"] for p in ("user-a", "user-b")),
        30,
        "kubelet showing both pods' NIC Unhealthy",
    )
    figures(f"both pods' allocatedResourcesStatus Unhealthy {time.monotonic() - lost:.2f} s after")
    wait_for(
        lambda: {_link_down(kube, ns, p) for p in ("user-a", "user-b")} == {"True"},
        30,
        "LinkDown=True on both claims",
    )
    figures(f"LinkDown=True on both claims {time.monotonic() - lost:.2f} s after")
    wait_for(
        lambda: all("NetclaimLinkDown" in _reasons(kube, ns, p) for p in ("user-a", "user-b")),
        30,
        "a NetclaimLinkDown Event on each pod",
    )

    apply(cluster, ns, *_documents(["user-c"])[1:])
    wait_for(
        lambda: _pending_unschedulable(kube, ns, "user-c"),
        60,
        "user-c Pending: the only NIC it asks is tainted",
    )
    time.sleep(5)  # the scheduler retrying meanwhile does not place it either
    assert _pending_unschedulable(kube, ns, "user-c")
    explained = kubectl_netclaim(cluster, "explain", "pod/user-c", "-n", ns)
    assert f"{NIC} on {NODE}: does not fit: tainted {LINK_DOWN} (NoSchedule) since " in explained, explained

    back = time.monotonic()
    link("up")
    wait_for(lambda: _taints(kube) == [], 30, "the taint gone")
    figures(f"taint gone {time.monotonic() - back:.2f} s after the carrier came back")
    wait_for(
        lambda: all(_device_health(kube, ns, p) == ["Healthy"] for p in ("user-a", "user-b")),
        30,
        "kubelet showing both pods' NIC Healthy again",
    )
    wait_for(
        lambda: {_link_down(kube, ns, p) for p in ("user-a", "user-b")} == {"False"},
        30,
        "LinkDown=False on both claims",
    )
    figures(f"Healthy and LinkDown=False {time.monotonic() - back:.2f} s after")
    wait_for(
        lambda: all("NetclaimLinkUp" in _reasons(kube, ns, p) for p in ("user-a", "user-b")),
        30,
        "a NetclaimLinkUp Event on each pod",
    )
    wait_for(lambda: configured_and_running(kube, ns, "user-c"), 120, "user-c running once the link is back")


def test_a_link_flapping_a_hundred_times_in_ten_seconds_costs_a_handful_of_slice_writes(
    cluster: ClusterHandle, kube: Client, link: Callable[[str], None], figures: Callable[[str], None]
) -> None:
    def writes() -> float:
        metrics = agent_metrics(cluster, NODE)
        return sum(v for k, v in metrics.items() if k.startswith("netclaim_resourceslice_writes_total"))

    def losses() -> float:
        return agent_metrics(cluster, NODE).get("netclaim_nic_link_losses_total", 0.0)

    def generation() -> int:
        return max(item.spec.pool.generation for item in node_slices(kube, NODE))

    before, lost_before, generation_before = writes(), losses(), generation()
    started = time.monotonic()
    for _ in range(100):
        link("down")
        time.sleep(0.05)
        link("up")
        time.sleep(0.05)
    figures(f"100 flaps in {time.monotonic() - started:.1f} s")
    wait_for(lambda: _taints(kube) == [], 30, "the taint gone once the link settled")
    time.sleep(3)  # anything still to come would come now
    written, generations = writes() - before, generation() - generation_before
    # every generation rewrites all of the node's slices: one per capacity (netclaim.core.devices.slices)
    slices = len(node_slices(kube, NODE))
    figures(
        f"slice writes for 100 flaps: {written:.0f} ({generations} generations of {slices} slices); "
        f"outages counted: {losses() - lost_before:.0f}"
    )
    assert 1 <= generations <= 4, generations
    assert written == generations * slices, (written, generations, slices)
    assert _taints(kube) == []


POLICY = Path(__file__).with_name("policy.yaml")


@pytest.fixture
def evicting_policy(cluster: ClusterHandle, kube: Client, tmp_path: Path) -> Iterator[None]:
    """The test policy with `linkDown: NoExecute` on lan1's NICs (and an attribute to see it published);
    the original back afterwards, once node-2's agent publishes it again."""
    edited = tmp_path / "policy.yaml"
    lan1 = "attributes: {netclaim.dev/network: lan1}"
    edited.write_text(
        POLICY.read_text().replace(
            lan1, "attributes: {netclaim.dev/network: lan1, netclaim.dev/tier: evict}\n  linkDown: NoExecute"
        )
    )
    assert edited.read_text() != POLICY.read_text()
    agents.set_policy(cluster, edited)
    wait_for(
        lambda: "netclaim.dev/tier" in published(kube, NODE)[NIC]["attributes"], 120, "the policy in force"
    )
    yield
    agents.set_policy(cluster, POLICY)
    wait_for(
        lambda: "netclaim.dev/tier" not in published(kube, NODE)[NIC]["attributes"],
        120,
        "the original policy back",
    )


def test_with_no_execute_chosen_the_pods_on_a_dead_link_are_evicted(
    cluster: ClusterHandle,
    kube: Client,
    ns: str,
    evicting_policy: None,
    link: Callable[[str], None],
    figures: Callable[[str], None],
) -> None:
    apply(cluster, ns, *_documents(["evicted"]))
    wait_for(lambda: configured_and_running(kube, ns, "evicted"), 120, "the pod running with net1")
    lost = time.monotonic()
    link("down")
    wait_for(lambda: [t["effect"] for t in _taints(kube)] == ["NoExecute"], 30, "a NoExecute taint")

    def evicted() -> bool:
        try:
            found = kube.get(Pod, "evicted", namespace=ns)
        except ApiError as err:
            return err.status.code == 404
        conditions = (found.status.conditions if found.status else None) or []
        return any(
            c.type == "DisruptionTarget" and c.reason == "DeletionByDeviceTaintManager" for c in conditions
        )

    wait_for(evicted, 60, "the pod evicted by Kubernetes' device taint eviction controller")
    figures(f"pod evicted {time.monotonic() - lost:.2f} s after its NIC's carrier went")

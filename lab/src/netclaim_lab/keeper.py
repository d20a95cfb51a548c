"""Keep `kubelet: false` nodes Ready: create their Node objects, renew their Leases and heartbeats, and
publish the fake GPUs the spec gives them (netclaim_lab.fake_gpus).

Without a kubelet, the node lifecycle controller would mark such a node NotReady and taint it
unreachable after its grace period; the scheduler would then skip it.
"""

from __future__ import annotations

import datetime
import itertools
import signal
import threading

from lightkube import Client, KubeConfig, codecs
from lightkube.core.exceptions import ApiError
from lightkube.models.coordination_v1 import LeaseSpec
from lightkube.models.core_v1 import NodeCondition, NodeSpec, NodeStatus, Taint
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.coordination_v1 import Lease
from lightkube.resources.core_v1 import Node

from netclaim_lab import fake_gpus
from netclaim_lab.layout import ClusterLayout
from netclaim_lab.spec import load_cluster_spec

HEARTBEAT_SECONDS = 10  # a kubelet renews its Lease every 10 s (a quarter of its 40 s duration)
STATUS_EVERY = 6  # heartbeats; the node lifecycle controller takes a renewed Lease for a heartbeat


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC).replace(microsecond=0)


def _micro_now() -> datetime.datetime:
    """A Lease's renewTime is a MicroTime: the API server refuses one without its six fraction digits, which
    lightkube leaves out when the microseconds are 0."""
    now = datetime.datetime.now(datetime.UTC)
    return now if now.microsecond else now.replace(microsecond=1)


def _status() -> NodeStatus:
    now = _now()
    # no kubelet runs a pod here, and bench-scale's dense stage binds 1,000 pods to one such node: a
    # kubelet's 110 left 890 of them Pending ("Too many pods") in the first full run
    capacity = {"cpu": "8", "memory": "32Gi", "pods": "1100"}
    return NodeStatus(
        capacity=capacity,
        allocatable=capacity,
        conditions=[
            NodeCondition(
                type="Ready",
                status="True",
                reason="NetclaimNodeKeeper",
                message="kept Ready by netclaim-lab cluster keep-nodes",
                lastHeartbeatTime=now,
                lastTransitionTime=now,
            )
        ],
    )


def ensure_node(client: Client, name: str, labels: dict[str, str]) -> None:
    try:
        client.get(Node, name)
    except ApiError as err:
        if err.status.code != 404:
            raise
        # no kubelet runs the agent's DaemonSet pod here: the label that takes the agent off a node
        all_labels = {
            "kubernetes.io/hostname": name,
            "netclaim.dev/kubelet": "false",
            "netclaim.dev/agent": "disabled",
            **labels,
        }
        # Tainted so that ordinary pods, which could never start there, are not scheduled onto it.
        taint = Taint(key="netclaim.dev/kubelet-less", value="true", effect="NoSchedule")
        client.create(Node(metadata=ObjectMeta(name=name, labels=all_labels), spec=NodeSpec(taints=[taint])))


def heartbeat(client: Client, name: str, *, status: bool = True) -> None:
    if status:
        client.apply(
            Node.Status(metadata=ObjectMeta(name=name), status=_status()),
            name,
            field_manager="netclaim-node-keeper",
            force=True,
        )
    client.apply(
        Lease(
            metadata=ObjectMeta(name=name, namespace="kube-node-lease"),
            spec=LeaseSpec(holderIdentity=name, leaseDurationSeconds=40, renewTime=_micro_now()),
        ),
        field_manager="netclaim-node-keeper",
        force=True,
    )


def keep_nodes(cluster: str) -> None:
    """Run until SIGTERM: every HEARTBEAT_SECONDS renew every kubelet-less node of the cluster."""
    layout = ClusterLayout.for_cluster(cluster)
    spec = load_cluster_spec(layout.spec_copy)
    client = Client(KubeConfig.from_file(layout.admin_kubeconfig), field_manager="netclaim-node-keeper")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    nodes = [n for n in spec.nodes if not n.kubelet]
    for node in nodes:
        ensure_node(client, node.name, node.labels)
    publish_gpus(
        client, {n.name: [(g.pcieRoot, g.numaNode) for g in n.gpus for _ in range(g.count)] for n in nodes}
    )
    keep(client, [n.name for n in nodes], stop)


def publish_gpus(client: Client, gpus: dict[str, list[tuple[str, int]]]) -> None:
    """Each node's fake GPUs (PCIe root, NUMA node), in one slice per node, and their DeviceClass."""
    if not any(gpus.values()):
        return
    found = [fake_gpus.device_class(), *(fake_gpus.resource_slice(n, g) for n, g in gpus.items() if g)]
    for manifest in found:
        client.apply(codecs.from_dict(manifest), field_manager="netclaim-node-keeper", force=True)


def keep(client: Client, names: list[str], stop: threading.Event) -> None:
    """Renew the Leases of `names` (read each round: a caller may add to it) until `stop`; their status
    in their first round and every STATUS_EVERY rounds."""
    reported: set[str] = set()
    for round_ in itertools.count():
        for name in list(names):
            try:
                heartbeat(client, name, status=round_ % STATUS_EVERY == 0 or name not in reported)
                reported.add(name)
            except Exception as err:  # noqa: BLE001 - it must outlive the apiserver's restarts (tests stop it)
                print(f"heartbeat of {name} failed: {err!r}", flush=True)
        if stop.wait(HEARTBEAT_SECONDS):
            return

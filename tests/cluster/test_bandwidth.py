"""Guaranteed is also capped: a pod's interface is shaped to the bandwidth its claim consumed (± 10 %)."""

from __future__ import annotations

import json
import subprocess

from lightkube import Client
from lightkube.resources.core_v1 import Pod

from netclaim_lab.cluster import ClusterHandle
from tests.cluster.helpers import (
    apply,
    claim_template,
    cni_config,
    in_pod_netns,
    macvlan,
    node_name,
    pod_manifest,
    ready_entry,
    sandbox_netns,
)
from tests.kube import wait_for

MI = 2**20
ON_NODE_1 = {"kubernetes.io/hostname": "node-1"}  # nodeName would bypass the scheduler (no allocation)


def _throughput(
    cluster: ClusterHandle, client_netns: str, server_netns: str, server: str, reverse: bool
) -> float:
    """bits/s measured by iperf3 over 4 s between two pods' network namespaces on node-1 (TCP, one stream)."""
    node = cluster.node("node-1")
    listener = subprocess.Popen(
        [*node.enter(), "nsenter", f"--net={server_netns}", "iperf3", "-s", "-1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(
            lambda: ":5201" in in_pod_netns(cluster, "node-1", server_netns, "ss", "-Hltn"),
            30,
            "iperf3 listening",
            interval=0.05,
        )
        command = ["iperf3", "-c", server, "-t", "4", "-O", "1", "-J", *(["-R"] if reverse else [])]
        report = json.loads(in_pod_netns(cluster, "node-1", client_netns, *command, timeout=30))
    finally:
        listener.wait(timeout=30)
    return float(report["end"]["sum_received"]["bits_per_second"])


def test_consumed_bandwidth_caps_the_interface_both_ways(
    cluster: ClusterHandle, kube: Client, ns: str
) -> None:
    on_enp0s10 = 'device.attributes["netclaim.dev"].ifName == "enp0s10"'
    config = cni_config([macvlan("10.70.0.0/24")], name="bw-net")
    apply(
        cluster,
        ns,
        claim_template("slow", "netclaim-shared", on_enp0s10, config, "200Mi"),
        claim_template("fast", "netclaim-shared", on_enp0s10, config, "600Mi"),
        {
            **pod_manifest("slow", "slow"),
            "spec": {**pod_manifest("slow", "slow")["spec"], "nodeSelector": ON_NODE_1},
        },
        {
            **pod_manifest("fast", "fast"),
            "spec": {**pod_manifest("fast", "fast")["spec"], "nodeSelector": ON_NODE_1},
        },
    )
    wait_for(
        lambda: ready_entry(kube, ns, "slow") is not None and ready_entry(kube, ns, "fast") is not None,
        120,
        "both pods configured",
    )
    netns = {}
    for name in ("slow", "fast"):
        current = kube.get(Pod, name, namespace=ns)
        assert current.metadata is not None and current.metadata.uid is not None
        netns[name] = sandbox_netns(cluster, node_name(current), current.metadata.uid)
    fast_entry = ready_entry(kube, ns, "fast")
    assert fast_entry is not None
    fast_ip = fast_entry["networkData"]["ips"][0].split("/")[0]
    upload = _throughput(cluster, netns["slow"], netns["fast"], fast_ip, reverse=False)  # slow pod sends
    download = _throughput(cluster, netns["slow"], netns["fast"], fast_ip, reverse=True)  # slow pod receives
    print(
        f"200Mi claim: sends {upload / MI:.1f} Mi/s, receives {download / MI:.1f} Mi/s "
        f"(cap 200 Mi/s; the peer's cap is 600 Mi/s)"
    )
    for measured in (upload, download):
        assert abs(measured - 200 * MI) <= 0.1 * 200 * MI, f"{measured / MI:.1f} Mi/s is not 200 Mi/s ± 10 %"
    qdiscs = in_pod_netns(cluster, "node-1", netns["slow"], "tc", "qdisc", "show")
    assert "qdisc tbf 1: dev net1 root" in qdiscs and "qdisc ingress ffff: dev net1" in qdiscs
    assert "rate 209715Kbit" in qdiscs or "rate 209Mbit" in qdiscs or "rate 210Mbit" in qdiscs, qdiscs

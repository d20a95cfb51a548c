"""MultiNetworkPolicy tests' pieces on the real cluster: servers on the pool's network that answer with
their name, policies over it, and real connections between pods (tests/cluster/test_netpolicy.py,
test_attacks.py, test_spoofing.py)."""

from __future__ import annotations

import ipaddress
from typing import Any

from netclaim_lab.cluster import ClusterHandle
from tests.cluster.helpers import in_pod_netns, kubectl_json, sandbox_netns
from tests.cluster.ipam import NETWORK, pod_addresses, pod_on

PORT, OTHER_PORT = 8080, 8081
SUBNET = "10.64.9.0/24"


def server(name: str, node: str, labels: dict[str, str]) -> dict[str, Any]:
    """A pod on the pool's network answering TCP on PORT and OTHER_PORT with its name."""
    made = pod_on(name, "t", node)
    made["metadata"]["labels"] = labels
    made["spec"]["containers"][0]["command"] = [
        "sh",
        "-c",
        f"mkdir -p /www && echo {name} > /www/index.html && httpd -p {PORT} -h /www && "
        f"exec httpd -f -p {OTHER_PORT} -h /www",
    ]
    return made


def policy(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "k8s.cni.cncf.io/v1beta1",
        "kind": "MultiNetworkPolicy",
        "metadata": {
            "name": name,
            "annotations": {"k8s.v1.cni.cncf.io/policy-for": f"netclaim.dev/{NETWORK}"},
        },
        "spec": spec,
    }


DENY_DB = policy("deny-db", {"podSelector": {"matchLabels": {"app": "db"}}, "policyTypes": ["Ingress"]})
ALLOW_CLIENTS = policy(
    "allow-clients",
    {
        "podSelector": {"matchLabels": {"app": "db"}},
        "ingress": [
            {"from": [{"podSelector": {"matchLabels": {"role": "client"}}}], "ports": [{"port": PORT}]}
        ],
    },
)


class Net:
    """The test namespace's pods and their addresses: net1's from the claims' status, eth0's from the pods."""

    def __init__(self, cluster: ClusterHandle, ns: str) -> None:
        self.cluster, self.ns = cluster, ns
        self.refresh()

    def refresh(self) -> None:
        self.net1 = {
            pod: str(ipaddress.ip_interface(addresses[0]).ip)
            for pod, addresses in pod_addresses(self.cluster, self.ns).items()
        }
        self.pods = {
            p["metadata"]["name"]: p
            for p in kubectl_json(self.cluster, "get", "pods", "-n", self.ns)["items"]
        }

    def primary(self, pod: str) -> str:
        return str(self.pods[pod]["status"]["podIP"])

    def tcp(self, source: str, address: str, port: int = PORT) -> str:
        """The answer's body (the server's name), or "" when none came within 4 s. busybox's `-w` bounds only
        the connect: a connection made just before a policy lands is not tracked by the pod's conntrack, so
        the new rules drop its request and nc would wait for an answer forever."""
        request = f"printf 'GET / HTTP/1.0\\r\\n\\r\\n' | timeout -s KILL 4 nc -w 2 {address} {port} || true"
        got = self.cluster.kubectl("exec", "-n", self.ns, source, "--", "sh", "-c", request, timeout=30)
        lines = got.strip().splitlines()
        return lines[-1] if lines and not lines[-1].startswith("HTTP/") else ""

    def pings(self, source: str, address: str) -> bool:
        got = self.cluster.kubectl(
            "exec",
            "-n",
            self.ns,
            source,
            "--",
            "sh",
            "-c",
            f"ping -c 1 -W 2 {address} >/dev/null && echo ok || true",
        )
        return got.strip() == "ok"

    def table(self, pod: str) -> str:
        """`nft list ruleset` inside the pod's network namespace (empty: no table at all)."""
        node = self.pods[pod]["spec"]["nodeName"]
        netns = sandbox_netns(self.cluster, node, self.pods[pod]["metadata"]["uid"])
        return in_pod_netns(self.cluster, node, netns, "nft", "list", "ruleset").strip()


def network_service(name: str, selector: str) -> dict[str, Any]:
    """A headless Service over the pool's network, choosing its pods by `selector` (docs/services.md)."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": name,
            "labels": {"netclaim.dev/network": NETWORK},
            "annotations": {"netclaim.dev/selector": selector},
        },
        "spec": {"clusterIP": "None", "ports": [{"name": "http", "port": PORT}]},
    }


def slice_addresses(cluster: ClusterHandle, namespace: str, service: str) -> set[str]:
    """The addresses a Service's EndpointSlices list."""
    found = kubectl_json(
        cluster, "get", "endpointslices", "-n", namespace, "-l", f"kubernetes.io/service-name={service}"
    )
    return {a for s in found["items"] for e in s.get("endpoints") or [] for a in e["addresses"]}

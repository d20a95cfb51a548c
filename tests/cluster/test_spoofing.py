"""A tenant's pods cannot pass for another tenant's on a secondary network (docs/security.md, "port
security"), on the real cluster over the lan3 NICs (ipn0) of node-1, node-2 and node-4.

The victim's db (node-1) lets in only its client (node-2). Another tenant's pods run with NET_ADMIN (their
namespace admits it, as network functions' namespaces do), one on db's own NIC and one on node-4: they take
the client's address, forge ARP and neighbour advertisements and send router advertisements; neither db nor
a pod no policy selects sees any of it. An address the victim's client releases, asked for by name at once
by the other tenant, reaches it only after the victim's rules and Service let it go. A pod repaired at
Synchronize, after a kill -9 of its agent at its RunPodSandbox, answers no packet before its table is in
place."""

from __future__ import annotations

import ipaddress
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from lightkube import Client
from lightkube.resources.core_v1 import Namespace, Pod, ServiceAccount

from netclaim_lab import agents
from netclaim_lab.cluster import ClusterHandle
from tests.cluster.helpers import apply, exists, in_pod_netns, kubectl_json, running, sandbox_netns
from tests.cluster.ipam import ip_pool, pod_addresses, pod_on, pool_template
from tests.cluster.netpolicy import PORT, Net, network_service, policy, server
from tests.kube import delete, typed, wait_for
from tests.test_port_guard_kernel import FORGE

SUBNET = "10.64.13.0/24"
CLIENT_ADDRESS = "10.64.13.50"  # the client's, by name: the other tenant asks for it once the client is gone
FRESH_ADDRESS = "10.64.13.60"  # the pod repaired at Synchronize, by name: the prober aims at it beforehand
# the client's and the prober's beside it, by name too: a pool address handed at random could be the fresh
# pod's (the prober once took .60, and the fresh pod's prepare was refused: the address was held)
BESIDE_FRESH = ("10.64.13.61", "10.64.13.62")
# and every other pod's beside the client's, by name: db once took .50 at random, and the client's prepare
# was refused (held) until the test timed out
DB_ADDRESS, BYSTANDER_ADDRESS, NEAR_ADDRESS, FAR_ADDRESS = (f"10.64.13.{n}" for n in (51, 52, 53, 54))
DATAGRAMS = 9999  # where the victim's pods take the client's datagrams (allowed beside PORT)
ALLOW_CLIENT = policy(
    "allow-client",
    {
        "podSelector": {"matchLabels": {"app": "db"}},
        "ingress": [
            {
                "from": [{"podSelector": {"matchLabels": {"role": "client"}}}],
                "ports": [{"port": PORT}, {"protocol": "UDP", "port": DATAGRAMS}],
            }
        ],
    },
)
# what a pod's datagram listener saw: each datagram's payload and source, until the one saying "end" (at
# most 120 s): a listener that stopped early would see nothing of what came later. It answers "ready?"
# (READY's question) without counting it, so no datagram is sent before it is bound.
LISTEN = rf"""
import socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(("0.0.0.0", {DATAGRAMS})); s.settimeout(120)
try:
    while True:
        data, (source, port) = s.recvfrom(100)
        if data == b"ready?":
            s.sendto(b"ready", (source, port))
        elif data == b"end":
            break
        else:
            print(data.decode(), source, flush=True)
except TimeoutError:
    print("no end", flush=True)
"""
# asks each listener (argv[2:]) "ready?" from address argv[1] until all have answered (60 s at most);
# prints those that never did
READY = rf"""
import socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind((sys.argv[1], 0)); s.settimeout(0.2)
waiting, deadline = set(sys.argv[2:]), time.monotonic() + 60
while waiting and time.monotonic() < deadline:
    for target in sorted(waiting):
        try:
            s.sendto(b"ready?", (target, {DATAGRAMS}))
        except OSError:  # not reachable yet (its neighbour entry, its route): asked again
            pass
    try:
        while True:
            data, (source, _) = s.recvfrom(100)
            if data == b"ready":
                waiting.discard(source)
    except TimeoutError:
        pass
print(" ".join(sorted(waiting)))
"""
SEND = rf"""
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind((sys.argv[1], 0))
for target in sys.argv[3:]:
    for _ in range(3):
        try:
            s.sendto(sys.argv[2].encode(), (target, {DATAGRAMS}))
        except OSError:
            pass
"""


@pytest.fixture
def pool(cluster: ClusterHandle) -> Iterator[str]:
    apply(cluster, "default", ip_pool("spf", {"subnet": SUBNET, "gateway": "10.64.13.1"}))
    yield "spf"
    cluster.kubectl("delete", "ippool", "spf", "--ignore-not-found")


@pytest.fixture
def attacker_ns(kube: Client) -> Iterator[str]:
    """Another tenant's namespace, which admits NET_ADMIN (Pod Security `privileged`)."""
    name = f"a-{uuid.uuid4().hex[:6]}"
    meta = {"name": name, "labels": {"pod-security.kubernetes.io/enforce": "privileged"}}
    kube.create(typed(Namespace, {"apiVersion": "v1", "kind": "Namespace", "metadata": meta}))
    wait_for(lambda: exists(kube, ServiceAccount, "default", name), 60, "the default ServiceAccount")
    yield name
    delete(kube, Namespace, name)
    wait_for(lambda: not list(kube.list(Pod, namespace=name)), 180, f"pods of {name} gone")


def _with(made: dict[str, Any], template: str, capabilities: tuple[str, ...] = ()) -> dict[str, Any]:
    """The pod on claim template `template`, with `capabilities` added."""
    spec = made["spec"]
    spec["resourceClaims"][0]["resourceClaimTemplateName"] = template
    if capabilities:
        spec["containers"][0]["securityContext"] = {"capabilities": {"add": list(capabilities)}}
    return made


def _logged(name: str, node: str, labels: dict[str, str]) -> dict[str, Any]:
    """A server whose httpd on PORT logs each request's source and path (busybox httpd -f -vv)."""
    made = server(name, node, labels)
    made["spec"]["containers"][0]["command"] = [
        "sh",
        "-c",
        f"mkdir -p /www && echo {name} > /www/index.html && exec httpd -f -vv -p {PORT} -h /www",
    ]
    return made


class Tenants:
    """The pods of the test's namespaces, as a person would poke at them."""

    def __init__(self, cluster: ClusterHandle, *namespaces: str) -> None:
        self.cluster = cluster
        self.nets = {ns: Net(cluster, ns) for ns in namespaces}

    def net(self, pod: str) -> Net:
        return next(net for net in self.nets.values() if pod in net.pods)

    def address(self, pod: str) -> str:
        return self.net(pod).net1[pod]

    def exec(self, pod: str, *command: str) -> str:
        return self.cluster.kubectl("exec", "-n", self.net(pod).ns, pod, "--", *command, timeout=30)

    def mac(self, pod: str) -> str:
        return self.exec(pod, "cat", "/sys/class/net/net1/address").strip()

    def neighbour(self, pod: str, address: str) -> str:
        said = self.exec(pod, "ip", "neigh", "show", address).split()
        return said[said.index("lladdr") + 1] if "lladdr" in said else ""

    def in_netns(self, pod: str, *command: str, timeout: float = 60) -> str:
        """A program of the node's run inside the pod's namespace: what the pod's own NET_RAW could run."""
        spec = self.net(pod).pods[pod]
        node = spec["spec"]["nodeName"]
        netns = sandbox_netns(self.cluster, node, spec["metadata"]["uid"])
        return in_pod_netns(self.cluster, node, netns, *command, timeout=timeout)

    def listening(
        self, targets: dict[str, str], asker: str, source: str
    ) -> Callable[[], dict[str, list[str]]]:
        """Start each target pod's datagram listener (pod → its address) and return once `asker`, from
        `source`, has had each answer (a listener is nsenter and a Python start: on a busy machine it was
        not bound a second later, and saw none of the client's datagrams); the call that is returned
        waits for what each saw."""
        seen: dict[str, list[str]] = {}

        def listen(pod: str) -> None:
            seen[pod] = self.in_netns(pod, sys.executable, "-c", LISTEN).splitlines()

        threads = [threading.Thread(target=listen, args=(pod,)) for pod in targets]
        for thread in threads:
            thread.start()
        silent = self.in_netns(asker, sys.executable, "-c", READY, source, *targets.values(), timeout=90)
        assert not silent.strip(), f"listeners never bound: {silent}"

        def done() -> dict[str, list[str]]:
            for thread in threads:
                thread.join(timeout=60)
            return seen

        return done

    def send(self, pod: str, source: str, payload: str, *targets: str) -> None:
        self.in_netns(pod, sys.executable, "-c", SEND, source, payload, *targets)


def test_no_pod_passes_for_another_on_the_network(
    cluster: ClusterHandle, kube: Client, ns: str, attacker_ns: str, pool: str, figures: Callable[[str], None]
) -> None:
    apply(
        cluster,
        ns,
        pool_template("db-ip", pool, static=[DB_ADDRESS]),
        pool_template("bystander-ip", pool, static=[BYSTANDER_ADDRESS]),
        pool_template("c", pool, static=[CLIENT_ADDRESS]),
        _with(_logged("db", "node-1", {"app": "db"}), "db-ip"),
        _with(_logged("bystander", "node-1", {"app": "other"}), "bystander-ip"),  # no policy selects it
        _with(server("client", "node-2", {"role": "client"}), "c"),
        ALLOW_CLIENT,
    )
    apply(
        cluster,
        attacker_ns,
        pool_template("near-ip", pool, static=[NEAR_ADDRESS]),
        pool_template("far-ip", pool, static=[FAR_ADDRESS]),
        _with(server("near", "node-1", {"role": "client"}), "near-ip", ("NET_ADMIN",)),  # db's own NIC
        _with(server("far", "node-4", {"role": "client"}), "far-ip", ("NET_ADMIN",)),
    )
    wait_for(
        lambda: len(running(kube, ns)) == 3 and len(running(kube, attacker_ns)) == 2, 180, "pods running"
    )
    pods = Tenants(cluster, ns, attacker_ns)
    targets = {pod: pods.address(pod) for pod in ("db", "bystander")}
    client_mac = pods.mac("client")
    victim = pods.nets[ns]
    assert pods.address("client") == CLIENT_ADDRESS
    assert victim.tcp("client", targets["db"]) == "db"  # the client gets in; db learns its MAC
    assert victim.tcp("client", targets["bystander"]) == "bystander"
    for attacker in ("near", "far"):
        assert pods.net(attacker).tcp(attacker, targets["db"]) == ""  # not the victim's client

    done = pods.listening(targets, "client", CLIENT_ADDRESS)
    pods.send("client", CLIENT_ADDRESS, "client", *targets.values())  # the control: the real client
    for attacker in ("near", "far"):
        # NET_ADMIN, by the pod itself: the client's address on its net1
        pods.exec(attacker, "ip", "addr", "add", f"{CLIENT_ADDRESS}/32", "dev", "net1")
        pods.send(attacker, CLIENT_ADDRESS, attacker, *targets.values())
        # NET_RAW: ARP saying the client's address is the attacker's, to all and to each target
        pods.exec(attacker, "sh", "-c", f"arping -U -c 2 -I net1 -s {CLIENT_ADDRESS} {CLIENT_ADDRESS}; true")
        own = pods.mac(attacker)
        for destination in ("ff:ff:ff:ff:ff:ff", *(pods.mac(p) for p in targets)):
            pods.in_netns(
                attacker, sys.executable, "-c", FORGE, "arp", "net1", own, CLIENT_ADDRESS, destination
            )
        pods.in_netns(attacker, sys.executable, "-c", FORGE, "ra", "net1")  # a router advertisement
        pods.exec(attacker, "ip", "addr", "del", f"{CLIENT_ADDRESS}/32", "dev", "net1")
    pods.send("client", CLIENT_ADDRESS, "end", *targets.values())  # after everything the attackers sent
    seen = done()
    assert {pod: sorted(set(lines)) for pod, lines in seen.items()} == {
        pod: [f"client {CLIENT_ADDRESS}"] for pod in targets
    }  # the client's datagrams, and no attacker's
    for pod in targets:
        assert pods.neighbour(pod, CLIENT_ADDRESS) in ("", client_mac), pod  # never an attacker's MAC
        assert "default" not in pods.exec(pod, "ip", "-6", "route", "show", "dev", "net1")
        assert "fd77::" not in pods.exec(pod, "ip", "-6", "addr", "show", "dev", "net1")
    assert victim.tcp("client", targets["db"]) == "db"  # the real client, still in
    figures(
        "spoofing: 2 attackers with NET_ADMIN (on db's NIC, on another node): forged source, ARP, RA; "
        f"{len(targets)} targets (selected by a policy, and not) saw 0 of their datagrams, their "
        "neighbour tables and routes unchanged; the client's datagrams arrived"
    )


def _peers(net: Net, pod: str) -> set[str]:
    """Every address the pod's table names (its allow rules)."""
    ruleset = net.table(pod)
    found = set()
    for word in ruleset.replace("{", " ").replace("}", " ").replace(",", " ").split():
        try:
            found.add(str(ipaddress.ip_address(word)))
        except ValueError:
            continue
    return found


def _listed(cluster: ClusterHandle, ns: str, service: str) -> set[str]:
    slices = kubectl_json(
        cluster, "get", "endpointslices", "-n", ns, "-l", f"kubernetes.io/service-name={service}"
    )
    return {a for s in slices["items"] for e in s.get("endpoints") or [] for a in e["addresses"]}


def test_a_released_address_reaches_another_tenant_only_after_the_rules_and_slices_let_it_go(
    cluster: ClusterHandle, kube: Client, ns: str, attacker_ns: str, pool: str, figures: Callable[[str], None]
) -> None:
    clients = network_service("clients", "role=client")
    apply(
        cluster,
        ns,
        pool_template("db-ip", pool, static=[DB_ADDRESS]),
        pool_template("c", pool, static=[CLIENT_ADDRESS]),
        _with(server("db", "node-1", {"app": "db"}), "db-ip"),
        _with(server("client", "node-2", {"role": "client"}), "c"),
        ALLOW_CLIENT,
        clients,
    )
    wait_for(lambda: len(running(kube, ns)) == 2, 180, "db and the client running")
    victim = Net(cluster, ns)
    wait_for(lambda: CLIENT_ADDRESS in _peers(victim, "db"), 60, "db's table lets the client in")
    wait_for(lambda: _listed(cluster, ns, "clients") == {CLIENT_ADDRESS}, 60, "the Service lists the client")

    released = time.monotonic()
    cluster.kubectl("delete", "pod", "-n", ns, "client", "--wait=false")
    apply(
        cluster,
        attacker_ns,
        pool_template("c", pool, static=[CLIENT_ADDRESS]),
        _with(server("thief", "node-4", {}), "c"),
    )

    def thief_has_it() -> bool:
        return CLIENT_ADDRESS in [
            str(ipaddress.ip_interface(a).ip) for a in pod_addresses(cluster, attacker_ns).get("thief", [])
        ]

    wait_for(thief_has_it, 240, "the other tenant's pod with the released address")
    waited = time.monotonic() - released
    # the moment the other tenant has it: the victim's rules and Service no longer name it
    assert CLIENT_ADDRESS not in _peers(victim, "db")
    assert CLIENT_ADDRESS not in _listed(cluster, ns, "clients")
    # the thief is told why it waits: still held, or quarantined, whichever its kubelet's retries met (a
    # quarantine shorter than a retry's backoff is never seen by it)
    told = cluster.kubectl("get", "events", "-n", attacker_ns, "-o", "jsonpath={.items[*].message}")
    assert f"address {CLIENT_ADDRESS} of IPPool {pool} is held by claim {ns}/" in told or (
        f"address {CLIENT_ADDRESS} of IPPool {pool} was released by claim {ns}/" in told
        and "is quarantined until every policy rule and Service that named it has followed" in told
    ), told
    wait_for(lambda: len(running(kube, attacker_ns)) == 1, 120, "the thief running")
    assert Net(cluster, attacker_ns).tcp("thief", victim.net1["db"]) == ""  # the victim's rule is not its
    figures(f"address reuse: the released address reached the other tenant after {waited:.1f} s (quarantine)")


def test_a_pod_repaired_at_synchronize_answers_nothing_before_its_table(
    cluster: ClusterHandle, kube: Client, ns: str, pool: str, figures: Callable[[str], None]
) -> None:
    """The agent of node-1 kills itself (SIGKILL) at the pod's RunPodSandbox: containerd starts the sandbox
    without it, the CDI gate holds the container, and the agent back repairs it at Synchronize. A prober
    that is no client hammers the pod's address from before it exists: its server logs none of it."""
    prober = pod_on("prober", "p", "node-2")
    prober["metadata"]["labels"] = {"role": "prober"}
    prober["spec"]["containers"][0]["command"] = [
        "sh",
        "-c",
        "while true; do printf 'GET /probe HTTP/1.0\\r\\n\\r\\n' | "
        f"timeout -s KILL 2 nc -w 1 {FRESH_ADDRESS} {PORT}; sleep 0.2; done",
    ]
    apply(
        cluster,
        ns,
        pool_template("c", pool, static=[BESIDE_FRESH[0]]),
        pool_template("p", pool, static=[BESIDE_FRESH[1]]),
        pool_template("f", pool, static=[FRESH_ADDRESS]),
        _with(server("client", "node-2", {"role": "client"}), "c"),
        prober,
        ALLOW_CLIENT,
    )
    wait_for(lambda: len(running(kube, ns)) == 2, 180, "the client and the prober running")
    agents.restart_agent(cluster, "node-1", faults="run-pod-sandbox")
    restarts = agents.restarts(cluster, "node-1")  # of the agent's new pod
    apply(cluster, ns, _with(_logged("fresh", "node-1", {"app": "db"}), "f"))
    wait_for(
        lambda: agents.restarts(cluster, "node-1") > restarts, 120, "the agent killed at the pod's sandbox"
    )
    agents.wait_ready(cluster, ["node-1"], timeout=120)
    wait_for(lambda: len(running(kube, ns)) == 3, 180, "the repaired pod running")
    net = Net(cluster, ns)
    assert net.tcp("client", FRESH_ADDRESS) == "fresh"  # the allowed client gets in: the log works
    time.sleep(3.0)  # the prober keeps trying meanwhile
    logged = cluster.kubectl("logs", "-n", ns, "fresh", timeout=30)
    assert "url:/probe" not in logged and "url:/" in logged, logged[-2000:]
    assert "attaching into a running sandbox" in agents.agent_log(cluster, "node-1")
    assert _peers(net, "fresh") == {net.net1["client"]}  # after the restart, the table the policy says
    figures("repair at Synchronize after kill -9: 0 of the prober's requests answered, before or after")

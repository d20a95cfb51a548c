"""MultiNetworkPolicy on a netclaim network, on the real cluster (docs/services.md): the agent isolates the
selected pods' net1 inside their namespaces with nftables, from rules the controller compiles out of the
policies, the pods' labels and the claims' addresses; the primary network is never touched.

Every check is a real connection: `nc` to a TCP port (busybox httpd answers with the pod's name) and
`ping`, over net1 (the pool's addresses) or eth0 (the pod's primary address)."""

from __future__ import annotations

import ipaddress
import re
import time
from collections.abc import Callable, Iterator

import pytest
from lightkube import Client

from netclaim_lab import agents
from netclaim_lab.cluster import ClusterHandle
from tests.cluster.helpers import apply, in_node, kubectl_json, kubectl_netclaim, running
from tests.cluster.ipam import NETWORK, installed_pool, pool_template
from tests.cluster.netpolicy import ALLOW_CLIENTS, DENY_DB, OTHER_PORT, PORT, SUBNET, Net, policy, server
from tests.kube import wait_for

RULES_LABEL = "netclaim.dev/policy-rules"


@pytest.fixture
def pool(cluster: ClusterHandle) -> Iterator[str]:
    yield from installed_pool(cluster, "pol", SUBNET, "10.64.9.1")


def _rules_maps(cluster: ClusterHandle) -> list[str]:
    found = kubectl_json(cluster, "get", "configmaps", "-n", agents.NAMESPACE, "-l", RULES_LABEL)
    return sorted(c["metadata"]["name"] for c in found["items"])


def _timed(check: Callable[[], bool], what: str) -> float:
    started = time.monotonic()
    wait_for(check, 60, what)
    return time.monotonic() - started


def test_default_deny_on_net1_then_an_allow_rule_follows_labels_and_the_primary_network_stays_open(
    cluster: ClusterHandle, kube: Client, ns: str, pool: str, figures: Callable[[str], None]
) -> None:
    apply(
        cluster,
        ns,
        pool_template("t", pool),
        server("db", "node-1", {"app": "db"}),
        server("client", "node-2", {"role": "client"}),
        server("other", "node-4", {"role": "other"}),
    )
    wait_for(lambda: len(running(kube, ns)) == 3, 180, "db, client and other running")
    net = Net(cluster, ns)
    db = net.net1["db"]
    assert ipaddress.ip_address(db) in ipaddress.ip_network(SUBNET), net.net1
    assert net.tcp("client", db) == "db" and net.pings("client", db)  # open before any policy
    assert net.table("db") == ""

    # default deny ingress on net1 for app=db
    apply(cluster, ns, DENY_DB)
    denied_s = _timed(lambda: net.tcp("client", db) == "", "client cut off from db's net1")
    assert not net.pings("client", db)
    assert net.tcp("other", db) == "" and not net.pings("other", db)
    # the primary network is untouched: the same client reaches db's eth0, port and ping
    assert net.tcp("client", net.primary("db")) == "db" and net.pings("client", net.primary("db"))
    # the other way: db's own connections out of net1 (egress is not isolated) and their replies pass
    assert net.tcp("db", net.net1["client"]) == "client" and net.pings("db", net.net1["client"])
    ruleset = net.table("db")
    assert 'iifname "net1"' in ruleset and "eth0" not in ruleset, ruleset
    assert net.table("client") == ""  # no policy selects it: no table

    # an allow rule for role=client opens exactly PORT, for exactly those pods
    apply(cluster, ns, ALLOW_CLIENTS)
    allowed_s = _timed(lambda: net.tcp("client", db) == "db", "client allowed to db:PORT over net1")
    assert net.tcp("client", db, OTHER_PORT) == "" and not net.pings("client", db)
    assert net.tcp("other", db) == ""
    explained = kubectl_netclaim(cluster, "explain", "pod/db", "-n", ns)
    for name, rules in (("deny-db", 0), ("allow-clients", 1)):
        line = f"policy {ns}/{name} selects it on net1 (network {NETWORK}): ingress isolated, {rules} rule(s)"
        assert line in explained, explained
    assert "policy" not in kubectl_netclaim(cluster, "explain", "pod/other", "-n", ns)

    # a new pod matching the rule is allowed; a relabelled one is cut off
    apply(cluster, ns, server("client-2", "node-4", {"role": "client"}))
    wait_for(lambda: len(running(kube, ns)) == 4, 180, "client-2 running")
    new_s = _timed(lambda: net.tcp("client-2", db) == "db", "the new client allowed")
    cluster.kubectl("label", "pod", "-n", ns, "client", "role=retired", "--overwrite")
    relabelled_s = _timed(lambda: net.tcp("client", db) == "", "the relabelled client cut off")
    assert net.tcp("client-2", db) == "db"

    # deleting the policies restores the open state, and the table goes
    cluster.kubectl("delete", "multi-networkpolicy", "-n", ns, "deny-db", "allow-clients")
    open_s = _timed(lambda: net.tcp("other", db) == "db", "other reaches db once the policies are gone")
    assert net.pings("other", db) and net.tcp("client", db, OTHER_PORT) == "db"
    wait_for(lambda: net.table("db") == "", 30, "db's table deleted")
    wait_for(lambda: _rules_maps(cluster) == [], 30, "no rules ConfigMap left")
    figures(
        f"\npolicy on net1: deny in {denied_s:.1f} s, allow in {allowed_s:.1f} s, a new client in "
        f"{new_s:.1f} s, a relabelled one cut off in {relabelled_s:.1f} s, open again in {open_s:.1f} s"
    )


def test_egress_with_an_ip_block_and_its_except(
    cluster: ClusterHandle, kube: Client, ns: str, pool: str
) -> None:
    apply(
        cluster,
        ns,
        pool_template("t", pool),
        server("db", "node-1", {"app": "db"}),
        server("web", "node-2", {"app": "web"}),
        server("client", "node-4", {"role": "client"}),
    )
    wait_for(lambda: len(running(kube, ns)) == 3, 180, "db, web and client running")
    net = Net(cluster, ns)
    assert net.tcp("client", net.net1["db"]) == "db" and net.tcp("client", net.net1["web"]) == "web"
    egress = policy(
        "client-out",
        {
            "podSelector": {"matchLabels": {"role": "client"}},
            "policyTypes": ["Egress"],
            "egress": [
                {
                    "to": [{"ipBlock": {"cidr": SUBNET, "except": [f"{net.net1['db']}/32"]}}],
                    "ports": [{"protocol": "TCP", "port": PORT}],
                }
            ],
        },
    )
    apply(cluster, ns, egress)
    wait_for(lambda: net.tcp("client", net.net1["db"]) == "", 60, "the except address cut off")
    assert net.tcp("client", net.net1["web"]) == "web"  # in the block, on the port
    assert net.tcp("client", net.net1["web"], OTHER_PORT) == ""  # in the block, another port
    assert not net.pings("client", net.net1["web"])
    assert net.tcp("client", net.primary("db")) == "db"  # eth0 is not ours
    assert net.tcp("web", net.net1["client"]) == "client"  # ingress to the client is not isolated
    ruleset = net.table("client")
    assert 'oifname "net1"' in ruleset and f"ip daddr != {net.net1['db']} tcp dport {PORT}" in ruleset, (
        ruleset
    )


def _peers(ruleset: str) -> set[str]:
    """The addresses a pod's table lets in on net1, on PORT."""
    found = set()
    for line in ruleset.splitlines():
        matched = re.search(r"ip saddr (\{ [^}]* \}|\S+) tcp dport " + str(PORT) + " accept", line)
        if matched:
            found |= {a.strip() for a in matched.group(1).strip("{} ").split(",")}
    return found


def test_after_a_kill_9_while_policies_change_every_pods_table_is_what_the_policies_say(
    cluster: ClusterHandle, kube: Client, ns: str, pool: str
) -> None:
    apply(
        cluster,
        ns,
        pool_template("t", pool),
        server("db-0", "node-1", {"app": "db"}),
        server("db-1", "node-1", {"app": "db"}),
        server("web", "node-1", {"app": "web"}),
        server("client-0", "node-2", {"role": "client"}),
        server("client-1", "node-4", {"role": "client"}),
        ALLOW_CLIENTS,
    )
    wait_for(lambda: len(running(kube, ns)) == 5, 180, "5 pods running")
    net = Net(cluster, ns)
    wait_for(lambda: net.tcp("web", net.net1["db-0"]) == "", 60, "web cut off from db-0")

    # while the agent of node-1 is down (kill -9), the policies and labels change under it
    agents.kill_agent(cluster, "node-1")
    cluster.kubectl("label", "pod", "-n", ns, "client-1", "role=retired", "--overwrite")
    cluster.kubectl("label", "pod", "-n", ns, "web", "role=client", "--overwrite")
    cluster.kubectl("label", "pod", "-n", ns, "db-1", "app=db-old", "--overwrite")
    agents.wait_ready(cluster, ["node-1"], timeout=120)

    # what the policies say now: db-0 lets in client-0 and web on PORT; db-1 and web are selected by none
    wanted = {net.net1["client-0"], net.net1["web"]}
    wait_for(lambda: _peers(net.table("db-0")) == wanted, 60, "db-0's table follows the new labels")
    ruleset = net.table("db-0")
    assert ruleset.count("accept") and "eth0" not in ruleset
    assert net.table("db-1") == "" and net.table("web") == ""
    assert net.tcp("web", net.net1["db-0"]) == "db-0" and net.tcp("client-1", net.net1["db-0"]) == ""
    assert net.tcp("client-1", net.net1["db-1"]) == "db-1"
    assert agents.restarts(cluster, "node-1") >= 1


def test_no_table_is_left_on_any_node_once_the_pods_go(
    cluster: ClusterHandle, kube: Client, ns: str, pool: str
) -> None:
    apply(
        cluster,
        ns,
        pool_template("t", pool),
        server("db", "node-1", {"app": "db"}),
        server("client", "node-2", {"role": "client"}),
        DENY_DB,
    )
    wait_for(lambda: len(running(kube, ns)) == 2, 180, "db and client running")
    net = Net(cluster, ns)
    wait_for(lambda: net.table("db") != "", 60, "db's table")

    def tables_left() -> dict[str, str]:
        """Each node's tables of ours in any network namespace it still has (a sandbox goes a moment after
        its pod object)."""
        every_netns = (
            "for n in /var/run/netns/*; do [ -e $n ] && nsenter --net=$n nft list tables; done; true"
        )
        found = {
            node: in_node(cluster, node, "sh", "-c", every_netns) for node in ("node-1", "node-2", "node-4")
        }
        return {node: listing for node, listing in found.items() if "netclaim" in listing}

    assert list(tables_left()) == ["node-1"]  # the probe sees db's table
    cluster.kubectl("delete", "pods", "-n", ns, "--all", "--wait=true", timeout=120)
    wait_for(lambda: not tables_left(), 60, "no table of ours in any namespace")
    # the policy stays: every node keeps the guards, and no node keeps rules for pods that are gone
    wait_for(lambda: _rules_maps(cluster) == ["netclaim-policy-guards"], 30, "only the guards left")
    cluster.kubectl("delete", "multi-networkpolicy", "-n", ns, "deny-db")
    wait_for(lambda: _rules_maps(cluster) == [], 30, "no rules ConfigMap left")

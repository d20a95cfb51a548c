"""The controller as a control plane, on the real cluster (docs/operating.md, The controller): one tenant's
policies, however large, cost no other tenant anything; a node's rules past one object's bound are split,
and every tenant's rules on that node still follow; a killed leader is replaced by the standby, and nothing
is freed twice, leaked or left behind across the hand-over.

Figures (how long the other tenant waited, how long the hand-over took) are printed, not asserted: the
lab's machine is shared."""

from __future__ import annotations

import json
import random
import re
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from lightkube import Client

from netclaim_lab import agents
from netclaim_lab.cluster import ClusterHandle
from tests.cluster.helpers import apply, controller_metrics, kubectl_json, running
from tests.cluster.ipam import (
    NETWORK,
    allocations,
    installed_pool,
    leak_report,
    pod_addresses,
    pool_template,
)
from tests.cluster.netpolicy import (
    ALLOW_CLIENTS,
    DENY_DB,
    PORT,
    Net,
    network_service,
    policy,
    server,
    slice_addresses,
)
from tests.kube import wait_for

SUBNET = "10.64.13.0/24"
RULES_LABEL = "netclaim.dev/policy-rules"


@pytest.fixture
def pool(cluster: ClusterHandle) -> Iterator[str]:
    yield from installed_pool(cluster, "cp", SUBNET, "10.64.13.1")


def _create(cluster: ClusterHandle, namespace: str, document: dict[str, Any]) -> None:
    """`kubectl create` (apply would keep a copy of a 400 kB policy in an annotation, which is refused)."""
    cluster.kubectl("create", "-n", namespace, "-f", "-", input_text=json.dumps(document, indent=2))


def _wide(name: str, selects: dict[str, str], peer: dict[str, Any]) -> dict[str, Any]:
    """100 rules of 100 peers each: the largest policy netclaim reads (≈ 420 kB as kubectl sends it)."""
    rule = {"from": [peer] * 100, "ports": [{"port": PORT}]}
    return policy(name, {"podSelector": {"matchLabels": selects}, "ingress": [rule] * 100})


def _timed(check: Callable[[], bool], what: str) -> float:
    """Seconds from now to the start of the first check that held: a probe that holds only by failing
    (a connection that nc gives up on after 2 s) is not counted in what it measures."""
    started = time.monotonic()
    held_at: list[float] = []

    def held() -> bool:
        tried = time.monotonic()
        if check():
            held_at.append(tried)
            return True
        return False

    wait_for(held, 120, what)
    return held_at[0] - started


def _the_other_tenant(
    cluster: ClusterHandle, kube: Client, namespace: str, pool: str, beside: tuple[str, int]
) -> Net:
    """The tenant that must not notice: db on node-1 behind a policy letting its client in, a Service over
    db; running, the allow in force, once `beside`'s (namespace, pods) run too."""
    apply(
        cluster,
        namespace,
        pool_template("t", pool),
        server("db", "node-1", {"app": "db"}),
        server("client", "node-2", {"role": "client"}),
        DENY_DB,
        ALLOW_CLIENTS,
        network_service("db", "app=db"),
    )
    wait_for(
        lambda: len(running(kube, namespace)) == 2 and len(running(kube, beside[0])) == beside[1],
        180,
        "pods running",
    )
    other = Net(cluster, namespace)
    wait_for(lambda: other.tcp("client", other.net1["db"]) == "db", 60, "the other tenant's allow in force")
    return other


def _controllers(cluster: ClusterHandle) -> dict[str, tuple[bool, int]]:
    """Each controller pod: (Ready, restarts)."""
    found = {}
    for pod in agents.controller_pods(cluster):
        statuses = (pod.get("status") or {}).get("containerStatuses") or [{}]
        found[pod["metadata"]["name"]] = (
            bool(statuses[0].get("ready")),
            int(statuses[0].get("restartCount", 0)),
        )
    return found


def test_one_tenants_largest_policies_cost_no_other_tenant_its_addresses_endpoints_or_rules(
    cluster: ClusterHandle,
    kube: Client,
    ns: str,
    other_tenant: str,
    pool: str,
    figures: Callable[[str], None],
) -> None:
    """Before: eight such policies took the controller to its memory limit, fourteen OOMKilled it, and one
    of 100 rules x 100 namespaceSelector peers cost 40 CPU-seconds a pass on the loop answering /healthz:
    meanwhile no address freed, no endpoint, every node's rules frozen."""
    apply(
        cluster,
        ns,
        pool_template("t", pool),
        server("solo", "node-4", {"app": "solo"}),
        server("peer", "node-2", {}),
    )
    other = _the_other_tenant(cluster, kube, other_tenant, pool, (ns, 2))
    hostile = Net(cluster, ns)
    assert hostile.tcp("peer", hostile.net1["solo"]) == "solo"
    before = _controllers(cluster)
    assert len(before) == 2 and all(ready for ready, _ in before.values()), before

    for index in range(8):
        _create(cluster, ns, _wide(f"wide-{index}", {"app": "solo"}, {"podSelector": {}}))
    _create(cluster, ns, _wide("every-namespace", {"app": "solo"}, {"namespaceSelector": {}}))
    started = time.monotonic()
    # fail closed: the namespace past its budget has its pods isolated, and is told why on each policy
    isolated_s = _timed(
        lambda: hostile.tcp("peer", hostile.net1["solo"]) == "", "the hostile namespace isolated"
    )

    def told() -> dict[str, str]:
        found = kubectl_json(
            cluster, "get", "events", "-n", ns, "--field-selector", "reason=NetworkPolicyInvalid"
        )
        return {e["involvedObject"]["name"]: e["message"] for e in found["items"] if "budget" in e["message"]}

    wait_for(lambda: len(told()) == 9, 60, "a Warning Event on each of the nine policies")
    assert all("exceed its budget of 10,000 peers" in m and "isolated" in m for m in told().values())
    assert controller_metrics(cluster)["netclaim_policy_namespaces_over_budget"] == 1

    # meanwhile the other tenant: a new pod's pool address, its Service endpoint, a policy change
    apply(cluster, other_tenant, server("db-2", "node-4", {"app": "db"}))
    address_s = _timed(lambda: "db-2" in pod_addresses(cluster, other_tenant), "db-2's pool address")
    other.refresh()
    endpoint_s = _timed(
        lambda: other.net1["db-2"] in slice_addresses(cluster, other_tenant, "db"),
        "db-2 in the Service's slice",
    )
    cluster.kubectl("label", "pod", "-n", other_tenant, "client", "role=retired", "--overwrite")
    revoked_s = _timed(lambda: other.tcp("client", other.net1["db"]) == "", "the relabelled client cut off")

    samples = []
    while time.monotonic() - started < 120:  # two minutes with the policies in place
        samples.append(_controllers(cluster))
        time.sleep(5)
    assert all(s == {name: (True, restarts) for name, (_, restarts) in before.items()} for s in samples), (
        samples
    )
    figures(
        f"\n9 policies of 100 rules x 100 peers ({len(samples)} samples over 2 min: controllers Ready, "
        f"not restarted): their namespace isolated in {isolated_s:.1f} s; the other tenant's new pod had "
        f"its address in {address_s:.1f} s, its endpoint {endpoint_s:.1f} s after, a revoked peer cut off "
        f"in {revoked_s:.1f} s"
    )


def _excepts_policy() -> dict[str, Any]:
    """25 rules x 100 ipBlocks x 10 excepts: each selected pod's rules alone ≈ 450 kB."""
    rules = [
        {
            "from": [
                {
                    "ipBlock": {
                        "cidr": f"10.{100 + r}.{b}.0/24",
                        "except": [f"10.{100 + r}.{b}.{e * 16}/28" for e in range(10)],
                    }
                }
                for b in range(100)
            ]
        }
        for r in range(25)
    ]
    return policy("excepts", {"podSelector": {"matchLabels": {"app": "big"}}, "ingress": rules})


def test_a_nodes_rules_past_one_objects_bound_are_split_and_every_tenants_rules_there_follow(
    cluster: ClusterHandle,
    kube: Client,
    ns: str,
    other_tenant: str,
    pool: str,
    figures: Callable[[str], None],
) -> None:
    """Before: 3 such pods on one node made its rules ConfigMap larger than the API takes (1 MiB): it was
    never written again, so another tenant's revoked allow stayed in force there."""
    apply(
        cluster,
        ns,
        pool_template("t", pool),
        *(server(f"big-{i}", "node-1", {"app": "big"}) for i in range(3)),
    )
    other = _the_other_tenant(cluster, kube, other_tenant, pool, (ns, 3))
    _create(cluster, ns, _excepts_policy())
    big = Net(cluster, ns)
    # the last block's ten excepts in the last rule, as nft shows them once merged (a /25 and a /27)
    last = "ip saddr != { 10.124.99.0-10.124.99.159 }"
    wait_for(lambda: last in big.table("big-2"), 120, "the last rule's excepts in big-2's table")

    parts = kubectl_json(cluster, "get", "configmaps", "-n", agents.NAMESPACE, "-l", f"{RULES_LABEL}=node-1")
    sizes = [len(c["data"]["rules.json"]) for c in parts["items"]]
    assert len(sizes) > 1 and max(sizes) <= 256 * 1024 and sum(sizes) > 1 << 20, sizes

    cluster.kubectl("delete", "multi-networkpolicy", "-n", other_tenant, "allow-clients")
    revoked_s = _timed(
        lambda: other.tcp("client", other.net1["db"]) == "", "the revoked allow gone on node-1"
    )
    apply(cluster, other_tenant, ALLOW_CLIENTS, server("db-2", "node-1", {"app": "db"}))
    wait_for(lambda: len(running(kube, other_tenant)) == 3, 180, "db-2 running")

    def addressed() -> bool:  # the agent writes the claim's status beside the pod's start, not before
        other.refresh()
        return "db-2" in other.net1

    wait_for(addressed, 60, "db-2's address in its claim's status")
    allowed_s = _timed(lambda: other.tcp("client", other.net1["db-2"]) == "db-2", "db-2 gets its allow rules")
    figures(
        f"\nnode-1's rules in {len(sizes)} ConfigMaps ({sum(sizes) / 1024:.0f} KiB, largest "
        f"{max(sizes) / 1024:.0f} KiB): the other tenant's revoked allow gone in {revoked_s:.1f} s, its new "
        f"pod allowed in {allowed_s:.1f} s"
    )


def test_a_killed_leader_is_replaced_by_the_standby_and_churn_leaves_nothing_behind(
    cluster: ClusterHandle, kube: Client, ns: str, pool: str, figures: Callable[[str], None]
) -> None:
    """60 s of pool addresses, Service backends and policy peers coming and going; the leader is killed
    (SIGKILL) 20 s in: its Lease is not given up, so a candidate takes it once it expires (10 s)."""
    apply(
        cluster,
        ns,
        pool_template("t", pool),
        server("db", "node-1", {"app": "db"}),
        DENY_DB,
        ALLOW_CLIENTS,
        network_service("clients", "role=client"),
    )
    wait_for(lambda: len(running(kube, ns)) == 1, 180, "db running")
    leader, holder = agents.controller_leader(cluster), agents.controller_holder(cluster)
    assert leader, "no controller holds the Lease"
    stop = threading.Event()
    made: list[str] = []

    def churn() -> None:
        rounds = random.Random(7)
        index = 0
        while not stop.is_set():
            index += 1
            name = f"c-{index}"
            apply(cluster, ns, server(name, ("node-2", "node-4")[index % 2], {"role": "client"}))
            made.append(name)
            if len(made) > 4:
                gone = made.pop(rounds.randrange(len(made) - 1))
                cluster.kubectl("delete", "pod", "-n", ns, gone, "--wait=false")
            elif len(made) > 2:
                cluster.kubectl("label", "pod", "-n", ns, made[0], "role=other", "--overwrite")
            time.sleep(2)

    worker = threading.Thread(target=churn, daemon=True)
    worker.start()
    time.sleep(20)
    agents.kill_controller(cluster, leader)
    killed = time.monotonic()
    wait_for(lambda: agents.controller_holder(cluster) not in ("", holder), 60, "another candidate leading")
    handover_s = time.monotonic() - killed
    successor = agents.controller_leader(cluster)
    time.sleep(max(0.0, 40 - handover_s))
    stop.set()
    worker.join(60)

    net = Net(cluster, ns)

    def settled() -> bool:
        net.refresh()
        clients = {
            name
            for name, pod in net.pods.items()
            if (pod["metadata"].get("labels") or {}).get("role") == "client"
            and not pod["metadata"].get("deletionTimestamp")
            and name in net.net1
        }
        wanted = {net.net1[name] for name in clients}
        table = set(re.findall(r"\d+\.\d+\.\d+\.\d+", net.table("db")))
        peers_right = wanted <= table and not table & {
            a for n, a in net.net1.items() if n not in clients | {"db"}
        }
        return slice_addresses(cluster, ns, "clients") == wanted and peers_right

    settle_s = _timed(settled, "slices and db's table what the pods say")
    # the addresses of the claims deleted last are freed once their quarantine (15 s) is over
    freed_s = _timed(
        lambda: leak_report(cluster, ns, pool).leaked == 0, "every deleted claim's address freed"
    )
    report = leak_report(cluster, ns, pool)
    assert report.leaked == 0 and report.duplicates == 0 and report.lost == 0, report.line()
    held = [a.address for a in allocations(cluster, pool)]
    assert len(set(held)) == len(held), held
    figures(
        f"\nleader {leader} killed (-9) during churn: {successor} led {handover_s:.1f} s later; slices and "
        f"tables settled {settle_s:.1f} s after the churn, the last addresses freed {freed_s:.1f} s after "
        f"that; {report.line()}; network {NETWORK}"
    )

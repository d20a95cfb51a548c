"""A pod's policy ruleset (nft's JSON) applied by the nftables adapter in a real network namespace (root,
iproute2, nftables): what it lets through net1 and what it drops, the primary interface untouched, the table
gone when nothing is isolated; and, over random tenant policies, that the kernel then holds our table only."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings

from netclaim.adapters import nftables as nft
from netclaim.core.policy import ruleset as rulesets
from netclaim.core.policy.rules import Allow, Direction, NetworkRules, PolicyObject, PortMatch, pod_rules
from netclaim.core.policy.spec import read_policy_spec
from netclaim.errors import ConfigError, KernelError
from tests.unit.test_nft_ruleset import PODS, SPEC

SERVER = """
import socket, sys, threading
def serve(port):
    s = socket.socket(socket.AF_INET6); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0); s.bind(("::", port)); s.listen()
    while True:
        s.accept()[0].close()
for port in (5432, 8080):
    threading.Thread(target=serve, args=(port,), daemon=True).start()
print("up", flush=True)
threading.Event().wait()
"""
CONNECT = """
import socket, sys
family = socket.AF_INET6 if ":" in sys.argv[1] else socket.AF_INET
s = socket.socket(family); s.settimeout(1.0); s.bind((sys.argv[1], 0))
try:
    s.connect((sys.argv[2], int(sys.argv[3]))); print("open")
except OSError:
    print("closed")
"""


def _run(*command: str) -> str:
    return subprocess.run(command, capture_output=True, text=True, check=True).stdout


@pytest.fixture
def pod() -> Iterator[tuple[str, str]]:
    """A pod namespace with net1 (10.9.1.1, fd09::1) and eth0 (10.9.2.1), and a client namespace on the
    other ends (10.9.1.2 and .3, fd09::2; 10.9.2.2), a server on ports 5432 and 8080 in the pod."""
    suffix = os.getpid()
    pod_ns, client_ns = f"ncpol{suffix}", f"nccli{suffix}"
    for command in (
        f"ip netns add {pod_ns}",
        f"ip netns add {client_ns}",
        f"ip -n {pod_ns} link add net1 type veth peer name c1 netns {client_ns}",
        f"ip -n {pod_ns} link add eth0 type veth peer name c2 netns {client_ns}",
        f"ip -n {pod_ns} addr add 10.9.1.1/24 dev net1",
        f"ip -n {pod_ns} addr add fd09::1/64 dev net1 nodad",
        f"ip -n {pod_ns} addr add 10.9.2.1/24 dev eth0",
        f"ip -n {client_ns} addr add 10.9.1.2/24 dev c1",
        f"ip -n {client_ns} addr add 10.9.1.3/24 dev c1",
        f"ip -n {client_ns} addr add fd09::2/64 dev c1 nodad",
        f"ip -n {client_ns} addr add 10.9.2.2/24 dev c2",
        *(
            f"ip -n {ns} link set {link} up"
            for ns, link in (
                (pod_ns, "net1"),
                (pod_ns, "eth0"),
                (pod_ns, "lo"),
                (client_ns, "c1"),
                (client_ns, "c2"),
            )
        ),
    ):
        subprocess.run(command.split(), check=True)
    server = subprocess.Popen(
        ["ip", "netns", "exec", pod_ns, sys.executable, "-c", SERVER], stdout=subprocess.PIPE, text=True
    )
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == "up"
        yield f"/run/netns/{pod_ns}", client_ns
    finally:
        server.kill()
        server.wait()
        server.stdout.close()  # type: ignore[union-attr]
        for ns in (pod_ns, client_ns):
            subprocess.run(["ip", "netns", "delete", ns], check=True)


def _reach(client_ns: str, source: str, target: str, port: int) -> str:
    return _run(
        "ip", "netns", "exec", client_ns, sys.executable, "-c", CONNECT, source, target, str(port)
    ).strip()


def _pings(netns: str, target: str, source: str | None = None) -> bool:
    """One echo answered within a second (busybox-static's ping, which make deps installs)."""
    flag = "-6" if ":" in target else "-4"
    via = ["-I", source] if source else []
    done = subprocess.run(
        ["ip", "netns", "exec", netns, "busybox", "ping", flag, "-c", "1", "-W", "1", *via, target],
        capture_output=True,
        text=True,
    )
    assert "applet not found" not in done.stderr and "exec of" not in done.stderr, done.stderr
    return done.returncode == 0


async def test_only_what_the_policy_allows_reaches_net1_and_eth0_is_untouched(pod: tuple[str, str]) -> None:
    netns, client = pod
    open_before = {port: _reach(client, "10.9.1.3", "10.9.1.1", port) for port in (5432, 8080)}
    assert open_before == {5432: "open", 8080: "open"}
    allows = (Allow(("10.9.1.2/32", "fd09::2/128"), (), (PortMatch("TCP", 5432, 5432),)),)
    await nft.apply(netns, rulesets.ruleset({"net1": NetworkRules(ingress=Direction(allows, ("team-a/p",)))}))
    seen = {
        "allowed peer, allowed port": _reach(client, "10.9.1.2", "10.9.1.1", 5432),
        "allowed peer, other port": _reach(client, "10.9.1.2", "10.9.1.1", 8080),
        "other peer, allowed port": _reach(client, "10.9.1.3", "10.9.1.1", 5432),
        "allowed peer over IPv6": _reach(client, "fd09::2", "fd09::1", 5432),
        "primary interface, any port": _reach(client, "10.9.2.2", "10.9.2.1", 8080),
    }
    assert seen == {
        "allowed peer, allowed port": "open",
        "allowed peer, other port": "closed",
        "other peer, allowed port": "closed",
        "allowed peer over IPv6": "open",  # neighbour discovery passes, or nothing would
        "primary interface, any port": "open",
    }
    assert not _pings(client, "10.9.1.1", "10.9.1.2") and _pings(client, "10.9.2.1", "10.9.2.2")
    shown = await nft.table(netns, rulesets.FAMILY, rulesets.NAME)
    jumps = [o["rule"]["expr"] for o in shown if "rule" in o and o["rule"]["chain"] == "input"]
    assert jumps == [
        [
            {"match": {"op": "==", "left": {"meta": {"key": "iifname"}}, "right": "net1"}},
            {"jump": {"target": "in_0"}},
        ]
    ]
    assert "eth0" not in json.dumps(shown)

    started = time.monotonic()
    await nft.apply(netns, rulesets.ruleset({"net1": NetworkRules()}))  # nothing isolated: the table goes
    assert time.monotonic() - started < nft.TIMEOUT_SECONDS
    assert await nft.table(netns, rulesets.FAMILY, rulesets.NAME) == []
    assert _reach(client, "10.9.1.3", "10.9.1.1", 8080) == "open" and _pings(client, "10.9.1.1", "10.9.1.2")


async def test_egress_and_an_ip_block_with_except(pod: tuple[str, str]) -> None:
    netns, client = pod
    allows = (Allow(("10.9.1.0/24",), ("10.9.1.3/32",)),)
    await nft.apply(
        netns, rulesets.ruleset({"net1": NetworkRules(egress=Direction(allows, ("team-a/out",)))})
    )
    pod_ns = Path(netns).name
    assert _pings(pod_ns, "10.9.1.2")
    assert not _pings(pod_ns, "10.9.1.3")  # the except
    assert not _pings(pod_ns, "fd09::2")  # no IPv6 address allowed
    assert _reach(client, "10.9.1.3", "10.9.1.1", 8080) == "open"  # ingress is not isolated: replies pass


async def test_a_batch_nft_refuses_changes_nothing(pod: tuple[str, str]) -> None:
    netns, _ = pod
    allows = (Allow(("10.9.1.2/32",)),)
    good = rulesets.ruleset({"net1": NetworkRules(ingress=Direction(allows, ("team-a/p",)))})
    await nft.apply(netns, good)
    before = await nft.table(netns, rulesets.FAMILY, rulesets.NAME)
    bad = json.loads(json.dumps(good).replace('"10.9.1.2"', '"10.9.1.999"'))
    with pytest.raises(KernelError, match="exit 1"):
        await nft.apply(netns, bad)
    assert await nft.table(netns, rulesets.FAMILY, rulesets.NAME) == before


def test_random_tenant_policies_leave_the_kernel_with_our_table_and_chains_only(pod: tuple[str, str]) -> None:
    """The renderer's property (tests/unit/test_nft_ruleset.py), held against nft and the kernel: each
    accepted policy's batch applies, and `nft list ruleset` then shows table inet netclaim alone, with our
    chains alone."""
    netns, _ = pod
    applied = 0

    @settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
    @given(spec=SPEC)
    def applies_ours(spec: dict[str, Any]) -> None:
        nonlocal applied
        try:
            policy = PolicyObject("team-a", "p", ("lan3",), read_policy_spec(spec, "p"))
        except ConfigError:
            return
        for rules in pod_rules([policy], PODS, {"team-a": {}, "team-b": {"a": "b"}}).values():
            asyncio.run(
                nft.apply(netns, rulesets.ruleset({f"net{i}": r for i, r in enumerate(rules.values(), 1)}))
            )
            listed = json.loads(_run("nsenter", f"--net={netns}", "nft", "-j", "list", "ruleset"))
            objects = [o for o in listed["nftables"] if "metainfo" not in o]
            assert {(o["table"]["family"], o["table"]["name"]) for o in objects if "table" in o} == {
                ("inet", "netclaim")
            }
            chains = {o["chain"]["name"] for o in objects if "chain" in o}
            assert chains <= {"input", "output"} | {f"{d}_{i}" for d in ("in", "out") for i in (0, 1)}, chains
            assert all(
                o[k]["table"] == "netclaim" for o in objects for k in ("chain", "rule", "set") if k in o
            )
            applied += 1

    applies_ours()
    assert applied >= 10, applied

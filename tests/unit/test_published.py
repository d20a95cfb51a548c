"""Which addresses the controller publishes as endpoints and policy peers (netclaim.core.ipam.published): a
pool's only through the claim's own IPAllocation, a tenant range's only if no other namespace reports it."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from netclaim.core.ipam.ippool import IPPool
from netclaim.core.ipam.published import Contested, PublishedAddresses
from netclaim.core.objects import Claim, IPAllocation
from tests.unit.fakes import SAMPLE_DRIVER, sample_claim

POOL = IPPool.from_api(
    {"metadata": {"name": "lan3"}, "spec": {"network": "lan3", "ranges": [{"subnet": "10.3.0.0/24"}]}}
)


def _claim(name: str, *ips: str, namespace: str = "team-a", network: str = "lan3") -> Claim:
    entry: dict[str, Any] = {
        "driver": SAMPLE_DRIVER,
        "conditions": [{"type": "Ready", "status": "True"}],
        "networkData": {"interfaceName": "net1", "ips": list(ips)},
        "data": {"netclaim.dev/network": network},
    }
    claim = sample_claim((), (), name=name, uid=f"{name}-uid", devices_status=(entry,))
    return replace(claim, namespace=namespace)


def _allocation(claim: Claim, address: str) -> IPAllocation:
    return IPAllocation(
        f"lan3.{address}", "u", "lan3", f"{address}/24", claim.namespace, claim.name, claim.uid, "node-1"
    )


def test_a_pool_address_is_published_only_for_the_claim_its_ipallocation_names() -> None:
    owner = _claim("owner", "10.3.0.7/24")
    forged = _claim("forged", "10.3.0.7/24", namespace="team-b")  # a node wrote another's address
    elsewhere = _claim("elsewhere", "10.3.0.9/24", network="lan9")  # in the pool's range, on another network
    published = PublishedAddresses(
        [owner, forged, elsewhere], [_allocation(owner, "10.3.0.7")], [POOL], SAMPLE_DRIVER
    )
    assert published.of(owner) == {"lan3": ("10.3.0.7",)}
    assert published.of(forged) == {} and published.of(elsewhere) == {}
    assert published.contested == ()  # pool addresses are the IPAllocations' to decide


def test_a_tenant_range_address_two_namespaces_report_is_published_for_neither_and_said() -> None:
    victim = _claim("victim", "10.70.0.5/16", "fd70::5/64")
    thief = _claim("thief", "10.70.0.5/16", namespace="team-b")
    sibling = _claim("sibling", "10.70.0.6/16")
    twin = _claim("twin", "10.70.0.6/16")  # the same namespace: a tenant can only confuse itself
    published = PublishedAddresses([victim, thief, sibling, twin], [], [POOL], SAMPLE_DRIVER)
    assert published.of(victim) == {"lan3": ("fd70::5",)} and published.of(thief) == {}
    assert published.of(sibling) == published.of(twin) == {"lan3": ("10.70.0.6",)}
    assert published.contested == (Contested("lan3", "10.70.0.5", ("team-a/victim", "team-b/thief")),)

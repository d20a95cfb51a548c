"""Which addresses the controller publishes as endpoints and policy peers (netclaim.core.ipam.published): a
pool's only through the claim's own IPAllocation, a tenant range's only if no other namespace reports it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from netclaim.controller.mirror import Mirror
from netclaim.core.ipam.ippool import IPPool
from netclaim.core.ipam.published import AddressReports, Contested, PublishedAddresses
from netclaim.core.kubeapi import Listed
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
    published = PublishedAddresses.of_claims(
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
    published = PublishedAddresses.of_claims([victim, thief, sibling, twin], [], [POOL], SAMPLE_DRIVER)
    assert published.of(victim) == {"lan3": ("fd70::5",)} and published.of(thief) == {}
    assert published.of(sibling) == published.of(twin) == {"lan3": ("10.70.0.6",)}
    assert published.contested == (Contested("lan3", "10.70.0.5", ("team-a/victim", "team-b/thief")),)


# --- AddressReports: kept as claims change, the same as gathered afresh --------------------------------

_ADDRESSES = ("10.3.0.7", "10.3.0.8", "10.9.0.1", "10.9.0.2")  # the first two in POOL's range


@st.composite
def _versions(draw: st.DrawFn) -> Claim | None:
    """A claim's next version (None: deleted): which namespace's, which addresses on which networks."""
    if draw(st.booleans()) and draw(st.booleans()):
        return None
    namespace = draw(st.sampled_from(("team-a", "team-b")))
    ips = draw(st.lists(st.sampled_from(_ADDRESSES), max_size=3))
    network = draw(st.sampled_from(("lan3", "lan9")))
    return replace(_claim("", *(f"{ip}/24" for ip in ips), network=network), namespace=namespace)


def _contested_afresh(claims: list[Claim]) -> tuple[Contested, ...]:
    """The rule itself, over every claim: an address outside the pools two namespaces report."""
    reporters: dict[tuple[str, str], set[tuple[str, str]]] = {}
    for claim in claims:
        for network, held in claim.network_addresses(SAMPLE_DRIVER).items():
            for address in held:
                reporters.setdefault((network, address), set()).add((claim.namespace, claim.name))
    return tuple(
        Contested(network, address, tuple(f"{ns}/{n}" for ns, n in sorted(by)))
        for (network, address), by in sorted(reporters.items())
        if len({ns for ns, _ in by}) > 1 and not address.startswith("10.3.0.")
    )


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(("a-uid", "b-uid", "c-uid", "d-uid")), _versions()), max_size=12))
def test_address_reports_kept_through_any_changes_judge_as_all_claims_gathered_afresh(
    changes: list[tuple[str, Claim | None]],
) -> None:
    """Each pass used to gather every claim's addresses afresh (45 MiB at 50,000 claims); the index kept
    across changes must say exactly what that said: the same contested addresses, the same published."""
    reports, current = AddressReports(SAMPLE_DRIVER), dict[str, Claim]()
    for uid, version in changes:
        after = None if version is None else replace(version, uid=uid, name=uid.removesuffix("-uid"))
        reports.change(current.pop(uid, None), after)
        if after is not None:
            current[uid] = after
        published = PublishedAddresses(reports, [], [POOL])
        assert published.contested == _contested_afresh(list(current.values()))
        afresh = PublishedAddresses.of_claims(current.values(), [], [POOL], SAMPLE_DRIVER)
        assert [published.of(c) for c in current.values()] == [afresh.of(c) for c in current.values()]


async def test_a_mirror_listing_again_tells_what_changed_while_its_watch_was_down() -> None:
    """A claim deleted while the watch was down is told as gone (its address no longer contested), one
    changed as changed, one added as added."""
    reports = AddressReports(SAMPLE_DRIVER)
    mirror: Mirror[Claim] = Mirror("claims", lambda c: c.uid, changed=reports.change)
    first = [_claim("a", "10.9.0.1/24"), _claim("b", "10.9.0.1/24", namespace="team-b")]
    second = [replace(first[1], name="b"), _claim("c", "10.9.0.2/24")]

    async def no_changes(since: str | None) -> AsyncIterator[tuple[str, Claim]]:
        return
        yield

    for listed, contested in ((first, ["10.9.0.1"]), (second, [])):

        async def listing(found: list[Claim] = listed) -> Listed[Claim]:
            return Listed(found, "1")

        async for _ in mirror.follow(listing, no_changes):
            pass
        assert [c.address for c in PublishedAddresses(reports, [], []).contested] == contested
    assert sorted(mirror.objects) == ["b-uid", "c-uid"]

"""Which of the addresses claims report the controller publishes: as a Service's endpoints and as policy
peers (netclaim.services, netclaim.netpolicy). Pure: the controller gathers the claims, IPAllocations and
IP pools.

A claim's status is written by the agent of the node the claim is allocated on (admission policy
netclaim-claim-status-own-node), and tenants' own IPAM may take any address of the admin's tenant ranges;
neither is proof that the address is the claim's. So an address a claim reports on a network is published
only when:

- it lies inside an IP pool's range (any pool's): an IPAllocation gives it to that very claim (agents
  create those only in their own node's name, and one address is one object: no two claims hold it);
- else (the claim's own IPAM, in a tenant range): no claim of another namespace reports it on the same
  network. An address two namespaces report is published for neither (`contested`, which the controller
  reports), so a tenant can never publish another tenant's address through its Service or into another
  tenant's allow rules; within one namespace a tenant can only confuse itself.
"""

from __future__ import annotations

import functools
import ipaddress
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from netclaim.core.ipam.ippool import IPPool
from netclaim.core.objects import Claim, IPAllocation

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True)
class Contested:
    """An address of a tenant range that claims of several namespaces report on one network."""

    network: str
    address: str
    claims: tuple[str, ...]  # namespace/name of each


class AddressReports:
    """Which claims report each address on each network, kept as claims come and go (the controller's
    claims mirror tells each change): what a pass reads to judge contested addresses without going over
    every claim of the cluster. At 50,000 claims, gathering it afresh for each pass cost about 45 MiB
    while the pass ran, twice when the Services' and the policies' passes overlapped."""

    def __init__(self, driver: str) -> None:
        self.driver = driver
        # network → address → the claim reporting it, or the claims when more than one do
        self._reporters: dict[str, dict[str, Claim | list[Claim]]] = {}
        self._shared: set[tuple[str, str]] = set()  # (network, address) more than one claim reports

    def change(self, before: Claim | None, after: Claim | None) -> None:
        if before is not None:
            self._remove(before)
        if after is not None:
            self._add(after)

    def _add(self, claim: Claim) -> None:
        for network, held in claim.network_addresses(self.driver).items():
            on_network = self._reporters.setdefault(network, {})
            for address in set(held):
                found = on_network.get(address)
                if found is None:
                    on_network[address] = claim
                    continue
                if isinstance(found, Claim):
                    found = on_network[address] = [found]
                    self._shared.add((network, address))
                found.append(claim)

    def _remove(self, claim: Claim) -> None:
        for network, held in claim.network_addresses(self.driver).items():
            on_network = self._reporters.get(network, {})
            for address in set(held):
                found = on_network.get(address)
                if isinstance(found, Claim):
                    if found.uid == claim.uid:
                        del on_network[address]
                    continue
                if found is None:
                    continue
                left = [c for c in found if c.uid != claim.uid]
                if len(left) > 1:
                    on_network[address] = left
                    continue
                self._shared.discard((network, address))
                if left:
                    on_network[address] = left[0]
                else:
                    del on_network[address]
            if not on_network:
                self._reporters.pop(network, None)

    def contested(self, pooled: Callable[[str], bool]) -> tuple[Contested, ...]:
        """The addresses outside the pools (`pooled`) that claims of more than one namespace report."""
        found = []
        for network, address in sorted(self._shared):
            claims = self._reporters[network][address]
            if isinstance(claims, list) and len({c.namespace for c in claims}) > 1 and not pooled(address):
                names = sorted((c.namespace, c.name) for c in claims)
                found.append(Contested(network, address, tuple(f"{ns}/{n}" for ns, n in names)))
        return tuple(found)


class PublishedAddresses:
    """What may be published as of one moment: the addresses claims report (AddressReports, kept as claims
    change), the pool addresses IPAllocations give, and the pools' ranges."""

    def __init__(
        self, reports: AddressReports, allocations: Iterable[IPAllocation], pools: Iterable[IPPool]
    ) -> None:
        self.driver = reports.driver
        self._given: dict[str, set[str]] = defaultdict(set)  # claim UID → its pool addresses
        for allocation in allocations:
            self._given[allocation.claim_uid].add(str(allocation.interface.ip))
        self._pooled: tuple[IPNetwork, ...] = tuple(r.network for p in pools for r in p.spec.ranges)
        self.contested = reports.contested(self._pool_address)
        self._refused = {(c.network, c.address) for c in self.contested}

    @classmethod
    def of_claims(
        cls,
        claims: Iterable[Claim],
        allocations: Iterable[IPAllocation],
        pools: Iterable[IPPool],
        driver: str,
    ) -> PublishedAddresses:
        """From claims gathered for the occasion (the controller keeps its AddressReports instead)."""
        reports = AddressReports(driver)
        for claim in claims:
            reports.change(None, claim)
        return cls(reports, allocations, pools)

    def _pool_address(self, address: str) -> bool:
        return bool(self._pooled) and _in_any(address, self._pooled)

    def of(self, claim: Claim) -> dict[str, tuple[str, ...]]:
        """Network → the claim's addresses there that may be published, in its interfaces' order."""
        found: dict[str, tuple[str, ...]] = {}
        for network, held in claim.network_addresses(self.driver).items():
            kept = tuple(a for a in held if self._publishes(claim, network, a))
            if kept:
                found[network] = kept
        return found

    def _publishes(self, claim: Claim, network: str, address: str) -> bool:
        if self._pool_address(address):
            return address in self._given.get(claim.uid, ())
        return (network, address) not in self._refused


@functools.lru_cache(maxsize=1 << 17)
def _in_any(address: str, networks: tuple[IPNetwork, ...]) -> bool:
    """Whether the address is in one of the networks (the pools' ranges): kept for the pairs seen last."""
    parsed = ipaddress.ip_address(address)
    return any(parsed in network for network in networks)

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
from collections.abc import Iterable
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


class PublishedAddresses:
    def __init__(
        self,
        claims: Iterable[Claim],
        allocations: Iterable[IPAllocation],
        pools: Iterable[IPPool],
        driver: str,
    ) -> None:
        self.driver = driver
        self._given: dict[str, set[str]] = defaultdict(set)  # claim UID → its pool addresses
        for allocation in allocations:
            self._given[allocation.claim_uid].add(str(allocation.interface.ip))
        self._pooled: tuple[IPNetwork, ...] = tuple(r.network for p in pools for r in p.spec.ranges)
        reporters: dict[tuple[str, str], dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
        # claim UID → the claim and its addresses, read once (for that claim object only: a caller may hold
        # another version of it)
        self._held: dict[str, tuple[Claim, dict[str, tuple[str, ...]]]] = {}
        self._pool_addresses: dict[str, bool] = {}  # address → whether a pool's, judged once
        for claim in claims:
            held_by = claim.network_addresses(driver)
            self._held[claim.uid] = (claim, held_by)
            for network, held in held_by.items():
                for address in held:
                    if not self._pool_address(address):
                        reporters[(network, address)][claim.namespace].append(claim.name)
        self.contested = tuple(
            Contested(network, address, tuple(f"{ns}/{n}" for ns, names in sorted(by.items()) for n in names))
            for (network, address), by in sorted(reporters.items())
            if len(by) > 1
        )
        self._refused = {(c.network, c.address) for c in self.contested}

    def _pool_address(self, address: str) -> bool:
        found = self._pool_addresses.get(address)
        if found is None:
            found = self._pool_addresses[address] = _in_any(address, self._pooled)
        return found

    def of(self, claim: Claim) -> dict[str, tuple[str, ...]]:
        """Network → the claim's addresses there that may be published, in its interfaces' order."""
        found: dict[str, tuple[str, ...]] = {}
        kept_of = self._held.get(claim.uid)
        held_by = (
            kept_of[1]
            if kept_of is not None and kept_of[0] is claim
            else claim.network_addresses(self.driver)
        )
        for network, held in held_by.items():
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

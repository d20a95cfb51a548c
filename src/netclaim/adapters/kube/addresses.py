"""IPPools and IPAllocations, read as JSON without lightkube's decoder: the agent's AddressesApi and the
controller's IPPoolsApi."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

from lightkube.generic_resource import create_global_resource
from lightkube.types import PatchType

from netclaim.adapters.kube.connection import (
    IP_ALLOCATIONS,
    IPPOOLS,
    KubeConnection,
    Unreadable,
    as_data,
    raise_for_status,
    selector,
    translated,
)
from netclaim.core.kubeapi import AddressesApi, IPPoolsApi, Listed
from netclaim.core.names import DRIVER_DOMAIN
from netclaim.core.objects import (
    CLAIM_UID_LABEL,
    POOL_LABEL,
    RELEASED_AT,
    IPAllocation,
    ListItems,
    as_object,
    ippool_problem,
)
from netclaim.errors import ConfigError, GoneError

log = logging.getLogger(__name__)
IPPoolResource = create_global_resource(DRIVER_DOMAIN, "v1alpha1", "IPPool", "ippools")
IPAllocationResource = create_global_resource(DRIVER_DOMAIN, "v1alpha1", "IPAllocation", "ipallocations")


class KubeAddresses(AddressesApi, IPPoolsApi):
    def __init__(self, kube: KubeConnection) -> None:
        self.kube = kube

    async def get_ippool(self, name: str) -> dict[str, Any]:
        found = await self.kube.read(f"IPPool {name}", IPPOOLS.path(name=name))
        problem = ippool_problem(found)
        if problem:
            raise ConfigError(f"IPPool {name}: cannot be read: {problem}")
        return as_object(found)

    async def list_ippools(self, *, cached: bool = False) -> list[dict[str, Any]]:
        params = {"resourceVersion": "0"} if cached else None
        pools, unreadable = await self.kube.read_items("IPPools", IPPOOLS.path(), _pools_of, params)
        self.kube.report_unreadable(IPPOOLS, "", unreadable)
        return pools

    async def write_ippool_status(self, name: str, status: dict[str, Any]) -> None:
        with translated(f"status of IPPool {name}"):
            await self.kube.client.patch(
                IPPoolResource.Status,
                name,
                [{"op": "add", "path": "/status", "value": status}],
                patch_type=PatchType.JSON,
            )

    async def ippool_changes(self) -> AsyncIterator[str]:
        async for kind, _ in self.kube.watch("watch of ippools", IPPOOLS.path()):
            yield kind

    async def list_ip_allocations(
        self, *, pool: str | None = None, claim_uid: str | None = None
    ) -> list[IPAllocation]:
        labels = {k: v for k, v in ((POOL_LABEL, pool), (CLAIM_UID_LABEL, claim_uid)) if v is not None}
        if not labels:
            return (await self.listed_ip_allocations()).items
        return (await self._listed({"labelSelector": selector(labels)})).items

    async def listed_ip_allocations(self) -> Listed[IPAllocation]:
        """Every one of the cluster (the controller's), in pages: as many as pool addresses are held."""
        allocations, unreadable, version = await self.kube.read_pages(
            "IPAllocations", IP_ALLOCATIONS.path(), _allocations_of, IP_ALLOCATIONS.page
        )
        self.kube.report_unreadable(IP_ALLOCATIONS, "", unreadable)
        return Listed(allocations, version)

    async def held_ip_allocations(self, claim_uid: str, not_older_than: str | None) -> Listed[IPAllocation]:
        params = {"labelSelector": selector({CLAIM_UID_LABEL: claim_uid})}
        if not_older_than is not None:
            params |= {"resourceVersion": not_older_than, "resourceVersionMatch": "NotOlderThan"}
        return await self._listed(params)

    async def _listed(self, params: dict[str, str]) -> Listed[IPAllocation]:
        """A pool's or a claim's (the agent's, on the pod's path): one answer."""
        path = IP_ALLOCATIONS.path()
        allocations, unreadable, version = await self.kube.read_items(
            "IPAllocations", path, _versioned, params
        )
        self.kube.report_unreadable(IP_ALLOCATIONS, params.get("labelSelector", ""), unreadable)
        return Listed(allocations, version)

    async def get_ip_allocation(self, name: str) -> IPAllocation:
        what = f"IPAllocation {name}"
        found = await self.kube.read(what, IP_ALLOCATIONS.path(name=name))
        try:
            return IPAllocation.from_api(found)
        except (TypeError, ValueError) as err:
            raise ConfigError(f"{what}: cannot be read: {err}") from None

    async def create_ip_allocation(self, allocation: IPAllocation) -> IPAllocation:
        body = IPAllocationResource.from_dict(allocation.to_api())
        with translated(f"IPAllocation {allocation.name}"):
            created = await self.kube.client.create(body)
        return IPAllocation.from_api(as_data(created))

    async def mark_released(self, allocation: IPAllocation, when: str) -> None:
        patch = {"metadata": {"uid": allocation.uid, "annotations": {RELEASED_AT: when}}}
        path = IP_ALLOCATIONS.path(name=allocation.name)
        headers = {"Content-Type": "application/merge-patch+json"}
        with translated(f"IPAllocation {allocation.name}"):
            raise_for_status(await self.kube.http.request("PATCH", path, json=patch, headers=headers))

    async def delete_ip_allocation(self, allocation: IPAllocation) -> None:
        """Not lightkube's delete(): it sends no body, so no preconditions."""
        options = {"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {"uid": allocation.uid}}
        path = IP_ALLOCATIONS.path(name=allocation.name)
        with contextlib.suppress(GoneError), translated(f"IPAllocation {allocation.name}"):
            raise_for_status(await self.kube.http.request("DELETE", path, json=options))

    async def ip_allocation_changes(
        self, since: str | None = None
    ) -> AsyncIterator[tuple[str, IPAllocation]]:
        async for kind, found in self.kube.watch(
            "watch of ipallocations", IP_ALLOCATIONS.path(), since=since
        ):
            try:
                yield kind, IPAllocation.from_api(found)
            except (TypeError, ValueError) as err:
                log.warning(
                    "IPAllocation cannot be read: it is neither counted as held nor freed",
                    extra={
                        "kind": "IPAllocation",
                        "object": (found.get("metadata") or {}).get("name"),
                        "problem": str(err),
                    },
                )


def _pools_of(listed: ListItems) -> tuple[list[dict[str, Any]], list[Unreadable]]:
    """The IPPools of a list that can be read; the others are not published."""
    effect = "It is not published."
    pools, unreadable = [], [Unreadable(None, problem, effect) for problem in listed.unread]
    for item in listed.items:
        problem = ippool_problem(item)
        if problem:
            unreadable.append(Unreadable(item, problem, effect))
        else:
            pools.append(item)
    return pools, unreadable


def _versioned(listed: ListItems) -> tuple[list[IPAllocation], list[Unreadable], str | None]:
    return (*_allocations_of(listed), listed.version)


def _allocations_of(listed: ListItems) -> tuple[list[IPAllocation], list[Unreadable]]:
    """The IPAllocations of a list that can be read; the others are neither counted as held nor freed."""
    effect = "It is neither counted as held nor freed."
    allocations, unreadable = [], [Unreadable(None, problem, effect) for problem in listed.unread]
    for item in listed.items:
        try:
            allocations.append(IPAllocation.from_api(item))
        except (TypeError, ValueError) as err:
            unreadable.append(Unreadable(item, str(err), effect))
    return allocations, unreadable

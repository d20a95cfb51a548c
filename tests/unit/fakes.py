"""Small fakes of the adapters for unit tests of publish/ and configure/ (the real ones: tests/cluster)."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from typing import Any

from netclaim.adapters.kube import Claim, KubeApi, Slice
from netclaim.errors import ConflictError, GoneError, NetclaimError


@dataclass
class Event:
    namespace: str
    pod: str
    pod_uid: str
    reason: str
    message: str


@dataclass
class FakeKubeApi(KubeApi):
    """An in-memory API server for the calls KubeApi makes; `fail_next` raises errors before calls."""

    claims: dict[tuple[str, str], Claim] = field(default_factory=dict)
    slices: dict[str, dict[str, Any]] = field(default_factory=dict)
    events: list[Event] = field(default_factory=list)
    node_uids: dict[str, str] = field(default_factory=dict)
    calls: list[str] = field(default_factory=list)
    fail_next: list[NetclaimError] = field(default_factory=list)
    slice_events: asyncio.Queue[str] = field(default_factory=asyncio.Queue)
    field_manager: str = "netclaim.dev"

    def _call(self, name: str) -> None:
        self.calls.append(name)
        if self.fail_next:
            raise self.fail_next.pop(0)

    def add_claim(self, claim: Claim) -> None:
        self.claims[(claim.namespace, claim.name)] = claim

    async def close(self) -> None:
        self._call("close")

    async def get_claim(self, namespace: str, name: str) -> Claim:
        self._call("get_claim")
        found = self.claims.get((namespace, name))
        if found is None:
            raise GoneError(f"claim {namespace}/{name}: not found")
        return found

    async def write_claim_devices(self, claim: Claim, devices: list[dict[str, Any]]) -> None:
        self._call("write_claim_devices")
        current = await self.get_claim(claim.namespace, claim.name)
        if current.resource_version != claim.resource_version:
            raise ConflictError(f"claim {claim.namespace}/{claim.name}: test failed")
        self.claims[(claim.namespace, claim.name)] = replace(
            current,
            devices_status=tuple(copy.deepcopy(devices)),
            resource_version=str(int(current.resource_version or "0") + 1),
        )

    async def create_pod_event(
        self, namespace: str, pod: str, pod_uid: str, reason: str, message: str
    ) -> None:
        self._call("create_pod_event")
        self.events.append(Event(namespace, pod, pod_uid, reason, message))

    async def node_uid(self, node: str) -> str:
        self._call("node_uid")
        return self.node_uids.setdefault(node, f"uid-{node}")

    async def list_slices(self, node: str, driver: str) -> list[Slice]:
        self._call("list_slices")
        return [
            Slice(
                name=name,
                pool=body["spec"]["pool"]["name"],
                generation=body["spec"]["pool"]["generation"],
                slice_count=body["spec"]["pool"]["resourceSliceCount"],
                devices=tuple(copy.deepcopy(body["spec"]["devices"])),
            )
            for name, body in sorted(self.slices.items())
            if body["spec"]["nodeName"] == node and body["spec"]["driver"] == driver
        ]

    async def apply_slice(self, body: dict[str, Any]) -> None:
        self._call("apply_slice")
        self.slices[body["metadata"]["name"]] = copy.deepcopy(body)

    async def delete_slice(self, name: str) -> None:
        self._call("delete_slice")
        self.slices.pop(name, None)

    async def slice_changes(self, node: str, driver: str) -> AsyncIterator[str]:
        self._call("slice_changes")
        while True:
            yield await self.slice_events.get()


# --- publish/ fakes: an inventory source, and netlink as netclaim.publish.inventory calls it ---------------

import ipaddress  # noqa: E402

from netclaim.adapters import netlink as real_netlink  # noqa: E402
from netclaim.publish.inventory import NetworkInterface  # noqa: E402


@dataclass
class FakeInventory:
    """An InventorySource in memory: `scan` returns `interfaces` (or raises what `fail_next` holds first);
    each item put on `change_events` is one burst of changes yielded by `changes`."""

    interfaces: list[NetworkInterface] = field(default_factory=list)
    fail_next: list[Exception] = field(default_factory=list)
    change_events: asyncio.Queue[None] = field(default_factory=asyncio.Queue)
    scans: int = 0

    async def scan(self) -> list[NetworkInterface]:
        self.scans += 1
        if self.fail_next:
            raise self.fail_next.pop(0)
        return list(self.interfaces)

    async def changes(self) -> AsyncIterator[None]:
        while True:
            await self.change_events.get()
            yield None


@dataclass
class FakeNetlink:
    """Stands in for the `netlink` module inside netclaim.publish.inventory (monkeypatch it there): links,
    addresses and default routes from these fields; `batches` feeds LinkEvents().next_batch()."""

    Link = real_netlink.Link

    known_links: list[real_netlink.Link] = field(default_factory=list)
    known_addresses: dict[int, list[ipaddress.IPv4Interface | ipaddress.IPv6Interface]] = field(
        default_factory=dict
    )
    default_route: set[int] = field(default_factory=set)
    batches: asyncio.Queue[list[str]] = field(default_factory=asyncio.Queue)
    subscriptions: list[str] = field(default_factory=list)  # "open" / "close" of each LinkEvents

    async def links(self, netns: str | None = None) -> list[real_netlink.Link]:
        return list(self.known_links)

    async def addresses(
        self, netns: str | None = None
    ) -> dict[int, list[ipaddress.IPv4Interface | ipaddress.IPv6Interface]]:
        return {index: list(found) for index, found in self.known_addresses.items()}

    async def default_route_interfaces(self, netns: str | None = None) -> set[int]:
        return set(self.default_route)

    def LinkEvents(self) -> FakeLinkEvents:
        """Named like the class it stands in for: inventory calls `netlink.LinkEvents()`."""
        return FakeLinkEvents(self)


class FakeLinkEvents:
    def __init__(self, netlink: FakeNetlink) -> None:
        self.netlink = netlink

    async def __aenter__(self) -> FakeLinkEvents:
        self.netlink.subscriptions.append("open")
        return self

    async def __aexit__(self, *_: object) -> None:
        self.netlink.subscriptions.append("close")

    async def next_batch(self) -> list[str]:
        return await self.netlink.batches.get()

"""The one module that speaks netlink (pyroute2). Everything else sees plain dataclasses.

Functions take an optional `netns` path: None is the agent's own (the node's) network namespace.
"""

from __future__ import annotations

import contextlib
import ipaddress
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from pyroute2 import AsyncIPRoute

IFF_UP = 0x1
IFF_LOOPBACK = 0x8
_RTMGRP_LINK = 0x1
_RTMGRP_IPV4_IFADDR = 0x10
_RTMGRP_IPV6_IFADDR = 0x100


@dataclass(frozen=True)
class Link:
    index: int
    name: str
    kind: str  # "" for physical devices; veth, macvlan, bridge, bond… for virtual ones
    mac: str
    mtu: int
    up: bool
    loopback: bool
    master: int | None
    operstate: str


@contextlib.asynccontextmanager
async def _ipr(netns: str | None = None) -> AsyncIterator[AsyncIPRoute]:
    ipr = AsyncIPRoute(netns_path=netns) if netns else AsyncIPRoute()
    try:
        yield ipr
    finally:
        ipr.close()


def _link(message: Any) -> Link:
    flags = int(message["flags"])
    master = message.get("master")
    return Link(
        index=int(message["index"]),
        name=str(message.get("ifname")),
        kind=str(message.get_nested("IFLA_LINKINFO", "IFLA_INFO_KIND") or ""),
        mac=str(message.get("address") or "").lower(),
        mtu=int(message.get("mtu") or 0),
        up=bool(flags & IFF_UP),
        loopback=bool(flags & IFF_LOOPBACK),
        master=int(master) if master else None,
        operstate=str(message.get("operstate") or "UNKNOWN"),
    )


async def links(netns: str | None = None) -> list[Link]:
    async with _ipr(netns) as ipr:
        return [_link(m) async for m in await ipr.get_links()]


async def addresses(
    netns: str | None = None,
) -> dict[int, list[ipaddress.IPv4Interface | ipaddress.IPv6Interface]]:
    """Global-scope addresses per interface index, in canonical CIDR form."""
    found: dict[int, list[ipaddress.IPv4Interface | ipaddress.IPv6Interface]] = {}
    async with _ipr(netns) as ipr:
        async for message in await ipr.get_addr():
            if message.get("scope", 0) != 0:
                continue
            address = ipaddress.ip_interface(f"{message.get('address')}/{message['prefixlen']}")
            found.setdefault(int(message["index"]), []).append(address)
    return found


async def default_route_interfaces(netns: str | None = None) -> set[int]:
    async with _ipr(netns) as ipr:
        return {int(r.get("oif")) async for r in await ipr.get_default_routes() if r.get("oif")}


class LinkEvents:
    """Notifications of link and address changes in one namespace (the content is re-read by the caller)."""

    def __init__(self, netns: str | None = None) -> None:
        self._netns = netns
        self._ipr: AsyncIPRoute | None = None

    async def __aenter__(self) -> LinkEvents:
        self._ipr = AsyncIPRoute(netns_path=self._netns) if self._netns else AsyncIPRoute()
        await self._ipr.bind(groups=_RTMGRP_LINK | _RTMGRP_IPV4_IFADDR | _RTMGRP_IPV6_IFADDR)
        return self

    async def __aexit__(self, *_: object) -> None:
        if self._ipr is not None:
            self._ipr.close()

    async def next_batch(self) -> list[str]:
        """Wait for the next burst of events; returns their kinds (RTM_NEWLINK, RTM_DELADDR…)."""
        assert self._ipr is not None, "use as an async context manager"
        return [str(m.get("event")) async for m in self._ipr.get()]

"""The controller's informers (netclaim.controller.informer): a list then a watch kept in memory, indexed,
every difference told to the handlers, a relist after a broken watch included."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest

from netclaim.controller.informer import Informer
from netclaim.core.kubeapi import DELETED, Listed
from netclaim.errors import ApiUnavailableError


@dataclass(frozen=True)
class Thing:
    name: str
    namespace: str
    labels: tuple[str, ...] = ()


@dataclass
class Source:
    """A kind as the API would serve it: `items` listed, then `events` watched until `broken`."""

    items: list[Thing]
    version: str | None = "1"
    events: asyncio.Queue[tuple[str, Thing] | None] = field(default_factory=asyncio.Queue)
    lists: int = 0

    async def listed(self) -> Listed[Thing]:
        self.lists += 1
        return Listed(list(self.items), self.version)

    async def changes(self, since: str | None) -> AsyncIterator[tuple[str, Thing]]:
        while (event := await self.events.get()) is not None:
            yield event
        raise ApiUnavailableError("watch ended (410 Gone)")


def _informer(source: Source) -> tuple[Informer[Thing], list[tuple[Thing | None, Thing | None]]]:
    told: list[tuple[Thing | None, Thing | None]] = []
    informer = Informer(
        "things",
        source,
        key=lambda t: f"{t.namespace}/{t.name}",
        indexes={"namespace": lambda t: [t.namespace], "label": lambda t: t.labels},
    )
    informer.on_change(lambda before, after: told.append((before, after)))
    return informer, told


async def test_the_list_is_kept_indexed_and_each_watched_change_told_once() -> None:
    a, b = Thing("a", "team-a", ("app=db",)), Thing("b", "team-b")
    source = Source([a, b])
    informer, told = _informer(source)
    task = asyncio.create_task(informer.run())
    await asyncio.wait_for(informer.synced.wait(), 5)
    assert told == [(None, a), (None, b)] and informer.indexed("namespace", "team-a") == [a]
    relabelled = Thing("a", "team-a", ("app=web",))
    source.events.put_nowait(("MODIFIED", relabelled))
    source.events.put_nowait(("MODIFIED", relabelled))  # the same again: nothing to tell
    source.events.put_nowait((DELETED, b))
    source.events.put_nowait(None)  # the watch ends once the three are read
    with pytest.raises(ApiUnavailableError):
        await task
    assert told[2:] == [(a, relabelled), (b, None)]
    assert informer.indexed("label", "app=db") == [] and informer.indexed("label", "app=web") == [relabelled]
    assert informer.indexed("namespace", "team-b") == []


async def test_a_relist_after_a_broken_watch_tells_what_changed_meanwhile() -> None:
    a, b, c = Thing("a", "ns"), Thing("b", "ns"), Thing("c", "ns")
    source = Source([a, b])
    informer, told = _informer(source)
    task = asyncio.create_task(informer.run())
    await asyncio.wait_for(informer.synced.wait(), 5)
    source.items = [b, c]  # while the watch was down: a deleted, c added
    source.events.put_nowait(None)
    with pytest.raises(ApiUnavailableError):
        await task
    assert informer.synced.is_set()  # stale by the restart's length, as a store is
    source.events.put_nowait(None)
    with pytest.raises(ApiUnavailableError):
        await informer.run()
    assert source.lists == 2
    assert told[2:] == [(a, None), (None, c)] and sorted(informer.objects) == ["ns/b", "ns/c"]


async def test_a_list_without_a_version_is_kept_but_not_synced() -> None:
    source = Source([Thing("a", "ns")], version=None)
    informer, _ = _informer(source)
    task = asyncio.create_task(informer.run())
    await asyncio.sleep(0.05)
    assert "ns/a" in informer.objects and not informer.synced.is_set()
    task.cancel()

"""netclaim.controller.mirror: a list, then a watch from its resourceVersion, kept in memory; unsynced
whenever what it holds may miss a change."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from netclaim.controller.mirror import Mirror
from netclaim.core.kubeapi import Listed
from netclaim.errors import ApiUnavailableError
from netclaim.runtime.metrics import REGISTRY

Item = tuple[str, int]  # (name, value): "" names an object whose identity could not be read


class _Source:
    def __init__(self, items: list[Item], version: str | None) -> None:
        self.items, self.version = items, version
        self.lists = 0
        self.watched_from: list[str | None] = []
        self.events: asyncio.Queue[tuple[str, Item] | Exception] = asyncio.Queue()

    async def listed(self) -> Listed[Item]:
        self.lists += 1
        return Listed(list(self.items), self.version)

    async def changes(self, since: str | None) -> AsyncIterator[tuple[str, Item]]:
        self.watched_from.append(since)
        while True:
            event = await self.events.get()
            if isinstance(event, Exception):
                raise event
            yield event


def _mirror() -> Mirror[Item]:
    return Mirror("items", lambda item: item[0])


async def test_a_list_then_each_change_from_its_version_is_kept_and_passed_on() -> None:
    source, mirror = _Source([("a", 1), ("b", 1), ("", 9)], "100"), _mirror()
    follow = mirror.follow(source.listed, source.changes)
    for event in [("MODIFIED", ("a", 2)), ("DELETED", ("b", 1)), ("ADDED", ("c", 1)), ("MODIFIED", ("", 5))]:
        source.events.put_nowait(event)
    passed = [await anext(follow) for _ in range(4)]
    assert passed == [("a", 2), ("b", 1), ("c", 1), ("", 5)]  # the unkeepable one too: it may matter
    assert source.watched_from == ["100"]
    assert mirror.synced
    assert mirror.objects == {"a": ("a", 2), "c": ("c", 1)}
    assert REGISTRY.get_sample_value("netclaim_informer_objects", {"kind": "items"}) == 2
    await follow.aclose()
    assert not mirror.synced


async def test_a_watch_that_ends_unsyncs_the_mirror_and_the_next_follow_lists_afresh() -> None:
    source, mirror = _Source([("a", 1)], "100"), _mirror()
    follow = mirror.follow(source.listed, source.changes)
    source.events.put_nowait(("ADDED", ("b", 1)))
    await anext(follow)
    source.events.put_nowait(ApiUnavailableError("410 Gone: too old resource version"))
    with pytest.raises(ApiUnavailableError):
        await anext(follow)
    assert not mirror.synced
    source.items, source.version = [("c", 1)], "200"  # meanwhile a and b went, c came
    again = mirror.follow(source.listed, source.changes)
    source.events.put_nowait(("MODIFIED", ("c", 2)))
    await anext(again)
    assert (source.lists, source.watched_from) == (2, ["100", "200"])
    assert mirror.objects == {"c": ("c", 2)} and mirror.synced
    await again.aclose()


async def test_a_list_without_a_version_leaves_the_mirror_unsynced_but_passes_changes_on() -> None:
    source, mirror = _Source([("a", 1)], None), _mirror()
    follow = mirror.follow(source.listed, source.changes)
    source.events.put_nowait(("ADDED", ("b", 1)))
    assert await anext(follow) == ("b", 1)
    assert source.watched_from == [None] and not mirror.synced
    await follow.aclose()

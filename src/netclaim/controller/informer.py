"""One kind's objects kept in memory by a list, then a watch from the list's resourceVersion (client-go's
shared informer): shared by every reconciler that reads the kind, indexed by what they look objects up by
(namespace, node, labels, pool...), and telling each change to handlers that queue the keys it concerns.
What is kept is a compact projection of each object (what the reconcilers read), never the object.

A watch that ends (the API server's 410 Gone, a lost connection) ends `run`; the supervisor starts it again,
which lists afresh: every difference from what was kept is told to the handlers as changes, so nothing
missed while the watch was down goes unseen. `synced` is set once a list is in (a reconciler waits for it
before its first key), and stays set across restarts: what is kept is then stale by the restart's length,
as an informer's store is. A reconciler that must not act on a stale view (freeing an address) reads the
object itself first.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Generic, TypeVar

from netclaim.core.kubeapi import DELETED, Watched
from netclaim.runtime import metrics

log = logging.getLogger(__name__)
T = TypeVar("T")
Handler = Callable[[T | None, T | None], None]  # (before, after): None before when added, after when gone


class Informer(Generic[T]):
    def __init__(
        self,
        kind: str,
        source: Watched[T],
        key: Callable[[T], str],
        indexes: Mapping[str, Callable[[T], Iterable[str]]] | None = None,
    ) -> None:
        self.kind = kind
        self.source = source
        self.key = key  # "" for an object that cannot be kept (its identity could not be read)
        self.indexes = dict(indexes or {})
        self.objects: dict[str, T] = {}
        self._indexed: dict[str, dict[str, set[str]]] = {name: {} for name in self.indexes}
        self.handlers: list[Handler[T]] = []
        self.synced = asyncio.Event()

    def on_change(self, handler: Handler[T]) -> None:
        self.handlers.append(handler)

    def indexed(self, index: str, value: str) -> list[T]:
        """The objects whose index `index` yields `value`."""
        return [self.objects[key] for key in sorted(self._indexed[index].get(value, ()))]

    def values(self, index: str) -> set[str]:
        """Every value index `index` yields for some object."""
        return set(self._indexed[index])

    def has(self, index: str, value: str) -> bool:
        return value in self._indexed[index]

    def restate(self, key: str, kept: T) -> None:
        """Keep `kept` for `key` instead, telling no handler: the same object, less of it held (or given
        back), its index values unchanged."""
        if key in self.objects:
            self.objects[key] = kept

    async def run(self) -> None:
        """List, tell what differs from what was kept, then follow the watch from the list's version."""
        listed = await self.source.listed()
        found = {key: item for item in listed.items if (key := self.key(item))}
        for key in sorted(set(self.objects) | set(found)):
            self._set(key, found.get(key))
        if listed.version is not None:  # else only a watch from now: a deletion in between could be missed
            self.synced.set()
        async for kind, changed in self.source.changes(listed.version):
            key = self.key(changed)
            if key:
                self._set(key, None if kind == DELETED else changed)

    def _set(self, key: str, after: T | None) -> None:
        before = self.objects.get(key)
        if before == after:
            return
        for name, values in self.indexes.items():
            for value in values(before) if before is not None else ():
                keys = self._indexed[name].get(value)
                if keys is not None:
                    keys.discard(key)
                    if not keys:
                        del self._indexed[name][value]
            for value in values(after) if after is not None else ():
                self._indexed[name].setdefault(value, set()).add(key)
        if after is None:
            self.objects.pop(key, None)
        else:
            self.objects[key] = after
        metrics.INFORMER_OBJECTS.labels(self.kind).set(len(self.objects))
        for handler in self.handlers:
            try:
                handler(before, after)
            except Exception:  # a handler's bug: the others, and the informer, go on
                log.exception("informer handler failed (a bug)", extra={"kind": self.kind, "object": key})

"""One kind's objects as the API server has them, kept in memory by a list and a watch from that list's
resourceVersion (what client-go's reflector keeps in an informer's store), so that the controller's passes
read memory instead of listing every claim and IPAllocation of the cluster each time: at 5,000 claims a
pass of lists cost the controller about a CPU-second and the API server as much again (docs/scale.md).

A watch that ends (the API server's 410 Gone: resumed too late) ends `follow`; the supervisor starts it
again, which lists afresh and replaces what was kept, telling `changed` each difference. Until the first
list is in, the mirror is not `listed`: a reader then lists for itself. From the moment a watch fails until
the next list is in, it is not `synced`: what it keeps is stale by as long, and a reader that would free an
address on it reads that address's claim itself first. A list whose resourceVersion could not be read
leaves the mirror unsynced too: a watch from now could miss a deletion between the list and the watch.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Generic, TypeVar

from netclaim.core.kubeapi import DELETED, Listed
from netclaim.runtime import metrics

T = TypeVar("T")


class Mirror(Generic[T]):
    def __init__(
        self,
        kind: str,
        key: Callable[[T], str],
        project: Callable[[T], T] = lambda found: found,
        changed: Callable[[T | None, T | None], None] = lambda before, after: None,
    ) -> None:
        self.kind = kind  # netclaim_informer_objects' label
        self.key = key  # "" for an object that cannot be kept (its identity could not be read)
        self.project = project  # what is kept of a watched object: what the readers read of it
        self.changed = changed  # told (before, after) of each object kept that changes
        self.objects: dict[str, T] = {}
        self.synced = False
        self.listed = asyncio.Event()  # set once a list is in, and stays set: `objects` is a view, if stale

    async def follow(
        self,
        listed: Callable[[], Awaitable[Listed[T]]],
        changes: Callable[[str | None], AsyncIterator[tuple[str, T]]],
    ) -> AsyncGenerator[T, None]:
        """List (`listed` gives the objects as they are kept: projected as it reads them, page by page),
        then apply each change of the watch from the list's version and yield its object (one that cannot
        be kept as well: a change of it may still concern the reader)."""
        self.synced = False
        try:
            found = await listed()
            kept = {k: o for o in found.items if (k := self.key(o))}
            for key in set(self.objects) | set(kept):
                before, after = self.objects.get(key), kept.get(key)
                if before != after:
                    self.changed(before, after)
            self.objects = kept
            self.synced = found.version is not None
            self.listed.set()
            metrics.INFORMER_OBJECTS.labels(self.kind).set(len(self.objects))
            async for kind, changed in changes(found.version):
                key = self.key(changed)
                if key:
                    after = None if kind == DELETED else self.project(changed)
                    self.changed(self.objects.pop(key, None), after)
                    if after is not None:
                        self.objects[key] = after
                metrics.INFORMER_OBJECTS.labels(self.kind).set(len(self.objects))
                yield changed
        finally:
            self.synced = False

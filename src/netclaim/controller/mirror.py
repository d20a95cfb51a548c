"""One kind's objects as the API server has them, kept in memory by a list and a watch from that list's
resourceVersion (what client-go's reflector keeps in an informer's store), so that the controller's passes
read memory instead of listing every claim and IPAllocation of the cluster each time: at 5,000 claims a
pass of lists cost the controller about a CPU-second and the API server as much again (docs/scale.md).

A watch that ends (the API server's 410 Gone: resumed too late) ends `follow`; the supervisor starts it
again, which lists afresh and replaces what was kept. Until the first list is in, and from the moment a
watch fails until the next list is, the mirror is not `synced`: a reader then lists for itself. A list
whose resourceVersion could not be read (an answer only the slow parser reads) leaves the mirror unsynced
too: a watch from now could miss a deletion between the list and the watch, and a deleted claim that
stays in memory would keep its addresses held.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Generic, TypeVar

from netclaim.core.kubeapi import DELETED, Listed
from netclaim.runtime import metrics

T = TypeVar("T")


class Mirror(Generic[T]):
    def __init__(
        self, kind: str, key: Callable[[T], str], project: Callable[[T], T] = lambda found: found
    ) -> None:
        self.kind = kind  # netclaim_informer_objects' label
        self.key = key  # "" for an object that cannot be kept (its identity could not be read)
        self.project = project  # what is kept of an object: what the readers read of it
        self.objects: dict[str, T] = {}
        self.synced = False

    async def follow(
        self,
        listed: Callable[[], Awaitable[Listed[T]]],
        changes: Callable[[str | None], AsyncIterator[tuple[str, T]]],
    ) -> AsyncGenerator[T, None]:
        """List, then apply each change of the watch from the list's version and yield its object (one
        that cannot be kept as well: a change of it may still concern the reader)."""
        self.synced = False
        try:
            found = await listed()
            self.objects = {k: self.project(o) for o in found.items if (k := self.key(o))}
            self.synced = found.version is not None
            metrics.INFORMER_OBJECTS.labels(self.kind).set(len(self.objects))
            async for kind, changed in changes(found.version):
                key = self.key(changed)
                if key and kind == DELETED:
                    self.objects.pop(key, None)
                elif key:
                    self.objects[key] = self.project(changed)
                metrics.INFORMER_OBJECTS.labels(self.kind).set(len(self.objects))
                yield changed
        finally:
            self.synced = False

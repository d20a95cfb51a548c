"""A kind the controller's informers keep (netclaim.core.kubeapi.Watched): listed in pages of PAGE
objects (a cluster's 50,000 pods are never one answer held whole in memory, as client-go's reflector
pages), then watched from the list's resourceVersion; each object made at once into the projection kept of
it. An object that cannot be made into one is left out and logged, never failing the list or the watch
(the kinds kept, pods and namespaces, are typed by the API server: none is expected)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from typing import Any, Generic, TypeVar

from netclaim.adapters.kube.connection import NAMESPACES, PODS, Kind, KubeConnection
from netclaim.core.kubeapi import Listed, Watched
from netclaim.core.objects import NamespaceLabels, Pod, as_object

log = logging.getLogger(__name__)
P = TypeVar("P")
PAGE = 500


class KubeWatched(Watched[P], Generic[P]):
    def __init__(
        self,
        kube: KubeConnection,
        kind: Kind,
        project: Callable[[dict[str, Any]], P],
        *,
        fields: str | None = None,
        metadata_only: bool = False,
    ) -> None:
        self.kube = kube
        self.kind = kind
        self.project = project
        self.path = kind.path()
        self.fields = fields
        self.metadata_only = metadata_only
        self.what = kind.plural

    def _made(self, found: dict[str, Any]) -> P | None:
        try:
            return self.project(found)
        except (ValueError, TypeError, KeyError, AttributeError) as err:
            meta = as_object(found.get("metadata"))
            log.warning(
                "object left out: it cannot be read",
                extra={
                    "kind": self.kind.name,
                    "object": f"{meta.get('namespace')}/{meta.get('name')}",
                    "error": str(err),
                },
            )
            return None

    async def listed(self) -> Listed[P]:
        items: list[P] = []
        token, version = "", None
        while True:
            params = {"limit": str(PAGE)} | ({"fieldSelector": self.fields} if self.fields else {})
            if token:
                params["continue"] = token
            page = as_object(await self.kube.read(f"list of {self.what}", self.path, params))
            meta = as_object(page.get("metadata"))
            items += [
                made for item in page.get("items") or [] if (made := self._made(as_object(item))) is not None
            ]
            version = meta.get("resourceVersion") if isinstance(meta.get("resourceVersion"), str) else None
            token = str(meta.get("continue") or "")
            if not token:
                return Listed(items, version)

    async def changes(self, since: str | None) -> AsyncIterator[tuple[str, P]]:
        async for kind, found in self.kube.watch(
            f"watch of {self.what}",
            self.path,
            fields=self.fields,
            metadata_only=self.metadata_only,
            since=since,
        ):
            made = self._made(found)
            if made is not None:
                yield kind, made


def pods(kube: KubeConnection) -> KubeWatched[Pod]:
    """Every scheduled pod, as the controller keeps it (Pod.compact)."""
    return KubeWatched(kube, PODS, lambda found: Pod.from_api(found).compact(), fields="spec.nodeName!=")


def namespaces(kube: KubeConnection) -> KubeWatched[NamespaceLabels]:
    """Every namespace's labels (what a policy's namespaceSelector reads): metadata only."""
    return KubeWatched(kube, NAMESPACES, NamespaceLabels.from_api, metadata_only=True)

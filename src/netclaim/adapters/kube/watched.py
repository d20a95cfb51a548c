"""A kind the controller's informers keep (netclaim.core.kubeapi.Watched): listed page by page
(KubeConnection.read_pages: a cluster's 50,000 pods are never one answer held whole in memory), then watched
from the list's resourceVersion; each object made at once into the projection kept of it. An object that
cannot be made into one is left out and logged, never failing the list or the watch (the kinds kept, pods and
namespaces, are typed by the API server: none is expected)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any, Generic, TypeVar

from netclaim.adapters.kube.connection import (
    CONFIG_MAPS,
    ENDPOINT_SLICES,
    NAMESPACES,
    PODS,
    POLICIES,
    SERVICES,
    Kind,
    KubeConnection,
    Unreadable,
    selector,
)
from netclaim.core.kubeapi import Listed, Watched
from netclaim.core.names import NETWORK, POLICY_RULES_LABEL, SLICE_MANAGED_BY
from netclaim.core.objects import ListItems, NamespaceLabels, Pod, as_object
from netclaim.core.policy.distribution import RulesMap
from netclaim.core.policy.rules import PolicySource
from netclaim.errors import NotServedError

log = logging.getLogger(__name__)
P = TypeVar("P")
NOT_SERVED = "not-served"  # a list's version when the kind is not served
NOT_SERVED_RETRY_SECONDS = 30.0


class KubeWatched(Watched[P], Generic[P]):
    def __init__(
        self,
        kube: KubeConnection,
        kind: Kind,
        project: Callable[[dict[str, Any]], P],
        *,
        namespace: str | None = None,
        fields: str | None = None,
        labels: str | None = None,
        metadata_only: bool = False,
        optional: bool = False,
    ) -> None:
        self.kube = kube
        self.kind = kind
        self.project = project
        self.path = kind.path(namespace)
        self.fields = fields
        self.labels = labels
        self.optional = optional  # a kind whose CRD may be absent: then none of it, looked for again later
        self.served = False
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
        """Every object; for an optional kind the cluster has never served here, none. One served before
        and not now (a CRD being replaced, an API server starting) fails the list instead: what is kept
        stays, and is acted on, until it is served again."""
        try:
            found = await self._listed()
        except NotServedError:
            if not self.optional or self.served:
                raise
            return Listed([], NOT_SERVED)
        self.served = True
        return found

    async def _listed(self) -> Listed[P]:
        params = {
            key: value
            for key, value in (("fieldSelector", self.fields), ("labelSelector", self.labels))
            if value
        }
        items, _, version = await self.kube.read_pages(
            f"list of {self.what}", self.path, self._page, self.kind.page, params
        )
        return Listed(items, version)

    def _page(self, listed: ListItems) -> tuple[list[P], list[Unreadable]]:
        for problem in listed.unread:
            log.warning(
                "object left out: it cannot be read", extra={"kind": self.kind.name, "error": problem}
            )
        return [made for item in listed.items if (made := self._made(as_object(item))) is not None], []

    async def changes(self, since: str | None) -> AsyncIterator[tuple[str, P]]:
        if since == NOT_SERVED:  # none to watch: the informer's run ends here, and lists again later
            await asyncio.sleep(NOT_SERVED_RETRY_SECONDS)
            return
        async for kind, found in self.kube.watch(
            f"watch of {self.what}",
            self.path,
            fields=self.fields,
            labels=self.labels,
            metadata_only=self.metadata_only,
            since=since,
        ):
            made = self._made(found)
            if made is not None:
                yield kind, made


def network_policies(kube: KubeConnection) -> KubeWatched[PolicySource]:
    """Every MultiNetworkPolicy, its spec kept as text only when it names a netclaim network; none while the
    cluster does not serve the kind."""
    return KubeWatched(kube, POLICIES, PolicySource.from_api, optional=True)


def rules_maps(kube: KubeConnection, namespace: str) -> KubeWatched[RulesMap]:
    """The rules ConfigMaps in the controller's namespace, each kept as its label and the digest of its
    rules: what tells the controller what is written, without holding it."""
    return KubeWatched(kube, CONFIG_MAPS, RulesMap.from_api, namespace=namespace, labels=POLICY_RULES_LABEL)


def network_services(kube: KubeConnection, project: Callable[[dict[str, Any]], P]) -> KubeWatched[P]:
    """The Services labelled with a netclaim network (one that loses the label is told as deleted)."""
    return KubeWatched(kube, SERVICES, project, labels=NETWORK)


def endpoint_slices(
    kube: KubeConnection, manager: str, project: Callable[[dict[str, Any]], P]
) -> KubeWatched[P]:
    """The EndpointSlices `manager` manages, every namespace's."""
    return KubeWatched(kube, ENDPOINT_SLICES, project, labels=selector({SLICE_MANAGED_BY: manager}))


def pods(kube: KubeConnection) -> KubeWatched[Pod]:
    """Every scheduled pod, as the controller keeps it (Pod.compact)."""
    return KubeWatched(kube, PODS, lambda found: Pod.from_api(found).compact(), fields="spec.nodeName!=")


def namespaces(kube: KubeConnection) -> KubeWatched[NamespaceLabels]:
    """Every namespace's labels (what a policy's namespaceSelector reads): metadata only."""
    return KubeWatched(kube, NAMESPACES, NamespaceLabels.from_api, metadata_only=True)

"""ResourceClaims and the pods that use them: the agent's ClaimsApi and the controller's ClusterClaimsApi."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx2 as httpx
from lightkube.models.core_v1 import ObjectReference
from lightkube.resources.core_v1 import Pod as PodResource
from lightkube.types import PatchType

from netclaim.adapters.kube.connection import (
    CLAIMS,
    KubeConnection,
    Unreadable,
    as_data,
    raise_for_status,
    translated,
)
from netclaim.core.events import EventReason
from netclaim.core.kubeapi import ClaimsApi, ClusterClaimsApi, Listed, PodAnnotationsApi
from netclaim.core.objects import Claim, ListItems, Pod, resource_version_of
from netclaim.errors import ConfigError, ConflictError

# kube-apiserver's whole answer to a JSON Patch that does not apply: a 422 with this message and no details
# (the operation that failed, and why, are not said)
PATCH_NOT_APPLIED = "the server rejected our request due to an error in our request"


def _patch_not_applied(response: httpx.Response) -> bool:
    if response.status_code != 422:
        return False
    try:
        said = json.loads(response.content)
    except ValueError:
        return False
    return isinstance(said, dict) and said.get("message") == PATCH_NOT_APPLIED and not said.get("details")


class KubeClaims(ClaimsApi, PodAnnotationsApi, ClusterClaimsApi):
    """Claims are read as JSON without lightkube's decoder (netclaim.adapters.kube.connection); pods, which
    carry nothing a tenant nests, through lightkube."""

    def __init__(self, kube: KubeConnection) -> None:
        self.kube = kube

    async def get_claim(self, namespace: str, name: str) -> Claim:
        what = f"claim {namespace}/{name}"
        data = await self.kube.read(what, CLAIMS.path(namespace, name))
        try:
            return Claim.from_api(data)
        except ValueError as err:
            raise ConfigError(f"{what}: cannot be read: {err}") from None

    async def list_claims(self, driver: str | None = None) -> list[Claim]:
        return (await self.listed_claims(driver)).items

    async def listed_claims(self, driver: str | None = None) -> Listed[Claim]:
        """Read page by page, each page's claims made (compacted for `driver`, when given) off the event
        loop; what cannot be read reported (claims_of)."""

        def made(listed: ListItems) -> tuple[list[Claim], list[Unreadable]]:
            claims, unreadable = claims_of(listed)
            return ([c.compact(driver) for c in claims] if driver else claims), unreadable

        claims, unreadable, version = await self.kube.read_pages(
            "ResourceClaims", CLAIMS.path(), made, CLAIMS.page
        )
        self.kube.report_unreadable(CLAIMS, "", unreadable)
        return Listed(claims, version)

    async def write_claim_devices(
        self, claim: Claim, driver: str, entries: list[dict[str, Any]]
    ) -> str | None:
        """A JSON Patch guarded by the claim's resourceVersion. Other drivers' entries are never sent back,
        and of the claim the server answers with only metadata.resourceVersion is read, from the start of
        the document: what another driver or a tenant wrote, however deep, cannot make this write fail."""
        patch: list[dict[str, Any]] = [
            {"op": "test", "path": "/metadata/resourceVersion", "value": claim.resource_version}
        ]
        if claim.devices_status:
            ours = [i for i, entry in enumerate(claim.devices_status) if entry.get("driver") == driver]
            patch += [{"op": "remove", "path": f"/status/devices/{i}"} for i in reversed(ours)]
            patch += [{"op": "add", "path": "/status/devices/-", "value": entry} for entry in entries]
        else:
            patch.append({"op": "add", "path": "/status/devices", "value": entries})
        path = CLAIMS.path(claim.namespace, claim.name, "status")
        with translated(f"status of claim {claim.namespace}/{claim.name}"):
            response = await self.kube.http.patch(
                path,
                content=json.dumps(patch).encode(),
                headers={"Content-Type": PatchType.JSON.value},
                params={"fieldManager": self.kube.field_manager},
            )
            if _patch_not_applied(response):
                # the patch's other operations were made from the version its test names: the test failed
                raise ConflictError(
                    f"status of claim {claim.namespace}/{claim.name}: changed since it was read "
                    f"(resourceVersion {claim.resource_version})"
                )
            raise_for_status(response)
        return resource_version_of(response.content)

    async def claim_changes(self, since: str | None = None) -> AsyncIterator[tuple[str, Claim]]:
        async for kind, found in self.kube.watch("watch of resourceclaims", CLAIMS.path(), since=since):
            try:
                yield kind, Claim.from_api(found)
            except ValueError as err:
                yield kind, Claim("", "", "", "", False, (), (), (), (), unreadable=f"cannot be read ({err})")

    async def get_pod(self, namespace: str, name: str) -> Pod:
        with translated(f"pod {namespace}/{name}"):
            found = await self.kube.client.get(PodResource, name, namespace=namespace)
        return Pod.from_api(as_data(found))

    async def write_pod_annotation(self, pod: Pod, key: str, value: str) -> None:
        patch = {"metadata": {"resourceVersion": pod.resource_version, "annotations": {key: value}}}
        with translated(f"pod {pod.namespace}/{pod.name}"):
            await self.kube.client.patch(
                PodResource,
                pod.name,
                patch,
                namespace=pod.namespace,
                patch_type=PatchType.MERGE,
                field_manager=self.kube.field_manager,
            )

    async def create_pod_event(
        self, namespace: str, pod: str, pod_uid: str, reason: EventReason, message: str, warning: bool = True
    ) -> None:
        involved = ObjectReference(kind="Pod", apiVersion="v1", name=pod, namespace=namespace, uid=pod_uid)
        await self.kube.create_event(involved, reason, message, warning)

    async def unschedulable_pods(self) -> list[Pod]:
        with translated("pending pods"):
            pods = [
                Pod.from_api(as_data(p))
                async for p in self.kube.client.list(
                    PodResource, namespace="*", fields={"status.phase": "Pending"}
                )
            ]
        return [p for p in pods if p.unschedulable]


def claims_of(listed: ListItems) -> tuple[list[Claim], list[Unreadable]]:
    """The claims of a list, and what of them cannot be read: a claim read only in part is listed, one
    without a readable identity is skipped. A claim no parser reads fails the list (ConfigError): its UID
    unread, the addresses it holds would look like a deleted claim's. (The API server stores none: it reads
    each opaque config as Go reads JSON, and refuses a number past float64, long before Python's limit on
    an int's digits.)"""
    if listed.unread:
        raise ConfigError(f"ResourceClaims: {len(listed.unread)} cannot be read: {listed.unread[0]}")
    claims, unreadable = [], []
    for item in listed.items:
        try:
            claim = Claim.from_api(item)
        except ValueError as err:
            unreadable.append(Unreadable(item, str(err), "It is skipped."))
            continue
        problems = claim.problems()
        if problems:
            effect = "netclaim reads the rest, and prepares none of its devices with a config it cannot read."
            unreadable.append(Unreadable(item, "; ".join(problems), effect))
        claims.append(claim)
    return claims, unreadable

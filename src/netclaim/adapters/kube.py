"""The Kubernetes API boundary: the only module that imports lightkube (and its HTTP client).

Callers see plain dataclasses and dicts in the API's own JSON shape, and netclaim's errors (see
netclaim.errors): 404 → GoneError; 409 or a failed resourceVersion test → ConflictError; transport
failures, timeouts, 429 and 5xx → ApiUnavailableError; any other refusal → ApiRejectedError.
"""

from __future__ import annotations

import contextlib
import datetime
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2 as httpx
from lightkube import AsyncClient, KubeConfig
from lightkube.core.client import FieldSelector
from lightkube.core.exceptions import ApiError
from lightkube.generic_resource import create_global_resource
from lightkube.models.core_v1 import EventSource, ObjectReference
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.apiextensions_v1 import CustomResourceDefinition
from lightkube.resources.core_v1 import Event, Node, Pod
from lightkube.resources.resource_v1 import (
    DeviceClass,
    ResourceClaim,
    ResourceClaimStatus,
    ResourceClaimTemplate,
    ResourceSlice,
)
from lightkube.types import PatchType

from netclaim.errors import (
    AlreadyExistsError,
    ApiRejectedError,
    ApiUnavailableError,
    ConfigError,
    ConflictError,
    GoneError,
)
from netclaim.names import DRIVER_DOMAIN

SERVICE_ACCOUNT_TOKEN = Path("/var/run/secrets/kubernetes.io/serviceaccount/token")
IPPoolResource = create_global_resource(DRIVER_DOMAIN, "v1alpha1", "IPPool", "ippools")
IPAllocationResource = create_global_resource(DRIVER_DOMAIN, "v1alpha1", "IPAllocation", "ipallocations")
POOL_LABEL = f"{DRIVER_DOMAIN}/pool"
CLAIM_UID_LABEL = f"{DRIVER_DOMAIN}/claim-uid"


@contextlib.contextmanager
def translated(what: str) -> Iterator[None]:
    """Re-raise lightkube's and the HTTP client's errors as netclaim's, naming `what` was asked."""
    try:
        yield
    except ApiError as err:
        code, message = err.status.code, str(err.status.message)
        if code == 404 and not (err.status.details and err.status.details.name):
            # not a named object that is gone: the server does not serve this kind (an upgrade, a skew)
            raise ApiRejectedError(f"{what}: {message} (the API server does not serve it)") from err
        if code == 404 or (code == 422 and "no longer" in message):
            raise GoneError(f"{what}: {message}") from err
        if code == 409 and err.status.reason == "AlreadyExists":
            raise AlreadyExistsError(f"{what}: {message}") from err
        if code == 409 or "test failed" in message or "testing value" in message:
            raise ConflictError(f"{what}: {message}") from err
        if code == 429 or (code is not None and code >= 500):
            raise ApiUnavailableError(f"{what}: {code} {message}") from err
        if code in (401, 403):
            raise ApiRejectedError(f"{what}: {message} (check the RBAC of the identity in use)") from err
        raise ApiRejectedError(f"{what}: {code} {message}") from err
    except httpx.HTTPStatusError as err:  # a watch refused before it streams (lightkube raises it as is)
        code = err.response.status_code
        if code == 404:
            raise GoneError(f"{what}: 404") from err
        if code == 429 or code >= 500:
            raise ApiUnavailableError(f"{what}: {code}") from err
        raise ApiRejectedError(f"{what}: {code}") from err
    except (httpx.TransportError, httpx.TimeoutException, OSError) as err:
        raise ApiUnavailableError(f"{what}: the API server did not answer ({err!r})") from err
    except RecursionError as err:  # the JSON decoder's answer to an object nested thousands deep
        raise ConfigError(f"{what}: nested too deeply to read") from err


@dataclass(frozen=True)
class AllocatedDevice:
    """One entry of a claim's `status.allocation.devices.results`."""

    request: str
    driver: str
    pool: str
    device: str
    share_id: str
    consumed_capacity: dict[str, str]


@dataclass(frozen=True)
class DeviceConfig:
    """One entry of `status.allocation.devices.config` with an opaque config."""

    source: str  # FromClass (the admin's DeviceClass) or FromClaim (the user's claim)
    requests: tuple[str, ...]
    driver: str
    parameters: object


@dataclass(frozen=True)
class PodRef:
    name: str
    uid: str


@dataclass(frozen=True)
class RequestSpec:
    """One request (or subrequest) of a claim's spec: its DeviceClass and CEL selectors."""

    name: str
    device_class: str
    selectors: tuple[str, ...]


def _request_specs(spec: dict[str, Any]) -> tuple[RequestSpec, ...]:
    found = []
    for request in (spec.get("devices") or {}).get("requests") or []:
        name = str(request.get("name", ""))
        options = [(name, request["exactly"])] if request.get("exactly") else []
        options += [(f"{name}/{sub.get('name', '')}", sub) for sub in request.get("firstAvailable") or []]
        for full_name, option in options:
            selectors = tuple(
                str((s.get("cel") or {}).get("expression", "")) for s in option.get("selectors") or []
            )
            found.append(RequestSpec(full_name, str(option.get("deviceClassName", "")), selectors))
    return tuple(found)


@dataclass(frozen=True)
class Claim:
    """A ResourceClaim as netclaim reads it."""

    namespace: str
    name: str
    uid: str
    resource_version: str
    allocated: bool
    results: tuple[AllocatedDevice, ...]
    configs: tuple[DeviceConfig, ...]
    reserved_for: tuple[PodRef, ...]  # pods only
    devices_status: tuple[dict[str, Any], ...]  # status.devices, every driver's, as the API has them
    owned_by_pod: bool = False  # generated from a ResourceClaimTemplate: it lives as long as its pod
    requests: tuple[RequestSpec, ...] = ()

    @classmethod
    def from_api(cls, data: dict[str, Any]) -> Claim:
        meta, status = data.get("metadata") or {}, data.get("status") or {}
        allocation = (status.get("allocation") or {}).get("devices")
        return cls(
            namespace=str(meta.get("namespace", "")),
            name=str(meta.get("name", "")),
            uid=str(meta.get("uid", "")),
            resource_version=str(meta.get("resourceVersion", "")),
            allocated=allocation is not None,
            results=tuple(
                AllocatedDevice(
                    request=str(r["request"]),
                    driver=str(r["driver"]),
                    pool=str(r["pool"]),
                    device=str(r["device"]),
                    share_id=str(r.get("shareID") or ""),
                    consumed_capacity={k: str(v) for k, v in (r.get("consumedCapacity") or {}).items()},
                )
                for r in (allocation or {}).get("results") or []
            ),
            configs=tuple(
                DeviceConfig(
                    source=str(c.get("source", "")),
                    requests=tuple(c.get("requests") or ()),
                    driver=str(c["opaque"].get("driver", "")),
                    parameters=c["opaque"].get("parameters"),
                )
                for c in (allocation or {}).get("config") or []
                if c.get("opaque") is not None
            ),
            reserved_for=tuple(
                PodRef(str(r["name"]), str(r["uid"]))
                for r in status.get("reservedFor") or []
                if r.get("resource") == "pods"
            ),
            devices_status=tuple(status.get("devices") or ()),
            owned_by_pod=any(
                o.get("kind") == "Pod" and o.get("controller") for o in meta.get("ownerReferences") or []
            ),
            requests=_request_specs(data.get("spec") or {}),
        )


@dataclass(frozen=True)
class Slice:
    """A ResourceSlice of a pool, as netclaim compares it."""

    name: str
    pool: str
    generation: int
    slice_count: int
    devices: tuple[dict[str, Any], ...]
    owner_uids: tuple[str, ...] = ()

    @classmethod
    def from_api(cls, data: dict[str, Any]) -> Slice:
        spec = data["spec"]
        return cls(
            name=str(data["metadata"]["name"]),
            pool=str(spec["pool"]["name"]),
            generation=int(spec["pool"]["generation"]),
            slice_count=int(spec["pool"]["resourceSliceCount"]),
            devices=tuple(spec.get("devices") or ()),
            owner_uids=tuple(str(o["uid"]) for o in data["metadata"].get("ownerReferences") or ()),
        )


def _data(obj: Any) -> dict[str, Any]:
    """A lightkube object (typed or generic) as the API's JSON data."""
    return dict(obj.to_dict())


@dataclass(frozen=True)
class IPAllocation:
    """An IPAllocation object: one address of a pool, held by one claim (the object's name is the lock)."""

    name: str
    uid: str
    pool: str
    address: str  # with the prefix length of its range, e.g. 10.10.3.7/24
    claim_namespace: str
    claim_name: str
    claim_uid: str
    node: str

    @classmethod
    def from_api(cls, data: dict[str, Any]) -> IPAllocation:
        meta, spec = data.get("metadata") or {}, data.get("spec") or {}
        claim = spec.get("claim") or {}
        return cls(
            name=str(meta.get("name", "")),
            uid=str(meta.get("uid", "")),
            pool=str(spec.get("pool", "")),
            address=str(spec.get("address", "")),
            claim_namespace=str(claim.get("namespace", "")),
            claim_name=str(claim.get("name", "")),
            claim_uid=str(claim.get("uid", "")),
            node=str(spec.get("node", "")),
        )

    def to_api(self) -> dict[str, Any]:
        return {
            "apiVersion": f"{DRIVER_DOMAIN}/v1alpha1",
            "kind": "IPAllocation",
            "metadata": {
                "name": self.name,
                "labels": {POOL_LABEL: self.pool, CLAIM_UID_LABEL: self.claim_uid},
            },
            "spec": {
                "pool": self.pool,
                "address": self.address,
                "claim": {"namespace": self.claim_namespace, "name": self.claim_name, "uid": self.claim_uid},
                "node": self.node,
            },
        }


class KubeApi:
    """The calls the agent makes, each translated (see the module docstring)."""

    def __init__(self, client: AsyncClient, field_manager: str, config: KubeConfig | None = None) -> None:
        self._client = client
        self.field_manager = field_manager
        self._config = config

    @classmethod
    def connect(cls, kubeconfig: Path | None, field_manager: str) -> KubeApi:
        """From a kubeconfig file, else the pod's ServiceAccount (in-cluster), else $KUBECONFIG."""
        if kubeconfig is not None:
            config = KubeConfig.from_file(kubeconfig)
        elif SERVICE_ACCOUNT_TOKEN.exists():
            config = KubeConfig.from_service_account()
        else:
            config = KubeConfig.from_env()
        # HTTP/2, as client-go: every request is a stream of one connection. Over HTTP/1.1 each
        # concurrent request needs a connection of its own, so the pool (and the agent's descriptors)
        # grew and shrank with how publish, status writes and claim reads happened to overlap.
        client = AsyncClient(
            config, field_manager=field_manager, timeout=httpx.Timeout(10.0, read=60.0), http2=True
        )
        return cls(client, field_manager, config)

    @contextlib.asynccontextmanager
    async def _watching(self) -> AsyncIterator[AsyncClient]:
        """A connection of the watch's own: on the shared HTTP/2 connection, idle watches keep httpcore's
        read lock and a request behind them waits until some watch gets an event (seen with three)."""
        if self._config is None:  # a test's client
            yield self._client
            return
        client = AsyncClient(
            self._config, field_manager=self.field_manager, timeout=httpx.Timeout(10.0, read=60.0)
        )
        try:
            yield client
        finally:
            await client.close()

    async def close(self) -> None:
        await self._client.close()

    async def get_claim(self, namespace: str, name: str) -> Claim:
        with translated(f"claim {namespace}/{name}"):
            claim = await self._client.get(ResourceClaim, name, namespace=namespace)
        return Claim.from_api(claim.to_dict())

    async def write_claim_devices(self, claim: Claim, devices: list[dict[str, Any]]) -> None:
        """Replace `status.devices` of the claim as read (ConflictError when it changed since)."""
        patch = [
            {"op": "test", "path": "/metadata/resourceVersion", "value": claim.resource_version},
            {"op": "add", "path": "/status/devices", "value": devices},
        ]
        with translated(f"status of claim {claim.namespace}/{claim.name}"):
            await self._client.patch(
                ResourceClaimStatus,
                claim.name,
                patch,
                namespace=claim.namespace,
                patch_type=PatchType.JSON,
                field_manager=self.field_manager,
            )

    async def get_pod(self, namespace: str, name: str) -> dict[str, Any]:
        with translated(f"pod {namespace}/{name}"):
            pod = await self._client.get(Pod, name, namespace=namespace)
        return _data(pod)

    async def write_pod_annotation(self, pod: dict[str, Any], key: str, value: str) -> None:
        """Set one annotation on the pod as read (ConflictError when the pod changed since)."""
        meta = pod["metadata"]
        patch = {"metadata": {"resourceVersion": meta["resourceVersion"], "annotations": {key: value}}}
        with translated(f"pod {meta['namespace']}/{meta['name']}"):
            await self._client.patch(
                Pod,
                meta["name"],
                patch,
                namespace=meta["namespace"],
                patch_type=PatchType.MERGE,
                field_manager=self.field_manager,
            )

    async def create_pod_event(
        self, namespace: str, pod: str, pod_uid: str, reason: str, message: str
    ) -> None:
        now = datetime.datetime.now(datetime.UTC).replace(microsecond=0)
        event = Event(
            metadata=ObjectMeta(generateName=f"{pod}.", namespace=namespace),
            involvedObject=ObjectReference(
                kind="Pod", apiVersion="v1", name=pod, namespace=namespace, uid=pod_uid
            ),
            reason=reason,
            message=message[:1024],
            type="Warning",
            source=EventSource(component=self.field_manager),
            firstTimestamp=now,
            lastTimestamp=now,
            count=1,
        )
        with translated(f"event on pod {namespace}/{pod}"):
            await self._client.create(event)

    async def node_uid(self, node: str) -> str:
        with translated(f"node {node}"):
            found = await self._client.get(Node, node)
        assert found.metadata is not None
        return str(found.metadata.uid)

    async def list_slices(self, node: str, driver: str) -> list[Slice]:
        selector: FieldSelector = {"spec.nodeName": node, "spec.driver": driver}
        with translated(f"ResourceSlices of node {node}"):
            found = [s.to_dict() async for s in self._client.list(ResourceSlice, fields=selector)]
        return [Slice.from_api(s) for s in found]

    async def apply_slice(self, body: dict[str, Any]) -> None:
        resource = ResourceSlice.from_dict(body)
        assert isinstance(resource, ResourceSlice)
        with translated(f"ResourceSlice {body['metadata']['name']}"):
            await self._client.apply(resource, field_manager=self.field_manager, force=True)

    async def delete_slice(self, name: str) -> None:
        """Delete a slice; one already gone is fine."""
        with contextlib.suppress(GoneError), translated(f"ResourceSlice {name}"):
            await self._client.delete(ResourceSlice, name)

    async def slice_changes(self, node: str, driver: str) -> AsyncIterator[str]:
        """The event types (ADDED, MODIFIED, DELETED) of this node's slices, as they happen."""
        selector: FieldSelector = {"spec.nodeName": node, "spec.driver": driver}
        async with self._watching() as client:
            with translated(f"watch of node {node}'s ResourceSlices"):
                async for event, _ in client.watch(ResourceSlice, fields=selector):
                    yield str(event)

    async def list_driver_slices(self, driver: str, pool: str) -> list[Slice]:
        """The slices of `driver`'s pool `pool` (a pool of no node: the IP pools' devices)."""
        selector: FieldSelector = {"spec.driver": driver}
        with translated(f"ResourceSlices of driver {driver}"):
            found = [s.to_dict() async for s in self._client.list(ResourceSlice, fields=selector)]
        return [Slice.from_api(s) for s in found if s["spec"]["pool"]["name"] == pool]

    async def crd_uid(self, name: str) -> str:
        """The UID of CustomResourceDefinition `name` (the owner of what exists only with it)."""
        with translated(f"CustomResourceDefinition {name}"):
            found = await self._client.get(CustomResourceDefinition, name)
        assert found.metadata is not None and found.metadata.uid is not None
        return found.metadata.uid

    async def get_ippool(self, name: str) -> dict[str, Any]:
        with translated(f"IPPool {name}"):
            found = await self._client.get(IPPoolResource, name)
        return _data(found)

    async def list_ippools(self) -> list[dict[str, Any]]:
        with translated("IPPools"):
            return [_data(p) async for p in self._client.list(IPPoolResource)]

    async def write_ippool_status(self, name: str, status: dict[str, Any]) -> None:
        with translated(f"status of IPPool {name}"):
            await self._client.patch(
                IPPoolResource.Status,
                name,
                [{"op": "add", "path": "/status", "value": status}],  # the whole status, nothing stale
                patch_type=PatchType.JSON,
            )

    async def list_ip_allocations(
        self, *, pool: str | None = None, claim_uid: str | None = None
    ) -> list[IPAllocation]:
        labels: dict[str, Any] = {
            k: v for k, v in ((POOL_LABEL, pool), (CLAIM_UID_LABEL, claim_uid)) if v is not None
        }
        with translated("IPAllocations"):
            found = [_data(a) async for a in self._client.list(IPAllocationResource, labels=labels or None)]
        return [IPAllocation.from_api(a) for a in found]

    async def get_ip_allocation(self, name: str) -> IPAllocation:
        with translated(f"IPAllocation {name}"):
            found = await self._client.get(IPAllocationResource, name)
        return IPAllocation.from_api(_data(found))

    async def create_ip_allocation(self, allocation: IPAllocation) -> IPAllocation:
        """Take the address: AlreadyExistsError when another claim (or this one, earlier) holds it."""
        body = IPAllocationResource.from_dict(allocation.to_api())
        with translated(f"IPAllocation {allocation.name}"):
            created = await self._client.create(body)
        return IPAllocation.from_api(_data(created))

    async def delete_ip_allocation(self, allocation: IPAllocation) -> None:
        """Release the address, only if the object is still the one read (same UID); gone already is fine."""
        generic: Any = self._client._client  # lightkube's delete() sends no body: no preconditions
        request = generic.prepare_request("delete", res=IPAllocationResource, name=allocation.name)
        request.data = {
            "apiVersion": "v1",
            "kind": "DeleteOptions",
            "preconditions": {"uid": allocation.uid},
        }
        with contextlib.suppress(GoneError), translated(f"IPAllocation {allocation.name}"):
            response = await generic.send(generic.build_adapter_request(request))
            generic.handle_response("delete", response, request)

    async def list_claims(self) -> list[Claim]:
        """Every ResourceClaim of the cluster (the controller's view)."""
        with translated("ResourceClaims"):
            return [
                Claim.from_api(c.to_dict()) async for c in self._client.list(ResourceClaim, namespace="*")
            ]

    async def changes(self, kind: str) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        """(event type, object) of every `kind` (ippools, ipallocations, resourceclaims, pods)."""
        resource: Any = {
            "ippools": IPPoolResource,
            "ipallocations": IPAllocationResource,
            "resourceclaims": ResourceClaim,
            "pods": Pod,
        }[kind]
        namespace = "*" if kind in ("resourceclaims", "pods") else None
        async with self._watching() as client:
            with translated(f"watch of {kind}"):
                async for event, obj in client.watch(resource, namespace=namespace):
                    yield str(event), _data(obj)

    async def unschedulable_pods(self) -> list[dict[str, Any]]:
        """Pending pods the scheduler could not place, with their resource claims."""
        selector: FieldSelector = {"status.phase": "Pending"}
        with translated("pending pods"):
            pods = [p.to_dict() async for p in self._client.list(Pod, namespace="*", fields=selector)]
        return [
            p
            for p in pods
            if any(
                c.get("type") == "PodScheduled" and c.get("reason") == "Unschedulable"
                for c in (p.get("status") or {}).get("conditions") or []
            )
        ]

    async def read_cluster(self, namespace: str | None) -> tuple[dict[str, list[dict[str, Any]]], list[str]]:
        """What `netclaim explain` and `status` read, with read access only: the namespace's pods and claim
        templates (every namespace's when None), and the cluster's claims, DeviceClasses, ResourceSlices,
        nodes and netclaim agent pods. A list the reader may not make is left empty and named in the
        second value (a tenant with a namespace's rights still gets what they may see)."""
        scope = namespace or "*"
        reads: dict[str, Any] = {
            "pods": (Pod, scope, None),
            "claims": (ResourceClaim, "*", None),
            "templates": (ResourceClaimTemplate, scope, None),
            "device_classes": (DeviceClass, None, None),
            "slices": (ResourceSlice, None, None),
            "nodes": (Node, None, None),
            "agent_pods": (Pod, "*", {"app.kubernetes.io/name": "netclaim-agent"}),
        }
        found: dict[str, list[dict[str, Any]]] = {}
        refused = []
        for key, (kind, where, labels) in reads.items():
            what = f"{kind.__name__} ({'netclaim agent pods' if labels else where or 'cluster'})"
            try:
                with translated(f"list {what}"):
                    listing = (
                        self._client.list(kind, namespace=where, labels=labels)
                        if where is not None
                        else self._client.list(kind, labels=labels)
                    )
                    found[key] = [item.to_dict() async for item in listing]
            except ApiRejectedError:
                if key == "claims" and namespace:  # a tenant: the namespace's own claims at least
                    try:
                        with translated(f"list {what}"):
                            found[key] = [
                                c.to_dict()
                                async for c in self._client.list(ResourceClaim, namespace=namespace)
                            ]
                    except ApiRejectedError:
                        found[key] = []
                else:
                    found[key] = []
                refused.append(what)
        return found, refused

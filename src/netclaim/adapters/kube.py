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
from lightkube.models.core_v1 import EventSource, ObjectReference
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Event, Node
from lightkube.resources.resource_v1 import ResourceClaim, ResourceClaimStatus, ResourceSlice
from lightkube.types import PatchType

from netclaim.errors import ApiRejectedError, ApiUnavailableError, ConfigError, ConflictError, GoneError

SERVICE_ACCOUNT_TOKEN = Path("/var/run/secrets/kubernetes.io/serviceaccount/token")


@contextlib.contextmanager
def translated(what: str) -> Iterator[None]:
    """Re-raise lightkube's and the HTTP client's errors as netclaim's, naming `what` was asked."""
    try:
        yield
    except ApiError as err:
        code, message = err.status.code, str(err.status.message)
        if code == 404 or (code == 422 and "no longer" in message):
            raise GoneError(f"{what}: {message}") from err
        if code == 409 or "test failed" in message or "testing value" in message:
            raise ConflictError(f"{what}: {message}") from err
        if code == 429 or (code is not None and code >= 500):
            raise ApiUnavailableError(f"{what}: {code} {message}") from err
        if code in (401, 403):
            raise ApiRejectedError(f"{what}: {message} (check the agent's RBAC)") from err
        raise ApiRejectedError(f"{what}: {code} {message}") from err
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
        )


@dataclass(frozen=True)
class Slice:
    """A ResourceSlice of a pool, as netclaim compares it."""

    name: str
    pool: str
    generation: int
    slice_count: int
    devices: tuple[dict[str, Any], ...]


class KubeApi:
    """The calls the agent makes, each translated (see the module docstring)."""

    def __init__(self, client: AsyncClient, field_manager: str) -> None:
        self._client = client
        self.field_manager = field_manager

    @classmethod
    def connect(cls, kubeconfig: Path | None, field_manager: str) -> KubeApi:
        """From a kubeconfig file, else the pod's ServiceAccount (in-cluster), else $KUBECONFIG."""
        if kubeconfig is not None:
            config = KubeConfig.from_file(kubeconfig)
        elif SERVICE_ACCOUNT_TOKEN.exists():
            config = KubeConfig.from_service_account()
        else:
            config = KubeConfig.from_env()
        # HTTP/2, as client-go: every request and watch is a stream of one connection. Over HTTP/1.1 each
        # concurrent request needs a connection of its own, so the pool (and the agent's descriptors)
        # grew and shrank with how publish, status writes and claim reads happened to overlap.
        client = AsyncClient(
            config, field_manager=field_manager, timeout=httpx.Timeout(10.0, read=60.0), http2=True
        )
        return cls(client, field_manager)

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
        return [
            Slice(
                name=str(s["metadata"]["name"]),
                pool=str(s["spec"]["pool"]["name"]),
                generation=int(s["spec"]["pool"]["generation"]),
                slice_count=int(s["spec"]["pool"]["resourceSliceCount"]),
                devices=tuple(s["spec"].get("devices") or ()),
            )
            for s in found
        ]

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
        with translated(f"watch of node {node}'s ResourceSlices"):
            async for event, _ in self._client.watch(ResourceSlice, fields=selector):
                yield str(event)

"""The Kubernetes API boundary: the only module that imports lightkube (and its HTTP client).

Callers see plain dataclasses and dicts in the API's own JSON shape, and netclaim's errors (see
netclaim.errors): 404 → GoneError; 409 or a failed resourceVersion test → ConflictError; transport
failures, timeouts, 429 and 5xx → ApiUnavailableError; any other refusal → ApiRejectedError.

The kinds that carry free JSON anyone may write (ResourceClaims: opaque configs and device status of
every driver; IPPools; IPAllocations) are read without lightkube's decoder, which recurses once per level
of nesting: the API server stores values nested thousands deep (10 KiB of `[[[[…]]]]`). They are fetched
with an HTTP client lightkube makes from the same kubeconfig and built by read_json (ijson: no recursion);
a free value nested deeper than netclaim reads (MAX_DEPTH) is left out before anything recursive touches
it, and the object says so. Each listed object is read on its own: one that cannot be read is skipped (a
claim: read as far as it can be), with a log line, the `netclaim_unreadable_objects_total` metric and a
Warning Event on it, once per version of the object; it never fails the list. Watches read only each
event's type and resourceVersion, so an object no one can read does not stop them either.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import logging
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx2 as httpx
from lightkube import AsyncClient, KubeConfig
from lightkube.config.client_adapter import AsyncClient as http_client
from lightkube.config.client_adapter import ConnectionParams
from lightkube.core.client import FieldSelector
from lightkube.core.exceptions import ApiError
from lightkube.core.resource import api_info
from lightkube.core.selector import build_selector
from lightkube.generic_resource import create_global_resource
from lightkube.models.core_v1 import EventSource, ObjectReference
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.apiextensions_v1 import CustomResourceDefinition
from lightkube.resources.core_v1 import Event, Node
from lightkube.resources.core_v1 import Pod as PodResource
from lightkube.resources.resource_v1 import (
    DeviceClass,
    ResourceClaim,
    ResourceClaimStatus,
    ResourceClaimTemplate,
    ResourceSlice,
)
from lightkube.types import PatchType

from netclaim import metrics
from netclaim.errors import (
    AlreadyExistsError,
    ApiRejectedError,
    ApiUnavailableError,
    ConfigError,
    ConflictError,
    GoneError,
    NetclaimError,
)
from netclaim.names import DRIVER_DOMAIN
from netclaim.objects import (
    CLAIM_UID_LABEL,
    IPPOOL_API_VERSION,
    POOL_LABEL,
    Claim,
    IPAllocation,
    Pod,
    Slice,
    as_object,
    as_text,
    cut,
    ippool_problem,
    read_json,
)

log = logging.getLogger(__name__)
SERVICE_ACCOUNT_TOKEN = Path("/var/run/secrets/kubernetes.io/serviceaccount/token")
TIMEOUT = httpx.Timeout(10.0, read=60.0)
WATCH_TIMEOUT = httpx.Timeout(10.0, read=None)  # a watch may be quiet for as long as nothing changes
EVENT_MESSAGE_BYTES = 1024
UNREADABLE_REASON = "NetclaimUnreadable"
# object versions remembered as reported unreadable; past it they are forgotten (reported once more)
MAX_REPORTED = 4096
IPPoolResource = create_global_resource(DRIVER_DOMAIN, "v1alpha1", "IPPool", "ippools")
IPAllocationResource = create_global_resource(DRIVER_DOMAIN, "v1alpha1", "IPAllocation", "ipallocations")


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
    except RecursionError as err:  # lightkube's decoder on an object nested thousands deep
        raise ConfigError(f"{what}: nested too deeply to read") from err


def _raise_for_status(response: httpx.Response) -> None:
    """An error answer as lightkube raises it (ApiError with the API's Status), for `translated`."""
    if response.is_error:
        if response.headers.get("Content-Type") == "application/json":
            raise ApiError(request=response.request, response=response)
        response.raise_for_status()


def _path(resource: Any, namespace: str | None = None, name: str | None = None) -> str:
    """The API path of a lightkube resource kind (or subresource: then of object `name`), as lightkube
    builds it: every namespace's unless `namespace`, one object's with `name`."""
    info = api_info(resource)
    kind = info.parent or info.resource
    parts = ["apis", kind.group, kind.version] if kind.group else ["api", kind.version]
    if namespace is not None:
        parts += ["namespaces", namespace]
    parts.append(info.plural)
    parts += [part for part in (name, info.action) if part is not None]
    return "/" + "/".join(parts)


def _data(obj: Any) -> dict[str, Any]:
    """A lightkube object (typed or generic) as the API's JSON data."""
    return dict(obj.to_dict())


class KubeApi:
    """The calls the agent and the controller make, each translated (see the module docstring)."""

    def __init__(
        self, config: KubeConfig, field_manager: str, transport: httpx.AsyncBaseTransport | None = None
    ) -> None:
        self.field_manager = field_manager
        current = config.get()
        if current is None:
            raise ConfigError("kubeconfig: no current context")
        self._config = current
        self._transport = transport  # tests' (httpx.MockTransport): the real clients, no server
        # HTTP/2, as client-go: every request is a stream of one connection. Over HTTP/1.1 each
        # concurrent request needs a connection of its own, so the pool (and the agent's descriptors)
        # grew and shrank with how publish, status writes and claim reads happened to overlap.
        self._client = AsyncClient(
            self._config, field_manager=field_manager, timeout=TIMEOUT, http2=True, transport=transport
        )
        self._http = self._connect(http2=True)
        self._reported: set[tuple[str, str, str]] = set()  # (kind, uid, resourceVersion) reported unreadable

    @classmethod
    def connect(cls, kubeconfig: Path | None, field_manager: str) -> KubeApi:
        """From a kubeconfig file, else the pod's ServiceAccount (in-cluster), else $KUBECONFIG."""
        if kubeconfig is not None:
            return cls(KubeConfig.from_file(kubeconfig), field_manager)
        if SERVICE_ACCOUNT_TOKEN.exists():
            return cls(KubeConfig.from_service_account(), field_manager)
        return cls(KubeConfig.from_env(), field_manager)

    def _connect(self, *, http2: bool) -> httpx.AsyncClient:
        """An HTTP client to the API server as lightkube makes its own (the kubeconfig's server, TLS and
        credentials), for the reads netclaim does without lightkube's decoder (read_json)."""
        # lightkube types `transport` for its sync client; its own AsyncClient passes an async one as well
        params = ConnectionParams(timeout=TIMEOUT, http2=http2, transport=self._transport)  # type: ignore[arg-type]
        return http_client(self._config, params)

    @contextlib.asynccontextmanager
    async def _watching(self) -> AsyncIterator[httpx.AsyncClient]:
        """A connection of the watch's own: on the shared HTTP/2 connection, idle watches keep httpcore's
        read lock and a request behind them waits until some watch gets an event (seen with three)."""
        http = self._connect(http2=False)
        try:
            yield http
        finally:
            await http.aclose()

    async def close(self) -> None:
        await self._client.close()
        await self._http.aclose()

    async def _read(self, what: str, path: str, params: dict[str, str] | None = None) -> Any:
        """GET `path`: its JSON, read without recursion (read_json)."""
        with translated(what):
            response = await self._http.get(path, params=params)
            _raise_for_status(response)
        try:
            return read_json(response.content)
        except ValueError as err:
            raise ApiUnavailableError(f"{what}: the API server's answer is {err}") from None

    async def _list(self, what: str, path: str, params: dict[str, str] | None = None) -> list[Any]:
        """The items of a list, each as the API has it (not read yet: each is read on its own)."""
        items = as_object(await self._read(what, path, params)).get("items") or []
        if not isinstance(items, list):
            raise ApiUnavailableError(f"{what}: the API server's answer has no list of items")
        return items

    async def _unreadable(self, kind: str, api_version: str, item: Any, problem: str, effect: str) -> None:
        """A listed object netclaim cannot read, in whole or in part: a log line, the metric and a Warning
        Event on the object (best effort), once per version of the object."""
        meta = item.get("metadata") if isinstance(item, dict) else None
        known = {
            key: value
            for key, value in (meta.items() if isinstance(meta, dict) else ())
            if key in ("namespace", "name", "uid", "resourceVersion") and isinstance(value, str)
        }
        version = (kind, known.get("uid", known.get("name", "")), known.get("resourceVersion", ""))
        if version in self._reported:
            return
        if len(self._reported) >= MAX_REPORTED:
            self._reported.clear()
        self._reported.add(version)
        metrics.UNREADABLE_OBJECTS.labels(kind).inc()
        where = "/".join(known[k] for k in ("namespace", "name") if k in known) or "(no name)"
        log.warning(
            f"{kind} cannot be read: {effect}", extra={"kind": kind, "object": where, "problem": problem}
        )
        if "name" not in known:
            return  # nothing to hang an Event on
        involved = ObjectReference(
            kind=kind,
            apiVersion=api_version,
            name=known["name"],
            namespace=known.get("namespace"),
            uid=known.get("uid"),
        )
        message = f"netclaim cannot read this {kind}: {problem}. {effect}"
        try:
            await self._create_event(involved, UNREADABLE_REASON, message)
        except NetclaimError as err:
            log.info("could not record an event", extra={"object": where, "error": str(err)})

    async def get_claim(self, namespace: str, name: str) -> Claim:
        """The claim (ConfigError when not even its identity can be read; see Claim.problems)."""
        what = f"claim {namespace}/{name}"
        data = await self._read(what, _path(ResourceClaim, namespace, name))
        try:
            return Claim.from_api(data)
        except ValueError as err:
            raise ConfigError(f"{what}: cannot be read: {err}") from None

    async def list_claims(self) -> list[Claim]:
        """Every ResourceClaim of the cluster (the controller's view). A claim read only in part is listed
        with what was read, and reported; one without a readable identity is skipped, and reported."""
        claims = []
        for item in await self._list("ResourceClaims", _path(ResourceClaim)):
            try:
                claim = Claim.from_api(item)
            except ValueError as err:
                await self._unreadable(
                    "ResourceClaim", "resource.k8s.io/v1", item, str(err), "It is skipped."
                )
                continue
            problems = claim.problems()
            if problems:
                effect = (
                    "netclaim reads the rest, and prepares none of its devices with a config it cannot read."
                )
                await self._unreadable(
                    "ResourceClaim", "resource.k8s.io/v1", item, "; ".join(problems), effect
                )
            claims.append(claim)
        return claims

    async def write_claim_devices(self, claim: Claim, driver: str, entries: list[dict[str, Any]]) -> None:
        """Replace `driver`'s entries of the claim's `status.devices` as read by `entries` (ConflictError
        when the claim changed since). Other drivers' entries stay where they are and are never sent back,
        and the claim the server answers with is not read: what another driver or a tenant wrote, however
        deep, cannot make this write fail."""
        patch: list[dict[str, Any]] = [
            {"op": "test", "path": "/metadata/resourceVersion", "value": claim.resource_version}
        ]
        if claim.devices_status:
            ours = [i for i, entry in enumerate(claim.devices_status) if entry.get("driver") == driver]
            patch += [{"op": "remove", "path": f"/status/devices/{i}"} for i in reversed(ours)]
            patch += [{"op": "add", "path": "/status/devices/-", "value": entry} for entry in entries]
        else:
            patch.append({"op": "add", "path": "/status/devices", "value": entries})
        path = _path(ResourceClaimStatus, claim.namespace, claim.name)
        with translated(f"status of claim {claim.namespace}/{claim.name}"):
            response = await self._http.patch(
                path,
                content=json.dumps(patch).encode(),
                headers={"Content-Type": PatchType.JSON.value},
                params={"fieldManager": self.field_manager},
            )
            _raise_for_status(response)

    async def get_pod(self, namespace: str, name: str) -> Pod:
        with translated(f"pod {namespace}/{name}"):
            found = await self._client.get(PodResource, name, namespace=namespace)
        return Pod.from_api(_data(found))

    async def write_pod_annotation(self, pod: Pod, key: str, value: str) -> None:
        """Set one annotation on the pod as read (ConflictError when the pod changed since)."""
        patch = {"metadata": {"resourceVersion": pod.resource_version, "annotations": {key: value}}}
        with translated(f"pod {pod.namespace}/{pod.name}"):
            await self._client.patch(
                PodResource,
                pod.name,
                patch,
                namespace=pod.namespace,
                patch_type=PatchType.MERGE,
                field_manager=self.field_manager,
            )

    async def create_pod_event(
        self, namespace: str, pod: str, pod_uid: str, reason: str, message: str
    ) -> None:
        involved = ObjectReference(kind="Pod", apiVersion="v1", name=pod, namespace=namespace, uid=pod_uid)
        await self._create_event(involved, reason, message)

    async def _create_event(self, involved: ObjectReference, reason: str, message: str) -> None:
        """A Warning Event on the object; a cluster-scoped object's goes to `default`, where kubectl looks."""
        namespace = involved.namespace or "default"
        now = datetime.datetime.now(datetime.UTC).replace(microsecond=0)
        event = Event(
            # the API appends 5 characters to generateName; a name is at most 253
            metadata=ObjectMeta(generateName=f"{str(involved.name)[:240]}.", namespace=namespace),
            involvedObject=involved,
            reason=reason,
            message=cut(message, EVENT_MESSAGE_BYTES),
            type="Warning",
            source=EventSource(component=self.field_manager),
            firstTimestamp=now,
            lastTimestamp=now,
            count=1,
        )
        with translated(f"event on {str(involved.kind).lower()} {namespace}/{involved.name}"):
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
        selector = build_selector({"spec.nodeName": node, "spec.driver": driver}, for_fields=True)
        path = _path(ResourceSlice)
        async for event in self._watch(f"watch of node {node}'s ResourceSlices", path, selector):
            yield event

    async def _watch(self, what: str, path: str, fields: str | None = None) -> AsyncIterator[str]:
        """The event types of a watch of `path`, on a connection of its own, resumed from the last event's
        resourceVersion when the server ends the stream. Each event is read without recursion and only its
        type and resourceVersion are looked at. An ERROR event (e.g. 410: resumed too late) ends the watch
        with ApiUnavailableError: the caller starts afresh, and reconciles what it may have missed."""
        version: str | None = None
        async with self._watching() as http:
            while True:
                params = {"watch": "true", "fieldSelector": fields, "resourceVersion": version}
                query = {key: value for key, value in params.items() if value is not None}
                with translated(what):
                    async with http.stream("GET", path, params=query, timeout=WATCH_TIMEOUT) as response:
                        if response.is_error:
                            await response.aread()
                            _raise_for_status(response)
                        async for line in response.aiter_lines():
                            if not line.strip():
                                continue
                            try:
                                event = as_object(read_json(line))
                                kind, found = as_text(event.get("type")), as_object(event.get("object"))
                                stamp = as_object(found.get("metadata")).get("resourceVersion")
                            except (ValueError, TypeError) as err:
                                raise ApiUnavailableError(
                                    f"{what}: an event that is not one ({err})"
                                ) from None
                            if kind == "ERROR":
                                status = f"{found.get('code')} {found.get('reason')}: {found.get('message')}"
                                raise ApiUnavailableError(f"{what}: the API server ended it ({status})")
                            version = stamp if isinstance(stamp, str) else version
                            yield kind

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

    async def device_class_exists(self, name: str) -> bool:
        try:
            with translated(f"DeviceClass {name}"):
                await self._client.get(DeviceClass, name)
        except GoneError:
            return False
        return True

    async def get_ippool(self, name: str) -> dict[str, Any]:
        """The IPPool as the API has it (ConfigError when it cannot be read)."""
        found = await self._read(f"IPPool {name}", _path(IPPoolResource, name=name))
        problem = ippool_problem(found)
        if problem:
            raise ConfigError(f"IPPool {name}: cannot be read: {problem}")
        return as_object(found)

    async def list_ippools(self) -> list[dict[str, Any]]:
        """Every IPPool as the API has it; one that cannot be read is skipped, and reported."""
        pools = []
        for item in await self._list("IPPools", _path(IPPoolResource)):
            problem = ippool_problem(item)
            if problem:
                await self._unreadable("IPPool", IPPOOL_API_VERSION, item, problem, "It is not published.")
            else:
                pools.append(item)
        return pools

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
        """The IPAllocations (of `pool`, of claim `claim_uid`); one that cannot be read is skipped, and
        reported: it is neither counted as held nor freed."""
        labels: dict[str, Any] = {
            k: v for k, v in ((POOL_LABEL, pool), (CLAIM_UID_LABEL, claim_uid)) if v is not None
        }
        params = {"labelSelector": build_selector(labels)} if labels else None
        allocations = []
        for item in await self._list("IPAllocations", _path(IPAllocationResource), params):
            try:
                allocations.append(IPAllocation.from_api(item))
            except (TypeError, ValueError) as err:
                effect = "It is neither counted as held nor freed."
                await self._unreadable("IPAllocation", IPPOOL_API_VERSION, item, str(err), effect)
        return allocations

    async def get_ip_allocation(self, name: str) -> IPAllocation:
        what = f"IPAllocation {name}"
        found = await self._read(what, _path(IPAllocationResource, name=name))
        try:
            return IPAllocation.from_api(found)
        except (TypeError, ValueError) as err:
            raise ConfigError(f"{what}: cannot be read: {err}") from None

    async def create_ip_allocation(self, allocation: IPAllocation) -> IPAllocation:
        """Take the address: AlreadyExistsError when another claim (or this one, earlier) holds it."""
        body = IPAllocationResource.from_dict(allocation.to_api())
        with translated(f"IPAllocation {allocation.name}"):
            created = await self._client.create(body)
        return IPAllocation.from_api(_data(created))

    async def delete_ip_allocation(self, allocation: IPAllocation) -> None:
        """Release the address, only if the object is still the one read (same UID); gone already is fine.
        Not lightkube's delete(): it sends no body, so no preconditions."""
        options = {"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {"uid": allocation.uid}}
        path = _path(IPAllocationResource, name=allocation.name)
        with contextlib.suppress(GoneError), translated(f"IPAllocation {allocation.name}"):
            _raise_for_status(await self._http.request("DELETE", path, json=options))

    async def changes(self, kind: str) -> AsyncIterator[str]:
        """The event types (ADDED, MODIFIED, DELETED) of every `kind` (ippools, ipallocations,
        resourceclaims, pods), as they happen; the objects are not read."""
        resource: Any = {
            "ippools": IPPoolResource,
            "ipallocations": IPAllocationResource,
            "resourceclaims": ResourceClaim,
            "pods": PodResource,
        }[kind]
        async for event in self._watch(f"watch of {kind}", _path(resource)):
            yield event

    async def unschedulable_pods(self) -> list[Pod]:
        """Pending pods the scheduler could not place."""
        selector: FieldSelector = {"status.phase": "Pending"}
        with translated("pending pods"):
            pods = [
                Pod.from_api(p.to_dict())
                async for p in self._client.list(PodResource, namespace="*", fields=selector)
            ]
        return [p for p in pods if p.unschedulable]

    async def read_cluster(self, namespace: str | None) -> tuple[dict[str, list[dict[str, Any]]], list[str]]:
        """What `netclaim explain` and `status` read, with read access only: the namespace's pods and claim
        templates (every namespace's when None), and the cluster's claims, DeviceClasses, ResourceSlices,
        nodes and netclaim agent pods. A list the reader may not make is left empty and named in the
        second value (a tenant with a namespace's rights still gets what they may see). Claims are read as
        the API has them without lightkube's decoder: a claim nested thousands deep fails no one's read."""
        scope = namespace or "*"
        reads: dict[str, Any] = {
            "pods": (PodResource, scope, None),
            "claims": (ResourceClaim, "*", None),
            "templates": (ResourceClaimTemplate, scope, None),
            "device_classes": (DeviceClass, None, None),
            "slices": (ResourceSlice, None, None),
            "nodes": (Node, None, None),
            "agent_pods": (PodResource, "*", {"app.kubernetes.io/name": "netclaim-agent"}),
        }
        found: dict[str, list[dict[str, Any]]] = {}
        refused = []
        for key, (kind, where, labels) in reads.items():
            what = f"{kind.__name__} ({'netclaim agent pods' if labels else where or 'cluster'})"
            try:
                found[key] = await self._read_all(f"list {what}", kind, where, labels)
            except ApiRejectedError:
                found[key] = []
                if key == "claims" and namespace:  # a tenant: the namespace's own claims at least
                    with contextlib.suppress(ApiRejectedError):
                        found[key] = await self._read_all(f"list {what}", ResourceClaim, namespace, None)
                refused.append(what)
        return found, refused

    async def _read_all(
        self, what: str, kind: Any, where: str | None, labels: dict[str, Any] | None
    ) -> list[dict[str, Any]]:
        if kind is ResourceClaim:
            path = _path(ResourceClaim, None if where == "*" else where)
            return [item for item in await self._list(what, path) if isinstance(item, dict)]
        with translated(what):
            listing = (
                self._client.list(kind, namespace=where, labels=labels)
                if where is not None
                else self._client.list(kind, labels=labels)
            )
            return [item.to_dict() async for item in listing]

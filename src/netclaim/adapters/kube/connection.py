"""One connection to the API server, shared by the roles a program uses, and what they share.

Errors are netclaim's (see netclaim.errors): 404 → GoneError; 409 → ConflictError (a claim status
patch whose resourceVersion test failed is one too: netclaim.adapters.kube.claims knows its bare 422);
transport failures, timeouts, 429 and 5xx → ApiUnavailableError; any other refusal → ApiRejectedError,
with the answer's causes.

The kinds that carry free JSON anyone may write (ResourceClaims: opaque configs and device status of
every driver; IPPools; IPAllocations) are read without lightkube's decoder, which recurses once per level
of nesting: the API server stores values nested thousands deep (10 KiB of `[[[[…]]]]`). They are fetched
with an HTTP client lightkube makes from the same kubeconfig and built by netclaim.core.objects (read_json,
read_list: no recursion), in a thread when large (a cluster's lists). Each listed object is read on its
own: one that cannot be read is skipped (a claim: read as far as it can be), with a log line, the
`netclaim_unreadable_objects_total` metric and a Warning Event on it, once per version of the object; it
never fails the list (but a claim no parser reads at all: see KubeClaims.list_claims). Watches read only
each event's type and resourceVersion, so an object no one can read does not stop them either.

Of lightkube, only its documented API is used (Client, KubeConfig, ApiError, resources and models,
generic resources, PatchType), but for `lightkube.config.client_adapter`: the function lightkube's own
clients are made with, from a kubeconfig's server, TLS and credentials (token files re-read, exec
plugins). It is not in lightkube's documentation; making that client here would copy its credential
handling. The API paths (Kind) and selectors are netclaim's own.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import httpx2 as httpx
from lightkube import ApiError, AsyncClient, KubeConfig
from lightkube.config.client_adapter import AsyncClient as http_client
from lightkube.config.client_adapter import ConnectionParams
from lightkube.core import exceptions as lightkube_errors
from lightkube.models.core_v1 import EventSource, ObjectReference
from lightkube.models.meta_v1 import ObjectMeta, Status
from lightkube.resources.core_v1 import Event

from netclaim.core.events import EventReason
from netclaim.core.objects import IPPOOL_API_VERSION, ListItems, as_object, as_text, cut, read_json, read_list
from netclaim.errors import (
    AlreadyExistsError,
    ApiForbiddenError,
    ApiRejectedError,
    ApiUnavailableError,
    ConfigError,
    ConflictError,
    GoneError,
    NetclaimError,
    NotServedError,
)
from netclaim.runtime import metrics

log = logging.getLogger(__name__)
T = TypeVar("T", bytes, str)
A = TypeVar("A")
R = TypeVar("R")
SERVICE_ACCOUNT_TOKEN = Path("/var/run/secrets/kubernetes.io/serviceaccount/token")
TIMEOUT = httpx.Timeout(10.0, read=60.0)
WATCH_TIMEOUT = httpx.Timeout(10.0, read=None)  # a watch may be quiet for as long as nothing changes
EVENT_MESSAGE_BYTES = 1024
# lists (kind and selector) whose unreadable objects are remembered as reported: the least recently read
# is forgotten past it (its objects are reported once more if it is read again)
MAX_LISTS_REMEMBERED = 64
# Warning Events on unreadable objects waiting to be sent; past it an object is only logged and counted
MAX_QUEUED_EVENTS = 256
# JSON read on the event loop up to this size (a few milliseconds, the slow parser's included); larger (a
# cluster's list: megabytes, a second or more), in a thread, so that the program's watches, health checks
# and writes go on meanwhile
INLINE_BYTES = 64 * 1024
METADATA_ONLY = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json"


@dataclass(frozen=True)
class Kind:
    """Where the API serves a kind netclaim reads as JSON."""

    api_version: str  # "v1" for the core group, else group/version
    name: str  # as objects name their kind (ResourceClaim)
    plural: str  # as paths name it (resourceclaims)
    page: int = 500  # objects per page of a list of it (read_pages)

    def path(self, namespace: str | None = None, name: str | None = None, subresource: str = "") -> str:
        """Every namespace's objects unless `namespace`; one object's with `name` (its `subresource`)."""
        parts = ["api" if "/" not in self.api_version else "apis", self.api_version]
        if namespace is not None:
            parts += ["namespaces", namespace]
        parts.append(self.plural)
        parts += [part for part in (name, subresource) if part]
        return "/" + "/".join(parts)


CLAIMS = Kind("resource.k8s.io/v1", "ResourceClaim", "resourceclaims")
SLICES = Kind("resource.k8s.io/v1", "ResourceSlice", "resourceslices")
IPPOOLS = Kind(IPPOOL_API_VERSION, "IPPool", "ippools")
IP_ALLOCATIONS = Kind(IPPOOL_API_VERSION, "IPAllocation", "ipallocations")
SERVICES = Kind("v1", "Service", "services")
PODS = Kind("v1", "Pod", "pods")
NAMESPACES = Kind("v1", "Namespace", "namespaces")
# a tenant's free JSON, up to the API's 1.5 MB an object, Multus's policies too (never counted against
# a namespace's budget): a page of 50 is at most 75 MB decoded at once, not 750
POLICIES = Kind("k8s.cni.cncf.io/v1beta1", "MultiNetworkPolicy", "multi-networkpolicies", page=50)
CONFIG_MAPS = Kind("v1", "ConfigMap", "configmaps")
ENDPOINT_SLICES = Kind("discovery.k8s.io/v1", "EndpointSlice", "endpointslices")


@dataclass(frozen=True)
class Unreadable:
    """A listed object netclaim cannot read, in whole or in part, and what becomes of it."""

    item: Any  # as the API has it (None: not even its JSON could be read)
    problem: str
    effect: str


def selector(pairs: Mapping[str, str]) -> str:
    """A label or field selector of equalities, as the API takes it."""
    return ",".join(f"{key}={value}" for key, value in pairs.items())


@contextlib.contextmanager
def translated(what: str) -> Iterator[None]:
    """Re-raise lightkube's and the HTTP client's errors as netclaim's, naming `what` was asked."""
    try:
        yield
    except ApiError as err:
        code, message = err.status.code, _said(err.status)
        if code == 404 and not (err.status.details and err.status.details.name):
            # not a named object that is gone: the server does not serve this kind (an upgrade, a skew)
            raise NotServedError(f"{what}: {message} (the API server does not serve it)") from err
        if code == 404 or (code == 422 and "no longer" in message):
            raise GoneError(f"{what}: {message}") from err
        if code == 409 and err.status.reason == "AlreadyExists":
            raise AlreadyExistsError(f"{what}: {message}") from err
        if code == 409:
            raise ConflictError(f"{what}: {message}") from err
        if code == 429 or (code is not None and code >= 500):
            raise ApiUnavailableError(f"{what}: {code} {message}") from err
        if code in (401, 403):
            raise ApiForbiddenError(f"{what}: {message} (check the RBAC of the identity in use)") from err
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


def _said(status: Status) -> str:
    """The answer's message and its causes' (a validation error names its fields there)."""
    causes = status.details.causes if status.details and status.details.causes else []
    return "; ".join([str(status.message), *(str(c.message) for c in causes if c.message)])


def raise_for_status(response: httpx.Response) -> None:
    """An error answer as lightkube raises it (ApiError with the API's Status), for `translated`."""
    if response.is_error:
        if response.headers.get("Content-Type") == "application/json":
            raise ApiError(request=response.request, response=response)
        response.raise_for_status()


def as_data(obj: Any) -> dict[str, Any]:
    """A lightkube object (typed or generic) as the API's JSON data."""
    return dict(obj.to_dict())


async def _off_the_loop_if_large(read: Callable[[T], R], data: T) -> R:
    """`read(data)`, in a thread when `data` is large enough to hold up the event loop."""
    if len(data) < INLINE_BYTES:
        return read(data)
    return await asyncio.to_thread(read, data)


def _as_read(value: A) -> A:
    return value


class KubeConnection:
    """The clients of one program (lightkube's, and the HTTP client for the JSON read without its decoder)
    and the objects it already reported unreadable; every role of the program is made over it."""

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
        self.client = AsyncClient(
            self._config, field_manager=field_manager, timeout=TIMEOUT, http2=True, transport=transport
        )
        self.http = self._connect(http2=True)
        # per list (kind and selector), the versions of the objects it last held unreadable: reported
        self._reported: OrderedDict[tuple[str, str], set[tuple[str, str]]] = OrderedDict()
        self._events: deque[tuple[ObjectReference, str]] = deque()  # Events on them, to be sent
        self._sender: asyncio.Task[None] | None = None

    @classmethod
    def connect(cls, kubeconfig: Path | None, field_manager: str) -> KubeConnection:
        """From a kubeconfig file, else the pod's ServiceAccount (in-cluster), else $KUBECONFIG."""
        try:
            if kubeconfig is not None:
                return cls(KubeConfig.from_file(kubeconfig), field_manager)
            if SERVICE_ACCOUNT_TOKEN.exists():
                return cls(KubeConfig.from_service_account(), field_manager)
            return cls(KubeConfig.from_env(), field_manager)
        except lightkube_errors.ConfigError as err:
            where = (
                f"--kubeconfig {kubeconfig}"
                if kubeconfig is not None
                else "the ServiceAccount or $KUBECONFIG"
            )
            raise ConfigError(f"{where}: {err}") from None

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
        if self._sender is not None:
            self._sender.cancel()
            await asyncio.gather(self._sender, return_exceptions=True)
        await self.client.close()
        await self.http.aclose()

    async def read(self, what: str, path: str, params: dict[str, str] | None = None) -> Any:
        """GET `path`: its JSON, read without recursion (read_json)."""
        return await self._get(what, path, params, read_json, _as_read)

    async def read_items(
        self, what: str, path: str, made: Callable[[ListItems], R], params: dict[str, str] | None = None
    ) -> R:
        """GET the list at `path`: its items (read_list: each as the API has it, and what no parser reads
        of it), made into what the caller needs by `made`, in a thread when large: a cluster's list is
        megabytes, and making its objects takes as long again."""
        return await self._get(what, path, params, read_list, made)

    async def read_pages(
        self,
        what: str,
        path: str,
        made: Callable[[ListItems], tuple[list[R], list[Unreadable]]],
        page_size: int,
        params: dict[str, str] | None = None,
    ) -> tuple[list[R], list[Unreadable], str | None]:
        """GET the list at `path` `page_size` objects at a time, as client-go's reflector does (a cluster's
        50,000 claims are never one answer held whole in memory, decoded objects and all): each page's
        items made by `made` as read_items makes them, and what it could not read; then the list's
        resourceVersion. A page whose metadata cannot be read fails the list (ApiUnavailableError): its
        continue token unknown, a list cut short must not read as a shorter list."""
        kept: list[R] = []
        unreadable: list[Unreadable] = []
        following = ""
        while True:
            page = {**(params or {}), "limit": str(page_size)} | (
                {"continue": following} if following else {}
            )
            (made_items, bad), version, following = await self._get(
                what, path, page, read_list, lambda found: (made(found), found.version, found.following)
            )
            if version is None:
                raise ApiUnavailableError(f"{what}: the metadata of a page of the list cannot be read")
            kept += made_items
            unreadable += bad
            if not following:
                return kept, unreadable, version

    async def _get(
        self,
        what: str,
        path: str,
        params: dict[str, str] | None,
        read: Callable[[bytes], A],
        made: Callable[[A], R],
    ) -> R:
        with translated(what):
            response = await self.http.get(path, params=params)
            raise_for_status(response)

        def answer(data: bytes) -> R:
            try:
                found = read(data)
            except ValueError as err:
                raise ApiUnavailableError(f"{what}: the API server's answer is {err}") from None
            return made(found)

        return await _off_the_loop_if_large(answer, response.content)

    def report_unreadable(self, kind: Kind, labels: str, unreadable: list[Unreadable]) -> None:
        """What one read of the list of `kind` (selected by `labels`) could not read: for each object, a log
        line, the metric and a Warning Event on it (best effort), once per version of the object for as
        long as the list holds it unreadable. What a list held unreadable at its last read is remembered,
        however many, so that no object is reported at every pass, and one that is fixed and breaks
        again is reported again. The Events are sent off the caller's path, MAX_QUEUED_EVENTS waiting at
        the most (past it an object is only logged and counted): a pass never waits for them."""
        listed = (kind.name, labels)
        before = self._reported.pop(listed, set())
        now = self._reported[listed] = set()  # the most recently read: the last forgotten
        if len(self._reported) > MAX_LISTS_REMEMBERED:
            self._reported.popitem(last=False)
        for entry in unreadable:
            meta = entry.item.get("metadata") if isinstance(entry.item, dict) else None
            known = {
                key: value
                for key, value in (meta.items() if isinstance(meta, dict) else ())
                if key in ("namespace", "name", "uid", "resourceVersion") and isinstance(value, str)
            }
            version = (known.get("uid", known.get("name", "")), known.get("resourceVersion", ""))
            now.add(version)
            if version not in before:
                self._report(kind, known, entry)

    def _report(self, kind: Kind, known: dict[str, str], entry: Unreadable) -> None:
        metrics.UNREADABLE_OBJECTS.labels(kind.name).inc()
        where = "/".join(known[k] for k in ("namespace", "name") if k in known) or "(no name)"
        event = "none: nothing to hang it on"
        if "name" in known:
            involved = ObjectReference(
                kind=kind.name,
                apiVersion=kind.api_version,
                name=known["name"],
                namespace=known.get("namespace"),
                uid=known.get("uid"),
            )
            event = self._queue_event(
                involved, f"netclaim cannot read this {kind.name}: {entry.problem}. {entry.effect}"
            )
        log.warning(
            f"{kind.name} cannot be read: {entry.effect}",
            extra={"kind": kind.name, "object": where, "problem": entry.problem, "event": event},
        )

    def _queue_event(self, involved: ObjectReference, message: str) -> str:
        if len(self._events) >= MAX_QUEUED_EVENTS:
            return f"not sent: {MAX_QUEUED_EVENTS} are waiting"
        self._events.append((involved, message))
        if self._sender is None or self._sender.done():
            self._sender = asyncio.create_task(self._send_events(), name="unreadable-events")
        return "queued"

    async def _send_events(self) -> None:
        while self._events:
            involved, message = self._events.popleft()
            try:
                await self.create_event(involved, EventReason.UNREADABLE, message)
            except NetclaimError as err:
                log.info("could not record an event", extra={"object": involved.name, "error": str(err)})
            except Exception:  # a bug in one Event stops none of the others
                log.exception("could not record an event (a bug)", extra={"object": involved.name})

    async def create_event(
        self, involved: ObjectReference, reason: EventReason, message: str, warning: bool = True
    ) -> None:
        """A Warning (or Normal) Event on the object; a cluster-scoped object's goes to `default`, where
        kubectl looks."""
        namespace = involved.namespace or "default"
        now = datetime.datetime.now(datetime.UTC).replace(microsecond=0)
        event = Event(
            # the API appends 5 characters to generateName; a name is at most 253
            metadata=ObjectMeta(generateName=f"{str(involved.name)[:240]}.", namespace=namespace),
            involvedObject=involved,
            reason=reason,
            message=cut(message, EVENT_MESSAGE_BYTES),
            type="Warning" if warning else "Normal",
            source=EventSource(component=self.field_manager),
            firstTimestamp=now,
            lastTimestamp=now,
            count=1,
        )
        with translated(f"event on {str(involved.kind).lower()} {namespace}/{involved.name}"):
            await self.client.create(event)

    async def watch(
        self,
        what: str,
        path: str,
        fields: str | None = None,
        labels: str | None = None,
        metadata_only: bool = False,
        since: str | None = None,
    ) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        """The events (type, object) of a watch of `path` from resourceVersion `since` (a list's: every
        change after it) or from now, on a connection of its own, resumed from the last
        event's resourceVersion when the server ends the stream. Each event is read without recursion; here
        only its type and resourceVersion are looked at. An ERROR event (e.g. 410: resumed too late) ends
        the watch with ApiUnavailableError: the caller starts afresh, and reconciles what it may have
        missed. With `metadata_only`, the server sends each object's metadata alone (as client-go's
        metadata informers ask): a pod's event is a tenth of its size to send and to read."""
        headers = {"Accept": METADATA_ONLY} if metadata_only else None
        version = since
        async with self._watching() as http:
            while True:
                params = {
                    "watch": "true",
                    "fieldSelector": fields,
                    "labelSelector": labels,
                    "resourceVersion": version,
                }
                query = {key: value for key, value in params.items() if value is not None}
                with translated(what):
                    async with http.stream(
                        "GET", path, params=query, headers=headers, timeout=WATCH_TIMEOUT
                    ) as response:
                        if response.is_error:
                            await response.aread()
                            raise_for_status(response)
                        async for line in response.aiter_lines():
                            if not line.strip():
                                continue
                            try:
                                event = as_object(await _off_the_loop_if_large(read_json, line))
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
                            yield kind, found

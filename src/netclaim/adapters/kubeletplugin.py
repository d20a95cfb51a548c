"""The kubelet side: plugin registration, the DRAPlugin service (v1) and the DRAResourceHealth
stream (v1) over unix sockets.

grpclib serves them: asyncio gRPC on h2, which the agent loads anyway for the API server (grpcio's C core
cost the agent ~10 MiB resident).

Thin on purpose: each call loops over the claims, asks the ClaimPreparer (prepare) or the ClaimUnpreparer
(unprepare), and maps results and errors by the table in netclaim.errors. A claim's failure goes into that
claim's `error`; the call itself never fails, so kubelet keeps the answers for the other claims.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

from grpclib.const import Status
from grpclib.exceptions import GRPCError
from grpclib.server import Server, Stream

from netclaim._proto import (
    dra_health_v1_grpc,
    dra_health_v1_pb2,
    dra_v1_grpc,
    dra_v1_pb2,
    pluginregistration_grpc,
    pluginregistration_pb2,
)
from netclaim.core.node import PreparedDevice
from netclaim.errors import AddressQuarantinedError, CniError, ConfigError, NetclaimError, TransientError
from netclaim.runtime import metrics
from netclaim.runtime.stopping import InFlight

log = logging.getLogger(__name__)
# kubelet 1.37 opens the health stream only for a plugin that names it here
SUPPORTED_VERSIONS = ["v1.DRAPlugin", "v1.DRAResourceHealth"]  # every supported kubelet (1.34+) speaks v1
HEALTH_RESEND_SECONDS = 10.0  # every device reported again at least this often, changed or not
HEALTH_TIMEOUT_SECONDS = 30  # kubelet shows a device not reported again within it as Unknown
STOP_GRACE_SECONDS = 2.0  # a call kubelet has under way when the agent stops gets this long to finish
CLOSE_WAIT_SECONDS = 0.5  # then the cancelled ones this long to unwind
_Request = TypeVar("_Request")
_Response = TypeVar("_Response")


class ClaimPreparer(Protocol):
    """What NodePrepareResources asks of netclaim, per claim: prepare it, or say on it why it cannot be."""

    async def prepare(self, namespace: str, name: str, uid: str) -> list[PreparedDevice]: ...

    async def report_failure(self, namespace: str, name: str, uid: str, message: str) -> None: ...


class ClaimUnpreparer(Protocol):
    """What NodeUnprepareResources asks of netclaim, per claim."""

    async def unprepare(self, namespace: str, name: str, uid: str) -> None: ...


class DeviceHealthSource(Protocol):
    """The node's devices and what is wrong with each (None: nothing), for kubelet's health stream."""

    def device_problems(self) -> dict[str, str | None]: ...

    async def health_changed(self) -> None:
        """Return at the next change of a device's problem."""
        ...


async def _claim_error(call: str, claim: Any, err: Exception, preparer: ClaimPreparer) -> str:
    """The claim's `error` for `err`, after the side effects its class calls for (netclaim.errors)."""
    where = {"claim": f"{claim.namespace}/{claim.name}"}
    metrics.KUBELET_CALLS.labels(call, "error").inc()
    if not isinstance(err, NetclaimError):
        log.error(f"{call} failed (a bug)", exc_info=err, extra=where)
        return f"internal error in the netclaim agent ({type(err).__name__}); see its log"
    log.warning(f"{call} failed", extra={**where, "error": str(err), "kind": type(err).__name__})
    told = isinstance(err, AddressQuarantinedError) or (
        isinstance(err, ConfigError | CniError) and not isinstance(err, TransientError)
    )
    if call == "prepare" and told:
        try:
            await preparer.report_failure(claim.namespace, claim.name, claim.uid, str(err))
        except NetclaimError as report_err:
            log.info("could not report the failure on the claim", extra={**where, "error": str(report_err)})
    return str(err)


def socket_paths(kubelet_root: Path, driver: str) -> tuple[Path, Path]:
    """(registration socket, DRA service socket) where kubelet looks for them."""
    return (
        kubelet_root / "plugins_registry" / f"{driver}-reg.sock",
        kubelet_root / "plugins" / driver / "dra.sock",
    )


class _Calls:
    """The calls a server is answering. grpclib's Server.close() cancels them; stop() lets them finish first,
    refusing new ones meanwhile (UNAVAILABLE, kubelet retries), as grpc's stop(grace) did."""

    def __init__(self) -> None:
        self.open = True
        self._running = InFlight()

    @contextlib.contextmanager
    def call(self) -> Iterator[None]:
        if not self.open:
            raise GRPCError(Status.UNAVAILABLE, "the netclaim agent is stopping")
        with self._running.working():
            yield

    async def drain(self, grace: float) -> None:
        self.open = False
        await self._running.settle(grace)


async def _unary(
    calls: _Calls, stream: Stream[_Request, _Response], answer: Callable[[_Request], Awaitable[_Response]]
) -> None:
    """One unary call: its request, `answer`'s response."""
    with calls.call():
        request = await stream.recv_message()
        if request is None:
            raise GRPCError(Status.INVALID_ARGUMENT, "no request message")
        await stream.send_message(await answer(request))


class _DraService:
    """DRAPlugin for one API version; `pb` is that version's generated message module."""

    def __init__(self, preparer: ClaimPreparer, unpreparer: ClaimUnpreparer, pb: Any) -> None:
        self.preparer = preparer
        self.unpreparer = unpreparer
        self.pb = pb

    def _device(self, device: PreparedDevice) -> Any:
        fields: dict[str, Any] = {
            "request_names": [device.request],
            "pool_name": device.pool,
            "device_name": device.device,
            "cdi_device_ids": list(device.cdi_device_ids),
        }
        if device.share_id:
            fields["share_id"] = device.share_id
        return self.pb.Device(**fields)

    async def prepare(self, request: Any) -> Any:
        response = self.pb.NodePrepareResourcesResponse()
        for claim in request.claims:
            started = time.monotonic()
            try:
                devices = await self.preparer.prepare(claim.namespace, claim.name, claim.uid)
                response.claims[claim.uid].devices.extend(self._device(d) for d in devices)
                metrics.KUBELET_CALLS.labels("prepare", "ok").inc()
            except asyncio.CancelledError:  # kubelet's deadline or its connection gone: it asks again
                log.warning("prepare cancelled", extra={"claim": f"{claim.namespace}/{claim.name}"})
                raise
            except Exception as err:  # noqa: BLE001 - mapped to this claim's error by its class
                response.claims[claim.uid].error = await _claim_error("prepare", claim, err, self.preparer)
            metrics.PREPARE_SECONDS.observe(time.monotonic() - started)
        return response

    async def unprepare(self, request: Any) -> Any:
        response = self.pb.NodeUnprepareResourcesResponse()
        for claim in request.claims:
            try:
                await self.unpreparer.unprepare(claim.namespace, claim.name, claim.uid)
                response.claims[claim.uid].error = ""
                metrics.KUBELET_CALLS.labels("unprepare", "ok").inc()
            except asyncio.CancelledError:
                log.warning("unprepare cancelled", extra={"claim": f"{claim.namespace}/{claim.name}"})
                raise
            except Exception as err:  # noqa: BLE001 - mapped to this claim's error by its class
                response.claims[claim.uid].error = await _claim_error("unprepare", claim, err, self.preparer)
        return response


class _DraV1(dra_v1_grpc.DRAPluginBase):
    def __init__(self, preparer: ClaimPreparer, unpreparer: ClaimUnpreparer, calls: _Calls) -> None:
        self.service = _DraService(preparer, unpreparer, dra_v1_pb2)
        self.calls = calls

    async def NodePrepareResources(
        self, stream: Stream[dra_v1_pb2.NodePrepareResourcesRequest, dra_v1_pb2.NodePrepareResourcesResponse]
    ) -> None:
        await _unary(self.calls, stream, self.service.prepare)

    async def NodeUnprepareResources(
        self,
        stream: Stream[dra_v1_pb2.NodeUnprepareResourcesRequest, dra_v1_pb2.NodeUnprepareResourcesResponse],
    ) -> None:
        await _unary(self.calls, stream, self.service.unprepare)


class _HealthV1(dra_health_v1_grpc.DRAResourceHealthBase):
    """Every device of the node's pool with its health: at once, at each change and every
    HEALTH_RESEND_SECONDS, for as long as kubelet keeps the stream (its own health clock restarts at each
    report). Not counted among the calls a stop waits for: it never ends by itself."""

    def __init__(self, source: DeviceHealthSource, pool: str, calls: _Calls) -> None:
        self.source = source
        self.pool = pool
        self.calls = calls

    def _report(self) -> dra_health_v1_pb2.NodeWatchResourcesResponse:
        now = int(time.time())
        return dra_health_v1_pb2.NodeWatchResourcesResponse(
            devices=[
                dra_health_v1_pb2.DeviceHealth(
                    device=dra_health_v1_pb2.DeviceIdentifier(pool_name=self.pool, device_name=name),
                    health=dra_health_v1_pb2.HEALTHY if problem is None else dra_health_v1_pb2.UNHEALTHY,
                    last_updated_time=now,
                    health_check_timeout_seconds=HEALTH_TIMEOUT_SECONDS,
                    message=(problem or "")[:1024],
                )
                for name, problem in sorted(self.source.device_problems().items())
            ]
        )

    async def NodeWatchResources(
        self,
        stream: Stream[
            dra_health_v1_pb2.NodeWatchResourcesRequest, dra_health_v1_pb2.NodeWatchResourcesResponse
        ],
    ) -> None:
        if not self.calls.open:
            raise GRPCError(Status.UNAVAILABLE, "the netclaim agent is stopping")
        await stream.recv_message()
        log.info("kubelet watches device health")
        while True:
            report = self._report()
            await stream.send_message(report)
            metrics.HEALTH_REPORTS.inc()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(HEALTH_RESEND_SECONDS):
                    await self.source.health_changed()


class _Registration(pluginregistration_grpc.RegistrationBase):
    def __init__(
        self, driver: str, endpoint: Path, on_registered: Callable[[bool], None], calls: _Calls
    ) -> None:
        self.driver = driver
        self.endpoint = endpoint
        self.on_registered = on_registered
        self.calls = calls

    async def GetInfo(
        self, stream: Stream[pluginregistration_pb2.InfoRequest, pluginregistration_pb2.PluginInfo]
    ) -> None:
        await _unary(self.calls, stream, self._info)

    async def NotifyRegistrationStatus(
        self,
        stream: Stream[
            pluginregistration_pb2.RegistrationStatus, pluginregistration_pb2.RegistrationStatusResponse
        ],
    ) -> None:
        await _unary(self.calls, stream, self._status)

    async def _info(self, request: pluginregistration_pb2.InfoRequest) -> pluginregistration_pb2.PluginInfo:
        return pluginregistration_pb2.PluginInfo(
            type="DRAPlugin",
            name=self.driver,
            endpoint=str(self.endpoint),
            supported_versions=SUPPORTED_VERSIONS,
        )

    async def _status(
        self, request: pluginregistration_pb2.RegistrationStatus
    ) -> pluginregistration_pb2.RegistrationStatusResponse:
        self.on_registered(request.plugin_registered)
        if request.plugin_registered:
            log.info("registered with kubelet")
        else:
            log.error("kubelet refused the registration", extra={"error": request.error})
        return pluginregistration_pb2.RegistrationStatusResponse()


def _make_room(socket: Path) -> None:
    socket.parent.mkdir(parents=True, exist_ok=True)
    socket.unlink(missing_ok=True)


def _owner_only(socket: Path) -> None:
    socket.chmod(0o600)


@dataclass(frozen=True)
class _Listener:
    """One server on one unix socket, only the owner may connect (kubelet runs as root)."""

    server: Server
    socket: Path
    calls: _Calls

    @classmethod
    async def start(cls, handlers: Callable[[_Calls], list[Any]], socket: Path) -> _Listener:
        calls = _Calls()
        server = Server(handlers(calls))
        _make_room(socket)
        await server.start(path=str(socket))
        _owner_only(socket)
        return cls(server, socket, calls)

    async def stop(self, grace: float) -> None:
        """Remove the socket (no new connection finds it), let the calls under way finish, then close."""
        self.socket.unlink(missing_ok=True)
        await self.calls.drain(grace)
        self.server.close()  # cancels what is still running
        # Bounded: on Python >= 3.12 asyncio's wait_closed() waits for the clients to hang up too, and kubelet
        # keeps its connection, which grpclib does not close (vmagamedov/grpclib#107); the agent's exit does.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.server.wait_closed(), CLOSE_WAIT_SECONDS)


@dataclass(frozen=True)
class KubeletPlugin:
    """The two running servers; `stop()` deregisters from kubelet first (it drops us at once)."""

    dra: _Listener
    registration: _Listener

    async def stop(self) -> None:
        for listener in (self.registration, self.dra):
            await listener.stop(STOP_GRACE_SECONDS)


async def serve(
    preparer: ClaimPreparer,
    unpreparer: ClaimUnpreparer,
    health: DeviceHealthSource,
    kubelet_root: Path,
    driver: str,
    pool: str,
    on_registered: Callable[[bool], None],
) -> KubeletPlugin:
    """Start the DRA and health services, then the registration socket kubelet watches. `pool`: the node's
    pool, where the devices the health stream names are."""
    registration_socket, dra_socket = socket_paths(kubelet_root, driver)
    dra = await _Listener.start(
        lambda calls: [
            _DraV1(preparer, unpreparer, calls),
            _HealthV1(health, pool, calls),
        ],
        dra_socket,
    )
    registration = await _Listener.start(
        lambda calls: [_Registration(driver, dra_socket, on_registered, calls)], registration_socket
    )
    log.info(
        "kubelet plugin listening", extra={"registration": str(registration_socket), "dra": str(dra_socket)}
    )
    return KubeletPlugin(dra, registration)

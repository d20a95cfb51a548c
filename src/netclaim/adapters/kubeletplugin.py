"""The kubelet side: plugin registration and the DRAPlugin service (v1 and v1beta1) over unix sockets.

Thin on purpose: each call loops over the claims, asks the ClaimPreparer (prepare) or the ClaimUnpreparer
(unprepare), and maps results and errors by the table in netclaim.errors. A claim's failure goes into that
claim's `error`; the call itself never fails, so kubelet keeps the answers for the other claims.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import grpc

from netclaim import metrics
from netclaim._proto import (
    dra_v1_pb2,
    dra_v1_pb2_grpc,
    dra_v1beta1_pb2,
    dra_v1beta1_pb2_grpc,
    pluginregistration_pb2,
    pluginregistration_pb2_grpc,
)
from netclaim.errors import CniError, ConfigError, NetclaimError, TransientError

log = logging.getLogger(__name__)
SUPPORTED_VERSIONS = ["v1.DRAPlugin", "v1beta1.DRAPlugin"]


@dataclass(frozen=True)
class PreparedDevice:
    request: str
    pool: str
    device: str
    share_id: str | None
    cdi_device_ids: tuple[str, ...] = ()


class ClaimPreparer(Protocol):
    """What NodePrepareResources asks of netclaim, per claim: prepare it, or say on it why it cannot be."""

    async def prepare(self, namespace: str, name: str, uid: str) -> list[PreparedDevice]: ...

    async def report_failure(self, namespace: str, name: str, uid: str, message: str) -> None: ...


class ClaimUnpreparer(Protocol):
    """What NodeUnprepareResources asks of netclaim, per claim."""

    async def unprepare(self, namespace: str, name: str, uid: str) -> None: ...


async def _claim_error(call: str, claim: Any, err: Exception, preparer: ClaimPreparer) -> str:
    """The claim's `error` for `err`, after the side effects its class calls for (netclaim.errors)."""
    where = {"claim": f"{claim.namespace}/{claim.name}"}
    metrics.KUBELET_CALLS.labels(call, "error").inc()
    if not isinstance(err, NetclaimError):
        log.error(f"{call} failed (a bug)", exc_info=err, extra=where)
        return f"internal error in the netclaim agent ({type(err).__name__}); see its log"
    log.warning(f"{call} failed", extra={**where, "error": str(err), "kind": type(err).__name__})
    blamed = isinstance(err, ConfigError | CniError) and not isinstance(err, TransientError)
    if call == "prepare" and blamed:
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
        if device.share_id and "share_id" in self.pb.Device.DESCRIPTOR.fields_by_name:
            fields["share_id"] = device.share_id
        return self.pb.Device(**fields)

    async def NodePrepareResources(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        response = self.pb.NodePrepareResourcesResponse()
        for claim in request.claims:
            started = time.monotonic()
            try:
                devices = await self.preparer.prepare(claim.namespace, claim.name, claim.uid)
                response.claims[claim.uid].devices.extend(self._device(d) for d in devices)
                metrics.KUBELET_CALLS.labels("prepare", "ok").inc()
            except Exception as err:  # noqa: BLE001 - mapped to this claim's error by its class
                response.claims[claim.uid].error = await _claim_error("prepare", claim, err, self.preparer)
            metrics.PREPARE_SECONDS.observe(time.monotonic() - started)
        return response

    async def NodeUnprepareResources(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        response = self.pb.NodeUnprepareResourcesResponse()
        for claim in request.claims:
            try:
                await self.unpreparer.unprepare(claim.namespace, claim.name, claim.uid)
                response.claims[claim.uid].error = ""
                metrics.KUBELET_CALLS.labels("unprepare", "ok").inc()
            except Exception as err:  # noqa: BLE001 - mapped to this claim's error by its class
                response.claims[claim.uid].error = await _claim_error("unprepare", claim, err, self.preparer)
        return response


class _DraV1(_DraService, dra_v1_pb2_grpc.DRAPluginServicer):
    def __init__(self, preparer: ClaimPreparer, unpreparer: ClaimUnpreparer) -> None:
        super().__init__(preparer, unpreparer, dra_v1_pb2)


class _DraV1beta1(_DraService, dra_v1beta1_pb2_grpc.DRAPluginServicer):
    def __init__(self, preparer: ClaimPreparer, unpreparer: ClaimUnpreparer) -> None:
        super().__init__(preparer, unpreparer, dra_v1beta1_pb2)


class _Registration(pluginregistration_pb2_grpc.RegistrationServicer):
    def __init__(self, driver: str, endpoint: Path, on_registered: Callable[[bool], None]) -> None:
        self.driver = driver
        self.endpoint = endpoint
        self.on_registered = on_registered

    async def GetInfo(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return pluginregistration_pb2.PluginInfo(
            type="DRAPlugin",
            name=self.driver,
            endpoint=str(self.endpoint),
            supported_versions=SUPPORTED_VERSIONS,
        )

    async def NotifyRegistrationStatus(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        self.on_registered(request.plugin_registered)
        if request.plugin_registered:
            log.info("registered with kubelet")
        else:
            log.error("kubelet refused the registration", extra={"error": request.error})
        return pluginregistration_pb2.RegistrationStatusResponse()


def _listen(server: grpc.aio.Server, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    server.add_insecure_port(f"unix://{path}")


@dataclass(frozen=True)
class KubeletPlugin:
    """The two running servers; `stop()` deregisters from kubelet first (it drops us at once)."""

    dra: grpc.aio.Server
    registration: grpc.aio.Server
    registration_socket: Path

    async def stop(self) -> None:
        self.registration_socket.unlink(missing_ok=True)
        for server in (self.registration, self.dra):
            await server.stop(grace=2)


async def serve(
    preparer: ClaimPreparer,
    unpreparer: ClaimUnpreparer,
    kubelet_root: Path,
    driver: str,
    on_registered: Callable[[bool], None],
) -> KubeletPlugin:
    """Start the DRA service, then the registration socket kubelet watches."""
    registration_socket, dra_socket = socket_paths(kubelet_root, driver)
    dra = grpc.aio.server()
    dra_v1_pb2_grpc.add_DRAPluginServicer_to_server(_DraV1(preparer, unpreparer), dra)
    dra_v1beta1_pb2_grpc.add_DRAPluginServicer_to_server(_DraV1beta1(preparer, unpreparer), dra)
    _listen(dra, dra_socket)
    await dra.start()
    dra_socket.chmod(0o600)
    registration = grpc.aio.server()
    pluginregistration_pb2_grpc.add_RegistrationServicer_to_server(
        _Registration(driver, dra_socket, on_registered), registration
    )
    _listen(registration, registration_socket)
    await registration.start()
    registration_socket.chmod(0o600)
    log.info(
        "kubelet plugin listening", extra={"registration": str(registration_socket), "dra": str(dra_socket)}
    )
    return KubeletPlugin(dra, registration, registration_socket)

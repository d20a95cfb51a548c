"""A small NRI plugin client: containerd's Node Resource Interface over its multiplexed ttrpc socket.

Wire, from the bottom:
    mux frame     [conn id u32 BE][length u32 BE][payload]   one unix socket carries two byte streams
                  conn 1: the runtime calls us (we serve nri.pkg.api.v1alpha1.Plugin)
                  conn 2: we call the runtime (nri.pkg.api.v1alpha1.Runtime)
    ttrpc frame   [length u32 BE][stream id u32 BE][type u8][flags u8][protobuf]   type 1 request, 2 response
    ttrpc Request {service, method, payload, timeout_nano}; Response {status{code, message}, payload}

Lifecycle: connect → RegisterPlugin → the runtime calls Configure (we subscribe to the pod sandbox events,
mask 0x7) → Synchronize (maybe in several `more` parts) → events. Pod events arrive as the dedicated
RunPodSandbox/StopPodSandbox/RemovePodSandbox methods (NRI ≥ 0.12) or as StateChange (older runtimes);
everything else is answered Unimplemented (code 12). When the runtime goes away the client reconnects
with backoff and registers again.

A hook's exception becomes an error status: containerd fails the sandbox and kubelet retries. A hook must
answer within the runtime's request timeout — a timeout would let the pod start without our work. When
the connection goes (containerd drops a plugin that was late), the hooks in flight are cancelled, and the
connection ends only once they are (a CNI plugin a hook started is killed: netclaim.adapters.cni).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import struct
from collections.abc import Awaitable, Callable
from pathlib import Path

from google.protobuf.message import DecodeError, Message

from netclaim._proto import nri_pb2, ttrpc_pb2
from netclaim.core.node import PodSandbox, SandboxEvents
from netclaim.errors import NetclaimError, ProtocolError
from netclaim.runtime import metrics
from netclaim.runtime.backoff import Backoff
from netclaim.runtime.supervisor import Supervisor

log = logging.getLogger(__name__)

PLUGIN_SERVICE = "nri.pkg.api.v1alpha1.Plugin"
RUNTIME_SERVICE = "nri.pkg.api.v1alpha1.Runtime"
PLUGIN_CONN, RUNTIME_CONN = 1, 2
REQUEST, RESPONSE = 1, 2
EVENT_MASK = 0x7  # RUN_POD_SANDBOX | STOP_POD_SANDBOX | REMOVE_POD_SANDBOX, valid on every NRI version
CODE_UNKNOWN, CODE_UNIMPLEMENTED = 2, 12
MAX_MESSAGE = 4 << 20
_MUX = struct.Struct(">II")
_TTRPC = struct.Struct(">IIBB")
MAX_MUX_FRAME = MAX_MESSAGE + _TTRPC.size


def _sandbox(pod: nri_pb2.PodSandbox) -> PodSandbox:
    netns = next((ns.path for ns in pod.linux.namespaces if ns.type == "network"), "")
    return PodSandbox(
        id=pod.id, uid=pod.uid, name=pod.name, namespace=pod.namespace, netns=netns, labels=dict(pod.labels)
    )


def mux_frame(conn: int, payload: bytes) -> bytes:
    return _MUX.pack(conn, len(payload)) + payload


def ttrpc_frame(stream: int, kind: int, data: bytes, flags: int = 0) -> bytes:
    if len(data) > MAX_MESSAGE:
        raise ProtocolError(f"ttrpc message of {len(data)} bytes exceeds {MAX_MESSAGE}")
    return _TTRPC.pack(len(data), stream, kind, flags) + data


class TtrpcStream:
    """Reassembles ttrpc frames from one mux connection's byte stream (frames may span mux frames)."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[tuple[int, int, int, bytes]]:
        self._buffer += data
        frames = []
        while len(self._buffer) >= _TTRPC.size:
            length, stream, kind, flags = _TTRPC.unpack_from(self._buffer)
            if length > MAX_MESSAGE:
                raise ProtocolError(f"ttrpc frame of {length} bytes exceeds {MAX_MESSAGE}")
            if len(self._buffer) < _TTRPC.size + length:
                break
            frames.append((stream, kind, flags, bytes(self._buffer[_TTRPC.size : _TTRPC.size + length])))
            del self._buffer[: _TTRPC.size + length]
        return frames


def parse_response(data: bytes) -> ttrpc_pb2.Response:
    try:
        return ttrpc_pb2.Response.FromString(data)
    except DecodeError as err:
        raise ProtocolError(f"a ttrpc response that does not decode: {err}") from err


class MuxDecoder:
    """The socket's byte stream → (mux connection, ttrpc stream, type, flags, payload), bounded: a frame
    longer than any message the runtime may send is a ProtocolError (the connection is dropped and
    dialled again), never an allocation of what its length field says."""

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._streams = {PLUGIN_CONN: TtrpcStream(), RUNTIME_CONN: TtrpcStream()}

    def feed(self, data: bytes) -> list[tuple[int, int, int, int, bytes]]:
        self._buffer += data
        frames = []
        while len(self._buffer) >= _MUX.size:
            conn, length = _MUX.unpack_from(self._buffer)
            if length > MAX_MUX_FRAME:
                raise ProtocolError(f"mux frame of {length} bytes exceeds {MAX_MUX_FRAME}")
            if len(self._buffer) < _MUX.size + length:
                break
            payload = bytes(self._buffer[_MUX.size : _MUX.size + length])
            del self._buffer[: _MUX.size + length]
            stream = self._streams.get(conn)
            if stream is None:
                continue  # unknown connection ids are dropped, as the runtime's mux does
            frames += [(conn, *frame) for frame in stream.feed(payload)]
        return frames


class Connection:
    """One registered session with the runtime; ends when the socket closes."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        hooks: SandboxEvents,
        background: Supervisor,
        name: str,
        index: str,
        on_state: Callable[[bool], None] | None = None,
    ) -> None:
        self.reader, self.writer = reader, writer
        self.hooks = hooks
        self.background = background  # runs each call of the runtime, and the repairs after Synchronize
        self.name, self.index = name, index
        self.on_state = on_state  # told True once synchronized (events flow), False when the link is lost
        self.request_timeout = 2.0  # seconds; replaced by the runtime's value in Configure
        self._decoder = MuxDecoder()
        self._write_lock = asyncio.Lock()
        self._next_stream = 1
        self._pending: dict[int, asyncio.Future[ttrpc_pb2.Response]] = {}
        self._sync_pods: list[PodSandbox] = []
        self._tasks: set[asyncio.Task[None]] = set()  # this connection's: cancelled when it ends

    async def _send(self, conn: int, frame: bytes) -> None:
        async with self._write_lock:
            self.writer.write(mux_frame(conn, frame))
            await self.writer.drain()

    async def call_runtime(self, method: str, request: Message, seconds: float) -> ttrpc_pb2.Response:
        stream, self._next_stream = self._next_stream, self._next_stream + 2
        envelope = ttrpc_pb2.Request(
            service=RUNTIME_SERVICE,
            method=method,
            payload=request.SerializeToString(),
            timeout_nano=int(seconds * 1e9),
        )
        future: asyncio.Future[ttrpc_pb2.Response] = asyncio.get_running_loop().create_future()
        self._pending[stream] = future
        try:
            await self._send(RUNTIME_CONN, ttrpc_frame(stream, REQUEST, envelope.SerializeToString()))
            response = await asyncio.wait_for(future, seconds)
        finally:
            self._pending.pop(stream, None)
        if response.status.code:
            raise ProtocolError(
                f"{method}: runtime answered code {response.status.code}: {response.status.message}"
            )
        return response

    async def run(self) -> None:
        """Read until the runtime closes the connection, dispatching its calls and our responses."""
        reading = asyncio.create_task(self._read_loop())
        registering = asyncio.create_task(
            self.call_runtime(
                "RegisterPlugin",
                nri_pb2.RegisterPluginRequest(
                    plugin_name=self.name, plugin_idx=self.index, NRI_version="v0.12.3"
                ),
                seconds=5.0,
            )
        )
        try:
            # a broken connection ends the registration at once, not after its time-out
            await asyncio.wait({reading, registering}, return_when=asyncio.FIRST_COMPLETED)
            if reading.done():
                reading.result()
            registering.result()
            await reading
        finally:
            reading.cancel()
            registering.cancel()
            # hooks in flight end with the connection: the runtime no longer waits for their answers.
            # Their cancellation is awaited (it kills any CNI plugin they started), so nothing of theirs
            # still runs when the next connection's Synchronize repairs what they left.
            for task in self._tasks:
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            self.writer.close()
            with contextlib.suppress(OSError):
                await self.writer.wait_closed()

    async def _read_loop(self) -> None:
        while True:
            received = await self.reader.read(64 * 1024)
            if not received:
                raise ConnectionError("the runtime closed the connection")
            for conn, stream_id, kind, _flags, data in self._decoder.feed(received):
                if conn == RUNTIME_CONN and kind == RESPONSE:
                    self._resolve(stream_id, data)
                elif conn == PLUGIN_CONN and kind == REQUEST:
                    self._hold(self.background.spawn("nri-call", self._serve(stream_id, data)))

    def _hold(self, task: asyncio.Task[None]) -> None:
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _resolve(self, stream_id: int, data: bytes) -> None:
        future = self._pending.get(stream_id)
        if future is not None and not future.done():
            future.set_result(parse_response(data))

    async def _serve(self, stream_id: int, data: bytes) -> None:
        request = ttrpc_pb2.Request()
        try:
            request.ParseFromString(data)
            payload, code, message = await self._dispatch(request)
        except DecodeError as err:
            payload, code, message = b"", CODE_UNKNOWN, f"bad request: {err}"
        response = ttrpc_pb2.Response(status=ttrpc_pb2.Status(code=code, message=message), payload=payload)
        await self._send(PLUGIN_CONN, ttrpc_frame(stream_id, RESPONSE, response.SerializeToString()))

    async def _dispatch(self, request: ttrpc_pb2.Request) -> tuple[bytes, int, str]:
        if request.service != PLUGIN_SERVICE:
            return b"", CODE_UNIMPLEMENTED, f"service {request.service}"
        handler = self._handlers().get(request.method)
        if handler is None:
            return b"", CODE_UNIMPLEMENTED, f"method {request.method}"
        try:
            with metrics.NRI_HOOK_SECONDS.labels(request.method).time():
                reply = await handler(request.payload)
        except NetclaimError as err:
            metrics.NRI_CALLS.labels(request.method, "failed").inc()
            log.warning("NRI %s failed", request.method, extra={"error": str(err)})
            return b"", CODE_UNKNOWN, str(err)
        except Exception as err:
            metrics.NRI_CALLS.labels(request.method, "bug").inc()
            log.exception("NRI %s failed (a bug)", request.method)
            return b"", CODE_UNKNOWN, f"internal error in the netclaim agent: {err!r}"
        metrics.NRI_CALLS.labels(request.method, "ok").inc()
        return reply.SerializeToString(), 0, ""

    def _handlers(self) -> dict[str, Callable[[bytes], Awaitable[Message]]]:
        return {
            "Configure": self._configure,
            "Synchronize": self._synchronize,
            "Shutdown": self._shutdown,
            "RunPodSandbox": self._pod_call(nri_pb2.RunPodSandboxRequest, self.hooks.run_pod_sandbox),
            "StopPodSandbox": self._pod_call(nri_pb2.StopPodSandboxRequest, self.hooks.stop_pod_sandbox),
            "RemovePodSandbox": self._pod_call(
                nri_pb2.RemovePodSandboxRequest, self.hooks.remove_pod_sandbox
            ),
            "StateChange": self._state_change,
        }

    @property
    def budget(self) -> float:
        """Time a hook may take: three quarters of the runtime's timeout, the rest is our margin."""
        return self.request_timeout * 0.75

    async def _configure(self, payload: bytes) -> Message:
        request = nri_pb2.ConfigureRequest.FromString(payload)
        if request.request_timeout > 0:
            self.request_timeout = request.request_timeout / 1000
        log.info(
            "NRI configured",
            extra={
                "runtime": request.runtime_name,
                "version": request.runtime_version,
                "nri": request.NRI_version,
                "timeout_s": self.request_timeout,
            },
        )
        return nri_pb2.ConfigureResponse(events=EVENT_MASK)

    async def _synchronize(self, payload: bytes) -> Message:
        request = nri_pb2.SynchronizeRequest.FromString(payload)
        self._sync_pods.extend(_sandbox(pod) for pod in request.pods)
        if request.more:
            return nri_pb2.SynchronizeResponse(more=True)
        pods, self._sync_pods = self._sync_pods, []
        # Repairs may take longer than the runtime waits for this answer: they run on their own.
        self._hold(self.background.spawn("nri-synchronize", self.hooks.synchronize(pods)))
        # Ready only now: the runtime sends pod events to a plugin once its Synchronize is answered, so a
        # pod that went between Configure and here would be missed by whoever trusted an earlier "ready".
        if self.on_state is not None:
            self.on_state(True)
        return nri_pb2.SynchronizeResponse(more=False)

    async def _shutdown(self, payload: bytes) -> Message:
        log.info("the runtime is shutting down")
        return nri_pb2.Empty()

    def _pod_call(
        self,
        kind: type[nri_pb2.RunPodSandboxRequest]
        | type[nri_pb2.StopPodSandboxRequest]
        | type[nri_pb2.RemovePodSandboxRequest],
        hook: Callable[[PodSandbox, float], Awaitable[None]],
    ) -> Callable[[bytes], Awaitable[Message]]:
        async def call(payload: bytes) -> Message:
            await hook(_sandbox(kind.FromString(payload).pod), self.budget)
            return nri_pb2.Empty()

        return call

    async def _state_change(self, payload: bytes) -> Message:
        event = nri_pb2.StateChangeEvent.FromString(payload)
        hooks = {
            nri_pb2.RUN_POD_SANDBOX: self.hooks.run_pod_sandbox,
            nri_pb2.STOP_POD_SANDBOX: self.hooks.stop_pod_sandbox,
            nri_pb2.REMOVE_POD_SANDBOX: self.hooks.remove_pod_sandbox,
        }
        hook = hooks.get(event.event)
        if hook is not None:
            await hook(_sandbox(event.pod), self.budget)
        return nri_pb2.Empty()


async def run_plugin(
    socket: Path,
    hooks: SandboxEvents,
    background: Supervisor,
    name: str = "netclaim",
    index: str = "50",
    on_state: Callable[[bool], None] | None = None,
) -> None:
    """Stay registered with the runtime at `socket` forever, reconnecting with backoff (0.2 s → 5 s)."""
    backoff = Backoff(first=0.2, cap=5.0)
    while True:
        try:
            reader, writer = await asyncio.open_unix_connection(str(socket))
        except OSError as err:
            log.info("NRI socket not reachable; retrying", extra={"socket": str(socket), "error": str(err)})
            await backoff.wait()
            continue
        connection = Connection(reader, writer, hooks, background, name, index, on_state)
        log.info("NRI connected", extra={"socket": str(socket)})
        try:
            await connection.run()
        except (asyncio.IncompleteReadError, ConnectionError, ProtocolError, TimeoutError) as err:
            log.warning("NRI connection lost; reconnecting", extra={"error": repr(err)})
        except Exception:  # whatever the runtime sent, the agent stays and dials again
            log.exception("NRI connection failed (a bug); reconnecting")
        if on_state is not None:
            on_state(False)
        backoff.reset()
        await backoff.wait()


async def reachable(socket_path: str) -> None:
    """Connect to the runtime's NRI socket and leave at once (the runtime drops a connection that never
    registers): OSError when nothing listens there."""
    _, writer = await asyncio.open_unix_connection(socket_path)
    writer.close()
    await writer.wait_closed()

"""NRI over ttrpc on recorded frames: the bytes a containerd sends and expects, without containerd.

The worked example of shared/reference (RegisterPlugin on conn 2; the Configure reply on conn 1) is checked
byte for byte; a scripted runtime on a socketpair then drives a whole session: registration, Configure,
Synchronize in two parts, RunPodSandbox, an unknown method, a hook error and a frame split across mux frames.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from google.protobuf.message import Message

from netclaim._proto import nri_pb2, ttrpc_pb2
from netclaim.adapters import nri
from netclaim.core.node import PodSandbox
from netclaim.errors import AttachError, ProtocolError
from netclaim.runtime import metrics
from netclaim.runtime.supervisor import Supervisor

REGISTER_FRAME = bytes.fromhex(
    "00000002"
    "00000055"
    "0000004b"
    "00000001"
    "01"
    "00"
    "0a1c"
    + b"nri.pkg.api.v1alpha1.Runtime".hex()
    + "120e"
    + b"RegisterPlugin".hex()
    + "1a15"
    + "0a0f"
    + b"net.example.com".hex()
    + "1202"
    + b"10".hex()
    + "2080e497d012"
)
CONFIGURE_REPLY_FRAME = bytes.fromhex("000000010000000e0000000400000001020012021007")


def test_the_worked_register_example_byte_for_byte() -> None:
    request = nri_pb2.RegisterPluginRequest(plugin_name="net.example.com", plugin_idx="10")
    envelope = ttrpc_pb2.Request(
        service="nri.pkg.api.v1alpha1.Runtime",
        method="RegisterPlugin",
        payload=request.SerializeToString(),
        timeout_nano=5_000_000_000,
    )
    frame = nri.mux_frame(2, nri.ttrpc_frame(1, nri.REQUEST, envelope.SerializeToString()))
    assert frame == REGISTER_FRAME


def test_the_configure_reply_example_byte_for_byte() -> None:
    reply = ttrpc_pb2.Response(payload=nri_pb2.ConfigureResponse(events=nri.EVENT_MASK).SerializeToString())
    assert (
        nri.mux_frame(1, nri.ttrpc_frame(1, nri.RESPONSE, reply.SerializeToString())) == CONFIGURE_REPLY_FRAME
    )


def test_frames_split_across_mux_frames_are_reassembled() -> None:
    stream = nri.TtrpcStream()
    whole = nri.ttrpc_frame(7, nri.REQUEST, b"x" * 300) + nri.ttrpc_frame(9, nri.REQUEST, b"y")
    assert stream.feed(whole[:5]) == [] and stream.feed(whole[5:200]) == []
    assert stream.feed(whole[200:]) == [(7, nri.REQUEST, 0, b"x" * 300), (9, nri.REQUEST, 0, b"y")]


@dataclass
class Hooks:
    calls: list[str] = field(default_factory=list)
    synchronized: asyncio.Event = field(default_factory=asyncio.Event)

    async def synchronize(self, pods: list[PodSandbox]) -> None:
        self.calls.append(f"synchronize {sorted(p.name for p in pods)}")
        self.synchronized.set()

    async def run_pod_sandbox(self, pod: PodSandbox, budget: float) -> None:
        self.calls.append(f"run {pod.name} {budget:.2f}")
        if pod.name == "broken":
            raise AttachError("cannot attach net1")

    async def stop_pod_sandbox(self, pod: PodSandbox, budget: float) -> None:
        self.calls.append(f"stop {pod.name}")

    async def remove_pod_sandbox(self, pod: PodSandbox, budget: float) -> None:
        self.calls.append(f"remove {pod.name}")


class Runtime:
    """The containerd side of the socket: reads mux frames, sends calls, returns parsed replies."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.streams = {1: nri.TtrpcStream(), 2: nri.TtrpcStream()}
        self.next_stream = 1

    async def frame(self) -> tuple[int, int, int, bytes]:
        while True:
            header = await self._exact(8)
            conn, length = struct.unpack(">II", header)
            frames = self.streams[conn].feed(await self._exact(length))
            if frames:
                stream, kind, _, data = frames[0]
                return conn, stream, kind, data

    async def _exact(self, size: int) -> bytes:
        loop = asyncio.get_running_loop()
        data = b""
        while len(data) < size:
            chunk = await loop.sock_recv(self.sock, size - len(data))
            assert chunk, "the plugin closed the connection"
            data += chunk
        return data

    async def call(self, method: str, message: Message, split: bool = False) -> ttrpc_pb2.Response:
        envelope = ttrpc_pb2.Request(
            service=nri.PLUGIN_SERVICE, method=method, payload=message.SerializeToString()
        )
        frame = nri.ttrpc_frame(self.next_stream, nri.REQUEST, envelope.SerializeToString())
        loop = asyncio.get_running_loop()
        parts = [frame[:7], frame[7:]] if split else [frame]
        for part in parts:
            await loop.sock_sendall(self.sock, nri.mux_frame(1, part))
        conn, stream, kind, data = await self.frame()
        assert (conn, stream, kind) == (1, self.next_stream, nri.RESPONSE)
        self.next_stream += 2
        return ttrpc_pb2.Response.FromString(data)


def test_a_whole_session_with_a_scripted_runtime() -> None:
    async def session() -> tuple[list[str], list[ttrpc_pb2.Response]]:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        theirs.setblocking(False)
        hooks = Hooks()
        states: list[bool] = []
        reader, writer = await asyncio.open_unix_connection(sock=ours)
        plugin = nri.Connection(reader, writer, hooks, Supervisor(), "netclaim", "50", states.append)
        running = asyncio.create_task(plugin.run())
        runtime = Runtime(theirs)
        conn, stream, kind, data = await runtime.frame()  # RegisterPlugin from the plugin
        register = ttrpc_pb2.Request.FromString(data)
        assert (conn, stream, kind, register.method) == (2, 1, nri.REQUEST, "RegisterPlugin")
        assert nri_pb2.RegisterPluginRequest.FromString(register.payload).plugin_idx == "50"
        ok = ttrpc_pb2.Response(status=ttrpc_pb2.Status(code=0))
        await asyncio.get_running_loop().sock_sendall(
            theirs, nri.mux_frame(2, nri.ttrpc_frame(1, nri.RESPONSE, ok.SerializeToString()))
        )
        pod = nri_pb2.PodSandbox(id="abc", name="web", uid="u1", namespace="ns")
        replies = [
            await runtime.call(
                "Configure", nri_pb2.ConfigureRequest(runtime_name="containerd", request_timeout=2000)
            ),
            await runtime.call("Synchronize", nri_pb2.SynchronizeRequest(pods=[pod], more=True)),
        ]
        hooks.calls.append(f"states before the last Synchronize {list(states)}")
        replies += [
            await runtime.call(
                "Synchronize", nri_pb2.SynchronizeRequest(pods=[nri_pb2.PodSandbox(name="db")], more=False)
            ),
            await runtime.call("RunPodSandbox", nri_pb2.RunPodSandboxRequest(pod=pod), split=True),
            await runtime.call("CreateContainer", nri_pb2.Empty()),
            await runtime.call(
                "RunPodSandbox", nri_pb2.RunPodSandboxRequest(pod=nri_pb2.PodSandbox(name="broken"))
            ),
            await runtime.call(
                "StateChange", nri_pb2.StateChangeEvent(event=nri_pb2.STOP_POD_SANDBOX, pod=pod)
            ),
        ]

        await asyncio.wait_for(hooks.synchronized.wait(), 10)  # Synchronize hands over in the background
        theirs.close()
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            await running  # the runtime hung up: run() ends with the connection
        return [*hooks.calls, f"states {states}"], replies

    def counted(result: str) -> float:
        return (
            metrics.REGISTRY.get_sample_value(
                "netclaim_nri_calls_total", {"method": "RunPodSandbox", "result": result}
            )
            or 0.0
        )

    before = {result: counted(result) for result in ("ok", "failed")}
    calls, replies = asyncio.run(session())
    # the alerts' attach failures: one RunPodSandbox of each outcome
    assert {result: counted(result) - before[result] for result in before} == {"ok": 1, "failed": 1}
    configure, sync_more, sync_last, run, unknown, broken, state_change = replies
    assert nri_pb2.ConfigureResponse.FromString(configure.payload).events == 0x7
    assert nri_pb2.SynchronizeResponse.FromString(sync_more.payload).more is True
    assert nri_pb2.SynchronizeResponse.FromString(sync_last.payload).more is False
    assert run.status.code == 0
    assert (unknown.status.code, unknown.status.message) == (12, "method CreateContainer")
    assert broken.status.code == 2 and "cannot attach net1" in broken.status.message
    assert state_change.status.code == 0
    assert [c for c in calls if not c.startswith("synchronize")] == [
        "states before the last Synchronize []",  # not ready while the runtime still synchronizes us
        "run web 1.50",
        "run broken 1.50",
        "stop web",
        "states [True]",
    ]  # budget: 3/4 of the 2 s timeout
    assert "synchronize ['db', 'web']" in calls  # both parts of Synchronize, handed over once


def test_a_frame_longer_than_any_message_is_refused_before_it_is_read() -> None:
    decoder = nri.MuxDecoder()
    with pytest.raises(ProtocolError, match="exceeds"):
        decoder.feed(struct.pack(">II", 1, 0xFFFFFFF0))  # a 4 GiB length, no payload behind it


def test_a_response_that_does_not_decode_is_a_protocol_error() -> None:
    with pytest.raises(ProtocolError):
        nri.parse_response(b"\xff\xff\xff")


def test_a_malformed_frame_drops_the_connection_and_the_plugin_dials_again(tmp_path: Path) -> None:
    """The agent never dies of what the runtime sends: the first connection gets garbage, the plugin
    reconnects and registers again on the second."""
    socket_path = tmp_path / "nri.sock"

    async def scenario() -> int:
        connections: list[bytes] = []
        registered = asyncio.Event()

        async def runtime(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            connections.append(await reader.read(4096))  # the plugin's RegisterPlugin
            if len(connections) == 1:
                writer.write(struct.pack(">II", 2, 0xFFFFFFF0))  # garbage: a frame no runtime sends
                await writer.drain()
            else:
                registered.set()
            with contextlib.suppress(ConnectionError):
                await reader.read()
            writer.close()

        server = await asyncio.start_unix_server(runtime, path=str(socket_path))
        plugin = asyncio.create_task(nri.run_plugin(socket_path, Hooks(), Supervisor()))
        try:
            await asyncio.wait_for(registered.wait(), 30)
            assert not plugin.done()
        finally:
            plugin.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await plugin
            server.close()
        return len(connections)

    assert asyncio.run(scenario()) == 2


def test_a_dropped_connection_ends_only_once_its_hooks_in_flight_have_ended() -> None:
    """The runtime hangs up while a RunPodSandbox is at work: the hook is cancelled, and the connection
    (after which the plugin dials again and repairs) ends only once that cancellation is complete."""

    @dataclass
    class StuckHooks(Hooks):
        started: asyncio.Event = field(default_factory=asyncio.Event)

        async def run_pod_sandbox(self, pod: PodSandbox, budget: float) -> None:
            self.started.set()
            try:
                await asyncio.Event().wait()  # inside ADD, say
            finally:
                await asyncio.sleep(0.1)  # what a cancelled hook does on its way out (kill its plugin)
                self.calls.append("run cancelled")

    async def session() -> list[str]:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        theirs.setblocking(False)
        hooks = StuckHooks()
        reader, writer = await asyncio.open_unix_connection(sock=ours)
        running = asyncio.create_task(
            nri.Connection(reader, writer, hooks, Supervisor(), "netclaim", "50").run()
        )
        runtime = Runtime(theirs)
        await runtime.frame()  # RegisterPlugin
        ok = ttrpc_pb2.Response(status=ttrpc_pb2.Status(code=0))
        loop = asyncio.get_running_loop()
        await loop.sock_sendall(
            theirs, nri.mux_frame(2, nri.ttrpc_frame(1, nri.RESPONSE, ok.SerializeToString()))
        )
        run = ttrpc_pb2.Request(
            service=nri.PLUGIN_SERVICE,
            method="RunPodSandbox",
            payload=nri_pb2.RunPodSandboxRequest(pod=nri_pb2.PodSandbox(name="web")).SerializeToString(),
        )
        await loop.sock_sendall(
            theirs, nri.mux_frame(1, nri.ttrpc_frame(1, nri.REQUEST, run.SerializeToString()))
        )
        await asyncio.wait_for(hooks.started.wait(), 10)
        theirs.close()
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            await running
        return [*hooks.calls, "connection ended"]

    assert asyncio.run(session()) == ["run cancelled", "connection ended"]

"""The agent's /metrics, /healthz, /readyz endpoint: answers, and holds its ground against abuse."""

from __future__ import annotations

import asyncio
import contextlib

from netclaim.adapters import http
from netclaim.adapters.http import Health


async def _get(port: int, line: bytes) -> bytes:
    """The whole reply, or b"" when the server closed without one."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(line)
        await writer.drain()
        return await asyncio.wait_for(reader.read(), 10)
    except ConnectionResetError:
        return b""
    finally:
        writer.close()


async def _serving(health: Health) -> tuple[asyncio.Server, int]:
    server = await http.serve("127.0.0.1:0", health)
    assert server is not None
    return server, server.sockets[0].getsockname()[1]


async def test_health_and_readiness_follow_the_parts() -> None:
    health = Health()
    health.expect("published")
    server, port = await _serving(health)
    try:
        assert (await _get(port, b"GET /healthz HTTP/1.1\r\n\r\n")).startswith(b"HTTP/1.1 200 OK")
        assert (await _get(port, b"GET /readyz HTTP/1.1\r\n\r\n")).startswith(b"HTTP/1.1 503")
        health.set("published", True)
        ready = await _get(port, b"GET /readyz HTTP/1.1\r\n\r\n")
        assert ready.startswith(b"HTTP/1.1 200 OK") and b'{"published": true}' in ready
        assert b"netclaim_published_devices" in await _get(port, b"GET /metrics HTTP/1.1\r\n\r\n")
        assert (await _get(port, b"GET /nope HTTP/1.1\r\n\r\n")).startswith(b"HTTP/1.1 404")
    finally:
        server.close()


async def test_a_request_line_over_the_limit_is_dropped_and_the_server_carries_on() -> None:
    server, port = await _serving(Health())
    try:
        assert await _get(port, b"GET /" + b"a" * 70_000 + b" HTTP/1.1\r\n\r\n") == b""
        assert (await _get(port, b"GET /healthz HTTP/1.1\r\n\r\n")).startswith(b"HTTP/1.1 200 OK")
    finally:
        server.close()


async def test_connections_over_the_cap_are_closed_at_once() -> None:
    server, port = await _serving(Health())
    idle: list[asyncio.StreamWriter] = []
    try:
        for _ in range(http.MAX_CONNECTIONS):  # slow clients: connected, sending nothing
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            idle.append(writer)
        await asyncio.sleep(0)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /healthz HTTP/1.1\r\n\r\n")
        try:
            refused = await asyncio.wait_for(reader.read(), 10)
        except ConnectionResetError:  # closed with the request unread: the kernel answers with a reset
            refused = b""
        assert refused == b"", refused  # no answer while the cap is reached
        writer.close()
        for slow in idle:
            slow.close()
        for slow in idle:
            with contextlib.suppress(ConnectionError):
                await slow.wait_closed()

        async def answered() -> bytes:
            while True:  # the server frees a slot when it has seen each slow client go
                reply = await _get(port, b"GET /healthz HTTP/1.1\r\n\r\n")
                if reply:
                    return reply

        assert (await asyncio.wait_for(answered(), 10)).startswith(b"HTTP/1.1 200 OK")
    finally:
        server.close()

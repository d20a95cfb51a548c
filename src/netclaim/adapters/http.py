"""The agent's own HTTP endpoint: /metrics (Prometheus), /healthz (alive) and /readyz (serving).

Ready means: this node's slices were published, kubelet accepted the plugin registration, and containerd
configured the NRI plugin (each only when that part is enabled). A DaemonSet readinessProbe uses /readyz.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from dataclasses import dataclass, field

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from netclaim.runtime.metrics import REGISTRY

log = logging.getLogger(__name__)


@dataclass
class Health:
    parts: dict[str, bool] = field(default_factory=dict)

    def expect(self, part: str) -> None:
        self.parts.setdefault(part, False)

    def set(self, part: str, ok: bool) -> None:
        self.parts[part] = ok

    @property
    def ready(self) -> bool:
        return all(self.parts.values())


def _response(status: str, content_type: str, body: bytes) -> bytes:
    head = (
        f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close"
    )
    return head.encode() + b"\r\n\r\n" + body


MAX_CONNECTIONS = 16  # a scraper and two probes need three; the rest are answered by closing
MAX_REQUEST_LINE = 4096  # bytes; /metrics, /healthz and /readyz need a few dozen
READ_SECONDS = 5.0


class _Server:
    def __init__(self, health: Health) -> None:
        self.health = health
        self.open = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.open >= MAX_CONNECTIONS:
            writer.close()  # over the cap: nothing is read, nothing is held
            return
        self.open += 1
        try:
            request = await asyncio.wait_for(reader.readline(), READ_SECONDS)
            words = request.split()
            path = words[1].decode(errors="replace") if len(words) > 1 else "/"
            writer.write(self._reply(path))
            await writer.drain()
        except (TimeoutError, ConnectionError, ValueError):  # ValueError: a line over MAX_REQUEST_LINE
            pass
        finally:
            self.open -= 1
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    def _reply(self, path: str) -> bytes:
        if path == "/metrics":
            return _response("200 OK", CONTENT_TYPE_LATEST, generate_latest(REGISTRY))
        if path == "/healthz":
            return _response("200 OK", "text/plain", b"ok\n")
        if path == "/readyz":
            body = json.dumps(self.health.parts, sort_keys=True).encode() + b"\n"
            return _response(
                "200 OK" if self.health.ready else "503 Service Unavailable", "application/json", body
            )
        return _response("404 Not Found", "text/plain", b"try /metrics, /healthz or /readyz\n")


async def serve(address: str, health: Health) -> asyncio.Server | None:
    """Listen on host:port ('' disables); returns the server (closed by the caller). At most
    MAX_CONNECTIONS at once, request lines of at most MAX_REQUEST_LINE bytes, READ_SECONDS to send one."""
    if not address:
        return None
    host, _, port = address.rpartition(":")
    handler = _Server(health)
    server = await asyncio.start_server(handler.handle, host or None, int(port), limit=MAX_REQUEST_LINE)
    log.info("serving /metrics, /healthz, /readyz", extra={"address": address})
    return server

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

from netclaim.metrics import REGISTRY

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


async def _handle(health: Health, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        request = await asyncio.wait_for(reader.readline(), 5)
        path = request.split()[1].decode() if len(request.split()) > 1 else "/"
        if path == "/metrics":
            reply = _response("200 OK", CONTENT_TYPE_LATEST, generate_latest(REGISTRY))
        elif path == "/healthz":
            reply = _response("200 OK", "text/plain", b"ok\n")
        elif path == "/readyz":
            body = json.dumps(health.parts, sort_keys=True).encode() + b"\n"
            reply = _response(
                "200 OK" if health.ready else "503 Service Unavailable", "application/json", body
            )
        else:
            reply = _response("404 Not Found", "text/plain", b"try /metrics, /healthz or /readyz\n")
        writer.write(reply)
        await writer.drain()
    except (TimeoutError, ConnectionError, IndexError):
        pass
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


async def serve(address: str, health: Health) -> asyncio.Server | None:
    """Listen on host:port ('' disables); returns the server (closed by the caller)."""
    if not address:
        return None
    host, _, port = address.rpartition(":")
    server = await asyncio.start_server(lambda r, w: _handle(health, r, w), host or None, int(port))
    log.info("serving /metrics, /healthz, /readyz", extra={"address": address})
    return server

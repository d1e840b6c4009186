"""The ASGI plumbing of ``squad serve``: request bodies and headers read, JSON answers sent, the
headers squad serve reads and writes (``X-Squad-Serve``, ``X-Squad-Priority``, ``X-Squad-Client``)."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from squad.serve import apis
from squad.serve.demand import Refused

__all__ = ["Send", "Receive", "SERVE_HEADER", "PRIORITY_HEADER", "CLIENT_HEADER", "read_body", "send_json", "relayed",
           "header", "priority_of", "client_name"]

SERVE_HEADER = "x-squad-serve"
"""Response header naming squad serve (its version): the endpoint admits on its own."""
PRIORITY_HEADER = "x-squad-priority"
"""Request header: a whole number, lower is admitted first (default 0); FIFO among equals."""
CLIENT_HEADER = "x-squad-client"
"""Request header naming the client for per-client counts (else the label of its key, else the body's
``user`` / ``metadata.user_id`` field, else the peer address)."""
_HOP = {b"connection", b"keep-alive", b"transfer-encoding", b"server", b"date"}

Send = Callable[[dict[str, Any]], Awaitable[None]]
Receive = Callable[[], Awaitable[dict[str, Any]]]


async def read_body(receive: Receive) -> bytes:
    """The whole request body (what came before a disconnect)."""
    chunks = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


async def send_json(send: Send, status: int, body: Any, headers: list[tuple[bytes, bytes]] | None = None) -> None:
    """Answer ``status`` with ``body`` as JSON (and ``headers``)."""
    data = json.dumps(body).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode()),
                            *(headers or [])]})
    await send({"type": "http.response.body", "body": data})


def relayed(headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """The engine's response headers a client gets (hop-by-hop ones left out)."""
    return [(k, v) for k, v in headers if k.lower() not in _HOP]


def header(scope: dict[str, Any], name: bytes) -> str | None:
    """Request header ``name`` (lower case) as text, or None."""
    for key, value in scope["headers"]:
        if key == name:
            return value.decode("utf-8", "replace")  # HTTP carries bytes; clients send UTF-8 names
    return None


def priority_of(scope: dict[str, Any]) -> int:
    """The request's :data:`PRIORITY_HEADER` (default 0); :class:`Refused` (400) outside -1000..1000."""
    value = header(scope, PRIORITY_HEADER.encode())
    if value is None:
        return 0
    try:
        priority = int(value)
    except ValueError:
        priority = None
    if priority is None or not -1000 <= priority <= 1000:
        raise Refused(400, f"{PRIORITY_HEADER}: write a whole number from -1000 to 1000 (lower is admitted first), "
                           f"got {value!r}")
    return priority


def client_name(scope: dict[str, Any], body: dict[str, Any]) -> str:
    """Who sent the request, for per-client counts (:data:`CLIENT_HEADER`), at most 64 characters."""
    named = header(scope, CLIENT_HEADER.encode())
    if named:
        return named[:64]
    named = scope.get("squad.key_label") or apis.client_field(body)
    if named:
        return named[:64]
    peer = scope.get("client")
    return str(peer[0]) if peer else "?"

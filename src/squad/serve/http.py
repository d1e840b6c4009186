"""The ASGI plumbing of ``squad serve``: request bodies read (bounded in size and time) and parsed
(off the event loop when large), headers, JSON answers sent, the headers squad serve reads and writes
(``X-Squad-Serve``, ``X-Squad-Priority``, ``X-Squad-Client``)."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import anyio

from squad.serve import apis
from squad.serve.demand import Refused

__all__ = ["Send", "Receive", "SERVE_HEADER", "PRIORITY_HEADER", "CLIENT_HEADER", "MAX_BODY", "BODY_TIMEOUT",
           "OFF_LOOP_BYTES", "MAX_DEPTH", "read_body", "drain", "parse_body", "shaped", "send_json", "relayed",
           "header", "priority_of", "client_name"]

MAX_BODY = 32 * 1024 * 1024
"""Bytes a request body may have (``squad serve --max-body``): larger ones get 413 as soon as their
``Content-Length`` (or, chunked, their bytes so far) says so. 32 MiB holds a prompt of several million
tokens, more than any context squad plans."""
BODY_TIMEOUT = 60.0
"""Seconds a client may take to send its whole body (408 after that)."""
OFF_LOOP_BYTES = 64 * 1024
"""A body of this many bytes or more is parsed, counted and written in a worker thread, so that it
holds up no other client (parsing 50 MB of JSON takes seconds)."""
MAX_DEPTH = 128
"""The deepest nesting of JSON arrays and objects a body may have (deeper bodies are 400: Python's
parser and every walk over the body recurse)."""

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


async def read_body(receive: Receive, *, limit: int | None = None, timeout: float | None = None,
                    declared: str | None = None) -> bytes:
    """The whole request body (what came before a disconnect). With ``limit``: :class:`Refused` 413 as
    soon as ``declared`` (the ``Content-Length`` header) or the bytes read pass it; with ``timeout``:
    :class:`Refused` 408 when the body takes longer (a slow client holds no one up but itself)."""
    if limit is not None and declared is not None:
        try:
            size = int(declared)
        except ValueError:
            raise Refused(400, f"Content-Length {declared[:40]!r} is not a number") from None
        if size > limit:
            raise _too_large(limit, size)
    chunks: list[bytes] = []
    got = 0
    with anyio.move_on_after(timeout if timeout is not None else float("inf")) as waited:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                break
            chunk = message.get("body", b"")
            got += len(chunk)
            if limit is not None and got > limit:
                raise _too_large(limit, None)
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
    if waited.cancelled_caught:
        raise Refused(408, f"the request body did not arrive within {timeout:g} s ({got:,} bytes came): send "
                           "it at once", "timeout_error")
    return b"".join(chunks)


async def drain(receive: Receive, timeout: float) -> None:
    """Read and drop what is left of a refused body (at most ``timeout`` seconds), so that the client,
    still sending, reads the answer instead of a reset connection."""
    with anyio.move_on_after(timeout):
        while True:
            message = await receive()
            if message["type"] == "http.disconnect" or not message.get("more_body", False):
                return


def _too_large(limit: int, size: int | None) -> Refused:
    what = f"{size:,} bytes" if size is not None else f"more than {limit:,} bytes"
    return Refused(413, f"the request body is {what}, but squad serve takes at most {limit:,} bytes "
                        f"({limit / 2**20:g} MiB): send a smaller request, or restart squad serve with a larger "
                        "--max-body", "request_too_large", limit=limit)


async def parse_body(raw: bytes) -> dict[str, Any]:
    """A request body as a JSON object; parsed in a worker thread from :data:`OFF_LOOP_BYTES` on.
    Raises :class:`Refused` (400) for anything else: not JSON, not UTF-8, ``NaN``, not an object, or
    nested deeper than :data:`MAX_DEPTH`."""
    try:
        if len(raw) >= OFF_LOOP_BYTES:
            return await anyio.to_thread.run_sync(_parse, raw)
        return _parse(raw)
    except RecursionError:
        raise Refused(400, f"squad serve could not read the request: JSON nested deeper than {MAX_DEPTH} "
                           "levels") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise Refused(400, f"squad serve could not read the request: {exc}") from None


def _parse(raw: bytes) -> dict[str, Any]:
    body = json.loads(raw, parse_constant=_constant)
    if not isinstance(body, dict):
        raise ValueError(f"the body is a JSON {type(body).__name__}, not an object")
    _check_depth(body)
    return body


def _constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _check_depth(body: Any) -> None:
    """Walk ``body`` without recursion; RecursionError past :data:`MAX_DEPTH` levels."""
    level: list[Any] = [body]
    for _ in range(MAX_DEPTH):
        nested: list[Any] = []
        for value in level:
            items = value.values() if isinstance(value, dict) else value
            nested.extend(v for v in items if isinstance(v, (dict, list)))
        if not nested:
            return
        level = nested
    raise RecursionError


async def send_json(send: Send, status: int, body: Any, headers: list[tuple[bytes, bytes]] | None = None) -> None:
    """Answer ``status`` with ``body`` as JSON (and ``headers``)."""
    data = json.dumps(body).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode()),
                            *(headers or [])]})
    await send({"type": "http.response.body", "body": data})


def shaped(send: Send, api: Any) -> Send:
    """``send`` with every error answer (HTTP status >= 400, not an event stream) in ``api``'s own
    shape (:meth:`squad.serve.apis.base.Api.error`; None: OpenAI's), and no engine 500 passed on as
    it is: it becomes a 502 naming the engine (squad checks a body's shape and counts it before it is
    sent, so what fails in the engine after that is the engine's failure)."""
    held: dict[str, Any] = {}

    async def out(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start" and message["status"] >= 400 and not any(
                k.lower() == b"content-type" and v.startswith(b"text/event-stream") for k, v in message["headers"]):
            held["start"], held["chunks"] = message, []
            return
        if "start" not in held or message["type"] != "http.response.body":
            await send(message)
            return
        held["chunks"].append(message.get("body", b""))
        if message.get("more_body", False):
            return
        start = held.pop("start")
        status, raw = start["status"], b"".join(held.pop("chunks"))
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        if not isinstance(body, dict):
            body = {"error": {"message": raw.decode("utf-8", "replace")[:1000] or f"HTTP {status}",
                              "type": "server_error" if status >= 500 else "invalid_request_error", "code": status}}
        if status == 500 and isinstance(body.get("error"), dict):
            status = 502
            error = body["error"]
            body = {**body, "error": {**error, "code": 502, "type": "server_error",
                                      "message": f"the engine failed on this request: {error.get('message', '')}"}}
        if api is not None:
            body = api.error(body)
        data = json.dumps(body).encode()
        headers = [(k, v) for k, v in start["headers"] if k.lower() not in (b"content-length", b"content-type")]
        await send({**start, "status": status, "headers": [*headers, (b"content-type", b"application/json"),
                                                           (b"content-length", str(len(data)).encode())]})
        await send({"type": "http.response.body", "body": data})

    return out


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

"""How squad serve ends a request it cannot finish (it stops: SIGTERM, Ctrl-C; the engine is gone for good), in
the request's API's own shape, so that every client's SDK raises a clear error instead of reading a cut answer:

- not answered yet: HTTP ``status`` with the API's error object (:func:`refusal`): OpenAI's
  ``{"error": {"message", "type", "param", "code"}}``, Anthropic's ``{"type": "error", "error": {"type",
  "message"}}`` for ``/v1/messages``;
- a stream already going: its last event is the API's error event (``data: {"error": ...}`` for chat and
  completions, ``event: error`` for Messages and Responses), then the response ends.
"""

from __future__ import annotations

import json
from typing import Any

from squad.serve.demand import error_body
from squad.serve.http import Send, send_json

__all__ = ["refusal", "error_event", "end_request", "broken_off"]

_ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                    404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 529: "overloaded_error"}


def refusal(kind: str, status: int, message: str) -> dict[str, Any]:
    """The error body of ``status`` with ``message`` in the shape of API ``kind`` (``messages``: Anthropic's)."""
    if kind == "messages":
        return {"type": "error", "error": {"type": _ANTHROPIC_TYPES.get(status, "api_error"), "message": message}}
    return error_body(status, message, "unavailable_error" if status == 503 else "server_error")


async def broken_off(host: Any, exc: BaseException) -> str:
    """What a client is told when the engine's answer to its request broke off (``exc``, an httpx error): that the
    engine exited (squad serve restarts it, :mod:`squad.serve.keeper`) when its process ended, else that the
    connection broke; both say to send the request again. ``host``: the gateway (its ``engine_exited``)."""
    if await host.engine_exited():
        return ("the engine exited while answering this request; squad serve restarts it with the same plan "
                "(/health tells when it is up): send the request again")
    return (f"the engine broke off this answer ({type(exc).__name__}: {str(exc) or 'connection closed'}); "
            "send the request again")


def error_event(kind: str, status: int, message: str) -> bytes:
    """The SSE event that ends a stream of API ``kind`` with an error."""
    if kind == "messages":
        return b"event: error\ndata: " + json.dumps(refusal(kind, status, message)).encode() + b"\n\n"
    if kind == "responses":  # openai's ResponseErrorEvent
        event = {"type": "error", "code": "server_error", "message": message, "param": None, "sequence_number": 0}
        return b"event: error\ndata: " + json.dumps(event).encode() + b"\n\n"
    return b"data: " + json.dumps(refusal(kind, status, message)).encode() + b"\n\n"


async def end_request(send: Send, kind: str, *, stream: bool, started: bool, message: str,
                      status: int = 503) -> None:
    """End a request of API ``kind`` that squad serve cannot finish: ``status`` and the error body when nothing was
    sent yet (``started`` False), else the stream's error event (nothing more for a whole answer already begun)."""
    try:
        if not started:
            await send_json(send, status, refusal(kind, status, message))
        else:
            await send({"type": "http.response.body", "body": error_event(kind, status, message) if stream else b""})
    except OSError:  # the client's connection is gone already
        pass

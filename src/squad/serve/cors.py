"""CORS for ``squad serve``: which web pages may call it from a browser.

None may by default, beyond its own origin (``http://HOST:PORT`` as the request's ``Host``
header names it): a page on another origin would otherwise drive the local engine with a key
it has. ``squad serve --cors-origin ORIGIN`` (repeatable; ``*`` for any) allows more.

- ``OPTIONS`` (a preflight, answered without a key): 204 with ``Access-Control-Allow-*`` for an
  allowed origin; 204 with ``Allow`` only for a plain ``OPTIONS`` without ``Origin``; 403 with an
  error naming the flag for an origin not allowed.
- Other responses to an allowed origin carry ``Access-Control-Allow-Origin`` and ``Vary: Origin``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from squad.serve.demand import error_body

__all__ = ["Cors", "METHODS"]

METHODS = b"GET, POST, OPTIONS"
MAX_AGE = b"600"
"""Seconds a browser may keep a preflight's answer."""


class Cors:
    """The allowed origins (exact ``scheme://host[:port]`` strings, or ``*``)."""

    def __init__(self, origins: Iterable[str] = ()) -> None:
        self.origins = {o.rstrip("/") for o in origins}

    def allowed(self, scope: dict[str, Any]) -> bytes | None:
        """The request's ``Origin`` when it may read the answer, else None (also for no Origin)."""
        origin = _header(scope, b"origin")
        if not origin:
            return None
        text = origin.decode("latin-1")
        host = _header(scope, b"host")
        if "*" in self.origins or text in self.origins or (host and text == "http://" + host.decode("latin-1")):
            return origin
        return None

    def headers(self, scope: dict[str, Any]) -> list[tuple[bytes, bytes]]:
        """Headers every response to an allowed origin carries."""
        origin = self.allowed(scope)
        return [(b"access-control-allow-origin", origin), (b"vary", b"Origin")] if origin else []

    def preflight(self, scope: dict[str, Any]) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        """``(status, headers, body)`` answering an ``OPTIONS`` request."""
        origin = _header(scope, b"origin")
        if origin is None:
            return 204, [(b"allow", METHODS)], b""
        if self.allowed(scope) is None:
            import json

            body = json.dumps(error_body(403, f"squad serve does not allow the origin {origin.decode('latin-1')}: "
                                              "restart it with --cors-origin ORIGIN to let that page call it",
                                         "permission_error")).encode()
            return 403, [(b"content-type", b"application/json"), (b"vary", b"Origin")], body
        asked = _header(scope, b"access-control-request-headers")
        allow = asked or b"authorization, content-type, x-api-key, anthropic-version, x-squad-client, x-squad-priority"
        return 204, [*self.headers(scope), (b"access-control-allow-methods", METHODS),
                     (b"access-control-allow-headers", allow), (b"access-control-max-age", MAX_AGE)], b""


def _header(scope: dict[str, Any], name: bytes) -> bytes | None:
    for key, value in scope["headers"]:
        if key == name:
            return value
    return None

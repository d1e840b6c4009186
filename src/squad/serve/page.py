"""The live page of ``squad serve`` at ``/squad/``: one HTML file with its script and style inline
(``live.html`` beside this module, shipped as package data; no build step), which polls ``/squad/status``
once a second and draws the slots, the pool as a bar, the queue with what each request waits for, the clients,
the programs (when the status has them) and the recent requests.

It is behind the serve key, as every ``/squad`` route, and the key never appears in the page:

- a client that sends the key (``Authorization: Bearer KEY`` or ``X-Api-Key``) gets the page;
- a browser opens ``/squad/?key=KEY`` once, or types the key into the form ``/squad/`` shows without one
  (``POST /squad/login``): either way squad serve answers with a redirect to ``/squad/`` (the key leaves the
  address bar and the history) and a cookie (``HttpOnly``, ``SameSite=Strict``, ``Path=/squad``) holding
  not the key but an HMAC of it, :func:`page_token`, which opens ``GET /squad/``, ``/squad/status`` and
  ``/squad/metrics`` only (never a generation request); ``/squad/logout`` drops it.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from functools import cache
from html import escape
from importlib import resources
from urllib.parse import parse_qs

from squad.serve.demand import Refused
from squad.serve.http import Receive, Send, header, read_body

__all__ = ["PAGE_PATHS", "COOKIE", "COOKIE_PATHS", "answer", "cookie_authorizes", "page_token", "live_html"]

PAGE_PATHS = ("/squad", "/squad/", "/squad/login", "/squad/logout")
"""Paths this module answers itself, each checking the key in its own way (before the gateway's key check)."""
COOKIE = "squad_page"
COOKIE_PATHS = ("/squad/status", "/squad/metrics")
"""What the page's cookie opens besides the page itself (``GET`` only)."""
LOGIN_BODY = 4096
"""Bytes the login form's body may have."""
_HEADERS = [
    (b"content-type", b"text/html; charset=utf-8"),
    (b"cache-control", b"no-store"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"content-security-policy", b"default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
                                 b"connect-src 'self'; img-src data:; form-action 'self'; frame-ancestors 'none'"),
]


@cache
def live_html() -> bytes:
    """The page (read once from the package)."""
    return resources.files("squad.serve").joinpath("live.html").read_bytes()


def page_token(key: bytes) -> str:
    """The cookie value for ``key``: ``HMAC-SHA256(key, "squad serve live page")`` in hex (not the key: a leaked
    cookie opens the read-only ``/squad`` pages, not generation)."""
    return hmac.new(key, b"squad serve live page", hashlib.sha256).hexdigest()


def _cookie(scope: dict) -> str | None:
    raw = header(scope, b"cookie")
    if raw is None:
        return None
    for part in raw.split(";"):
        name, _, value = part.strip().partition("=")
        if name == COOKIE:
            return value
    return None


def _known(candidate: str, keys: list[bytes]) -> bytes | None:
    """The key ``candidate`` is (compared in constant time), else None."""
    value = candidate.strip().encode()
    found = None
    for key in keys:
        if secrets.compare_digest(value, key):
            found = key
    return found


def _token_ok(scope: dict, keys: list[bytes]) -> bool:
    token = _cookie(scope)
    if not token:
        return False
    return any(secrets.compare_digest(token.encode(), page_token(key).encode()) for key in keys)


def cookie_authorizes(scope: dict, keys: list[bytes]) -> bool:
    """Whether the page's cookie opens this request: a ``GET`` of :data:`COOKIE_PATHS` with a valid cookie."""
    return scope["method"] == "GET" and scope["path"] in COOKIE_PATHS and _token_ok(scope, keys)


async def answer(scope: dict, receive: Receive, send: Send, *, keys: list[bytes], authorized: bool) -> None:
    """Answer a request for one of :data:`PAGE_PATHS`. ``keys``: every key squad serve takes; ``authorized``: the
    request sent one of them in a header."""
    path, method = scope["path"], scope["method"]
    if path == "/squad":
        query = scope.get("query_string", b"")
        await _redirect(send, "/squad/" + (f"?{query.decode()}" if query else ""), status=308)
    elif path == "/squad/logout":
        await _redirect(send, "/squad/", cookie=f"{COOKIE}=; Path=/squad; HttpOnly; SameSite=Strict; Max-Age=0")
    elif path == "/squad/login" and method == "POST":
        try:
            body = await read_body(receive, limit=LOGIN_BODY, timeout=10.0, declared=header(scope, b"content-length"))
        except Refused as exc:
            await _html(send, exc.status, _login(str(exc)))
            return
        given = parse_qs(body.decode(errors="replace")).get("key", [""])[0]
        key = _known(given, keys)
        if key is None:
            await _html(send, 401, _login("That is not the key squad serve printed."))
        else:
            await _redirect(send, "/squad/", cookie=_set_cookie(key))
    elif path == "/squad/" and method in ("GET", "HEAD"):
        linked = parse_qs(scope.get("query_string", b"").decode(errors="replace")).get("key")
        if linked is not None:  # once, from a link: the key leaves the address bar at once
            key = _known(linked[0], keys)
            if key is None:
                await _html(send, 401, _login("That is not the key squad serve printed."))
            else:
                await _redirect(send, "/squad/", cookie=_set_cookie(key))
        elif authorized:  # the key in a header: the page, and a cookie for its script's polls
            presented = _presented(scope, keys)
            await _html(send, 200, live_html(), cookie=_set_cookie(presented) if presented else None)
        elif _token_ok(scope, keys):
            await _html(send, 200, live_html())
        else:
            await _html(send, 401, _login(""))
    else:
        await _html(send, 405, _login(f"squad serve has no {method} {path}"))


def _presented(scope: dict, keys: list[bytes]) -> bytes | None:
    for name, value in scope["headers"]:
        if name == b"authorization" and value[:7].lower() == b"bearer ":
            value = value[7:]
        elif name != b"x-api-key":
            continue
        return _known(value.decode(errors="replace"), keys)
    return None


def _set_cookie(key: bytes) -> str:
    return f"{COOKIE}={page_token(key)}; Path=/squad; HttpOnly; SameSite=Strict"


async def _redirect(send: Send, location: str, *, status: int = 303, cookie: str | None = None) -> None:
    headers = [(b"location", location.encode()), (b"content-length", b"0"), (b"cache-control", b"no-store"),
               (b"referrer-policy", b"no-referrer")]
    if cookie is not None:
        headers.append((b"set-cookie", cookie.encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": b""})


async def _html(send: Send, status: int, data: bytes, *, cookie: str | None = None) -> None:
    headers = [*_HEADERS, (b"content-length", str(len(data)).encode())]
    if cookie is not None:
        headers.append((b"set-cookie", cookie.encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": data})


def _login(message: str) -> bytes:
    """The form a browser without the cookie gets (``message``: why, escaped)."""
    note = f'<p class="err">{escape(message)}</p>' if message else ""
    return f"""<!doctype html><html lang="en"><head><meta charset="utf-8"><title>squad serve</title>
<meta name="viewport" content="width=device-width,initial-scale=1">
<style>body{{font:15px system-ui,sans-serif;background:#0f1115;color:#e6e6e6;display:grid;place-items:center;
height:100vh;margin:0}}form{{background:#181b22;padding:24px 28px;border-radius:8px;min-width:320px}}
input{{width:100%;box-sizing:border-box;padding:8px;margin:8px 0 12px;background:#0f1115;color:#e6e6e6;
border:1px solid #333;border-radius:4px}}button{{padding:8px 14px;background:#3b82f6;color:#fff;border:0;
border-radius:4px}}.err{{color:#f87171}}</style></head><body>
<form method="post" action="/squad/login"><h2>squad serve</h2>{note}
<label for="key">The key squad serve printed</label>
<input id="key" name="key" type="password" autocomplete="current-password" autofocus>
<button type="submit">Open the live page</button></form></body></html>""".encode()

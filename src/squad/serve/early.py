"""A streamed request that waits, in squad serve's queue or while the engine reads its prompt (prefill), gets its
answer's start early and keep-alives until its first token, so neither wait counts against the client's read
(idle) timeout.

SDK clients (openai, anthropic: httpx underneath) time out when no byte arrives for their read
timeout (600 s by default), and then retry, which queues the same request again. So once a
streamed request has waited :data:`EARLY_AFTER` seconds, squad serve sends ``200`` with
``text/event-stream`` and then an SSE comment line (``: queued ...``, which SSE readers skip)
every :data:`KEEPALIVE_EVERY` seconds until the engine's first token (for the Messages API its own ``ping`` event,
which the Anthropic SDKs skip). When the engine's status line comes first (it answers at once, then reads the
prompt), keep-alives follow it the same way. The engine's own status line is then
dropped; an error status it answers (a 400, a 502 from squad serve) arrives as one
``data: {"error": ...}`` frame, the shape llama-server itself uses for an error inside a stream.
A request that is not streamed keeps its status for the engine's answer (a JSON body cannot
carry a late error).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio

__all__ = ["EarlyStart", "EARLY_AFTER", "KEEPALIVE_EVERY"]

EARLY_AFTER = 1.0
"""Seconds a streamed request waits in the queue before its answer starts."""
KEEPALIVE_EVERY = 10.0
"""Seconds between two keep-alive comments while it waits."""

Send = Callable[[dict[str, Any]], Awaitable[None]]


class EarlyStart:
    """Wraps one streamed request's ASGI ``send`` (:meth:`send`); :meth:`holding` covers its wait."""

    def __init__(self, send: Send, *, after: float | None = None, every: float | None = None,
                 kind: str = "") -> None:
        self._send = send
        self.after = EARLY_AFTER if after is None else after
        self.every = KEEPALIVE_EVERY if every is None else every
        self.kind = kind
        """The request's API (``messages``: keep-alives are its ``ping`` events)."""
        self.started = False
        """The status line went out early."""
        self.passed = False
        """The engine's status line went out as it was (before the early start)."""
        self.phase = "counting"
        """What the request waits for: ``counting`` (squad counts its prompt), ``queued`` (squad's queue),
        ``prefill`` (admitted: the engine reads it)."""
        self.kept = 0
        """Keep-alives sent."""
        self._status = 200
        self._error: list[bytes] = []
        self._done = anyio.Event()
        self._lock = anyio.Lock()

    @asynccontextmanager
    async def holding(self) -> AsyncIterator[EarlyStart]:
        """Keep the client's connection alive while the block waits; :meth:`admitted` ends that.
        What the block raises comes out as it is (not in an exception group)."""
        error: BaseException | None = None
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._hold)
            try:
                yield self
            except BaseException as exc:  # noqa: BLE001 - re-raised below, outside the group
                error = exc
            finally:
                self._done.set()
        if error is not None:
            raise error

    async def answering(self) -> None:
        """The wait is over (the first token is here): no more keep-alive lines (returns once none is being
        sent)."""
        self._done.set()
        async with self._lock:
            pass

    def admitted(self) -> None:
        """Admitted: the wait goes on while the engine reads the prompt (keep-alives say so)."""
        self.phase = "prefill"

    def keepalive(self, waited: float) -> bytes:
        """One keep-alive: the Messages API's ``ping`` event, else an SSE comment."""
        if self.kind == "messages":
            return b'event: ping\ndata: {"type": "ping"}\n\n'
        what = {"counting": "squad serve counts the prompt", "queued": "queued in squad serve"}.get(
            self.phase, "the engine reads the prompt")
        return f": {what} ({waited:.0f} s)\n\n".encode()
    async def _hold(self) -> None:
        with anyio.move_on_after(self.after):
            await self._done.wait()
        waited = self.after
        while not self._done.is_set():
            async with self._lock:
                if self._done.is_set():
                    return
                if not self.started and not self.passed:
                    self.started = True
                    await self._send({"type": "http.response.start", "status": 200, "headers": [
                        (b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache"),
                        (b"x-squad-queued", b"early")]})
                await self._send({"type": "http.response.body", "body": self.keepalive(waited), "more_body": True})
                self.kept += 1
            with anyio.move_on_after(self.every):
                await self._done.wait()
            waited += self.every

    async def send(self, message: dict[str, Any]) -> None:
        """``send`` for the request: as it is until the start went out early, then without the
        status line, an error body turned into one ``data:`` frame."""
        if self._done.is_set() and not self._lock.locked() and not self.started:
            await self._send(message)  # admitted before the early start: the holder sends nothing more
            return
        async with self._lock:
            if not self.started:
                if message["type"] == "http.response.start":
                    self.passed = True
                    if message["status"] >= 400:  # an error body follows: no keep-alive inside it
                        self._done.set()
                elif not message.get("more_body", False):
                    self._done.set()
                await self._send(message)
                return
        if message["type"] == "http.response.start":
            self._status = message["status"]
            return
        if self._status < 400:
            await self._send(message)
            return
        self._error.append(message.get("body", b""))
        if not message.get("more_body", False):
            body = b"".join(self._error).strip() or b'{"error": {"message": "no answer", "type": "server_error"}}'
            await self._send({"type": "http.response.body", "body": b"data: " + body + b"\n\n"})

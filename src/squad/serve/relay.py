"""One admitted generation request of ``squad serve``: admit, forward to the engine, relay the
answer chunk by chunk (or assemble a whole one, :mod:`squad.serve.assemble`), with the call's
events; several prompts or ``n`` > 1 go to :mod:`squad.serve.fanout` (the module docstring of
:mod:`squad.serve.gateway` tells the whole round trip)."""

from __future__ import annotations

import contextlib
import json
import math
import time
from typing import TYPE_CHECKING, Any

import anyio
import httpx

from squad.chat.settle import Ending
from squad.engine.llama import COMPLETIONS_FIELDS
from squad.errors import AdmissionError
from squad.events import CallFailed, CallFinished, CallFirstToken, Event, Origin
from squad.serve import apis
from squad.serve.assemble import STREAMABLE_PATHS, assembly_for, streamed_upstream
from squad.serve.demand import Kind, Refused, error_body
from squad.serve.early import EarlyStart
from squad.serve.ending import broken_off, error_event, refusal
from squad.serve.fanout import fan_out, split
from squad.serve.http import OFF_LOOP_BYTES, Receive, Send, relayed, send_json
from squad.serve.programs import Program
from squad.serve.progress import PROGRESS_KINDS, Progress
from squad.serve.shapes import Asked, asked_of, mend_answer, stream_mender
from squad.serve.status import Live
from squad.serve.stream_start import ChatRole, FirstEvent, MessagesStart, ResponsesStart

if TYPE_CHECKING:
    from squad.serve.apis import Api
    from squad.serve.host import RelayHost

__all__ = ["Relay"]


class Relay:
    """One admitted generation request (see the module docstring)."""

    def __init__(self, gateway: RelayHost, live: Live, scope: dict[str, Any], body: dict[str, Any], raw: bytes,
                 api: Api) -> None:
        self.g, self.live, self.scope, self.body, self.raw, self.api = gateway, live, scope, body, raw, api
        self.kind: Kind = api.name  # type: ignore[assignment]  # each API's name is a Kind
        self.big = len(raw) >= OFF_LOOP_BYTES
        """A large body: parsed, counted and written off the event loop."""
        self.finished = self.disconnected = False
        self.prompt_tokens = 0
        """The prompt's tokens as squad counted them (0 until counted)."""
        self.asked: Asked = asked_of(body, self.kind)
        """What the client's own body says of its answer's shape (:mod:`squad.serve.shapes`)."""
        self.program: Program | None = None
        """The program it belongs to (:mod:`squad.serve.programs`), set by the gateway; None: the request alone."""
        self.early: EarlyStart | None = None
        """A stream's keep-alives until its first token (:mod:`squad.serve.early`)."""
        self.passed = 0
        """Requests of other clients admitted while it waited (header ``X-Squad-Passed``)."""

    async def watch(self, receive: Receive, scope: anyio.CancelScope) -> None:
        """Cancel the request when the client disconnects (queued, waiting or streaming)."""
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                if not self.finished:
                    self.disconnected = True
                    scope.cancel()
                return

    async def run(self, send: Send) -> str:
        """Admit, forward and relay; return the outcome for the ledger. A stream that waits (counted, queued, its
        prompt read) gets keep-alives until its first token (:mod:`squad.serve.early`)."""
        if not self.live.stream:
            return await self._run(send)
        early = self.early = EarlyStart(send, after=self.g.early_after, every=self.g.keepalive_every, kind=self.kind)
        async with early.holding():
            return await self._run(early.send)

    async def _run(self, send: Send) -> str:
        g, live = self.g, self.live
        admission = g.admission
        api = self.api
        try:  # its shape; tool choice and schemas as the engine honours them (squad.serve.apis)
            api.check(self.body)
            body = self.body if api.several else {k: v for k, v in self.body.items() if k not in COMPLETIONS_FIELDS}
            body = apis.prepare(body, self.kind, g.engine.tool_call_prefix, g.engine.call_id_length)
            parts = split(body, self.kind, self.scope["path"])
        except Refused as exc:
            await send_json(send, exc.status, exc.body)
            return "refused"
        if parts is not None:  # several prompts, or n > 1: one reservation per completion
            self.body = body
            if self.early is not None:  # (its own answer: no keep-alives inside it)
                await self.early.answering()
            return await fan_out(self, parts, send)
        try:  # counted (squad.serve.apis)
            demand = await apis.demand(body, api, g, big=self.big)
        except Refused as exc:
            await send_json(send, exc.status, exc.body)
            return "refused" if exc.status == 400 else "failed"
        self.prompt_tokens = demand.prompt
        # exactly the reserved limit, in every field the engine reads it from: rewritten, never trusted
        self.body = api.write_limit(body, demand.max_tokens)
        self.asked = asked_of(self.asked.body, self.kind, limit=demand.max_tokens, sent=self.body)
        sent = streamed_upstream(self.body, self.kind) if self.assembled else self.body
        # (assembled: streamed from the engine, so that llama-server stops it when the client leaves)
        if self.asks_progress:  # prefill progress, relayed as SSE comments (squad.serve.progress)
            sent = {**sent, "return_progress": True}
        content = (await anyio.to_thread.run_sync(_dumps, sent)) if self.big else _dumps(sent)
        g.ledger.move(live, "queued", tokens=demand.tokens)
        program = self.program
        origin = program.origin() if program is not None else Origin(live.client, conversation=live.id)
        early = self.early
        if early is not None:
            early.phase = "queued"
        if program is not None:
            g.programs.queued(program)
        admitted: float | None = None
        g.shares.watch(live.id, origin.agent)
        try:
            async with contextlib.AsyncExitStack() as stack:
                limit = g.max_queue_wait
                with anyio.move_on_after(math.inf if limit is None else limit) as waiting:
                    held = await stack.enter_async_context(admission.reserve(
                        demand.tokens, agent=origin, priority=live.priority, call=live.id))
                if waiting.cancelled_caught:
                    return await self._waited_too_long(send, limit or 0.0)
                admitted = time.monotonic()
                self.passed = g.shares.passed(live.id)
                if program is not None:
                    g.programs.admitted(program, held.slot)
                if early is not None:
                    early.admitted()
                g.ledger.move(live, "running", slot=held.slot)
                async with g.until_engine_free(held) as ending:
                    return await self._forward(send, self._pinned(content, held.slot), held.queued_s, ending)
        except AdmissionError as exc:  # the engine was reloaded smaller while it waited
            await send_json(send, 400, error_body(400, str(exc), "exceed_context_size_error"))
            return "refused"
        finally:
            g.shares.passed(live.id)  # forgotten, whatever happened
            if program is not None:
                g.programs.left(program, admitted=admitted is not None,
                                held_s=time.monotonic() - admitted if admitted is not None else 0.0)

    @property
    def asks_progress(self) -> bool:
        """A stream squad serve asks llama-server's prefill progress for (unless the client asked it itself)."""
        return (self.live.stream and self.kind in PROGRESS_KINDS and self.g.engine.kind == "llama.cpp"
                and "return_progress" not in self.body)

    def _pinned(self, content: bytes, slot: int) -> bytes:
        """The body sent, pinned (``id_slot``) to the slot admission granted when squad serve launched the engine
        (no other client shares its slots): the slot the request's conversation used last when it was free, its
        prefix still there. Messages are not pinned (llama-server's conversion drops the field)."""
        if (slot < 0 or not self.g.pins or self.kind not in ("chat", "completion", "responses")
                or not content.endswith(b"}") or content == b"{}"):
            return content
        return content[:-1] + b', "id_slot": ' + str(slot).encode() + b"}"

    async def _waited_too_long(self, send: Send, limit: float) -> str:
        """The request waited ``--max-queue-wait`` seconds: 503 with ``Retry-After`` in its API's shape (a stream
        that started early ends with its API's error event)."""
        message = (f"squad serve's queue is full: this request waited {limit:g} s (--max-queue-wait) without a "
                   f"slot; retry later")
        retry = str(max(1, math.ceil(limit))).encode()
        if self.early is not None and self.early.started:
            await send({"type": "http.response.body", "body": error_event(self.kind, 503, message)})
        else:
            await send_json(send, 503, refusal(self.kind, 503, message), [(b"retry-after", retry)])
        return "refused"

    async def _forward(self, send: Send, content: bytes, queued_s: float, ending: Ending) -> str:
        g, live = self.g, self.live
        upstream = g.generation_upstream()
        request = upstream.build_request("POST", self.scope["path"], content=content,
                                         headers={"content-type": "application/json"},
                                         params=self.scope.get("query_string", b"").decode() or None)
        sent = time.monotonic()
        ending.sent()
        try:
            try:
                response = await upstream.send(request, stream=True)
            except (httpx.ConnectError, httpx.RemoteProtocolError):
                # a pooled connection the engine had just closed (keep-alive end, its per-connection
                # request cap): the request got no answer, so it is resent once on a new connection (F22)
                try:
                    response = await upstream.send(request, stream=True)
                except (httpx.ConnectError, httpx.RemoteProtocolError):
                    if not await g.engine_back():  # the engine died: squad serve restarted it (squad.serve.keeper)
                        raise
                    response = await upstream.send(request, stream=True)
        except httpx.TransportError as exc:
            self._emit(CallFailed, error="EngineGone", message=repr(exc), attempts=1)
            await send_json(send, 502, error_body(502, f"the engine at {g.engine.base_url} is not answering ({exc!r})",
                                              "server_error"))
            return "failed"
        ending.started()
        if self.assembled and response.status_code == 200:
            return await self._assemble(send, response, queued_s, ending, sent)
        started = False
        try:
            headers = [*relayed(response.headers.raw), *self._waited(queued_s)]
            await send({"type": "http.response.start", "status": response.status_code, "headers": headers})
            started = True
            await self._relay(send, response, sent, ending)
        except httpx.HTTPError as exc:  # the engine broke off (died, or timed out)
            self._emit(CallFailed, error=type(exc).__name__, message=repr(exc), attempts=1)
            why = await broken_off(self.g, exc)
            if not started:
                await send_json(send, 502, error_body(502, why, "server_error"))
            else:  # the stream's end, in its API's own shape (squad.serve.ending)
                await send({"type": "http.response.body",
                            "body": error_event(self.kind, 502, why) if live.stream else b""})
            return "failed"
        finally:
            with anyio.CancelScope(shield=True):
                await response.aclose()  # on a disconnect too: the engine frees the slot at once
        if response.status_code >= 400:
            self._emit(CallFailed, error=f"HTTP {response.status_code}", message="", attempts=1)
            return "failed"
        self._emit(CallFinished, attempts=1, finish_reason=None, prompt_tokens=None, completion_tokens=None,
                   queued_s=queued_s, ttft_s=None, total_s=time.monotonic() - sent, tokens_per_s=None, slot=live.slot)
        return "completed"

    async def _relay(self, send: Send, response: httpx.Response, sent: float, ending: Ending) -> None:
        """The engine's answer, chunk by chunk as it arrives: its prefill progress as comments
        (:mod:`squad.serve.progress`), its start and the API's own fields mended (:mod:`squad.serve.stream_start`,
        :mod:`squad.serve.shapes`); the keep-alives end at its first token."""
        ok = response.status_code == 200
        start = self._first_event(response.status_code)  # b11434 can leave a stream's start out
        shape = stream_mender(self.asked) if self.live.stream and ok else None
        progress = Progress() if self.asks_progress and ok else None
        first = True
        async for chunk in response.aiter_raw():
            if progress is not None and not progress.answering:
                comments, chunk = progress.feed(chunk)
                if comments:
                    await send({"type": "http.response.body", "body": comments, "more_body": True})
                if not chunk:
                    continue
            if first:
                first = False
                if self.early is not None:
                    await self.early.answering()
                self._emit(CallFirstToken, ttft_s=time.monotonic() - sent, slot=self.live.slot)
            if start is not None:
                chunk = start.feed(chunk)
            if shape is not None and chunk:
                chunk = shape.feed(chunk)
            if chunk:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        ending.done()  # the engine's answer was read to its end: its task is over
        tail = progress.end() if progress is not None else b""
        tail = start.feed(tail) + start.end() if start is not None else tail
        if shape is not None:
            tail = shape.feed(tail) + shape.end()
        await send({"type": "http.response.body", "body": tail})

    def _waited(self, queued_s: float) -> list[tuple[bytes, bytes]]:
        """Headers of how it waited: ``X-Squad-Queued-Ms``, ``X-Squad-Passed`` (requests of other clients admitted
        meanwhile), ``X-Squad-Program`` (the program it was counted in)."""
        out = [(b"x-squad-queued-ms", str(round(queued_s * 1000)).encode()),
               (b"x-squad-passed", str(self.passed).encode())]
        name = self.program.program if self.program is not None and self.program.source != "request" else ""
        if name and name.isascii() and name.isprintable():
            out.append((b"x-squad-program", name.encode()))
        return out

    def _first_event(self, status: int) -> FirstEvent | ResponsesStart | None:
        """The mender of a streamed answer's first event (:mod:`squad.serve.stream_start`), if any."""
        if not self.live.stream or status != 200:
            return None
        if self.kind == "messages":
            return MessagesStart(model=str(self.body.get("model") or ""), input_tokens=self.prompt_tokens)
        if self.kind == "chat":
            return ChatRole()
        if self.kind == "responses":
            return ResponsesStart(model=str(self.body.get("model") or ""))
        return None

    @property
    def assembled(self) -> bool:
        """A request the client does not stream, sent to llama-server streamed and answered whole
        (:mod:`squad.serve.assemble`)."""
        return (not self.live.stream and self.g.engine.kind == "llama.cpp"
                and (self.scope["path"] in STREAMABLE_PATHS or self.kind in ("responses", "messages")))

    async def _assemble(self, send: Send, response: httpx.Response, queued_s: float, ending: Ending,
                        sent: float) -> str:
        got = assembly_for(self.kind, model=str(self.body.get("model") or ""), input_tokens=self.prompt_tokens)
        try:
            try:
                async for line in response.aiter_lines():
                    if not got.started and line.startswith("data: "):
                        self._emit(CallFirstToken, ttft_s=time.monotonic() - sent, slot=self.live.slot)
                    got.line(line)
                ending.done()  # read to its end: the engine's task is over
            except httpx.HTTPError as exc:  # the engine broke off (died, or timed out)
                self._emit(CallFailed, error=type(exc).__name__, message=repr(exc), attempts=1)
                await send_json(send, 502, error_body(502, await broken_off(self.g, exc), "server_error"))
                return "failed"
        finally:
            with anyio.CancelScope(shield=True):
                await response.aclose()  # on a disconnect too: the engine stops at its next token
        status, body = got.answer()
        if not got.done and status == 200:
            status, body = 502, error_body(502, "the engine ended the answer without finishing it", "server_error")
        headers = self._waited(queued_s)
        if status == 200:
            body = mend_answer(self.asked, body)  # the API's own fields (squad.serve.shapes)
            if self.asked.dropped:
                headers.append((b"x-squad-dropped-tool-calls", str(self.asked.dropped).encode()))
        await send_json(send, status, body, headers)
        if status != 200:
            self._emit(CallFailed, error=f"HTTP {status}", message=str(body)[:200], attempts=1)
            return "failed"
        self._emit(CallFinished, attempts=1, finish_reason=None, prompt_tokens=None, completion_tokens=None,
                   queued_s=queued_s, ttft_s=None, total_s=time.monotonic() - sent, tokens_per_s=None,
                   slot=self.live.slot)
        return "completed"

    def _emit(self, kind: type[Event], **data: Any) -> None:
        if self.g.observed:
            self.g.emit(kind(agent=self.live.client, conversation=self.live.id, call=self.live.id,
                             engine=self.g.engine.base_url, **data))


def _dumps(body: dict[str, Any]) -> bytes:
    return json.dumps(body).encode()

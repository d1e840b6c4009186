"""A request that asks for several completions at once: a list of prompts (``/v1/completions``,
as OpenAI clients send) or ``n`` > 1. squad serve sends it on as one request per prompt and
choice (``n`` = 1 each), each counted, reserved, queued and released on its own as it ends, and
gives the client one answer: choice ``index`` = prompt number × n + choice number (OpenAI's and
llama-server's order), usage summed. Streamed, the parts' chunks are relayed as they arrive with
their index rewritten, one usage chunk (when asked) and one ``[DONE]`` at the end. A part the
engine refuses ends the whole request with that answer (the other parts are stopped); a part
that breaks off mid-stream ends the stream with an error frame.

Why not one upstream request: llama-server posts all its tasks at once, so squad would have to
hold every part's reservation before sending (more parts than slots could never start, and two
such requests could each hold half of the pool waiting for the other half).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import anyio
import httpx

from squad.engine.llama import COMPLETIONS_FIELDS
from squad.errors import AdmissionError
from squad.events import Origin
from squad.serve import apis
from squad.serve.assemble import STREAMABLE_PATHS, Assembly, data_of, streamed_upstream
from squad.serve.demand import Kind, Refused, completions, error_body
from squad.serve.ending import broken_off
from squad.serve.stream_start import add_role

if TYPE_CHECKING:
    from squad.serve.host import Fanned
    from squad.serve.http import Send

__all__ = ["split", "fan_out", "MAX_PARTS", "OPENAI_PATHS"]

MAX_PARTS = 128
"""Most prompts × n one request may ask for."""


OPENAI_PATHS = STREAMABLE_PATHS
"""Where several completions are answered as one (OpenAI's shape); llama-server's own
``/completion`` and ``/completions`` answer them in a shape of their own."""


def split(body: dict[str, Any], kind: Kind, path: str = "/v1/completions") -> list[dict[str, Any]] | None:
    """The parts of ``body`` (sent to ``path``) in choice order (each one prompt, ``n`` = 1), or
    None when it asks for one completion. Raises :class:`Refused` (400) for a bad ``n``, an empty
    prompt list, more than :data:`MAX_PARTS` parts, or several on llama-server's ``/completion``."""
    n = completions(body)  # n_cmpl, else n: what llama-server reads
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise Refused(400, f"n must be a whole number of at least 1, got {n!r}", param="n")
    prompts = _prompts(body.get("prompt")) if kind == "completion" else None
    if prompts is not None and not prompts:
        raise Refused(400, "prompt is an empty list: give at least one prompt", param="prompt")
    count = len(prompts or [None]) * n
    if count == 1:
        return None
    if path not in OPENAI_PATHS:
        raise Refused(400, f"{path} with {count} completions in one request: send them to /v1/completions (squad "
                           "serve answers a list of prompts and n there), or one request each", param="prompt")
    if count > MAX_PARTS:
        raise Refused(400, f"this request asks for {count} completions ({len(prompts or [None])} prompts × n={n}); "
                           f"squad serve takes at most {MAX_PARTS} in one request: send several requests", param="n")
    return [_part(body, p) for p in (prompts or [None]) for _ in range(n)]


def _prompts(prompt: Any) -> list[Any] | None:
    """The prompts of a ``prompt`` field that holds several (a list of texts or of token-id
    lists), else None (one text, one token-id list, or something demand counting refuses)."""
    if not isinstance(prompt, list):
        return None
    if prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return None  # one prompt as token ids
    if all(isinstance(p, str) or (isinstance(p, list) and all(isinstance(t, int) and not isinstance(t, bool)
                                                               for t in p)) for p in prompt):
        return prompt
    return None


def _part(body: dict[str, Any], prompt: Any) -> dict[str, Any]:
    part = {k: v for k, v in body.items() if k not in COMPLETIONS_FIELDS}
    if prompt is not None:
        part["prompt"] = prompt
    return part


async def fan_out(relay: Fanned, parts: list[dict[str, Any]], send: Send) -> str:
    """Answer ``relay``'s request from ``parts`` (see the module docstring); return the outcome
    for the ledger."""
    return await _Fanout(relay, parts, send).run()


class _Fanout:
    def __init__(self, relay: Fanned, parts: list[dict[str, Any]], send: Send) -> None:
        self.relay, self.parts, self.send = relay, parts, send
        self.g = relay.g
        self.stream = bool(relay.body.get("stream"))
        self.include_usage = bool((relay.body.get("stream_options") or {}).get("include_usage"))
        self.results: list[dict[str, Any] | None] = [None] * len(parts)
        self.usage = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
        self.envelope: dict[str, Any] | None = None  # id, object, created, model of the first answer
        self.failed: tuple[int, Any] | None = None  # (status, body) of the first part that failed
        self.started = False  # the 200 and event-stream headers were sent
        self.lock = anyio.Lock()
        model = relay.body.get("model")
        self.model = model if isinstance(model, str) and model else None
        """The request's ``model``, echoed in the answer (squad.serve.shapes)."""

    async def run(self) -> str:
        g, live = self.g, self.relay.live
        demands = []
        for part in self.parts:  # every part is checked before any is sent
            try:
                demands.append(await apis.demand(part, self.relay.api, g, big=self.relay.big))
            except Refused as exc:
                await self._answer(exc.status, exc.body)
                return "refused" if exc.status == 400 else "failed"
        # exactly the reserved limit, in every field the engine reads it from (squad.serve.apis.base)
        self.parts = [self.relay.api.write_limit(part, d.max_tokens) for part, d in zip(self.parts, demands)]
        g.ledger.move(live, "queued", tokens=sum(d.tokens for d in demands))
        async with anyio.create_task_group() as tg:
            for i, (part, demand) in enumerate(zip(self.parts, demands)):
                tg.start_soon(self._one, i, part, demand.tokens, tg.cancel_scope)
        if self.failed is not None:
            status, body = self.failed
            if not self.started:
                await self._answer(status, body)
            else:
                await self._event(body if isinstance(body, dict) and "error" in body
                                  else error_body(status, str(body), "server_error"))
                await self.send({"type": "http.response.body", "body": b""})
            return "refused" if status == 400 else "failed"
        if self.stream:
            await self._start()
            if self.include_usage:
                await self._event({**(self.envelope or {}), "choices": [], "usage": self.usage})
            await self.send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": True})
            await self.send({"type": "http.response.body", "body": b""})
        else:
            choices = [choice for result in self.results for choice in (result or {}).get("choices", [])[:1]]
            for index, choice in enumerate(choices):
                choice["index"] = index
            merged = {**(self.results[0] or {}), "choices": choices, "usage": self.usage}
            if self.model is not None:
                merged["model"] = self.model
            merged.pop("timings", None)
            await self._answer(200, merged)
        return "completed"

    async def _one(self, index: int, part: dict[str, Any], tokens: int, scope: anyio.CancelScope) -> None:
        g, live = self.g, self.relay.live
        program = self.relay.program  # its client's share and its program's order (squad.serve.shares)
        origin = (Origin(program.client, conversation=f"{live.id}.{index}", parent=program.program)
                  if program is not None else Origin(live.client, conversation=live.id))
        call = f"{live.id}.{index}"
        try:
            async with g.admission.reserve(tokens, agent=origin, priority=live.priority, call=call) as held:
                if live.state != "running":
                    g.ledger.move(live, "running", slot=held.slot)
                async with g.until_engine_free(held) as ending:
                    ending.sent()
                    sent = part if self.stream else streamed_upstream(part)  # streamed: the engine stops it at once
                    upstream = g.generation_upstream()
                    request = upstream.build_request("POST", self.relay.scope["path"],
                                                     content=json.dumps(sent).encode(),
                                                     headers={"content-type": "application/json"})
                    try:
                        try:
                            response = await upstream.send(request, stream=True)
                        except (httpx.ConnectError, httpx.RemoteProtocolError):
                            # a pooled connection the engine had just closed: no answer came, so it is
                            # resent once on a new connection (F22), as the gateway's relay does
                            response = await upstream.send(request, stream=True)
                    except httpx.TransportError as exc:
                        self._fail(502, error_body(502, f"the engine at {g.engine.base_url} is not answering ({exc!r})",
                                                   "server_error"), scope)
                        return
                    ending.started()
                    try:
                        if response.status_code >= 400:
                            raw = await response.aread()
                            ending.done()
                            self._fail(response.status_code, _json_or_text(raw), scope)
                        elif self.stream:
                            await self._relay(index, response, scope)
                            ending.done()
                        else:
                            got = Assembly()
                            async for line in response.aiter_lines():
                                got.line(line)
                            ending.done()
                            status, body = got.answer()
                            if status != 200:
                                self._fail(status, body, scope)
                            else:
                                self._keep(index, body)
                    except httpx.HTTPError as exc:
                        self._fail(502, error_body(502, await broken_off(self.g, exc), "server_error"), scope)
                    finally:
                        with anyio.CancelScope(shield=True):
                            await response.aclose()
        except AdmissionError as exc:
            self._fail(400, error_body(400, str(exc), "exceed_context_size_error"), scope)

    async def _relay(self, index: int, response: httpx.Response, scope: anyio.CancelScope) -> None:
        first = True  # a part's first chat chunk gets the role b11434 can leave out (squad.serve.stream_start)
        async for line in response.aiter_lines():
            chunk = data_of(line)
            if chunk is None:
                continue
            if "error" in chunk:
                self._fail(500, chunk, scope)
                return
            if isinstance(chunk.get("usage"), dict):
                self._add_usage(chunk["usage"])
            choices = chunk.get("choices")
            if not choices:
                continue  # the part's usage chunk: one summed usage chunk ends the stream
            self.envelope = self.envelope or {k: chunk[k] for k in ("id", "object", "created", "model") if k in chunk}
            if self.model is not None:
                chunk["model"] = self.envelope["model"] = self.model
            for choice in choices:
                choice["index"] = index
            if first:
                add_role(chunk)
                first = False
            chunk.pop("usage", None)
            chunk.pop("timings", None)
            if self.envelope.get("id"):
                chunk["id"] = self.envelope["id"]
            await self._start()
            await self._event(chunk)

    def _keep(self, index: int, body: Any) -> None:
        if isinstance(body, dict):
            self.results[index] = body
            if isinstance(body.get("usage"), dict):
                self._add_usage(body["usage"])

    def _add_usage(self, usage: dict[str, Any]) -> None:
        for key in self.usage:
            value = usage.get(key)
            if isinstance(value, int):
                self.usage[key] += value

    def _fail(self, status: int, body: Any, scope: anyio.CancelScope) -> None:
        if self.failed is None:
            self.failed = (status, body)
        scope.cancel()  # the other parts stop; each is released once the engine lets go of it

    async def _start(self) -> None:
        async with self.lock:
            if not self.started:
                self.started = True
                await self.send({"type": "http.response.start", "status": 200,
                                 "headers": [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]})

    async def _event(self, obj: dict[str, Any]) -> None:
        async with self.lock:
            await self.send({"type": "http.response.body", "body": f"data: {json.dumps(obj)}\n\n".encode(),
                             "more_body": True})

    async def _answer(self, status: int, body: Any) -> None:
        data = json.dumps(body).encode() if not isinstance(body, (bytes, str)) else (
            body.encode() if isinstance(body, str) else body)
        await self.send({"type": "http.response.start", "status": status,
                         "headers": [(b"content-type", b"application/json"),
                                     (b"content-length", str(len(data)).encode())]})
        await self.send({"type": "http.response.body", "body": data})


def _json_or_text(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode("utf-8", "replace")

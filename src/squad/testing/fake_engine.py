"""A fake llama-server for fast, honest tests: real HTTP on 127.0.0.1, the real API shapes.

``FakeEngine`` runs a starlette app under uvicorn in a thread of its own, so the code under test
talks to it over TCP as it does to llama-server::

    async with FakeEngine(slots=4, n_ctx=1024, token_delay=0.002) as fe:
        fe.script(Reply(content="hello there", finish_reason="stop"))

It imitates b11434's endpoints, its one unified pool of ``n_ctx`` cells (overflow fails every
processing request), its 400 for a prompt over the slot context and its 503 while loading.
Tokens: one per whitespace-separated word (:func:`count_tokens`). Needs ``squad[testing]``.

Design (what it imitates, exactly): docs/design/fake-engine.md
"""

from __future__ import annotations

import collections
import itertools
import json
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio

try:
    import uvicorn
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response, StreamingResponse
    from starlette.routing import Route
except ImportError as exc:  # pragma: no cover - depends on the install
    raise ImportError("squad.testing needs the 'testing' extra: pip install 'squad[testing]'") from exc

from squad.engine.info import EngineInfo
from squad.engine.llama import CONTEXT_EXCEEDED, N_BATCH
from squad.testing.counting import count_tokens
from squad.testing.generation import Reply, _Failed, _Run, _Slot, _Truncated

__all__ = ["FakeEngine", "Reply"]

def _error(code: int, message: str, type_: str, **extra: Any) -> JSONResponse:
    return JSONResponse({"error": {"code": code, "message": message, "type": type_, **extra}}, status_code=code)


_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
                500: "server_error", 501: "not_supported_error", 503: "unavailable_error"}


class FakeEngine:
    """A llama-server look-alike on ``127.0.0.1:<free port>``; an async context manager.

    Arguments: ``slots`` (parallel slots), ``n_ctx`` (unified pool and per-slot context, in
    tokens), ``api_key`` (bearer key or None), ``load_time`` (seconds of 503 after start),
    ``token_delay`` (seconds per generated token), ``prompt_delay`` (seconds per prompt token of
    prefill, processed ``n_batch`` tokens at a time: with ``return_progress`` a streaming request
    gets llama-server's ``prompt_progress`` chunks), ``n_ctx_train`` (reported in /v1/models).

    Recorded (read them from the test): ``requests`` (chat bodies seen), ``max_processing``
    (most slots busy at once), ``max_held`` (most pool cells held at once), ``overflows``
    (times the pool overflowed), ``completed``, ``disconnects`` (streams the client closed),
    ``processing`` and ``deferred`` (now).
    """

    def __init__(
        self,
        *,
        slots: int = 2,
        n_ctx: int = 4096,
        api_key: str | None = None,
        load_time: float = 0.0,
        token_delay: float = 0.0,
        n_ctx_train: int = 8192,
        model_path: str = "/fake/SmolLM2-135M-Instruct.Q4_1.gguf",
        prompt_delay: float = 0.0,
        n_batch: int = N_BATCH,
    ) -> None:
        self.slots, self.n_ctx, self.api_key = slots, n_ctx, api_key
        self.prompt_delay, self.n_batch = prompt_delay, n_batch
        self.load_time, self.token_delay = load_time, token_delay
        self.n_ctx_train, self.model_path = n_ctx_train, model_path
        self.responder: Callable[[dict], Reply] | None = None
        self.requests: list[dict] = []
        self.count_requests = 0
        """How many ``/v1/chat/completions/input_tokens`` requests were answered."""
        self.max_processing = self.max_held = self.overflows = self.completed = self.disconnects = 0
        self.deferred = 0
        self._script: collections.deque[Reply] = collections.deque()
        self._lock = threading.Lock()
        self._slots = [_Slot(i) for i in range(slots)]
        self._tasks = itertools.count()
        self._ready_at = 0.0
        self._port = 0
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._free: anyio.Semaphore | None = None  # made inside the server's loop

    # -- public ------------------------------------------------------------------------

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._port}"

    @property
    def info(self) -> EngineInfo:
        """What squad would read back from this engine (unified KV: pool = n_ctx)."""
        return EngineInfo(base_url=self.base_url, api_key=self.api_key, slots=self.slots, n_ctx=self.n_ctx,
                          kv_unified=True, pool=self.n_ctx, n_ctx_train=self.n_ctx_train,
                          model_path=self.model_path, model_alias="fake", build_info="b0-fake", launched=False)

    @property
    def processing(self) -> int:
        return sum(s.busy for s in self._slots)

    @property
    def held(self) -> int:
        return sum(s.held for s in self._slots)

    def script(self, *replies: Reply) -> None:
        """Queue behaviours; each chat request takes the next one (then ``responder``, then the default)."""
        with self._lock:
            self._script.extend(replies)

    def set_loading(self, seconds: float) -> None:
        """Answer 503 ``Loading model`` on every endpoint for the next ``seconds``."""
        self._ready_at = time.monotonic() + seconds

    async def start(self) -> None:
        """Start serving (on the same port again after :meth:`stop`)."""
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        # accepted connections inherit it: no 40 ms delayed-ACK stall on reused connections
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.bind(("127.0.0.1", self._port))
        self._port = sock.getsockname()[1]
        config = uvicorn.Config(self._app(), log_level="error", lifespan="on", loop="asyncio", http="h11",
                                # uvicorn annotates int but passes it to asyncio.timeout: seconds, a float works
                                timeout_graceful_shutdown=0.2, access_log=False)  # type: ignore[arg-type]
        self._server = uvicorn.Server(config)
        self._slots = [_Slot(i) for i in range(self.slots)]
        self._ready_at = time.monotonic() + self.load_time
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]},
                                        name=f"fake-engine-{self._port}", daemon=True)
        self._thread.start()
        while not self._server.started:
            if not self._thread.is_alive():
                raise RuntimeError("the fake engine failed to start")
            await anyio.sleep(0.01)

    async def stop(self) -> None:
        """Stop serving: the port refuses connections, running streams are cut."""
        if self._server is None or self._thread is None:
            return
        self._server.should_exit = True
        await anyio.to_thread.run_sync(self._thread.join, 10.0)
        self._server = self._thread = None

    async def restart(self, load_time: float = 0.0) -> EngineInfo:
        """Stop, then start on the same port, loading for ``load_time`` seconds."""
        await self.stop()
        self.load_time = load_time
        await self.start()
        return self.info

    async def __aenter__(self) -> FakeEngine:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # -- app ---------------------------------------------------------------------------

    def _app(self) -> Starlette:
        @asynccontextmanager
        async def lifespan(app: Starlette) -> AsyncIterator[None]:
            self._free = anyio.Semaphore(self.slots)
            yield

        return Starlette(routes=self._routes(), lifespan=lifespan)

    def _routes(self) -> list[Route]:
        """The HTTP routes of this kind of server (a subclass answers another kind's)."""
        return [
            Route("/health", self._health),
            Route("/props", self._props),
            Route("/slots", self._slots_view),
            Route("/v1/models", self._models),
            Route("/v1/chat/completions/input_tokens", self._input_tokens, methods=["POST"]),
            Route("/v1/chat/completions", self._chat, methods=["POST"]),
            Route("/chat/completions", self._chat, methods=["POST"]),
        ]

    def _gate(self, request: Request, *, auth: bool = True) -> Response | None:
        if time.monotonic() < self._ready_at:
            return _error(503, "Loading model", "unavailable_error")
        if auth and self.api_key and request.headers.get("authorization") != f"Bearer {self.api_key}":
            return _error(401, "Invalid API Key", "authentication_error")
        return None

    async def _health(self, request: Request) -> Response:
        return self._gate(request, auth=False) or JSONResponse({"status": "ok"})

    async def _props(self, request: Request) -> Response:
        return self._gate(request) or JSONResponse({
            "default_generation_settings": {"n_ctx": self.n_ctx, "params": {"n_predict": -1}},
            "total_slots": self.slots, "model_path": self.model_path, "model_alias": "fake",
            "chat_template": "{{ messages }}", "build_info": "b0-fake", "is_sleeping": False,
        })

    async def _slots_view(self, request: Request) -> Response:
        def view(s: _Slot) -> dict:
            d: dict[str, Any] = {"id": s.id, "n_ctx": self.n_ctx, "speculative": False, "is_processing": s.busy}
            if s.busy:
                d |= {"id_task": s.task, "n_prompt_tokens": s.n_prompt,
                      "next_token": [{"n_decoded": s.n_decoded, "n_remain": s.n_remain, "has_next_token": True}]}
            return d

        return self._gate(request) or JSONResponse([view(s) for s in self._slots])

    async def _models(self, request: Request) -> Response:
        meta = {"n_ctx": self.n_ctx, "n_ctx_train": self.n_ctx_train, "n_params": 134515008,
                "size": 98362432, "n_vocab": 49152, "vocab_type": 2, "n_embd": 576}
        return self._gate(request) or JSONResponse({"object": "list", "data": [
            {"id": self.model_path.rsplit("/", 1)[-1], "object": "model", "owned_by": "llamacpp", "meta": meta}]})

    async def _input_tokens(self, request: Request) -> Response:
        if gated := self._gate(request):
            return gated
        body = await request.json()
        self.count_requests += 1
        return JSONResponse({"input_tokens": count_tokens(body.get("messages", []), body.get("tools"))})

    # -- chat ----------------------------------------------------------------------------

    def _next_reply(self, body: dict) -> Reply:
        with self._lock:
            if self._script:
                return self._script.popleft()
        return self.responder(body) if self.responder else Reply()

    @property
    def pool(self) -> int:
        """KV cells the running requests share (llama-server with unified KV: ``n_ctx``)."""
        return self.n_ctx

    def _overflowed(self) -> bool:
        """The running requests need more than the pool: llama.cpp fails them all (True); a kind
        that preempts or truncates records it and returns False."""
        return True

    def _too_long(self, n_prompt: int) -> tuple[int, Response | None]:
        """A prompt that alone does not fit one request's context: ``(tokens to run, error or None)``.
        llama-server answers 400 ``exceed_context_size_error``."""
        return n_prompt, _error(400, f"request ({n_prompt} tokens) exceeds the available context size "
                                     f"({self.n_ctx} tokens), try increasing it", "exceed_context_size_error",
                                n_prompt_tokens=n_prompt, n_ctx=self.n_ctx)

    def charge(self, slot: _Slot, tokens: int) -> None:
        """Add cells to a slot; on pool overflow fail every processing slot (llama.cpp's rule)."""
        slot.held += tokens
        self.max_held = max(self.max_held, self.held)
        if self.held > self.pool:
            self.overflows += 1
            if not self._overflowed():
                return
            for s in self._slots:
                if s.busy and s.failed is None:
                    s.failed, s.held = CONTEXT_EXCEEDED, 0
        if slot.failed:
            raise _Failed(slot.failed)

    async def _chat(self, request: Request) -> Response:
        if gated := self._gate(request):
            return gated
        body = await request.json()
        self.requests.append(body)
        messages = body.get("messages") or []
        n_prompt = count_tokens(messages, body.get("tools"))
        if n_prompt >= self.n_ctx:
            n_prompt, refused = self._too_long(n_prompt)
            if refused is not None:
                return refused
        reply = self._next_reply(body)
        if reply.status is not None:
            message = "Loading model" if reply.status == 503 else reply.error_message
            return _error(reply.status, message, _ERROR_TYPES.get(reply.status, "server_error"))

        assert self._free is not None
        self.deferred += 1
        try:
            await self._free.acquire()
        finally:
            self.deferred -= 1
        slot = next(s for s in self._slots if not s.busy)
        slot.busy, slot.task, slot.failed, slot.held = True, next(self._tasks), None, 0
        slot.n_prompt, slot.n_decoded = n_prompt, 0
        self.max_processing = max(self.max_processing, self.processing)

        def release() -> None:
            slot.busy, slot.held = False, 0
            assert self._free is not None
            self._free.release()

        run = _Run(self, slot, body, reply, n_prompt)
        chunks = run.chunks()
        try:
            first = await chunks.__anext__()
        except _Failed as failed:
            release()
            return JSONResponse(failed.body, status_code=failed.code)
        except _Truncated:  # cut before the first token: an empty 200 stream
            release()
            return Response(b"", media_type="text/event-stream")
        except BaseException:
            release()
            raise
        if not body.get("stream"):
            return await self._collect(run, first, chunks, release)
        return _SlotStream(self._sse(run, first, chunks, body), release=release, engine=self,
                           media_type="text/event-stream")

    async def _collect(self, run: _Run, first: dict, chunks: AsyncIterator[dict],
                       release: Callable[[], None]) -> Response:
        try:
            async for _ in chunks:
                pass
        except _Failed as failed:
            return JSONResponse(failed.body, status_code=failed.code)
        except _Truncated:
            return _error(500, "connection closed", "server_error")
        finally:
            release()
        self.completed += 1
        message: dict[str, Any] = {"role": "assistant", "content": run.content}
        if run.reasoning:
            message["reasoning_content"] = run.reasoning
        if run.tool_calls:
            message["tool_calls"] = run.tool_calls
        return JSONResponse({"id": run.id, "object": "chat.completion", "created": int(time.time()), "model": "fake",
                             "choices": [{"index": 0, "message": message, "finish_reason": run.finish_reason}],
                             "usage": run.usage(), "timings": run.timings()})

    async def _sse(self, run: _Run, first: dict, chunks: AsyncIterator[dict], body: dict) -> AsyncIterator[bytes]:
        def frame(obj: dict) -> bytes:
            return f"data: {json.dumps(obj)}\n\n".encode()

        yield frame(first)
        try:
            async for chunk in chunks:
                yield frame(chunk)
        except _Failed as failed:
            yield frame(failed.body)
            return
        except _Truncated:
            return
        if (body.get("stream_options") or {}).get("include_usage"):
            yield frame(run.envelope([], usage=run.usage(), timings=run.timings()))
        self.completed += 1
        yield b"data: [DONE]\n\n"


class _SlotStream(StreamingResponse):
    """A streaming response that frees its slot however it ends (done, error, disconnect)."""

    def __init__(self, content: AsyncIterator[bytes], *, release: Callable[[], None], engine: FakeEngine,
                 media_type: str) -> None:
        super().__init__(content, media_type=media_type)
        self._release, self._engine, self._done = release, engine, False

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        async def watch_send(message: Any) -> None:
            if message.get("type") == "http.response.body" and not message.get("more_body", False):
                self._done = True
            await send(message)

        try:
            await super().__call__(scope, receive, watch_send)
        finally:
            if not self._done:
                self._engine.disconnects += 1
            self._release()

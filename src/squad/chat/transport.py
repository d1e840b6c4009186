"""The llama-server transport: one attempt of a chat call over HTTP, its errors typed.

:class:`LlamaServerTransport` is the innermost layer of :class:`squad.chat.client.EngineClient`.
It sends through one ``openai.AsyncOpenAI`` (SDK retries off: ``max_retries=0``), always
streaming with usage requested; chunks and SDK errors become a :class:`~squad.chat.ChatResult` or
squad's typed errors (:mod:`squad.chat.stream`, field cases F05-F07, F17). It counts prompts
(:mod:`squad.chat.counting`: the model's own tokenizer, else the engine's count) and answers
``/health`` (:meth:`engine_up`). It never retries a call and never admits one: the layers above do.

Deadlines (:mod:`squad.chat.deadline`): each attempt is stopped when nothing arrives for a window
derived from the engine's measured speed, or when it passes an overall bound estimated from its
counted prompt and ``max_tokens``; a fixed ``request_timeout`` replaces both. llama-server is asked
for ``return_progress``, so prompt processing counts as progress; each finished call's ``timings``
update the engine's speed. Cancelling a call closes its HTTP stream at once, so llama-server frees
the slot.
"""

from __future__ import annotations

import contextlib
import time
from typing import TYPE_CHECKING, Any, Literal

import anyio
import httpx
import openai
from tenacity import AsyncRetrying, stop_after_attempt

from squad.chat import ChatRequest, ChatResult
from squad.chat.call import Admitted, emit, with_call_id
from squad.chat.counting import PromptCounter
from squad.chat.deadline import CallWatch, EngineDeadlines, EngineSpeed
from squad.chat.retrying import COUNT_ATTEMPTS, WAITS, retry_idempotent
from squad.chat.settle import EngineSlots
from squad.chat.stream import Loading, StreamAssembly, classify, error_message
from squad.engine.control import NO_PUBLIC_HEALTH
from squad.engine.info import EngineInfo
from squad.engine.template_profile import fit_call_ids
from squad.errors import EngineError, EngineGone
from squad.events import CallFirstToken, EventSink

if TYPE_CHECKING:
    from squad.engine.tokens import TokenCounter

__all__ = ["LlamaServerTransport", "KEEPALIVE_S", "AUX_TIMEOUT_S"]

KEEPALIVE_S = 2.0
"""Seconds an idle connection to the engine stays pooled (below cpp-httplib's 5 s keep-alive)."""

AUX_TIMEOUT_S = 600.0
"""Seconds a token count or ``/health`` request may take when call deadlines are derived."""

COUNT_CONCURRENCY = 16
"""Token-count requests to one engine at once (the rest wait in an ``anyio.CapacityLimiter``, O(1) per waiter)."""


class LlamaServerTransport:
    """One engine over HTTP (see the module docstring); a :class:`~squad.chat.ChatEngine`.

    - ``engine``: the read-back :class:`EngineInfo`; set a reloaded one (a new port or key opens new
      connections; the old ones close on :meth:`aclose`);
    - ``deadlines``: this engine's :class:`~squad.chat.deadline.EngineDeadlines`;
    - ``counter``: the local token counter (``"auto"``: the model file's, when on this machine;
      None: always ask the engine);
    - ``on_event``: receives ``call.first_token``.
    """

    def __init__(self, engine: EngineInfo, *, deadlines: EngineDeadlines,
                 counter: TokenCounter | None | Literal['auto'] = "auto", on_event: EventSink | None = None) -> None:
        self.deadlines, self.on_event = deadlines, on_event
        self._engine = engine
        self._template = (engine.call_id_length, engine.tool_call_prefix)
        """What the engine's template demands (read from its text once, not per call)."""
        self._retired: list[openai.AsyncOpenAI | httpx.AsyncClient] = []
        self.counter = PromptCounter(engine.model_path, self._count_remote, counter, template=engine.chat_template)
        self._counting = anyio.CapacityLimiter(COUNT_CONCURRENCY)
        """At most :data:`COUNT_CONCURRENCY` count requests in the HTTP pool at once: a map of thousands would
        otherwise queue every item's count in httpcore's pool, whose assignment walks its whole queue per request
        (O(n) each, O(n^2) a map: issue 31). The limiter's own queue is a deque, O(1) per waiter."""
        self.openai, self.http = self._connect(engine)
        self.slots = EngineSlots(lambda: self.http)
        """The engine's ``/slots``, read to release a call that ended early only once its slot is free."""

    # -- engine and connections -----------------------------------------------------------

    @property
    def engine(self) -> EngineInfo:
        return self._engine

    @engine.setter
    def engine(self, info: EngineInfo) -> None:
        if (info.base_url, info.api_key) != (self._engine.base_url, self._engine.api_key):
            self._retired += [self.openai, self.http]
            self.openai, self.http = self._connect(info)
        if info.model_path != self._engine.model_path:  # another model: its speed is not known yet
            self.deadlines.speed = EngineSpeed()
        self._engine, self._template = info, (info.call_id_length, info.tool_call_prefix)

    def _connect(self, info: EngineInfo) -> tuple[openai.AsyncOpenAI, httpx.AsyncClient]:
        key = info.api_key or "none"
        # An idle pooled connection is dropped well before the engine's own keep-alive timeout
        # (cpp-httplib's default is 5 s, as httpx's is), so a call never reuses a socket the
        # engine is closing at that moment ("Server disconnected" before the first token).
        limits = httpx.Limits(max_connections=1000, max_keepalive_connections=100, keepalive_expiry=KEEPALIVE_S)
        # squad's own deadlines (squad.chat.deadline) fire first: the SDK's are only a backstop
        backstop = self.deadlines.policy.longest_call + 30.0
        # as keywords: the SDK's HTTP client is httpx's or, in newer SDKs, httpx2's (which takes httpx's limits)
        pool: dict[str, Any] = {"limits": limits, "timeout": backstop}
        sdk = openai.AsyncOpenAI(base_url=info.base_url + "/v1", api_key=key, max_retries=0, timeout=backstop,
                                 http_client=openai.DefaultAsyncHttpxClient(**pool))
        http = httpx.AsyncClient(base_url=info.base_url, headers={"Authorization": f"Bearer {key}"},
                                 timeout=httpx.Timeout(self.deadlines.policy.request_timeout or AUX_TIMEOUT_S,
                                                       connect=10.0), limits=limits)
        return sdk, http

    async def prepare(self) -> None:
        """Load the local token counter (:meth:`PromptCounter.prepare`), and start the engine's
        speed from its ``/metrics`` when it has served calls before."""
        await self.counter.prepare()
        if self._engine.kind == "llama.cpp":
            with contextlib.suppress(httpx.HTTPError):
                r = await self.http.get("/metrics", timeout=5.0)
                if r.status_code == 200:
                    self.deadlines.speed.seed(r.text)

    async def aclose(self) -> None:
        """Close every connection this transport opened."""
        self.slots.close()
        for c in [self.openai, self.http, *self._retired]:
            with anyio.CancelScope(shield=True):
                await c.close() if isinstance(c, openai.AsyncOpenAI) else await c.aclose()
        self._retired.clear()

    async def engine_up(self, probes: int = 3) -> bool:
        """True if ``/health`` answers at all (200 or 503 loading) within ``probes`` tries (a
        jittered wait between them): the engine is only declared gone when confirmed down (F22)."""
        try:
            async for attempt in AsyncRetrying(stop=stop_after_attempt(probes), wait=WAITS["health"],
                                               sleep=anyio.sleep, reraise=True):
                with attempt:
                    r = await self.http.get("/health", timeout=2.0)
                    if r.status_code not in (200, 503, *NO_PUBLIC_HEALTH):
                        raise EngineGone(f"/health answered HTTP {r.status_code}")
        except (httpx.TransportError, EngineGone):
            return False
        return True

    # -- counting -------------------------------------------------------------------------

    async def count(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> int:
        """Exact prompt tokens for ``messages`` (+ ``tools``), as ``/v1/chat/completions/input_tokens``
        would answer (:mod:`squad.chat.counting`). Raises ``Loading`` (503), :class:`EngineGone`,
        :class:`EngineError`."""
        return (await self.counter(messages, tools))[0]

    async def _count_remote(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> int:
        """The engine's count. Idempotent, so a dropped connection is resent (field case F22): up to
        :data:`~squad.chat.retrying.COUNT_ATTEMPTS` attempts before :class:`EngineGone`."""
        engine = self._engine
        return await engine.counting.chat(self._post_count, messages, tools, engine.model_alias)

    async def _post_count(self, path: str, body: dict[str, Any]) -> Any:
        """POST a count request to the engine (the kind's counter says which, :attr:`EngineInfo.counting`): the JSON of
        its answer. Raises ``Loading`` (503), :class:`EngineGone`, :class:`EngineError`."""
        try:
            async with self._counting:
                r = await retry_idempotent(lambda: self.http.post(path, json=body))
        except httpx.TimeoutException as exc:
            raise EngineError(f"{path} timed out after {self.http.timeout.read} s") from exc
        except httpx.TransportError as exc:
            raise EngineGone(f"engine at {self._engine.base_url} is not answering ({exc!r}) "
                             f"after {COUNT_ATTEMPTS} attempts") from exc
        if r.status_code == 503:
            raise Loading(error_message(r.json() if r.content else {}, "Loading model"))
        if r.status_code != 200:
            raise EngineError(f"engine refused to count tokens: HTTP {r.status_code} {r.text[:300]}")
        return r.json()

    # -- one attempt ----------------------------------------------------------------------

    async def complete(self, request: ChatRequest) -> ChatResult:
        """Send ``request`` once, not admitted by squad (:meth:`send` with nothing counted or reserved)."""
        return await self.send(request, Admitted())

    async def send(self, request: ChatRequest, admitted: Admitted) -> ChatResult:
        """Send ``request`` once and read its stream, within its deadlines; ``admitted``: what the
        admitted layer counted and reserved for it (:class:`~squad.chat.call.Admitted`). Raises the
        errors of :func:`squad.chat.stream.classify` and :class:`~squad.errors.CallTimeout`."""
        request = with_call_id(request)
        prompt = (admitted.prompt if admitted.prompt is not None
                  else await self.count(self.messages(request), request.tools))
        with self.deadlines.watch(prompt, request.max_tokens, queued_upstream=admitted.upstream) as watch:
            result = await self._stream(request, admitted, watch)
        if watch.expired:
            raise watch.error(request.agent, self._engine.describe_process())
        self.deadlines.speed.observe(result.timings.engine)
        return result

    def _body(self, req: ChatRequest, admitted: Admitted) -> dict[str, Any]:
        kwargs: dict[str, Any] = {}
        if req.tools:
            kwargs["tools"] = req.tools
            if req.tool_choice:
                kwargs["tool_choice"] = req.tool_choice
            if req.parallel_tool_calls is not None:
                kwargs["parallel_tool_calls"] = req.parallel_tool_calls
        if req.response_format is not None:
            kwargs["response_format"] = req.response_format
        if admitted.upstream:  # the endpoint admits (squad serve): say who asks, and how urgently
            kwargs["extra_headers"] = {"X-Squad-Client": req.agent, "X-Squad-Priority": str(req.priority)}
        extra = dict(req.sampling or {})
        if self._engine.engine_kind.progress:  # prompt processing shows as progress (squad.chat.deadline)
            extra.setdefault("return_progress", True)
        if admitted.pin is not None:  # the granted slot: the conversation's prefix, or a fan-out's restored one
            extra["id_slot"] = admitted.pin
        # a thinking budget as this kind reads it (none it can take: the runtime warned, it thinks within max_tokens)
        extra.update(self._engine.engine_kind.thinking_fields(req.thinking_budget) or {})
        return dict(model=self._engine.model_alias or "default", messages=self.messages(req),
                    max_tokens=req.max_tokens, stream=True, stream_options={"include_usage": True}, extra_body=extra,
                    **kwargs)

    async def _stream(self, req: ChatRequest, admitted: Admitted, watch: CallWatch) -> ChatResult:
        agent, ending, on_delta = req.agent, admitted.ending, req.on_delta
        sent = time.monotonic()
        got = StreamAssembly()
        ending.sent()
        try:
            stream = await self.openai.chat.completions.create(**self._body(req, admitted))
        except openai.APIError as exc:
            if isinstance(exc, openai.APIStatusError):  # the engine answered: its task is over
                ending.done()
            raise self._classify(req, admitted, exc, started=False) from exc
        watch.started()
        ending.started()
        try:
            async for chunk in stream:
                if got.add(chunk, on_delta):
                    watch.token()
                    if got.first_at is None:
                        got.first_at = time.monotonic()
                        emit(self.on_event, CallFirstToken, req, self._engine.base_url, ttft_s=got.first_at - sent,
                             slot=admitted.slot)
                elif chunk.model_extra and isinstance(progress := chunk.model_extra.get("prompt_progress"), dict):
                    watch.progress(progress)
            ending.done()
        except openai.APIError as exc:
            if not isinstance(exc, openai.APIConnectionError):  # an error frame: the engine ended the task
                ending.done()
            raise self._classify(req, admitted, exc, started=got.first_at is not None, partial=got.content) from exc
        finally:
            with anyio.CancelScope(shield=True):
                await stream.close()  # on cancellation too: the engine frees the slot
        return got.result(agent, sent)

    def messages(self, req: ChatRequest) -> list[dict[str, Any]]:
        """The messages sent for ``req``: a forced tool choice on an engine that applies a template
        squad ships ends with an assistant message holding the template's call prefix, which
        llama-server continues (see :mod:`squad.engine.chat_templates`: b11434's ``required``
        alone lets a model write text first). Tool call ids are fitted to what the template demands
        (Mistral's: 9 alphanumeric characters, :attr:`EngineInfo.call_id_length`)."""
        id_length, prefix = self._template  # ids the template accepts, its call opener
        messages = fit_call_ids(req.messages, id_length)
        if req.tool_choice == "required" and req.tools and prefix:
            return [*messages, {"role": "assistant", "content": prefix}]
        return messages

    def _classify(self, req: ChatRequest, admitted: Admitted, exc: openai.APIError, *, started: bool,
                  partial: str = "") -> Exception:
        admission, pool = admitted.admission, self._engine.pool
        return classify(exc, req.agent, base_url=self._engine.base_url, engine_pool=pool,
                        squad_pool=admission.pool if admission else pool,
                        squad_reserved=admission.reserved if admission else 0,
                        request_timeout=self.deadlines.policy.longest_call, started=started, partial=partial)

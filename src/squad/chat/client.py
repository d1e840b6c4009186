"""llama-server behind the chat seam (:class:`squad.chat.ChatEngine`): count, admit, stream,
retry.

:class:`EngineClient` streams every call through one ``openai.AsyncOpenAI`` (SDK retries off)
after reserving ``prompt tokens + max_tokens`` in :class:`~squad.sched.admission.Admission`;
prompt counts are exact (:mod:`squad.chat.counting`). Retried: 503 loading (F03), a request
that never reached the engine (F22), an overflow another client caused (F20), jittered; never
a prompt too long, a budget, spent reasoning, another 4xx or a timeout (:class:`CallTimeout`,
F04). A cut call keeps its reservation until ``/slots`` shows the slot free. Raises the
:class:`~squad.errors.AgentRunError` kinds and :class:`~squad.errors.EngineError`.

Design: docs/design/client.md
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import hashlib
import itertools
import json
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Literal

import anyio
import httpx
import openai
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception,
    retry_if_exception_type,
    retry_if_not_exception_type,
    stop_after_attempt,
    wait_random,
    wait_random_exponential,
)
from tenacity.wait import wait_base

from squad.sched.admission import Admission, Reservation
from squad.chat import ChatRequest, ChatResult
from squad.chat.counting import PromptCounter
from squad.chat.deadline import CallWatch, Deadlines, EngineDeadlines, EngineSpeed
from squad.engine.control import NO_PUBLIC_HEALTH
from squad.engine.info import EngineInfo
from squad.engine.llama import CONTEXT_EXCEEDED, round_ctx
from squad.engine.template_profile import fit_call_ids
from squad.errors import (
    AdmissionError,
    AgentRunError,
    ContextExceeded,
    EngineError,
    EngineGone,
    EngineLoadTimeout,
    SquadError,
    TruncatedStream,
)
from squad.events import (
    CallFailed,
    CallFinished,
    CallFirstToken,
    CallRetried,
    EngineWarning,
    Event,
    EventSink,
)
from squad.sched.share import MIN_SHARED_TOKENS, request_shares
from squad.chat.settle import CALL_SETTLE_TIMEOUT, EngineSlots, Ending, until_engine_free
from squad.chat.stream import (
    InnocentOverflow,
    Loading,
    StreamAssembly,
    classify,
    error_message,
)

if TYPE_CHECKING:
    from squad.engine.tokens import TokenCounter

__all__ = ["EngineClient"]

_CALL_IDS = itertools.count(1)

KEEPALIVE_S = 2.0
"""Seconds an idle connection to the engine stays pooled (below cpp-httplib's 5 s keep-alive)."""
"""Call ids are unique in the process: ``c1``, ``c2``, ..."""

COUNT_CACHE = 4096
"""Prompt counts remembered (least recently used dropped first)."""

AUX_TIMEOUT_S = 600.0
"""Seconds a token count or ``/health`` request may take when call deadlines are derived."""

PROGRESS_KINDS = ("llama.cpp", "squad-serve")
"""Engine kinds asked for ``return_progress`` (llama-server's prompt-progress chunks)."""

COUNT_ATTEMPTS = 4
"""Attempts for an idempotent request (a token count) that hit a transport error (F22)."""

WAITS: dict[str, wait_base] = {
    "loading": wait_random(0.25, 0.75),             # 503: poll about every 0.5 s
    "gone": wait_random(0.05, 0.2),                 # resend on a fresh connection (or after a restart)
    "overflow": wait_random_exponential(0.25, max=4.0),  # full jitter, doubling per overflow (F20)
    "count": wait_random_exponential(0.05, max=1.0),     # an idempotent token count (F22)
    "health": wait_random(0.2, 0.4),                # probing /health before declaring the engine gone
}
"""The client's waits between attempts, each by its kind, all with jitter (tenacity), so
processes sharing one engine never retry in step (field case F20). An exponential wait grows
with the attempts of its own kind."""


@dataclass
class _Call:
    """One complete() call's state across attempts; ``id`` is its call id."""

    request: ChatRequest
    id: str
    started: float = field(default_factory=time.monotonic)
    attempts: int = 0
    restarted: bool = False
    first_loading: float | None = None
    overflows: int = 0
    gone: int = 0
    held: int = 0
    """The most tokens this process had reserved when the engine overflowed (F20 message)."""
    need: int = 0
    """This call's own reservation (prompt + max_tokens)."""

    @property
    def agent(self) -> str:
        return self.request.origin.agent


class EngineClient:
    """Chat calls to one engine. Async context manager; see the module docstring for the rules.

    - ``engine``: the read-back :class:`EngineInfo` (settable after a reload).
    - ``admission``: shared admission; ``"auto"`` (default) builds it from what the engine
      reported; None sends without reserving (an engine that admits on its own, a proxy)
      (not unified KV: each request is also kept under ``n_ctx``).
    - ``request_timeout``: a fixed deadline in seconds for one attempt (F04: never resent);
      None (default): derived per call from the work and the engine's speed (:mod:`squad.chat.deadline`).
    - ``deadlines``: the policy of derived deadlines (floor, no-progress floor, margin);
      ``request_timeout`` given overrides its fixed deadline.
    - ``restart``: called once when the engine is gone (e.g. ``Launcher.restart``).
    - ``gone_reason``: asked when a call fails because the engine stopped answering or cut
      its stream; a text such as ``"engine exited (signal 9 SIGKILL), log: PATH"`` is added
      to the error (None: nothing known).
    - ``load_deadline``: seconds to wait out 503 before :class:`EngineLoadTimeout`.
    - ``max_attempts``: attempts for an innocent ``Context size has been exceeded.``.
    - ``counter``: the token counter for prompts; ``"auto"`` (default) uses the engine's model
      file when it is on this machine (:func:`squad.engine.tokens.counter_for_model`), None
      always asks the engine.
    """

    def __init__(
        self,
        engine: EngineInfo,
        *,
        admission: "Admission | None | Literal['auto']" = "auto",
        request_timeout: float | None = None,
        on_event: EventSink | None = None,
        restart: Callable[[], Awaitable[EngineInfo]] | None = None,
        gone_reason: Callable[[], Awaitable[str | None]] | None = None,
        load_deadline: float = 120.0,
        max_attempts: int = 3,
        counter: "TokenCounter | None | Literal['auto']" = "auto",
        deadlines: Deadlines | None = None,
    ) -> None:
        policy = deadlines or Deadlines()
        if request_timeout is not None:
            policy = dataclasses.replace(policy, request_timeout=request_timeout)
        self.deadlines = EngineDeadlines(policy)
        """This engine's deadline policy, measured speed and calls in flight."""
        self.request_timeout = policy.longest_call
        """Seconds the longest attempt may take (the fixed deadline, else the derived ones' cap)."""
        self.load_deadline, self.max_attempts = load_deadline, max_attempts
        self._on_event, self._restart, self._gone_reason = on_event, restart, gone_reason
        self._retired: list[Any] = []
        self._engine = engine
        self.admission: Admission | None = (Admission.for_engine(engine, on_event=on_event) if admission == "auto"
                                            else admission)  # type: ignore[assignment]
        self.counter = PromptCounter(engine.model_path, self._count_remote, counter, template=engine.chat_template)
        self._connect(engine)
        self.slots = EngineSlots(lambda: self._http)
        """The engine's ``/slots``, read to release a call that ended early only once its slot is free."""

    # -- engine and connections ---------------------------------------------------------

    @property
    def engine(self) -> EngineInfo:
        return self._engine

    @engine.setter
    def engine(self, info: EngineInfo) -> None:
        """Adopt a reloaded engine (new port or key → new connections; old ones closed on aclose)."""
        if (info.base_url, info.api_key) != (self._engine.base_url, self._engine.api_key):
            self._retired += [self._openai, self._http]
            self._connect(info)
        if info.model_path != self._engine.model_path:  # another model: its speed is not known yet
            self.deadlines.speed = EngineSpeed()
        self._engine = info

    def _connect(self, info: EngineInfo) -> None:
        key = info.api_key or "none"
        # An idle pooled connection is dropped well before the engine's own keep-alive timeout
        # (cpp-httplib's default is 5 s, as httpx's is), so a call never reuses a socket the
        # engine is closing at that moment ("Server disconnected" before the first token).
        limits = httpx.Limits(max_connections=1000, max_keepalive_connections=100, keepalive_expiry=KEEPALIVE_S)
        # squad's own deadlines (squad.chat.deadline) fire first: the SDK's are only a backstop
        backstop = self.request_timeout + 30.0
        self._openai = openai.AsyncOpenAI(base_url=info.base_url + "/v1", api_key=key, max_retries=0,
                                          timeout=backstop,
                                          http_client=openai.DefaultAsyncHttpxClient(limits=limits, timeout=backstop))
        self._http = httpx.AsyncClient(base_url=info.base_url, headers={"Authorization": f"Bearer {key}"},
                                       timeout=httpx.Timeout(self.deadlines.policy.request_timeout or AUX_TIMEOUT_S,
                                                             connect=10.0), limits=limits)

    async def aclose(self) -> None:
        """Close every connection this client opened."""
        self.slots.close()
        for c in [self._openai, self._http, *self._retired]:
            with anyio.CancelScope(shield=True):
                await c.close() if isinstance(c, openai.AsyncOpenAI) else await c.aclose()
        self._retired.clear()

    async def __aenter__(self) -> "EngineClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- counting ---------------------------------------------------------------------------

    async def prepare(self) -> None:
        """Load the local token counter for the engine's model (:class:`~squad.chat.counting.PromptCounter`);
        :meth:`count` does it on first use; the session does it at open so no call waits.
        Also starts the engine's speed from its ``/metrics`` when it has served calls before."""
        await self.counter.prepare()
        if self._engine.kind == "llama.cpp":
            with contextlib.suppress(httpx.HTTPError):
                r = await self._http.get("/metrics", timeout=5.0)
                if r.status_code == 200:
                    self.deadlines.speed.seed(r.text)

    async def count(self, messages: list[dict], tools: list[dict] | None = None) -> int:
        """Exact prompt tokens for ``messages`` (+ ``tools``), as ``/v1/chat/completions/input_tokens``
        would answer: remembered, or counted with the model's own tokenizer, or asked of the
        engine (:mod:`squad.chat.counting`). Raises ``Loading`` (503, waited out by :meth:`complete`),
        :class:`EngineGone`, :class:`EngineError`."""
        return (await self.counter(messages, tools))[0]

    count_prompt_tokens = count  # the name earlier versions used

    async def _count_remote(self, messages: list[dict], tools: list[dict] | None) -> int:
        """The engine's count. Idempotent, so a dropped connection is retried (field case F22):
        up to :data:`COUNT_ATTEMPTS` attempts with jittered backoff before :class:`EngineGone`."""
        how = self._engine.count_with
        if how == "estimate":  # no tokenize endpoint (Ollama, LM Studio, SGLang, unknown): a high estimate
            from squad.chat.counting import estimate_chat_tokens

            return estimate_chat_tokens(messages, tools)
        body: dict[str, Any] = {"messages": messages}
        if tools:
            body["tools"] = tools
        if how == "tokenize":  # vLLM: POST /tokenize with the chat messages -> {"count", "max_model_len", "tokens"}
            body["model"] = self._engine.model_alias
            r = await self._post_idempotent("/tokenize", body)
        else:
            r = await self._post_idempotent("/v1/chat/completions/input_tokens", body)
        if r.status_code == 503:
            raise Loading(error_message(r.json() if r.content else {}, "Loading model"))
        if r.status_code != 200:
            raise EngineError(f"engine refused to count tokens: HTTP {r.status_code} {r.text[:300]}")
        answer = r.json()
        return int(answer["count"] if how == "tokenize" else answer["input_tokens"])

    async def _post_idempotent(self, path: str, body: dict[str, Any]) -> httpx.Response:
        try:
            async for attempt in AsyncRetrying(
                retry=retry_if_exception_type(httpx.TransportError) & retry_if_not_exception_type(httpx.TimeoutException),
                stop=stop_after_attempt(COUNT_ATTEMPTS), wait=WAITS["count"],
                sleep=anyio.sleep, reraise=True,
            ):
                with attempt:
                    return await self._http.post(path, json=body)
        except httpx.TimeoutException as exc:
            raise EngineError(f"{path} timed out after {self._http.timeout.read} s") from exc
        except httpx.TransportError as exc:
            raise EngineGone(f"engine at {self._engine.base_url} is not answering ({exc!r}) "
                             f"after {COUNT_ATTEMPTS} attempts") from exc
        raise AssertionError("unreachable")  # pragma: no cover

    # -- calls --------------------------------------------------------------------------------

    async def complete(self, request: ChatRequest) -> ChatResult:
        """One chat call: count → check budget → reserve → stream → release.

        Returns a :class:`~squad.chat.ChatResult` whose ``call`` is the id its events carry.
        Raises :class:`AdmissionError` (over budget or pool, never sent),
        :class:`PromptTooLong`, :class:`ContextExceeded`, :class:`TruncatedStream`,
        :class:`ReasoningBudgetExhausted`, :class:`CallTimeout`, :class:`EngineLoadTimeout`,
        :class:`EngineGone`, :class:`AgentRunError`; each carries ``call_id``, the id its
        ``call.failed`` event names.
        """
        call = _Call(request, f"c{next(_CALL_IDS)}")
        try:
            result = await self._with_retries(call)
        except SquadError as exc:
            if isinstance(exc, (EngineGone, TruncatedStream)) and self._gone_reason is not None:
                reason = await self._gone_reason()
                if reason and exc.args:
                    exc.args = (f"{exc.args[0]}; {reason}", *exc.args[1:])
            self._emit(CallFailed, call, error=type(exc).__name__, message=str(exc), attempts=call.attempts)
            exc.call_id = call.id  # type: ignore[attr-defined]  (the call its events name: squad.chat.routing)
            raise
        result.attempts, result.call = call.attempts, call.id
        result.timings.total_s = time.monotonic() - call.started
        usage = result.usage
        self._emit(CallFinished, call, attempts=call.attempts, finish_reason=result.finish_reason,
                   prompt_tokens=usage.prompt_tokens if usage else None,
                   completion_tokens=usage.completion_tokens if usage else None,
                   queued_s=result.timings.queued_s, ttft_s=result.timings.ttft_s, total_s=result.timings.total_s,
                   tokens_per_s=result.timings.tokens_per_s, slot=result.slot)
        return result

    async def _with_retries(self, call: _Call) -> ChatResult:
        agent = call.agent
        call.attempts += 1
        try:  # the common path: one attempt, no retry machinery
            return await self._attempt(call)
        except (Loading, EngineGone, InnocentOverflow) as exc:
            pending: BaseException | None = exc
        try:
            async for attempt in self._retrying(call):
                with attempt:
                    if pending is not None:  # the policy judges the first failure as attempt 1
                        failed, pending = pending, None
                        raise failed
                    call.attempts += 1
                    result = await self._attempt(call)
        except Loading as exc:
            raise EngineLoadTimeout(
                f"engine at {self._engine.base_url} still answered 503 ({exc}) after {self.load_deadline:.0f} s "
                f"while agent '{agent}' waited: wait for the model to load or raise load_deadline"
            ) from exc
        except EngineGone as exc:
            if await self._engine_up():  # not gone: the connection failed, the engine did not
                raise AgentRunError(
                    f"agent '{agent}': the connection to the engine failed {call.gone} times before the first token "
                    f"although the engine answers /health ({exc}); try again", agent=agent) from exc
            raise
        except InnocentOverflow as exc:
            raise ContextExceeded(
                f"agent '{agent}': the engine kept failing with '{CONTEXT_EXCEEDED}' over {call.overflows} attempts "
                f"although this process had at most {call.held} of the engine's {self._engine.pool} tokens reserved "
                f"(this call {call.need}: prompt + max_tokens): another client is using this engine's pool; "
                "give squad its own engine or raise the context", agent=agent) from exc
        return result

    async def engine_up(self, probes: int = 3) -> bool:
        """True if the engine answers ``/health`` at all within ``probes`` tries (see :meth:`_engine_up`)."""
        return await self._engine_up(probes)

    async def _engine_up(self, probes: int = 3) -> bool:
        """True if ``/health`` answers at all (200 or 503 loading) within ``probes`` tries (a
        jittered wait between them): the engine is only declared gone when it is confirmed
        down (field case F22)."""
        try:
            async for attempt in AsyncRetrying(stop=stop_after_attempt(probes), wait=WAITS["health"],
                                               sleep=anyio.sleep, reraise=True):
                with attempt:
                    r = await self._http.get("/health", timeout=2.0)
                    if r.status_code not in (200, 503, *NO_PUBLIC_HEALTH):
                        raise EngineGone(f"/health answered HTTP {r.status_code}")
        except (httpx.TransportError, EngineGone):
            return False
        return True

    def _retrying(self, call: _Call) -> AsyncRetrying:
        """The one retry policy (see the module docstring)."""

        def stop(state: RetryCallState) -> bool:
            exc = state.outcome.exception() if state.outcome else None
            if isinstance(exc, Loading):
                return time.monotonic() - (call.first_loading or call.started) >= self.load_deadline
            if isinstance(exc, EngineGone):
                # The request never reached the engine, so resending is safe: once at once
                # (a pooled keep-alive connection the engine had closed), then once more after
                # a restart when one is possible.
                call.gone += 1
                return call.gone > 1 and (self._restart is None or call.restarted)
            call.overflows += 1
            return call.overflows >= self.max_attempts

        def wait(state: RetryCallState) -> float:
            exc = state.outcome.exception() if state.outcome else None
            kind = "loading" if isinstance(exc, Loading) else "gone" if isinstance(exc, EngineGone) else "overflow"
            # an exponential wait counts the attempts of its own kind, not the loading polls before
            counted = {"gone": call.gone, "overflow": call.overflows}.get(kind, 1)
            return WAITS[kind](_attempt_no(state, counted))

        async def before_sleep(state: RetryCallState) -> None:
            exc = state.outcome.exception() if state.outcome else None
            reason = {Loading: "engine loading (503)", EngineGone: "connection failed before the first token (resent)",
                      InnocentOverflow: "pool overflowed by another client"}.get(type(exc), type(exc).__name__)
            self._emit(CallRetried, call, reason=reason, attempt=state.attempt_number, error=str(exc))
            if isinstance(exc, Loading) and call.first_loading is None:
                call.first_loading = time.monotonic()
            if isinstance(exc, EngineGone) and call.gone > 1 and self._restart is not None and not call.restarted:
                call.restarted = True
                if await self._engine_up():  # the connection failed, not the engine: resend, never restart a live one
                    return
                self.engine = await self._restart()
                if self.admission is not None:
                    self.admission.adopt(self.engine)

        return AsyncRetrying(
            retry=retry_if_exception(lambda e: isinstance(e, (Loading, EngineGone, InnocentOverflow))),
            stop=stop, wait=wait, before_sleep=before_sleep, sleep=anyio.sleep, reraise=True,
        )

    async def _attempt(self, call: _Call) -> ChatResult:
        req, agent = call.request, call.agent
        _refuse_oversized(req, agent, self._engine.pool)
        prompt, local = await self.counter(self._messages(req), req.tools)
        need = prompt + req.max_tokens
        # An agent's budget holds exact counts. On a kind with no tokenize endpoint the count is an
        # estimate that runs high on purpose (squad.chat.counting.estimate_chat_tokens): it still
        # bounds the reservation and the engine's own limit, but would refuse calls that fit.
        estimated = not local and self._engine.count_with == "estimate"
        if req.budget is not None and need > req.budget and not estimated:
            trained = self._engine.n_ctx_train  # never a budget the model cannot hold
            fixes = [f"raise its budget to {round_ctx(need)}"] if not trained or round_ctx(need) <= trained else []
            if prompt < req.budget:
                fixes.append(f"lower max_tokens to {req.budget - prompt}")
            fixes.append("lower its max_tool_rounds (tool results are cut to fit, the rounds still add up)"
                         if any(m.get("role") == "tool" for m in req.messages) else
                         "shorten the prompt or the history it is given")
            raise AdmissionError(
                f"agent '{agent}' needs {need} tokens (prompt {prompt} + max_tokens {req.max_tokens}) but its budget "
                f"is {req.budget}: " + ", or ".join(fixes), agent=agent)
        # shared input (squad.sched.share): the first call of a fan-out member whose prompt starts with the
        # fan-out's shared text; only on an engine squad gave a slot save directory
        group = request_shares(req) if self.admission is not None and self._engine.slot_save_dir else None
        shared = await group.probe(self._http) if group is not None else 0
        if shared < MIN_SHARED_TOKENS:
            group, shared = None, 0
        admitted = (self.admission.reserve(need, agent=req.origin, priority=req.priority, call=call.id, shared=shared)
                    if self.admission is not None else contextlib.nullcontext(Reservation(req.origin, need, call=call.id)))
        call.need = need
        sink = self._on_event
        async with admitted as reservation, until_engine_free(self.admission, reservation, self.slots, on_event=sink,
                                                              timeout=CALL_SETTLE_TIMEOUT) as ending:
            pin = (reservation.slot if group is not None
                   and await group.enter(self._http, reservation.slot, self._engine.slot_save_dir) else None)
            with self.deadlines.watch(prompt, req.max_tokens, queued_upstream=self.admission is None) as watch:
                try:
                    result = await self._stream(call, reservation, watch, ending, pin=pin)
                except InnocentOverflow as exc:
                    call.held = max(call.held, exc.reserved)
                    raise
            if watch.expired:
                raise watch.error(agent)
        self.deadlines.speed.observe(result.timings.engine)
        result.reserved_tokens, result.slot = need, reservation.slot
        result.timings.queued_s = reservation.queued_s
        if local and result.usage is not None:
            warning = self.counter.reconcile(prompt, result.usage.prompt_tokens)
            if warning is not None and self._on_event is not None:
                self._on_event(EngineWarning(engine=self._engine.base_url, warning=warning))
        return result

    async def _stream(self, call: _Call, reservation: Reservation, watch: CallWatch, ending: Ending,
                      pin: int | None = None) -> ChatResult:
        """Send and read one attempt; ``pin``: the engine slot (``id_slot``) that holds its shared prefix."""
        req, agent = call.request, call.agent
        kwargs: dict[str, Any] = {"tools": req.tools} if req.tools else {}
        if req.tools and req.tool_choice:
            kwargs["tool_choice"] = req.tool_choice
        if req.tools and req.parallel_tool_calls is not None:
            kwargs["parallel_tool_calls"] = req.parallel_tool_calls
        if req.response_format is not None:
            kwargs["response_format"] = req.response_format
        if self.admission is None:  # the endpoint admits (squad serve): say who asks, and how urgently
            kwargs["extra_headers"] = {"X-Squad-Client": agent, "X-Squad-Priority": str(req.priority)}
        extra = dict(req.sampling or {})
        if self._engine.kind in PROGRESS_KINDS:  # prompt processing shows as progress (squad.chat.deadline)
            extra.setdefault("return_progress", True)
        if pin is not None:  # the slot admission granted, restored with the fan-out's prefix (squad.sched.share)
            extra["id_slot"] = pin
        sent = time.monotonic()
        got = StreamAssembly()
        ending.sent()
        try:
            stream = await self._openai.chat.completions.create(
                model=self._engine.model_alias or "default", messages=self._messages(req), max_tokens=req.max_tokens,
                stream=True, stream_options={"include_usage": True}, extra_body=extra, **kwargs)
        except openai.APIError as exc:
            if isinstance(exc, openai.APIStatusError):  # the engine answered: its task is over
                ending.done()
            raise self._classify(exc, agent, started=False) from exc
        watch.started()
        ending.started()
        try:
            async for chunk in stream:
                produced = got.add(chunk, req.on_delta)
                if produced:
                    watch.token()
                elif isinstance(progress := (chunk.model_extra or {}).get("prompt_progress"), dict):
                    watch.progress(progress)
                if produced and got.first_at is None:
                    got.first_at = time.monotonic()
                    self._emit(CallFirstToken, call, ttft_s=got.first_at - sent, slot=reservation.slot)
            ending.done()
        except openai.APIError as exc:
            if not isinstance(exc, openai.APIConnectionError):  # an error frame: the engine ended the task
                ending.done()
            raise self._classify(exc, agent, started=got.first_at is not None, partial=got.content) from exc
        finally:
            with anyio.CancelScope(shield=True):
                await stream.close()  # on cancellation too: the engine frees the slot
        return got.result(agent, sent)

    def _messages(self, req: ChatRequest) -> list[dict]:
        """The messages sent for ``req``: a forced tool choice on an engine that applies a template
        squad ships ends with an assistant message holding the template's call prefix, which
        llama-server continues (see :mod:`squad.engine.chat_templates`: b11434's ``required``
        alone lets a model write text first). Tool call ids are fitted to what the template demands
        (Mistral's: 9 alphanumeric characters, :attr:`EngineInfo.call_id_length`)."""
        messages = fit_call_ids(req.messages, self._engine.call_id_length)  # ids the template accepts
        prefix = self._engine.tool_call_prefix
        if req.tool_choice == "required" and req.tools and prefix:
            return [*messages, {"role": "assistant", "content": prefix}]
        return messages

    def _classify(self, exc: openai.APIError, agent: str, *, started: bool, partial: str = "") -> Exception:
        return classify(exc, agent, base_url=self._engine.base_url, engine_pool=self._engine.pool,
                        squad_pool=self.admission.pool if self.admission else self._engine.pool,
                        squad_reserved=self.admission.reserved if self.admission else 0,
                        request_timeout=self.request_timeout, started=started, partial=partial)

    def _emit(self, kind: type[Event], call: _Call, **data: Any) -> None:
        if self._on_event is not None:
            origin = call.request.origin
            try:
                self._on_event(kind(agent=origin.agent, conversation=origin.conversation, parent=origin.parent,
                                    call=call.id, engine=self._engine.base_url, **data))
            except Exception:  # noqa: BLE001 - a display bug must not break a call
                pass


def _attempt_no(state: RetryCallState, n: int) -> RetryCallState:
    """``state`` as a wait sees it when ``n`` attempts of its own kind have failed."""
    clone = copy.copy(state)
    clone.attempt_number = max(1, n)
    return clone


def _count_key(messages: list[dict], tools: list[dict] | None) -> str:
    text = json.dumps([messages, tools], sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


def _refuse_oversized(req: ChatRequest, agent: str, pool: int) -> None:
    """Raise :class:`AdmissionError` for a prompt of more than
    :data:`~squad.chat.counting.MAX_BYTES_PER_TOKEN` bytes per token of the agent's budget (or of the
    engine's pool): it cannot fit, so it is neither counted nor sent (field case F18)."""
    from squad.chat.counting import MAX_BYTES_PER_TOKEN

    tokens, what = (req.budget, "its budget") if req.budget else (pool, "the engine's pool")
    if not tokens:
        return
    size = sum(len(str(m.get("content") or "").encode("utf-8", "surrogatepass")) for m in req.messages)
    if size > MAX_BYTES_PER_TOKEN * tokens:
        raise AdmissionError(
            f"agent '{agent}': its prompt is {size:,} bytes, more than {what} of {tokens:,} tokens can hold even at "
            f"{MAX_BYTES_PER_TOKEN} bytes per token; it was neither counted nor sent: shorten the prompt", agent=agent)

"""llama-server behind the chat seam (:class:`squad.chat.ChatEngine`): the composed client.

:class:`EngineClient` is a stack of layers, outermost first, each a
:class:`~squad.chat.wrapper.WrapperChatEngine` in a file of its own:

1. this one: gives each call its id and reports how it ended (``call.finished`` / ``call.failed``);
2. :class:`~squad.chat.retrying.RetryingChatEngine`: the one retry policy (503 waited out, a
   connection lost before the first token resent, an overflow another client caused), jittered;
3. :class:`~squad.chat.admitted.AdmittedChatEngine`: the exact prompt count, the budget refusal, the
   reservation in :class:`~squad.sched.admission.Admission`, released on the engine's word;
4. :class:`~squad.chat.transport.LlamaServerTransport`: one attempt over HTTP (openai SDK,
   ``max_retries=0``), streamed, its deadlines, its errors typed.

The layers share one call's state through :mod:`squad.chat.call`.

Design: docs/design/client.md
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, Literal

from squad.chat import ChatRequest, ChatResult
from squad.chat.admitted import AdmittedChatEngine
from squad.chat.call import emit, with_call_id
from squad.chat.counting import PromptCounter
from squad.chat.deadline import Deadlines, EngineDeadlines
from squad.chat.retrying import RetryingChatEngine
from squad.chat.settle import EngineSlots
from squad.chat.transport import KEEPALIVE_S, LlamaServerTransport
from squad.chat.wrapper import WrapperChatEngine
from squad.engine.info import EngineInfo
from squad.errors import EngineGone, SquadError, TruncatedStream
from squad.events import CallFailed, CallFinished, EventSink
from squad.sched.admission import Admission

if TYPE_CHECKING:
    from squad.engine.tokens import TokenCounter

__all__ = ["EngineClient", "KEEPALIVE_S"]


class EngineClient(WrapperChatEngine):
    """Chat calls to one engine: the layers of the module docstring. Async context manager.

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
        admission: Admission | None | Literal['auto'] = "auto",
        request_timeout: float | None = None,
        on_event: EventSink | None = None,
        restart: Callable[[], Awaitable[EngineInfo]] | None = None,
        gone_reason: Callable[[], Awaitable[str | None]] | None = None,
        load_deadline: float = 120.0,
        max_attempts: int = 3,
        counter: TokenCounter | None | Literal['auto'] = "auto",
        deadlines: Deadlines | None = None,
    ) -> None:
        policy = deadlines or Deadlines()
        if request_timeout is not None:
            policy = dataclasses.replace(policy, request_timeout=request_timeout)
        self.transport = LlamaServerTransport(engine, deadlines=EngineDeadlines(policy), counter=counter,
                                              on_event=on_event)
        t = self.transport
        self.admitted = AdmittedChatEngine(
            t, Admission.for_engine(engine, on_event=on_event) if admission == "auto" else admission,
            counter=t.counter, slots=t.slots, http=lambda: t.http, messages=t.messages,
            prefill_deadline=lambda tokens: t.deadlines.prefill_deadline(tokens), on_event=on_event)
        self.retrying = RetryingChatEngine(self.admitted, load_deadline=load_deadline, max_attempts=max_attempts,
                                           restart=restart, adopt=self._adopt_restarted, on_event=on_event)
        super().__init__(self.retrying)
        self._on_event, self._gone_reason = on_event, gone_reason
        self.request_timeout = policy.longest_call
        """Seconds the longest attempt may take (the fixed deadline, else the derived ones' cap)."""

    # -- what the session and tests read ----------------------------------------------------

    @property
    def engine(self) -> EngineInfo:
        return self.transport.engine

    @engine.setter
    def engine(self, info: EngineInfo) -> None:
        """Adopt a reloaded engine (new port or key → new connections; old ones closed on aclose)."""
        self.transport.engine = info

    @property
    def admission(self) -> Admission | None:
        """This engine's :class:`Admission`, or None when the engine admits on its own."""
        return self.admitted.admission

    @admission.setter
    def admission(self, admission: Admission | None) -> None:
        self.admitted.admission = admission

    @property
    def on_event(self) -> EventSink | None:
        """Receives every layer's events (settable: each layer is told)."""
        return self._on_event

    @on_event.setter
    def on_event(self, sink: EventSink | None) -> None:
        self._on_event = self.transport.on_event = self.admitted.on_event = self.retrying.on_event = sink

    @property
    def counter(self) -> PromptCounter:
        return self.transport.counter

    @property
    def deadlines(self) -> EngineDeadlines:
        """This engine's deadline policy, measured speed and calls in flight."""
        return self.transport.deadlines

    @property
    def slots(self) -> EngineSlots:
        return self.transport.slots

    @property
    def load_deadline(self) -> float:
        return self.retrying.load_deadline

    @property
    def max_attempts(self) -> int:
        return self.retrying.max_attempts

    def _adopt_restarted(self, info: EngineInfo) -> None:
        self.engine = info
        if self.admission is not None:
            self.admission.adopt(info)

    async def prepare(self) -> None:
        """Load the local token counter for the engine's model (:class:`~squad.chat.counting.PromptCounter`);
        :meth:`count` does it on first use; the session does it at open so no call waits.
        Also starts the engine's speed from its ``/metrics`` when it has served calls before."""
        await self.transport.prepare()

    async def count(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> int:
        """Exact prompt tokens for ``messages`` (+ ``tools``): :meth:`LlamaServerTransport.count`."""
        return await self.transport.count(messages, tools)

    count_prompt_tokens = count  # the name earlier versions used

    async def engine_up(self, probes: int = 3) -> bool:
        """True if the engine answers ``/health`` at all within ``probes`` tries."""
        return await self.transport.engine_up(probes)

    async def __aenter__(self) -> EngineClient:
        return self

    # -- calls --------------------------------------------------------------------------------

    async def complete(self, request: ChatRequest) -> ChatResult:
        """One chat call: count → check budget → reserve → stream → release, resent by the policy.

        Returns a :class:`~squad.chat.ChatResult` whose ``call`` is the id its events carry.
        Raises :class:`AdmissionError` (over budget or pool, never sent),
        :class:`PromptTooLong`, :class:`ContextExceeded`, :class:`TruncatedStream`,
        :class:`ReasoningBudgetExhausted`, :class:`CallTimeout`, :class:`EngineLoadTimeout`,
        :class:`EngineGone`, :class:`AgentRunError`; each carries ``call_id``, the id its
        ``call.failed`` event names.
        """
        request, started = with_call_id(request, fresh=True), time.monotonic()  # each call its own id
        try:
            result = await self.inner.complete(request)
        except SquadError as exc:
            if isinstance(exc, (EngineGone, TruncatedStream)) and self._gone_reason is not None:
                reason = await self._gone_reason()
                if reason and exc.args:
                    exc.args = (f"{exc.args[0]}; {reason}", *exc.args[1:])
            emit(self._on_event, CallFailed, request, self.engine.base_url, error=type(exc).__name__,
                 message=str(exc), attempts=getattr(exc, "attempts", 1))
            # the call its events name, for squad.chat.routing's call.moved
            exc.call_id = request.call  # type: ignore[attr-defined]
            raise
        result.call = request.call
        timings = result.timings
        timings.total_s = time.monotonic() - started
        usage = result.usage
        cached = _cache_n(timings.engine)
        emit(self._on_event, CallFinished, request, self.engine.base_url, attempts=result.attempts,
             finish_reason=result.finish_reason, prompt_tokens=usage.prompt_tokens if usage else None,
             completion_tokens=usage.completion_tokens if usage else None, queued_s=timings.queued_s,
             ttft_s=timings.ttft_s, total_s=timings.total_s, tokens_per_s=timings.tokens_per_s, slot=result.slot,
             cached_tokens=cached, shared_tokens=min(cached or 0, result.shared_tokens))
        return result


def _cache_n(engine: Mapping[str, Any] | None) -> int | None:
    """Prompt tokens the engine reused from its cache: llama-server's ``timings.cache_n`` (None: not said)."""
    value = (engine or {}).get("cache_n")
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None

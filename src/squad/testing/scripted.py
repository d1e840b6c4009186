"""An in-process :class:`~squad.chat.ChatEngine` with scripted replies.

For tests of what squad decides (fail-fast and collect policies, cancellation reasons, the
hand-back cut, conversation ids in events) without HTTP. Every call really goes through
squad's :class:`~squad.sched.admission.Admission` (slots and pool as given), takes ``delay``
seconds (cancellable), and records its :class:`~squad.chat.ChatRequest` in ``requests``::

    engine = ScriptedEngine("first answer", "second answer", slots=2)
    engine = ScriptedEngine(responder=lambda req: f"hi from {req.agent}")
    async with Squad(agents, engine=engine) as sq: ...

A script item (or what ``responder`` returns) is an answer text, a
:class:`~squad.chat.ChatResult` (tool calls, finish reasons), or an exception instance to
raise (e.g. ``ContextExceeded("...")``). A call with the script used up and no responder fails
the test with ``AssertionError`` naming the unexpected call.
"""

from __future__ import annotations

import copy
from collections import deque
from collections.abc import Callable
from typing import Any

import anyio

from squad.chat import ChatRequest, ChatResult, Usage
from squad.engine.info import EngineInfo
from squad.events import EventSink
from squad.sched.admission import Admission
from squad.testing.counting import _words, count_tokens

__all__ = ["ScriptedEngine", "Scripted"]

Scripted = str | ChatResult | BaseException
"""One scripted outcome: answer text, a full result, or an exception to raise."""


class ScriptedEngine:
    """A scripted :class:`~squad.chat.ChatEngine` (see the module docstring).

    - ``slots``/``n_ctx``: the engine it pretends to be (one unified pool of ``n_ctx`` tokens);
    - ``delay``: seconds each call takes once admitted (or a function of the request);
    - ``on_event``: receives admission's ``call.*`` events (optional).
    """

    def __init__(self, *script: Scripted, responder: Callable[[ChatRequest], Scripted] | None = None,
                 slots: int = 2, n_ctx: int = 8192,
                 delay: float | Callable[[ChatRequest], float] = 0.0, on_event: EventSink | None = None) -> None:
        self.script: deque[Scripted] = deque(script)
        self.responder = responder
        self.delay = delay
        self.requests: list[ChatRequest] = []
        self.max_in_flight = 0
        self.engine = EngineInfo(base_url="scripted://engine", api_key=None, slots=slots, n_ctx=n_ctx,
                                 kv_unified=True, pool=n_ctx, launched=False, model_alias="scripted")
        self.admission: Admission | None = Admission.for_engine(self.engine, on_event=on_event)
        self._calls = 0

    async def count(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> int:
        """Words + overheads (:func:`squad.testing.count_tokens`)."""
        return count_tokens(messages, tools)

    async def complete(self, request: ChatRequest) -> ChatResult:
        """Admit, wait ``delay``, answer from the script; raises a scripted exception."""
        self.requests.append(request)
        self._calls += 1
        call = f"s{self._calls}"
        prompt = count_tokens(request.messages, request.tools)
        assert self.admission is not None
        async with self.admission.reserve(prompt + request.max_tokens, agent=request.origin,
                                          priority=request.priority, call=call) as reservation:
            self.max_in_flight = max(self.max_in_flight, self.admission.in_flight)
            delay = self.delay(request) if callable(self.delay) else self.delay
            if delay:
                await anyio.sleep(delay)
            outcome = self._next(request)
        if isinstance(outcome, BaseException):
            raise outcome
        if isinstance(outcome, str):
            outcome = ChatResult(content=outcome, usage=Usage(prompt, _words(outcome)))
        result = copy.copy(outcome)
        result.call, result.slot, result.reserved_tokens = call, reservation.slot, prompt + request.max_tokens
        if request.on_delta is not None and result.content:
            request.on_delta(result.content)
        return result

    def _next(self, request: ChatRequest) -> Scripted:
        if self.script:
            return self.script.popleft()
        if self.responder is not None:
            return self.responder(request)
        raise AssertionError(f"unexpected call #{self._calls} from agent {request.agent!r}: the script is used up "
                             f"(last message: {request.messages[-1].get('content')!r:.80})")

    async def engine_up(self) -> bool:
        """Always: the script never dies."""
        return True

    async def aclose(self) -> None:
        """Nothing to release."""

"""The admitted layer: count the prompt, refuse what cannot fit, reserve it, release on the engine's word.

:class:`AdmittedChatEngine` holds each attempt of a call in squad's
:class:`~squad.sched.admission.Admission` for ``prompt tokens + max_tokens`` (the prompt counted
exactly by ``counter``) while the layer under it sends it. A call that ends before its answer was
read to the end (cancelled, timed out, connection broken) keeps its reservation until the
engine's ``/slots`` shows the slot free (:func:`squad.chat.settle.until_engine_free`, the engine's
word). Before reserving it refuses, never sending: a prompt too large to count (F18) and a call
over its agent's budget (:mod:`squad.chat.budget`).

``admission`` None: the endpoint admits on its own (squad serve, F20): nothing is reserved here,
the request says who asks and how urgently (``X-Squad-Client``, ``X-Squad-Priority``), and its
deadlines allow for the endpoint's queue.
"""

from __future__ import annotations

import contextlib
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING

import httpx

from squad.chat import ChatEngine, ChatRequest, ChatResult
from squad.chat.budget import refuse_over_budget, refuse_oversized
from squad.chat.call import Call, opened
from squad.chat.counting import PromptCounter
from squad.chat.settle import CALL_SETTLE_TIMEOUT, EngineSlots, until_engine_free
from squad.chat.stream import InnocentOverflow
from squad.chat.wrapper import WrapperChatEngine
from squad.events import EngineWarning, EventSink
from squad.sched.admission import Admission, Reservation
from squad.sched.share import MIN_SHARED_TOKENS, ShareGroup, request_shares

if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

__all__ = ["AdmittedChatEngine"]


class AdmittedChatEngine(WrapperChatEngine):
    """Admits ``inner``'s calls (module docstring).

    - ``admission``: the engine's :class:`Admission`, or None (the endpoint admits);
    - ``counter``: exact prompt counts (:class:`~squad.chat.counting.PromptCounter`);
    - ``slots``: the engine's ``/slots`` (:class:`~squad.chat.settle.EngineSlots`), read to release
      a call that ended early;
    - ``http``: returns the engine's ``httpx.AsyncClient``, for a fan-out's shared prefix
      (:mod:`squad.sched.share`);
    - ``on_event``: receives ``engine.warning`` (a local count below the engine's) and settling's.
    """

    def __init__(self, inner: ChatEngine, admission: Admission | None, *, counter: PromptCounter,
                 slots: EngineSlots, http: Callable[[], httpx.AsyncClient],
                 messages: Callable[[ChatRequest], list[dict[str, Any]]],
                 on_event: EventSink | None = None) -> None:
        super().__init__(inner)
        self.admission, self.counter, self.slots = admission, counter, slots
        self._http, self._messages, self.on_event = http, messages, on_event

    async def complete(self, request: ChatRequest) -> ChatResult:
        """Count, refuse or reserve, then ``inner.complete(request)``; the result gets
        ``reserved_tokens``, ``slot`` and ``timings.queued_s``. Raises :class:`AdmissionError` (never
        sent), what admission raises (:class:`EngineLost`) and what ``inner`` raises."""
        engine, admission = self.engine, self.admission
        with opened(request) as call:
            refuse_oversized(request, engine.pool)
            prompt, local = await self.counter(self._messages(request), request.tools)
            # An agent's budget holds exact counts. On a kind with no tokenize endpoint the count is an
            # estimate that runs high on purpose (squad.chat.counting.estimate_chat_tokens): it still
            # bounds the reservation and the engine's own limit, but would refuse calls that fit.
            if local or engine.count_with != "estimate":
                refuse_over_budget(request, prompt, engine.n_ctx_train)
            need = prompt + request.max_tokens
            group, shared = await self._shares(request)
            call.need, call.prompt, call.admission, call.upstream = need, prompt, admission, admission is None
            async with self._reserve(call, need, shared) as reservation, until_engine_free(
                    admission, reservation, self.slots, on_event=self.on_event,
                    timeout=CALL_SETTLE_TIMEOUT) as ending:
                call.ending, call.slot = ending, reservation.slot
                call.pin = (reservation.slot if group is not None
                            and await group.enter(self._http(), reservation.slot, engine.slot_save_dir) else None)
                try:
                    result = await self.inner.complete(request)
                except InnocentOverflow as exc:
                    call.held = max(call.held, exc.reserved)
                    raise
        result.reserved_tokens, result.slot = need, reservation.slot
        result.timings.queued_s = reservation.queued_s
        if local and result.usage is not None:
            warning = self.counter.reconcile(prompt, result.usage.prompt_tokens)
            if warning is not None and self.on_event is not None:
                self.on_event(EngineWarning(engine=engine.base_url, warning=warning))
        return result

    def _reserve(self, call: Call, need: int, shared: int) -> AbstractAsyncContextManager[Reservation]:
        req = call.request
        if self.admission is None:
            return contextlib.nullcontext(Reservation(req.origin, need, call=call.id))
        return self.admission.reserve(need, agent=req.origin, priority=req.priority, call=call.id, shared=shared)

    async def _shares(self, request: ChatRequest) -> tuple[ShareGroup | None, int]:
        """The fan-out group whose shared prefix this call restores, and its tokens (squad.sched.share):
        the first call of a fan-out member whose prompt starts with the shared text, only on an
        engine squad gave a slot save directory; else ``(None, 0)``."""
        if self.admission is None or not self.engine.slot_save_dir:
            return None, 0
        group = request_shares(request)
        shared = await group.probe(self._http()) if group is not None else 0
        return (group, shared) if shared >= MIN_SHARED_TOKENS else (None, 0)


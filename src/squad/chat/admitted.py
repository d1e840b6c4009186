"""The admitted layer: count the prompt, refuse what cannot fit, reserve it, release on the engine's word.

:class:`AdmittedChatEngine` holds each attempt of a call in squad's
:class:`~squad.sched.admission.Admission` for ``prompt tokens + max_tokens`` (the prompt counted
exactly by ``counter``) while the layer under it sends it: it hands that layer the count and the
reservation as an argument (``send(request, admitted)``, :class:`~squad.chat.call.Admitted`). A call
that ends before its answer was read to the end (cancelled, timed out, connection broken) keeps its
reservation until the engine's ``/slots`` shows the slot free
(:func:`squad.chat.settle.until_engine_free`, the engine's word). Before reserving it refuses, never
sending: a prompt too large to count (F18) and a call over its agent's budget (:mod:`squad.chat.budget`).

``admission`` None: the endpoint admits on its own (squad serve, F20): nothing is reserved here,
the request says who asks and how urgently (``X-Squad-Client``, ``X-Squad-Priority``), and its
deadlines allow for the endpoint's queue.
"""

from __future__ import annotations

import contextlib
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import httpx

from squad.chat import ChatEngine, ChatRequest, ChatResult
from squad.chat.budget import refuse_over_budget, refuse_oversized
from squad.chat.call import Admitted, emit, with_call_id
from squad.chat.counting import PromptCounter
from squad.chat.settle import CALL_SETTLE_TIMEOUT, EngineSlots, until_engine_free
from squad.chat.stream import InnocentOverflow
from squad.chat.wrapper import WrapperChatEngine
from squad.events import EngineWarning, EventSink, ShareSkipped
from squad.sched.admission import Admission, Reservation
from squad.sched.share import MIN_SHARED_TOKENS, ShareGroup

if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

__all__ = ["AdmittedChatEngine", "SendingEngine"]


@runtime_checkable
class SendingEngine(ChatEngine, Protocol):
    """What the admitted layer sends through: a :class:`~squad.chat.ChatEngine` that also takes what
    was counted and reserved for an attempt as an argument (:class:`squad.chat.transport.LlamaServerTransport`)."""

    async def send(self, request: ChatRequest, admitted: Admitted) -> ChatResult: ...


class AdmittedChatEngine(WrapperChatEngine):
    """Admits ``inner``'s calls (module docstring).

    - ``admission``: the engine's :class:`Admission`, or None (the endpoint admits);
    - ``counter``: exact prompt counts (:class:`~squad.chat.counting.PromptCounter`);
    - ``slots``: the engine's ``/slots`` (:class:`~squad.chat.settle.EngineSlots`), read to release
      a call that ended early;
    - ``http``: returns the engine's ``httpx.AsyncClient``, for a fan-out's shared prefix
      (:mod:`squad.sched.share`);
    - ``prefill_deadline``: seconds a fan-out's one-time prefill of N tokens may take
      (:meth:`squad.chat.deadline.EngineDeadlines.prefill_deadline`);
    - ``on_event``: receives ``engine.warning`` (a local count below the engine's), ``share.skipped``
      and settling's.

    On an engine squad launched (it has a slot save directory) every call is pinned (``id_slot``) to
    the slot admission granted, which is the slot the conversation's last call used when free: its
    prefix is still there, so a tool loop's next round reuses it.
    """

    inner: SendingEngine

    def __init__(self, inner: SendingEngine, admission: Admission | None, *, counter: PromptCounter,
                 slots: EngineSlots, http: Callable[[], httpx.AsyncClient],
                 messages: Callable[[ChatRequest], list[dict[str, Any]]],
                 prefill_deadline: Callable[[int], float] = lambda tokens: 600.0,
                 on_event: EventSink | None = None) -> None:
        super().__init__(inner)
        self.admission, self.counter, self.slots = admission, counter, slots
        self._http, self._messages, self.on_event = http, messages, on_event
        self.prefill_deadline = prefill_deadline

    async def complete(self, request: ChatRequest) -> ChatResult:
        """Count, refuse or reserve, then ``inner.send(request, admitted)`` (the count and the
        reservation as an :class:`~squad.chat.call.Admitted`); the result gets ``reserved_tokens``,
        ``slot``, ``shared_tokens`` and ``timings.queued_s``. Raises :class:`AdmissionError` (never
        sent), what admission raises (:class:`EngineLost`) and what ``inner`` raises."""
        engine, admission = self.engine, self.admission
        request = with_call_id(request)
        refuse_oversized(request, engine.pool)
        prompt, local = await self.counter(self._messages(request), request.tools)
        # An agent's budget holds exact counts. On a kind with no tokenize endpoint the count is an
        # estimate that runs high on purpose (squad.engine.kinds.counting.Estimate): it still
        # bounds the reservation and the engine's own limit, but would refuse calls that fit.
        if local or engine.counting.exact:
            refuse_over_budget(request, prompt, engine.n_ctx_train)
        need = prompt + request.max_tokens
        group, shared = await self._shares(request)
        async with self._reserve(request, need) as reservation, until_engine_free(
                admission, reservation, self.slots, on_event=self.on_event,
                timeout=CALL_SETTLE_TIMEOUT) as ending:
            restored = 0
            if group is not None and await group.enter(
                    self._http(), reservation.slot, engine.slot_save_dir,
                    deadline_s=self.prefill_deadline(shared), skip=self._skipper(request, shared)):
                restored = shared
            owned = admission is not None and bool(engine.slot_save_dir) and reservation.slot >= 0
            admitted = Admitted(prompt=prompt, admission=admission, upstream=admission is None,
                                slot=reservation.slot, pin=reservation.slot if owned or restored else None,
                                ending=ending)
            try:
                result = await self.inner.send(request, admitted)
            except InnocentOverflow as exc:
                exc.need = need
                raise
        result.reserved_tokens, result.slot, result.shared_tokens = need, reservation.slot, restored
        result.timings.queued_s = reservation.queued_s
        if local and result.usage is not None:
            warning = self.counter.reconcile(prompt, result.usage.prompt_tokens)
            if warning is not None and self.on_event is not None:
                self.on_event(EngineWarning(engine=engine.base_url, warning=warning))
        return result

    def _reserve(self, req: ChatRequest, need: int) -> AbstractAsyncContextManager[Reservation]:
        if self.admission is None:
            return contextlib.nullcontext(Reservation(req.origin, need, call=req.call))
        return self.admission.reserve(need, agent=req.origin, priority=req.priority, call=req.call)

    def _skipper(self, req: ChatRequest, tokens: int) -> Callable[[str], None]:
        def skip(reason: str) -> None:
            emit(self.on_event, ShareSkipped, req, self.engine.base_url, reason=reason, tokens=tokens)
        return skip

    async def _shares(self, request: ChatRequest) -> tuple[ShareGroup | None, int]:
        """The fan-out group whose common prefix this call restores, and its tokens (squad.sched.share):
        the first call of a fan-out member whose messages begin with the group's prefix, only on an
        engine squad gave a slot save directory; else ``(None, 0)``, with a ``share.skipped`` once
        per group when it cannot be used."""
        group = request.share  # the runtime's: the member's first call holding the prefix goes through it
        if group is None or not group.claim(request.origin.conversation, request.messages) or self.admission is None:
            return None, 0
        if not self.engine.slot_save_dir:
            group.tell_once("the engine has no slot save directory (squad did not launch it); each member "
                            "prefills its own prompt", self._skipper(request, 0))
            return None, 0
        shared = await group.probe(self._http(), request.tools)
        if shared < MIN_SHARED_TOKENS:
            group.tell_once(f"the common prefix is {shared} tokens, under the {MIN_SHARED_TOKENS} worth a slot "
                            "save; each member prefills its own prompt", self._skipper(request, shared))
            return None, 0
        return group, shared


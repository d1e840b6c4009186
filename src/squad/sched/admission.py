"""Admission control: never send the engine more than its slots and its KV pool hold.

llama-server serves ``slots`` requests at once from ONE unified pool of KV cells; when the
running requests together need more cells than the pool, it fails **every** processing
request with ``Context size has been exceeded.`` (``docs/llama-facts.md``). So before a
call is sent it reserves ``prompt tokens + max_tokens`` here, and waits while either all
slots are taken or the reservation does not fit what is left of the pool.

Queue order is a :class:`~squad.sched.policy.QueuePolicy` (``queue=``): by default ``program``
(lower ``priority`` number first, then the program with the least service so far, then the
smaller call; bounded so no call waits unboundedly); ``fifo`` keeps strict arrival order with no
barging, ``backfill`` lets a call that fits pass a head that does not, a bounded number of times. The
runtime gives the main agent priority 0 and sub-agents 1, so the main agent's next call goes
to the front as soon as it asks and cannot be starved by its own sub-agents' fan-out.

Events (:mod:`squad.events`): :class:`~squad.events.CallQueued`,
:class:`~squad.events.CallAdmitted`, :class:`~squad.events.CallReleased`, each carrying the
caller's :class:`~squad.events.Origin`, the call id it was given and the engine id.
"""

from __future__ import annotations

import heapq
import itertools
import math
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, cast

import anyio

from squad.engine.llama import round_ctx
from squad.errors import AdmissionError, EngineLost
from squad.events import CallAdmitted, CallQueued, CallReleased, Event, EventSink, Origin
from squad.sched.policy import QueuePolicy, Room, queue_policy
from squad.sched.room import Reservation

if TYPE_CHECKING:
    from squad.engine.info import EngineInfo

__all__ = ["Admission", "Reservation"]

_HOMES = 4096
"""Conversations whose last slot admission remembers (the oldest forgotten first)."""


@dataclass
class _Waiter:
    reservation: Reservation
    seq: int
    granted: anyio.Event = field(default_factory=anyio.Event)
    error: AdmissionError | EngineLost | None = None


def _limit_note(info: EngineInfo) -> str:
    if info.truncates:
        return (f" ({info.kind} would silently truncate a longer prompt, so squad refuses it before sending: "
                "it was not sent)")
    return ""


class Admission:
    """Slot- and KV-aware admission for one engine.

    - ``slots``: parallel slots the engine reported (``/props`` ``total_slots``).
    - ``pool``: KV cells the slots share, in tokens (unified KV: ``n_ctx``).
    - ``per_request_limit``: most tokens one request may use, if lower than ``pool``
      (e.g. ``n_ctx`` per slot when KV is not unified).
    - ``on_event``: receives ``call.queued`` / ``call.admitted`` / ``call.released``.
    - ``engine``: the engine id its events carry (its base URL).
    - ``limit_note``: why the per-request limit matters for this engine, added to the error for
      a request above it (e.g. Ollama truncates such a prompt silently).
    - ``queue``: the order of waiting calls, a :class:`~squad.sched.policy.QueuePolicy` or its
      name (``program`` default, ``fifo``, ``backfill``); ``ValueError`` for an unknown name.

    Cost per call, n calls waiting: ``reserve`` and its release O(log n) amortised (the policy's
    ``add``/``pick``/``remove``, each O(log n) or better: see the policies; the slot numbers a
    min-heap, O(log slots); the waiting tokens and the count per priority kept as calls come and go,
    O(1)). The views ``queued`` and ``queued_calls`` sort the queue, O(n log n): for displays only.
    """

    def __init__(self, slots: int, pool: int, *, per_request_limit: int | None = None,
                 on_event: EventSink | None = None, engine: str | None = None, limit_note: str = "",
                 queue: str | QueuePolicy | None = None) -> None:
        self._check_shape(slots, pool)
        self.queue: QueuePolicy = queue_policy(queue)
        self.limit_note = limit_note
        self.slots, self.pool, self.per_request_limit = slots, pool, per_request_limit
        self._on_event = on_event
        self.engine = engine
        self._running: dict[int, Reservation] = {}  # slot -> reservation
        self._reserved = 0  # sum of the running reservations' tokens
        self._free: list[int] = list(range(slots))  # free slot numbers, a min-heap
        self._homes: dict[str, int] = {}  # conversation -> the slot its last call used (its prefix is there)
        self._owner: dict[int, str] = {}  # slot -> the conversation whose prompt it holds
        self._released: dict[int, float] = {}  # slot -> when its last call was released
        self._seq = itertools.count()
        self._idle: list[anyio.Event] = []
        self._queued_tokens = 0  # tokens the waiting calls ask for
        self._by_priority: dict[int, int] = {}  # priority -> calls waiting at it (a handful of keys)
        self._held = False
        self.closed: EngineLost | None = None
        """Set by :meth:`close`: the engine was lost; every reservation fails with it."""

    @classmethod
    def for_engine(cls, info: EngineInfo, *, on_event: EventSink | None = None,
                   queue: str | QueuePolicy | None = None) -> Admission:
        """Admission for an engine as it reported itself: its slots, its pool, and each
        request kept under the per-slot context ``info.n_ctx`` (which is below the pool when
        KV is not unified, or when one slot is capped at the training context)."""
        return cls(info.slots, info.pool, per_request_limit=info.n_ctx, on_event=on_event, engine=info.base_url,
                   limit_note=_limit_note(info), queue=queue)

    def adopt(self, info: EngineInfo) -> None:
        """Take a reloaded engine's slots and pool (see :meth:`resize`)."""
        self.engine, self.limit_note = info.base_url, _limit_note(info)
        self.resize(info.slots, info.pool, per_request_limit=info.n_ctx)

    # -- views for the live display ------------------------------------------------------

    @property
    def in_flight(self) -> int:
        """Calls admitted and not yet released."""
        return len(self._running)

    @property
    def settling(self) -> int:
        """Calls in flight whose request has ended on squad's side while the engine may still work
        on it (:func:`squad.chat.settle.until_engine_free`): still counted in :attr:`in_flight` and
        :attr:`reserved`."""
        return sum(1 for r in self._running.values() if r.settling)

    @property
    def reserved(self) -> int:
        """Tokens reserved by the calls in flight."""
        return self._reserved

    @property
    def queued(self) -> list[str]:
        """Agents waiting, in the order they will be admitted."""
        return [w.reservation.agent for w in self._waiters]

    @property
    def _waiters(self) -> list[_Waiter]:
        return cast("list[_Waiter]", self.queue.ordered())  # Admission adds only _Waiters

    @property
    def queued_calls(self) -> list[tuple[str | None, int]]:
        """``(call id, tokens)`` of the waiting calls, in the order they will be admitted."""
        return [(w.reservation.call, w.reservation.tokens) for w in self._waiters]

    @property
    def queued_tokens(self) -> int:
        """Tokens the waiting calls ask for (kept as calls come and go: O(1))."""
        return self._queued_tokens

    @property
    def limit(self) -> int:
        """Most tokens one call can ever reserve."""
        return min(self.pool, self.per_request_limit or self.pool)

    # -- reserve ---------------------------------------------------------------------------

    def check(self, tokens: int, *, agent: str | Origin) -> None:
        """Raise :class:`AdmissionError` if ``tokens`` could never be admitted."""
        if tokens <= 0:
            raise ValueError(f"a reservation needs a positive token count, got {tokens}")
        if tokens > self.limit:
            agent = agent.agent if isinstance(agent, Origin) else agent
            raise AdmissionError(
                f"agent '{agent}' needs {tokens} tokens (prompt + max_tokens) but one request may use at most "
                f"{self.limit} tokens of this engine's context{self.limit_note}: raise the context to "
                f"{round_ctx(tokens)} or lower max_tokens / shorten the prompt by {tokens - self.limit} tokens",
                agent=agent,
            )

    @asynccontextmanager
    async def reserve(self, tokens: int, *, agent: str | Origin, priority: int = 0,
                      call: str | None = None) -> AsyncIterator[Reservation]:
        """Hold ``tokens`` KV cells and one slot for the block; wait (in order) until they fit.

        ``agent`` is the caller (a name or its :class:`~squad.events.Origin`); ``call`` the
        call id its events carry. A conversation gets back the slot its last call used when that
        slot is free (the engine still holds its prefix there); else the lowest free slot.

        Raises :class:`AdmissionError` at once if ``tokens`` alone exceeds the pool (or
        ``per_request_limit``), or later if a :meth:`resize` makes it impossible. Cancelling
        the waiting task removes it from the queue cleanly.
        """
        origin = agent if isinstance(agent, Origin) else Origin(agent)
        if self.closed is not None:
            raise self.closed
        self.check(tokens, agent=origin)
        waiter = _Waiter(Reservation(origin=origin, tokens=tokens, priority=priority, call=call), next(self._seq))
        started = time.monotonic()
        position = sum(n for p, n in self._by_priority.items() if p <= priority)
        self._enqueue(waiter)
        self._dispatch()
        if not waiter.granted.is_set():
            self._emit(CallQueued, waiter.reservation, tokens=tokens, position=position,
                       in_flight=self.in_flight, pool_used=self.reserved)
            try:
                await self._wait(waiter)
            except BaseException:
                if self._dequeue(waiter):
                    self._dispatch()  # the head may have changed
                else:
                    self._release(waiter.reservation, started)
                raise
        if waiter.error is not None:
            raise waiter.error
        reservation = waiter.reservation
        reservation.queued_s = time.monotonic() - started
        self._emit(CallAdmitted, reservation, tokens=tokens, slot=reservation.slot, queued_s=reservation.queued_s,
                   in_flight=self.in_flight, pool_used=self.reserved)
        admitted = time.monotonic()
        try:
            yield reservation
        finally:
            self._release(reservation, admitted)

    # -- reload support ------------------------------------------------------------------------

    async def drain(self, timeout: float | None = None, *, hold: bool = False) -> None:
        """Wait until no call is in flight; raises ``TimeoutError`` after ``timeout`` seconds
        (None: no deadline of its own, e.g. under ``Launcher.reload``'s ``drain_timeout``).

        With ``hold=True`` no new call is admitted from now until :meth:`resize` or
        :meth:`resume` (the launcher drains and holds before reloading the engine).
        """
        if hold:
            self._held = True
        with anyio.fail_after(timeout):  # None: no deadline
            while self._running:
                idle = anyio.Event()
                self._idle.append(idle)
                await idle.wait()

    def hold(self) -> None:
        """Admit no new call until :meth:`resume` or :meth:`resize` (the engine restarts); calls in flight go on."""
        self._held = True

    def resume(self) -> None:
        """Admit again after ``drain(hold=True)``."""
        self._held = False
        self._dispatch()

    def resize(self, slots: int, pool: int, *, per_request_limit: int | None = None) -> None:
        """Adopt a reloaded engine's slots and pool, and resume admitting.

        Queued calls that can no longer fit fail with :class:`AdmissionError`.
        """
        self._check_shape(slots, pool)
        self.slots, self.pool, self.per_request_limit = slots, pool, per_request_limit
        self._free = [s for s in range(slots) if s not in self._running]
        heapq.heapify(self._free)
        for waiter in list(self._waiters):
            try:
                self.check(waiter.reservation.tokens, agent=waiter.reservation.agent)
            except AdmissionError as exc:
                waiter.error = exc
                self._dequeue(waiter)
                waiter.granted.set()
        self.resume()

    def close(self, lost: EngineLost) -> None:
        """The engine is gone: every waiting call fails with ``lost`` (it was never sent), and so
        does every later :meth:`reserve`. Calls in flight keep their slots until they end."""
        self.closed = lost
        for waiter in self._waiters:
            waiter.error = lost
            self._dequeue(waiter)
            waiter.granted.set()

    # -- internals -----------------------------------------------------------------------------

    @staticmethod
    def _check_shape(slots: int, pool: int) -> None:
        if slots < 1 or pool < 1:
            raise ValueError(f"admission needs at least one slot and a positive pool, got slots={slots} pool={pool}")

    def _enqueue(self, waiter: _Waiter) -> None:
        """Into the policy's queue, and into the counts the views read (O(1) here)."""
        self.queue.add(waiter)
        r = waiter.reservation
        self._queued_tokens += r.tokens
        self._by_priority[r.priority] = self._by_priority.get(r.priority, 0) + 1

    def _dequeue(self, waiter: _Waiter) -> bool:
        """Out of the policy's queue without a grant; False if it was not there."""
        if not self.queue.remove(waiter):
            return False
        self._left_queue(waiter)
        return True

    def _left_queue(self, waiter: _Waiter) -> None:
        r = waiter.reservation
        self._queued_tokens -= r.tokens
        left = self._by_priority[r.priority] - 1
        if left:
            self._by_priority[r.priority] = left
        else:
            del self._by_priority[r.priority]

    def _fits(self, reservation: Reservation) -> bool:
        return self._reserved + reservation.tokens <= self.pool

    async def _wait(self, waiter: _Waiter) -> None:
        """Wait until granted; a policy that holds a call for a while (``wake_in``: seconds) is
        asked again when the hold ends, even if no call arrives or ends meanwhile."""
        while not waiter.granted.is_set():
            wake_in = getattr(self.queue, "wake_in", None)
            delay = wake_in() if wake_in is not None else None
            with anyio.move_on_after(delay + 0.001 if delay is not None else math.inf):
                await waiter.granted.wait()
            if not waiter.granted.is_set():
                self._dispatch()

    def _dispatch(self) -> None:
        """Grant the waiters the queue policy picks while a slot is free and they fit."""
        while self._free and not self._held and self.closed is None:
            room = Room(self._fits, free=self.pool - self._reserved, pool=self.pool, slots=self.slots,
                        running=len(self._running))
            head = self.queue.pick(room)
            if head is None:
                return
            assert isinstance(head, _Waiter)
            self._left_queue(head)
            slot = self._slot_for(head.reservation)
            head.reservation.slot = slot
            self._running[slot] = head.reservation
            self._reserved += head.reservation.tokens
            head.granted.set()

    def _slot_for(self, reservation: Reservation) -> int:
        """The free slot to grant: the one the same conversation used last, when free (its prefix is
        still in the engine's cells there); else the lowest free slot no conversation holds a prefix
        in; else the free slot released longest ago (its conversation the least likely to come back
        soon). O(slots)."""
        home = self._homes.get(reservation.origin.conversation) if reservation.origin.conversation else None
        if home is None or home not in self._free:
            home = min(self._free, key=lambda s: (s in self._owner, self._released.get(s, 0.0), s))
        if home == self._free[0]:
            return heapq.heappop(self._free)
        self._free.remove(home)
        heapq.heapify(self._free)
        return home

    def _release(self, reservation: Reservation, since: float) -> None:
        if self._running.get(reservation.slot) is not reservation:
            return
        del self._running[reservation.slot]
        self._reserved -= reservation.tokens
        self._released[reservation.slot] = time.monotonic()
        old = self._owner.pop(reservation.slot, None)
        if old is not None and self._homes.get(old) == reservation.slot:
            del self._homes[old]  # another conversation's prompt is in that slot now
        if reservation.origin.conversation:
            self._owner[reservation.slot] = reservation.origin.conversation
            self._homes.pop(reservation.origin.conversation, None)  # most recent last: a bounded, ordered map
            self._homes[reservation.origin.conversation] = reservation.slot
            if len(self._homes) > _HOMES:
                gone = next(iter(self._homes))
                if self._owner.get(self._homes[gone]) == gone:
                    del self._owner[self._homes[gone]]
                del self._homes[gone]
        if reservation.slot < self.slots:
            heapq.heappush(self._free, reservation.slot)
        held_s = time.monotonic() - since
        self.queue.served(reservation, held_s)
        self._emit(CallReleased, reservation, tokens=reservation.tokens, slot=reservation.slot,
                   held_s=held_s, in_flight=self.in_flight, pool_used=self.reserved)
        self._dispatch()
        if not self._running:
            for idle in self._idle:
                idle.set()
            self._idle.clear()

    def _emit(self, kind: type[Event], reservation: Reservation, **data: object) -> None:
        if self._on_event is not None:
            origin = reservation.origin
            try:
                self._on_event(kind(agent=origin.agent, conversation=origin.conversation, parent=origin.parent,
                                    call=reservation.call, engine=self.engine, **data))  # type: ignore[arg-type]
            except Exception:  # noqa: BLE001 - a display bug must not break admission
                pass

"""The relay of a Ray run's events: a worker's squad emits into its :class:`_Outbox` (placed
for the driver), the driver fetches them (:func:`_fetch`, one long-polling call per worker)
into a :class:`_Feed` that moves them onto its clocks (:func:`_clock_offsets`) and gives them
to the run's sinks. Rules: :mod:`squad.cluster.ray`."""

from __future__ import annotations

import contextvars
import threading
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import anyio

from squad.events import AgentStarted, Event, EventSink, emit_to

__all__ = ["POLL_S", "FLUSH_TIMEOUT"]

POLL_S = 0.5
"""Longest a worker's events call waits for an event before it answers with none (seconds)."""
FLUSH_TIMEOUT = 10.0
"""Longest the driver waits for an item's last events after its result came (seconds)."""


class _Feed:
    """The driver's end of one worker's events: :meth:`forward` gives each fetched event to the
    sinks on the driver's clocks (``offsets``: the worker's ``time.monotonic()`` and
    ``time.time()`` minus the driver's, :func:`_clock_offsets`), except those of an item in
    ``lost`` (its worker was lost, the item went elsewhere); :meth:`reached` waits until a
    number of the worker's events have come."""

    def __init__(self, worker: str, sinks: Sequence[EventSink], offsets: tuple[float, float] = (0.0, 0.0)) -> None:
        self.worker, self.sinks, self.offsets = worker, list(sinks), offsets
        self.engine: str | None = None
        self.received = 0
        self.lost: set[int] = set()
        self.closed = False
        self._arrived = anyio.Event()

    def forward(self, batch: Sequence[tuple[int | None, Event]]) -> None:
        """Emit ``batch`` (``(item, event)`` pairs as :class:`_Outbox` hands them out)."""
        mono, wall = self.offsets
        for item, event in batch:
            self.engine = self.engine or event.engine
            if item is None or item not in self.lost:
                emit_to(self.sinks, replace(event, t=event.t - mono, wall=event.wall - wall))
        self.received += len(batch)
        self._arrived.set()
        self._arrived = anyio.Event()

    def close(self) -> None:
        """No more events will come (the worker is gone): nobody waits for them."""
        self.closed = True
        self._arrived.set()

    async def reached(self, count: int) -> None:
        """Return once ``count`` events of the worker have been forwarded (or none can come any
        more, or :data:`FLUSH_TIMEOUT` passed: a result is never held back for its events)."""
        with anyio.move_on_after(FLUSH_TIMEOUT):
            while self.received < count and not self.closed:
                await self._arrived.wait()


async def _fetch(actor: Any, feed: _Feed) -> None:
    """Fetch ``actor``'s events into ``feed`` until the actor is gone (or this is cancelled)."""
    try:
        while True:
            feed.forward(await actor.events.remote(POLL_S))
    except Exception:  # noqa: BLE001 - the actor died or was closed: its run() says why
        feed.close()


async def _clock_offsets(actor: Any, rounds: int = 3) -> tuple[float, float]:
    """How far ``actor``'s clocks are ahead of the driver's, in seconds: ``(monotonic, wall)``,
    from the round trip with the least delay of ``rounds`` (error at most half of it)."""
    best: tuple[float, float, float] | None = None
    for _ in range(rounds):
        m0, w0 = time.monotonic(), time.time()
        mono, wall = await actor.clock.remote()
        m1, w1 = time.monotonic(), time.time()
        if best is None or m1 - m0 < best[0]:
            best = (m1 - m0, mono - (m0 + m1) / 2, wall - (w0 + w1) / 2)
    assert best is not None
    return best[1], best[2]


_ITEM: contextvars.ContextVar[int | None] = contextvars.ContextVar("squad_ray_item", default=None)
"""In a worker: the driver's index of the map item the running task works on."""


class _Outbox:
    """A worker's events on their way to the driver: the worker's squad emits into it (its event
    loop's thread), Ray's threads :meth:`take` them. Each event is placed for the driver:
    ``worker`` set, ``engine`` the worker's engine when it had none, conversation and call ids
    prefixed with the worker's short id, an ``agent.started`` of a map item carrying the driver's
    index; each is handed out with the driver's index of its item (None: not an item's)."""

    def __init__(self, worker: str) -> None:
        self.worker = worker
        self.prefix = worker.partition("@")[0] + ":"
        self.engine: str | None = None
        self.count = 0
        """Events put in so far."""
        self._events: list[tuple[int | None, Event]] = []
        self._items: dict[str, int] = {}  # the worker's conversation id -> the driver's item index
        self._cond = threading.Condition()

    def __call__(self, event: Event) -> None:
        item = _ITEM.get()
        if isinstance(event, AgentStarted) and item is not None and event.conversation:
            self._items[event.conversation] = item  # the item's conversation, or one it started
        item = self._items.get(event.conversation or "")
        named = {k: self.prefix + v for k in ("conversation", "parent", "call") if (v := getattr(event, k))}
        if isinstance(event, AgentStarted) and event.item is not None and item is not None:
            named["item"] = item  # the driver's index (the worker's map numbers it so too: first_item)
        placed = replace(event, worker=self.worker, engine=event.engine or self.engine, **named)
        with self._cond:
            self._events.append((item, placed))
            self.count += 1
            self._cond.notify_all()

    def take(self, timeout: float) -> list[tuple[int | None, Event]]:
        """Every event not taken yet, waiting up to ``timeout`` seconds for the first."""
        with self._cond:
            if not self._events:
                self._cond.wait(timeout)
            taken, self._events = self._events, []
            return taken



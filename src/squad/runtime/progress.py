"""A map's progress as events: :class:`~squad.events.MapProgress` when the map starts, at most once per
:data:`EVERY_S` while it runs, and when its last item ends; O(1) per item, so a map of any size is a handful of
events, not a line per item."""

from __future__ import annotations

import time
from collections.abc import Callable

from squad.events import EventSink, MapProgress

__all__ = ["EVERY_S", "MapProgressMeter"]

EVERY_S = 1.0
"""Seconds between two progress events of one map while it runs."""


class MapProgressMeter:
    """Counts a map's items as they end and emits :class:`MapProgress` to ``emit``: ``rate`` is items done per
    second since :meth:`start` (on ``clock``), ``eta_s`` the rest at that rate."""

    def __init__(self, agent: str, total: int, emit: EventSink, *, clock: Callable[[], float] = time.monotonic,
                 every_s: float = EVERY_S) -> None:
        self.agent, self.total, self._emit, self._clock, self.every_s = agent, total, emit, clock, every_s
        self.done = self.failed = 0
        self._start = self._last = 0.0

    def start(self) -> None:
        self._start = self._last = self._clock()
        self._send(self._start)

    def item_done(self, ok: bool) -> None:
        """One item ended (``ok``: with an answer)."""
        self.done += 1
        self.failed += not ok
        now = self._clock()
        if self.done >= self.total or now - self._last >= self.every_s:
            self._last = now
            self._send(now)

    def _send(self, now: float) -> None:
        elapsed = now - self._start
        rate = self.done / elapsed if elapsed > 0 and self.done else 0.0
        eta = (self.total - self.done) / rate if rate > 0 else None
        self._emit(MapProgress(agent=self.agent, done=self.done, total=self.total, failed=self.failed,
                               rate=round(rate, 3), eta_s=None if eta is None else round(eta, 1)))

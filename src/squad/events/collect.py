"""The summary collector: a :class:`~squad.events.sink.Sink` that keeps a run's events and
digests them on demand (:func:`squad.events.summary.summarize`)."""

from __future__ import annotations

import threading

from squad.events import Event
from squad.events.summary import TraceSummary, summarize

__all__ = ["SummaryCollector"]


class SummaryCollector:
    """Keeps every event it is given (from any thread) until :meth:`close`; :meth:`summary`
    is the :class:`~squad.events.summary.TraceSummary` of those so far."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.closed = False
        self._lock = threading.Lock()

    def __call__(self, event: Event) -> None:
        with self._lock:
            if not self.closed:
                self.events.append(event)

    def flush(self) -> None:
        """Nothing is buffered: every event is kept as it comes."""

    def close(self) -> None:
        """Keep no more events (those kept stay readable)."""
        self.closed = True

    def summary(self) -> TraceSummary:
        with self._lock:
            return summarize(list(self.events))

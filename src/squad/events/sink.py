"""Where events go: an :data:`EventSink` is any callable taking an event (``on_event=``); a
:class:`Sink` is one with a lifetime, ``flush()`` and ``close()`` (the JSONL trace, the
OpenTelemetry exporter, the live view, the summary collector). :func:`emit_to` delivers an event
to sinks, :func:`flush_all` and :func:`close_all` end a run's sinks; a failing sink never breaks
a run."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Protocol, runtime_checkable

from squad.events.event import Event

__all__ = ["EventSink", "Sink", "emit_to", "flush_all", "close_all"]

EventSink = Callable[[Event], None]
"""What ``on_event=`` takes: called with each event as it happens, from the run's threads."""


@runtime_checkable
class Sink(Protocol):
    """An event sink with a lifetime: called with each event (from any of the run's threads),
    :meth:`flush` pushes out what it buffers (a squad flushes its sinks when it closes),
    :meth:`close` ends it: what it holds is written out, open spans ended (safe to call twice).
    Whoever made a sink closes it (``run_sync`` closes the sinks of its one run)."""

    def __call__(self, event: Event) -> None: ...

    def flush(self) -> None: ...

    def close(self) -> None: ...


def emit_to(sinks: list[EventSink], event: Event) -> None:
    """Deliver ``event`` to every sink; a failing sink never breaks a run."""
    for sink in sinks:
        try:
            sink(event)
        except Exception:  # noqa: BLE001 - a display bug must not kill agents
            pass


def flush_all(sinks: Iterable[EventSink]) -> None:
    """``flush()`` every sink that has one (a plain callable has nothing to flush); errors ignored."""
    _each(sinks, "flush")


def close_all(sinks: Iterable[EventSink]) -> None:
    """``flush()`` then ``close()`` every sink that has them; errors ignored."""
    sinks = list(sinks)
    _each(sinks, "flush")
    _each(sinks, "close")


def _each(sinks: Iterable[EventSink], method: str) -> None:
    for sink in sinks:
        call = getattr(sink, method, None)
        if callable(call):
            try:
                call()
            except Exception:  # noqa: BLE001 - a sink that cannot flush or close must not break the run's end
                pass

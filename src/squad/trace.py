"""Run events: what happened to which agent, when. Sinks receive them as they happen.

Event kinds (``Event.kind``) used across squad:
``engine.loaded`` (data: the read-back plan), ``agent.started``, ``call.queued``
(data: tokens, position), ``call.admitted`` (data: reserved tokens, in_flight, pool_used),
``call.first_token``, ``call.finished`` (data: usage, timings), ``call.failed``
(data: error, retry), ``call.retried``, ``agent.finished``, ``agent.failed``,
``agent.cancelled`` (data: reason).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

__all__ = ["Event", "EventSink", "emit_to"]


@dataclass(frozen=True)
class Event:
    """One run event. ``t`` is ``time.monotonic()`` seconds; ``wall`` is ``time.time()``."""

    kind: str
    agent: str | None = None
    data: dict[str, Any] = field(default_factory=dict)
    t: float = field(default_factory=time.monotonic)
    wall: float = field(default_factory=time.time)


EventSink = Callable[[Event], None]


def emit_to(sinks: list[EventSink], event: Event) -> None:
    """Deliver ``event`` to every sink; a failing sink never breaks a run."""
    for sink in sinks:
        try:
            sink(event)
        except Exception:  # noqa: BLE001 - a display bug must not kill agents
            pass

"""Large maps in the live view: their progress instead of a row and a line per item.

A map of more than :data:`BIG_MAP` items is shown by its :class:`~squad.events.MapProgress` (done/total, rate,
ETA) in the status line and as a plain line at most once a second; its items get no row of their own and no line
unless they fail. :class:`BulkMaps` keeps only the items running now (conversation -> item, queued call): memory and
work per event are O(1), whatever the map's size.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from squad.events import (
    AgentCancelled,
    AgentFailed,
    AgentFinished,
    AgentStarted,
    CallAdmitted,
    CallFailed,
    CallQueued,
    Event,
    MapProgress,
    item_label,
)

__all__ = ["BIG_MAP", "BulkMaps"]

BIG_MAP = 20
"""A map of more items than this is shown by its progress, not a row per item."""


@dataclass
class BulkMaps:
    """The progress of each agent's latest map and the items of large maps running now."""

    progress: dict[str, MapProgress] = field(default_factory=dict)
    running: dict[str, tuple[int, str | None]] = field(default_factory=dict)
    """Conversation -> (item, its call waiting in the queue or None), for items of large maps."""
    waiting: int = 0
    """Calls of those items waiting in squad's queue."""

    def big(self, agent: str | None) -> bool:
        p = self.progress.get(agent or "")
        return p is not None and p.total > BIG_MAP

    def take(self, event: Event) -> bool:
        """Fold an item event of a large map in; True when the view shows nothing more of it (no row, no line):
        its start, calls and answer. A failure or cancellation is left to the view (False), after it is counted."""
        conversation = event.conversation or ""
        if isinstance(event, AgentStarted):
            if event.item is None or not self.big(event.agent):
                return False
            self.running[conversation] = (event.item, None)
            return True
        if conversation not in self.running:
            return False
        item, queued = self.running[conversation]
        if isinstance(event, CallQueued):
            self.waiting += queued is None
            self.running[conversation] = (item, event.call or "?")
        elif isinstance(event, (CallAdmitted, CallFailed)) and queued is not None:
            self.waiting -= 1
            self.running[conversation] = (item, None)
        if isinstance(event, (AgentFinished, AgentFailed, AgentCancelled)):
            self.waiting -= queued is not None
            del self.running[conversation]
        return not isinstance(event, (AgentFailed, AgentCancelled, CallFailed))

    def item_label(self, event: Event) -> str | None:
        """``agent[i]`` for an event of a running large-map item (read before :meth:`take`), else None."""
        found = self.running.get(event.conversation or "")
        return None if found is None else item_label(event.agent or "?", found[0])

    def text(self) -> str | None:
        """``echo: 1,234/10,000 items done, 56.1/s, about 2m 36s left`` for each map still running."""
        parts = [f"{agent}: {p.message}" for agent, p in self.progress.items() if p.done < p.total]
        return " · ".join(parts) or None

"""The event base: :class:`Event` (the ids that place it and when it happened), :class:`Origin`
(who makes a model call), the registry of kinds (:data:`EVENT_TYPES`) and
:func:`event_from_record`, which reads a trace line back. The kinds: :mod:`squad.events.kinds`."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any, ClassVar

__all__ = ["Event", "Origin", "item_label", "EVENT_TYPES", "event_from_record"]

EVENT_TYPES: dict[str, type[Event]] = {}
"""Every event class by its ``kind``."""

_PLACE = ("agent", "conversation", "parent", "call", "engine", "worker")


@dataclass(frozen=True)
class Origin:
    """Who makes a model call: the agent, its conversation id and that conversation's parent;
    ``item``: the index of the map item the conversation works on (``Squad.map``), else None."""

    agent: str
    conversation: str | None = None
    parent: str | None = None
    item: int | None = None

    @property
    def label(self) -> str:
        """How views name the conversation: ``agent``, or ``agent[item]`` for a map item."""
        return item_label(self.agent, self.item)


def item_label(agent: str, item: int | None) -> str:
    """``agent``, or ``agent[item]`` for a map item (the views' name for a conversation)."""
    return agent if item is None else f"{agent}[{item}]"


@dataclass(frozen=True, kw_only=True)
class Event:
    """Base of every event: the ids that place it and when it happened (module docstring)."""

    kind: ClassVar[str] = ""
    agent: str | None = None
    conversation: str | None = None
    parent: str | None = None
    call: str | None = None
    engine: str | None = None
    worker: str | None = None
    t: float = field(default_factory=time.monotonic)
    wall: float = field(default_factory=time.time)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.kind:
            EVENT_TYPES[cls.kind] = cls

    @property
    def data(self) -> dict[str, Any]:
        """The kind's own fields (not the ids or times), as a dict."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if f.name not in _PLACE and f.name not in ("t", "wall")}

    def ids(self) -> dict[str, str | None]:
        """``agent``, ``conversation``, ``parent``, ``call``, ``engine`` and ``worker``."""
        return {name: getattr(self, name) for name in _PLACE}



def event_from_record(record: dict[str, Any]) -> Event | None:
    """The event a trace line describes, or None for a kind this version does not know.

    Raises ``KeyError``/``TypeError``/``ValueError`` for a record that is not an event.
    """
    cls = EVENT_TYPES.get(str(record["kind"]))
    if cls is None:
        return None
    names = {f.name for f in dataclasses.fields(cls)}
    data = {k: v for k, v in dict(record.get("data") or {}).items() if k in names}
    place = {k: record.get(k) for k in _PLACE}
    return cls(**place, **data, t=float(record["t"]), wall=float(record.get("wall", 0.0)))


"""Workloads: which agent conversations run at the same time, with which budgets.

One workload type serves all three ways squad is used (recipe flows, a main agent with
the sub-agents it may @mention or delegate to, batches of parallel runs), and the
concurrency analysis the planner needs lives here, in one place.

A workload is a tree of frozen nodes:

- :class:`Call`: one agent conversation holding up to ``budget`` tokens of context.
- :class:`Sequence`: children one after another.
- :class:`Parallel`: children all at once.
- :class:`Map`: ``item`` run for ``count`` inputs, at most ``limit`` at a time
  (``count`` None = unknown length, then ``limit`` bounds it; both None = unbounded).
- :class:`Delegate`: a main agent that keeps its conversation (and its budget) while the
  sub-agent workload ``subs`` runs (@mentions, sub-agents as tools).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

__all__ = ["Call", "Sequence", "Parallel", "Map", "Delegate", "Node"]


@dataclass(frozen=True)
class Call:
    """One agent conversation; ``budget`` is the context it may hold, in tokens."""

    agent: str
    budget: int


@dataclass(frozen=True)
class Sequence:
    items: tuple["Node", ...]
    label: str | None = None


@dataclass(frozen=True)
class Parallel:
    items: tuple["Node", ...]
    label: str | None = None


@dataclass(frozen=True)
class Map:
    item: "Node"
    count: int | None = None
    limit: int | None = None
    label: str | None = None


@dataclass(frozen=True)
class Delegate:
    main: Call
    subs: "Node"
    label: str | None = None


Node = Union[Call, Sequence, Parallel, Map, Delegate]

"""Workloads: which agent conversations run at the same time, with which budgets.

A workload is a tree of frozen nodes: :class:`Call` (one conversation holding up to ``budget``
tokens; None = auto), :class:`Sequence`, :class:`Parallel`, :class:`Map` (``item`` for
``count`` inputs, at most ``limit`` at a time) and :class:`Delegate` (a main agent holding its
conversation while its sub-agents run). :func:`stages` turns it into a worst-case concurrency
timeline of :class:`Stage` s; the planner sizes slots from :func:`peak_concurrency` and the
context from :func:`peak_context` (tokens). One workload type serves recipes, @mentions and
parallel runs.

Design (the worst-case rules per node): docs/design/workload.md
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

__all__ = [
    "Call",
    "Sequence",
    "Parallel",
    "Map",
    "Delegate",
    "Node",
    "Stage",
    "stages",
    "peak_concurrency",
    "peak_context",
    "calls",
    "with_budgets",
]


@dataclass(frozen=True)
class Call:
    """One agent conversation; ``budget`` is the context it may hold, in tokens (None = auto,
    resolved by the planner; counted as 0 in sums until then). ``label`` (e.g. a recipe step's
    id) names its place in the timeline; calls that differ only by label are equal."""

    agent: str
    budget: int | None
    label: str | None = field(default=None, compare=False)


@dataclass(frozen=True)
class Sequence:
    items: tuple[Node, ...]
    label: str | None = field(default=None, compare=False)  # display only, like Call.label


@dataclass(frozen=True)
class Parallel:
    items: tuple[Node, ...]
    label: str | None = field(default=None, compare=False)  # display only, like Call.label


@dataclass(frozen=True)
class Map:
    item: Node
    count: int | None = None
    limit: int | None = None
    label: str | None = field(default=None, compare=False)  # display only, like Call.label


@dataclass(frozen=True)
class Delegate:
    main: Call
    subs: Node
    label: str | None = field(default=None, compare=False)  # display only, like Call.label


Node = Call | Sequence | Parallel | Map | Delegate


@dataclass(frozen=True)
class Stage:
    """Conversations that can be holding context at the same time.

    - ``calls``: the agents running together (a map's copies repeat the same :class:`Call`).
    - ``label``: where in the workload this is, e.g. ``"step 2 (review)"``.
    - ``unbounded``: conversations an unbounded fan-out may copy any number of times (one
      representative each); empty for a bounded stage.
    """

    calls: tuple[Call, ...]
    label: str = ""
    unbounded: tuple[Call, ...] = ()

    @property
    def size(self) -> int:
        """Agents running at once; ``math.inf`` (a float) when the stage is unbounded."""
        return math.inf if self.unbounded else len(self.calls)  # type: ignore[return-value]

    @property
    def budget(self) -> int:
        """Sum of the budgets in tokens of the bounded calls (unbounded copies excluded)."""
        return sum(c.budget or 0 for c in self.calls)

    @property
    def agents(self) -> tuple[str, ...]:
        """Agent names in order, repeats kept; an unbounded agent is shown as ``name×∞``."""
        return tuple(c.agent for c in self.calls) + tuple(f"{c.agent}×∞" for c in self.unbounded)

    def largest(self, n: int) -> tuple[Call, ...]:
        """The ``n`` calls with the largest budgets that can run at once in this stage
        (unbounded conversations copied as often as needed), largest first."""
        pool = list(self.calls)
        if self.unbounded:
            top = max(self.unbounded, key=lambda c: c.budget or 0)
            pool += [top] * n
        return tuple(heapq.nlargest(n, pool, key=lambda c: c.budget or 0))

    def describe(self) -> str:
        """``"step 2: lead, security, style"``: the label, then the agents."""
        names = ", ".join(self.agents) or "nothing"
        return f"{self.label}: {names}" if self.label else names


def stages(node: Node) -> tuple[Stage, ...]:
    """The concurrency timeline of a workload, in order (rules in the module docstring).

    An empty workload (an empty sequence or parallel block, or a map of zero items) has no
    stages. Labels name the position: ``step N`` for a sequence's children (with the
    child's own label in parentheses), ``×N`` for a map's copies, ``main waiting`` for a
    delegation; a stage with no position of its own is ``step N`` of the timeline.
    """
    result = _stages(node)  # the root's own label names the whole timeline: not repeated
    return tuple(s if s.label else _relabel(s, f"step {i}") for i, s in enumerate(result, 1))


def peak_concurrency(node: Node) -> Stage | None:
    """The stage with the most agents running at once (unbounded counts as most; ties go to
    the larger budget, then the earlier stage), or None for an empty workload."""
    return _pick(stages(node), lambda s: (s.size, s.budget))


def peak_context(node: Node) -> Stage | None:
    """The stage with the largest sum of budgets in tokens (an unbounded stage counts as
    largest; ties go to the earlier stage), or None for an empty workload."""
    return _pick(stages(node), lambda s: (bool(s.unbounded), s.budget))


def calls(node: Node) -> tuple[Call, ...]:
    """Every distinct :class:`Call` in the workload, in first-seen order."""
    seen: dict[Call, None] = {}
    for stage in stages(node):
        for c in stage.calls + stage.unbounded:
            seen.setdefault(c, None)
    return tuple(seen)


def with_budgets(node: Node, auto: int) -> Node:
    """``node`` with every auto budget (``Call.budget`` None) set to ``auto`` tokens."""
    if isinstance(node, Call):
        return Call(node.agent, auto, node.label) if node.budget is None else node
    if isinstance(node, Sequence):
        return Sequence(tuple(with_budgets(n, auto) for n in node.items), label=node.label)
    if isinstance(node, Parallel):
        return Parallel(tuple(with_budgets(n, auto) for n in node.items), label=node.label)
    if isinstance(node, Map):
        return Map(with_budgets(node.item, auto), node.count, node.limit, node.label)
    if isinstance(node, Delegate):
        return Delegate(with_budgets(node.main, auto), with_budgets(node.subs, auto), node.label)  # type: ignore[arg-type]
    raise TypeError(f"not a workload node: {node!r}")


def _pick(timeline: tuple[Stage, ...], key: Callable[[Stage], tuple[int, int]]) -> Stage | None:
    best: Stage | None = None
    for stage in timeline:
        if best is None or key(stage) > key(best):
            best = stage
    return best


def _stages(node: Node) -> tuple[Stage, ...]:
    if isinstance(node, Call):
        return (Stage((node,)),)
    if isinstance(node, Sequence):
        out: list[Stage] = []
        for i, child in enumerate(node.items, 1):
            name = f"step {i}" + (f" ({child.label})" if _own_label(child) else "")
            out += [_relabel(s, name) for s in _stages(child)]
        return tuple(out)
    if isinstance(node, Parallel):
        return _parallel([_stages(child) for child in node.items])
    if isinstance(node, Map):
        return _map(node)
    if isinstance(node, Delegate):
        main = node.main
        inner = _stages(node.subs)
        waiting = [
            Stage((main,) + s.calls, _join(f"{main.agent} waiting", s.label), s.unbounded)
            for s in inner
        ]
        if not waiting:
            return (Stage((main,), main.agent),)
        return (Stage((main,), f"{main.agent} alone"), *waiting, Stage((main,), f"{main.agent} alone"))
    raise TypeError(f"not a workload node: {node!r}")


def _parallel(children: list[tuple[Stage, ...]]) -> tuple[Stage, ...]:
    children = [c for c in children if c]
    if not children:
        return ()
    by_count = [_pick(c, lambda s: (s.size, s.budget)) for c in children]
    by_context = [_pick(c, lambda s: (bool(s.unbounded), s.budget)) for c in children]
    combos = [by_count] if by_count == by_context else [by_count, by_context]
    out = []
    for combo in combos:
        labels = [s.label for s in combo if s.label]  # type: ignore[union-attr]
        out.append(
            Stage(
                tuple(c for s in combo for c in s.calls),  # type: ignore[union-attr]
                " + ".join(labels) if len(labels) > 1 and len(combos) > 1 else "",
                _unique(c for s in combo for c in s.unbounded),  # type: ignore[union-attr]
            )
        )
    return tuple(out)


def _map(node: Map) -> tuple[Stage, ...]:
    bounds = [b for b in (node.count, node.limit) if b is not None]
    inner = _stages(node.item)
    if not bounds:
        return tuple(
            Stage((), _join("×∞", s.label), _unique(s.calls + s.unbounded)) for s in inner
        )
    copies = max(0, min(bounds))
    if copies == 0:
        return ()
    return tuple(Stage(s.calls * copies, _join(f"×{copies}", s.label), s.unbounded) for s in inner)


def _unique(items: Iterable[Call]) -> tuple[Call, ...]:
    return tuple(dict.fromkeys(items))


def _own_label(node: Node) -> bool:
    return bool(node.label)


def _join(outer: str, inner: str) -> str:
    return f"{outer} › {inner}" if inner else outer


def _relabel(stage: Stage, outer: str) -> Stage:
    return Stage(stage.calls, _join(outer, stage.label), stage.unbounded)

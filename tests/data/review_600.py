# Test input for the review recipe: squad's own src/squad/events.py and src/squad/workload.py
# (commit e463884) joined, a real ~600-line file with decorators, braces and non-ASCII text.
# Questions about this file: squad-dev@example.com
"""Run events: one frozen dataclass per kind, each carrying the ids that place it.

Every event has:

- ``agent``: the agent's name (None for engine events);
- ``conversation``: the id of the agent conversation it belongs to (``"security#3"``), minted
  by the runtime for each agent turn;
- ``parent``: the conversation that started this one (the main agent's, for a sub-agent
  dispatched by an @mention or called as a tool), None for a top-level conversation;
- ``call``: the id of one engine call (``"c17"``), minted by the client and handed to
  admission, so the queue, admission, first token, end and release of one call share it;
- ``engine``: the engine that served it (its base URL);
- ``t`` (``time.monotonic()`` seconds) and ``wall`` (Unix seconds).

So a call nests in its conversation, a conversation in its parent, and everything names its
engine: trace and view match calls exactly, never by slot or arrival order.

The kinds (``Event.kind``), all emitted by squad, and nothing else:

============================  ==================================================================
``engine.planned``            the planner's plan before launch (slots, n_ctx, reasons, warnings)
``engine.loaded``             what an engine applied, read back (slots, n_ctx, pool, reason:
                              launched, attached, reloaded or restarted)
``engine.replanning``         a reload for a bigger plan begins (from_slots, to_slots, n_ctx)
``engine.warning``            something the user should know about the engine (warning)
``mention.dispatched``        a main agent's @mentions run (agents)
``mention.queued``            more sub-agents mentioned than slots: some wait (agents, slots)
``agent.started``             a conversation begins (priority, item: its map item's index or
                              None; shown as ``agent[item]``)
``agent.finished``            it answered (summary)
``agent.failed``              it failed (error)
``agent.cancelled``           it was cancelled (reason)
``call.queued``               a call waits in squad's admission queue (tokens, position)
``call.admitted``             it got a slot and its reservation (tokens, slot, queued_s)
``call.first_token``          its first token arrived (ttft_s, slot)
``call.finished``             it ended with an answer (finish_reason, usage, timings)
``call.failed``               it ended with an error (error, message, attempts)
``call.retried``              it is being sent again (reason, attempt, error)
``call.released``             its slot and reservation were given back (tokens, held_s)
``tool.called``               a tool ran for an agent (tool, ok)
``answer.cut``                a sub-agent answer was cut to fit the main agent's budget
============================  ==================================================================

On disk (JSON Lines, :mod:`squad.trace`) an event is
``{"kind", "t", "wall", "agent", "conversation", "parent", "call", "engine", "data": {...}}``
with the kind's own fields in ``data``; :func:`event_from_record` reads it back.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar

__all__ = [
    "Event",
    "EventSink",
    "Origin",
    "item_label",
    "EVENT_TYPES",
    "emit_to",
    "event_from_record",
    "EnginePlanned",
    "EngineLoaded",
    "EngineReplanning",
    "EngineWarning",
    "MentionDispatched",
    "MentionQueued",
    "AgentStarted",
    "AgentFinished",
    "AgentFailed",
    "AgentCancelled",
    "CallQueued",
    "CallAdmitted",
    "CallFirstToken",
    "CallFinished",
    "CallFailed",
    "CallRetried",
    "CallReleased",
    "ToolCalled",
    "AnswerCut",
]

EVENT_TYPES: dict[str, type["Event"]] = {}
"""Every event class by its ``kind``."""

_PLACE = ("agent", "conversation", "parent", "call", "engine")


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
        """``agent``, ``conversation``, ``parent``, ``call`` and ``engine``."""
        return {name: getattr(self, name) for name in _PLACE}


EventSink = Callable[[Event], None]


def emit_to(sinks: list[EventSink], event: Event) -> None:
    """Deliver ``event`` to every sink; a failing sink never breaks a run."""
    for sink in sinks:
        try:
            sink(event)
        except Exception:  # noqa: BLE001 - a display bug must not kill agents
            pass


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


# --- engine -----------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class EnginePlanned(Event):
    kind: ClassVar[str] = "engine.planned"
    slots: int
    n_ctx: int
    reasons: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


@dataclass(frozen=True, kw_only=True)
class EngineLoaded(Event):
    """``n_ctx``: per-slot context (``/props``); ``pool``: KV cells the slots share (tokens)."""

    kind: ClassVar[str] = "engine.loaded"
    slots: int
    n_ctx: int
    pool: int
    base_url: str = ""
    reason: str = "launched"


@dataclass(frozen=True, kw_only=True)
class EngineReplanning(Event):
    kind: ClassVar[str] = "engine.replanning"
    from_slots: int
    to_slots: int
    n_ctx: int
    agents: int = 0


@dataclass(frozen=True, kw_only=True)
class EngineWarning(Event):
    kind: ClassVar[str] = "engine.warning"
    warning: str


# --- mentions and agents ----------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class MentionDispatched(Event):
    kind: ClassVar[str] = "mention.dispatched"
    agents: list[str]


@dataclass(frozen=True, kw_only=True)
class MentionQueued(Event):
    kind: ClassVar[str] = "mention.queued"
    agents: int
    slots: int
    message: str = ""


@dataclass(frozen=True, kw_only=True)
class AgentStarted(Event):
    kind: ClassVar[str] = "agent.started"
    priority: int = 0
    item: int | None = None


@dataclass(frozen=True, kw_only=True)
class AgentFinished(Event):
    kind: ClassVar[str] = "agent.finished"
    summary: str = ""


@dataclass(frozen=True, kw_only=True)
class AgentFailed(Event):
    kind: ClassVar[str] = "agent.failed"
    error: str


@dataclass(frozen=True, kw_only=True)
class AgentCancelled(Event):
    kind: ClassVar[str] = "agent.cancelled"
    reason: str


# --- calls ------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class _Admission(Event):
    """What admission says of every call: ``tokens`` reserved or asked for (prompt +
    max_tokens), and after the event the calls in flight and the tokens reserved in the pool."""

    tokens: int
    in_flight: int = 0
    pool_used: int = 0


@dataclass(frozen=True, kw_only=True)
class CallQueued(_Admission):
    """``position`` in squad's queue (0 = head)."""

    kind: ClassVar[str] = "call.queued"
    position: int = 0


@dataclass(frozen=True, kw_only=True)
class CallAdmitted(_Admission):
    """``slot``: squad's slot number (0-based); ``queued_s`` seconds waited."""

    kind: ClassVar[str] = "call.admitted"
    slot: int
    queued_s: float = 0.0


@dataclass(frozen=True, kw_only=True)
class CallFirstToken(Event):
    kind: ClassVar[str] = "call.first_token"
    ttft_s: float
    slot: int | None = None


@dataclass(frozen=True, kw_only=True)
class CallFinished(Event):
    """Times in seconds; tokens from the engine's ``usage``."""

    kind: ClassVar[str] = "call.finished"
    finish_reason: str
    attempts: int = 1
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    queued_s: float = 0.0
    ttft_s: float | None = None
    total_s: float = 0.0
    tokens_per_s: float | None = None
    slot: int | None = None


@dataclass(frozen=True, kw_only=True)
class CallFailed(Event):
    kind: ClassVar[str] = "call.failed"
    error: str
    message: str = ""
    attempts: int = 1


@dataclass(frozen=True, kw_only=True)
class CallRetried(Event):
    kind: ClassVar[str] = "call.retried"
    reason: str
    attempt: int
    error: str = ""


@dataclass(frozen=True, kw_only=True)
class CallReleased(_Admission):
    """``held_s``: seconds the slot and reservation were held."""

    kind: ClassVar[str] = "call.released"
    slot: int
    held_s: float = 0.0


# --- tools and hand-back ----------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class ToolCalled(Event):
    kind: ClassVar[str] = "tool.called"
    tool: str
    ok: bool


@dataclass(frozen=True, kw_only=True)
class AnswerCut(Event):
    """A sub-agent answer (``agent``) cut by ``omitted_tokens`` to fit ``main``'s budget."""

    kind: ClassVar[str] = "answer.cut"
    omitted_tokens: int
    room_tokens: int
    main: str
    rule: str = "equal share of the main agent's remaining budget"
"""Workloads: which agent conversations run at the same time, with which budgets.

One workload type serves all three ways squad is used (recipe flows, a main agent with
the sub-agents it may @mention or delegate to, batches of parallel runs), and the
concurrency analysis the planner needs lives here, in one place.

A workload is a tree of frozen nodes:

- :class:`Call`: one agent conversation holding up to ``budget`` tokens of context
  (None = auto: the planner gives it a share of the model's context, :func:`with_budgets`).
- :class:`Sequence`: children one after another.
- :class:`Parallel`: children all at once.
- :class:`Map`: ``item`` run for ``count`` inputs, at most ``limit`` at a time
  (``count`` None = unknown length, then ``limit`` bounds it; both None = unbounded).
- :class:`Delegate`: a main agent that keeps its conversation (and its budget) while the
  sub-agent workload ``subs`` runs (@mentions, sub-agents as tools).

The analysis turns a tree into a concurrency timeline (:func:`stages`): each :class:`Stage`
is a set of conversations that can be holding context at the same time. The planner sizes
slots from :func:`peak_concurrency` and the context from :func:`peak_context`.

Worst-case rules, applied recursively so nesting composes:

- ``Sequence``: its children's stages, in order.
- ``Parallel``: the children run at once and their timing is not known, so any stage of one
  child may coincide with any stage of another. Each child's busiest stage is combined
  (one stage when every child has one stage; else the combination of the children's
  count-peaks and the combination of their context-peaks).
- ``Map(item, count, limit)``: ``min(count, limit)`` copies of each stage of ``item``
  (None = no bound on that side). Both None: unbounded; the stage keeps one copy of each
  such conversation in :attr:`Stage.unbounded` and the planner caps it.
- ``Delegate(main, subs)``: ``main`` alone, then every stage of ``subs`` with ``main``
  added (a main agent waiting on its sub-agents still holds its conversation), then
  ``main`` alone again.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from typing import Union

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
    resolved by the planner; counted as 0 in sums until then)."""

    agent: str
    budget: int | None


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
        return Call(node.agent, auto) if node.budget is None else node
    if isinstance(node, Sequence):
        return Sequence(tuple(with_budgets(n, auto) for n in node.items), label=node.label)
    if isinstance(node, Parallel):
        return Parallel(tuple(with_budgets(n, auto) for n in node.items), label=node.label)
    if isinstance(node, Map):
        return Map(with_budgets(node.item, auto), node.count, node.limit, node.label)
    if isinstance(node, Delegate):
        return Delegate(with_budgets(node.main, auto), with_budgets(node.subs, auto), node.label)  # type: ignore[arg-type]
    raise TypeError(f"not a workload node: {node!r}")


def _pick(timeline: tuple[Stage, ...], key) -> Stage | None:
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


def _unique(items) -> tuple[Call, ...]:
    return tuple(dict.fromkeys(items))


def _own_label(node: Node) -> bool:
    return not isinstance(node, Call) and bool(node.label)


def _join(outer: str, inner: str) -> str:
    return f"{outer} › {inner}" if inner else outer


def _relabel(stage: Stage, outer: str) -> Stage:
    return Stage(stage.calls, _join(outer, stage.label), stage.unbounded)

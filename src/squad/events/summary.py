"""A run's events digested: per agent, per call, engine loads, peak concurrency.

:func:`summarize` turns events (live, or read back by :func:`squad.events.jsonl.load_trace`) into a
:class:`TraceSummary`: one :class:`CallSpan` per engine call, matched by its call id (queue,
admission, first token, end, release), one :class:`AgentSummary` per agent (per map item:
``security[3]``, from ``agent.started``'s ``item``) with its outcome (``done``, or a
non-answer of :mod:`squad.runtime.outcome`: ``truncated``, ``empty``, ``failed``, ``cancelled``), the
recipe steps' warnings, the engine loads and the peak number of calls holding a slot at once.
On Ray (:mod:`squad.cluster.ray`), a map item whose worker was lost while it held it (``item.lost``) is
counted once: the events of the lost attempt that reached the trace (its conversation and those
it started) are left out, and the item's row gets a note saying so.
``squad trace show/plot`` and ``squad run``'s table read it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from squad.events import (
    AgentCancelled,
    AgentFailed,
    AgentFinished,
    AgentResumed,
    AgentStarted,
    CallAdmitted,
    CallFailed,
    CallFinished,
    CallFirstToken,
    CallMoved,
    CallQueued,
    CallReleased,
    CallRetried,
    EngineLoaded,
    EngineLost,
    Event,
    ItemLost,
    MCPWarning,
    OutputRetried,
    StepWarning,
    ToolLimited,
    ToolTruncated,
    WorkerStarted,
    item_label,
)
from squad.events.jsonl import jsonable
from squad.events.names import engine_labels, engine_legend, short_url
from squad.runtime.outcome import worst

__all__ = ["summarize", "TraceSummary", "AgentSummary", "CallSpan", "EngineLoad", "EngineLoss", "RayWorker",
           "short_url", "engine_labels", "engine_legend"]


@dataclass
class CallSpan:
    """One engine call (one call id), seconds relative to the trace start.

    ``queued`` is when it entered squad's admission queue (None when admitted at once),
    ``admitted`` when it got a slot and its reservation, ``first_token`` and ``end`` when the
    stream produced its first token and ended (finished, failed or released). ``slot`` is
    squad's slot number; ``conversation``/``parent`` place it in its agent conversation.
    ``error`` is set for a failed call; ``retried`` when it was sent more than once;
    ``finish_reason`` is the engine's for a finished call (``length``: stopped at max_tokens).
    ``engine``: the engine that served it (its base URL); ``moved_to``: the engine it went to
    when its own was lost (``rerun``: it had streamed and ran again from its start there).
    """

    agent: str
    call: str
    conversation: str | None = None
    parent: str | None = None
    queued: float | None = None
    admitted: float | None = None
    first_token: float | None = None
    end: float | None = None
    slot: int | None = None
    reserved: int | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    error: str | None = None
    retried: bool = False
    finish_reason: str | None = None
    engine: str | None = None
    moved_to: str | None = None
    rerun: bool = False
    shared_tokens: int = 0
    """Prompt tokens a fan-out's prefix prefilled once gave it, as the engine counted them (``call.finished``)."""
    cached_tokens: int | None = None
    """Prompt tokens the engine reused from its cache (``call.finished``, its ``timings.cache_n``)."""

    @property
    def start(self) -> float:
        """When the call began (queued, else admitted, else first token)."""
        for t in (self.queued, self.admitted, self.first_token, self.end):
            if t is not None:
                return t
        return 0.0

    @property
    def wait_s(self) -> float:
        """Seconds spent in squad's admission queue."""
        if self.queued is None or self.admitted is None:
            return 0.0
        return max(0.0, self.admitted - self.queued)


@dataclass
class AgentSummary:
    """What one agent (or one map item, named ``agent[i]``) did: times in seconds from the
    trace start, tokens from usage."""

    name: str
    started: float | None = None
    ended: float | None = None
    status: str = "running"
    """``running`` (no end event: the run crashed or is still going), ``done``, or its worst
    non-answer (:func:`squad.runtime.outcome.worst`): ``truncated`` (stopped at max_tokens),
    ``empty``, ``cancelled``, ``failed``."""
    calls: int = 0
    queued_s: float = 0.0
    """Total seconds its calls waited in squad's admission queue."""
    first_token: float | None = None
    """When its first call's first token arrived."""
    ttft_s: float | None = None
    """Seconds from its first call's start to that first token."""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    slots: list[int] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    reason: str | None = None
    notes: list[str] = field(default_factory=list)
    """What the run said of it that is not a failure (``tool.limited``: a sub-agent call refused;
    ``tool.truncated``: a tool result cut to fit its budget)."""
    engines: list[str] = field(default_factory=list)
    """The engines its calls went to (base URLs), in order."""


@dataclass
class EngineLoad:
    """An ``engine.loaded`` event: when, and what the engine reported it applied."""

    t: float
    slots: int
    n_ctx: int
    pool: int
    reason: str
    engine: str | None


@dataclass
class EngineLoss:
    """An ``engine.lost`` event: one of several engines died and was taken out (seconds from the start)."""

    t: float
    engine: str | None
    reason: str
    remaining: int


@dataclass
class RayWorker:
    """A Ray worker of the run (``worker.started``, :mod:`squad.cluster.ray`): when it was ready, its
    engine and what it reported; ``items``: the map items it served (lost attempts not counted)
    and ``calls``: their engine calls."""

    worker: str
    t: float
    engine: str | None
    slots: int
    pool: int
    items: int = 0
    calls: int = 0


@dataclass
class TraceSummary:
    """A trace digested: per-agent rows, calls as spans, engine loads, peak concurrency."""

    agents: dict[str, AgentSummary]
    calls: list[CallSpan]
    engine_loads: list[EngineLoad]
    max_in_flight: int
    duration_s: float
    events: int
    warnings: list[str] = field(default_factory=list)
    """Recipe steps' warnings (``step.warning``: a non-answer, naming the step and the fix) and
    MCP servers' (``mcp.warning``: stdout noise, an exit mid-run)."""
    lost: list[EngineLoss] = field(default_factory=list)
    """Engines taken out mid-run (several engines, :mod:`squad.chat.routing`)."""

    @property
    def engines(self) -> list[str]:
        """The engines that served calls (base URLs), in order of first use."""
        return list(dict.fromkeys(s.engine for s in sorted(self.calls, key=lambda c: c.start) if s.engine))
    workers: list[RayWorker] = field(default_factory=list)
    """A Ray run's workers, in the order they were ready."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe form (``squad trace show --json``)."""
        return jsonable(self)


_RELEASED = "ended without finishing"
"""Provisional error of a call released by admission before any ``call.finished``."""


def summarize(events: Iterable[Event]) -> TraceSummary:
    """Digest events (live or from :func:`load_trace`) into a :class:`TraceSummary`.

    Calls are matched by their call id, so two calls of one agent on the same slot back to
    back are two spans. Times are made relative to the first event. A call released without
    a ``call.finished`` counts as failed, with its ``call.failed`` error when there is one, else
    the error of its conversation's ``agent.failed``/``agent.cancelled``.
    """
    events = sorted(events, key=lambda e: e.t)
    count = len(events)
    lost_attempts = _lost_conversations(events)
    events = [e for e in events if e.conversation is None or e.conversation not in lost_attempts]
    digest = _Digest(events)
    for ev in events:
        digest.apply(ev)
    duration = (events[-1].t - digest.t0) if events else 0.0
    calls = list(digest.spans.values())
    _assign_lanes(calls, duration)
    for s in calls:
        _add_call(digest.agent(s.agent), s)
    for a in digest.agents.values():
        mine = [s for s in calls if s.agent == a.name]
        ends = [s.end for s in mine if s.end is not None]
        if a.ended is None and a.status == "running" and ends and all(s.end is not None for s in mine):
            a.ended = max(ends)
            a.status = "failed" if a.errors else "done"
    return TraceSummary(agents=digest.agents, calls=calls, engine_loads=digest.loads,
                        max_in_flight=max(digest.peak_reported, _peak(calls, duration)), duration_s=duration,
                        events=count, warnings=digest.warnings, lost=digest.lost, workers=list(digest.workers.values()))


class _Digest:
    """What :func:`summarize` folds the events (sorted, lost attempts left out) into."""

    def __init__(self, events: list[Event]) -> None:
        self.t0 = events[0].t if events else 0.0
        self.agents: dict[str, AgentSummary] = {}
        self.loads: list[EngineLoad] = []
        self.lost: list[EngineLoss] = []
        self.warnings: list[str] = []
        self.spans: dict[str, CallSpan] = {}
        self.workers: dict[str, RayWorker] = {}
        self.peak_reported = 0
        self.labels = {e.conversation: item_label(e.agent, e.item) for e in events
                       if isinstance(e, AgentStarted) and e.item is not None and e.conversation and e.agent}

    def who(self, ev: Event) -> str | None:
        """The agent's name, or ``agent[i]`` for a map item's conversation."""
        return self.labels.get(ev.conversation or "", ev.agent)

    def agent(self, name: str | None) -> AgentSummary:
        key = name or "?"
        if key not in self.agents:
            self.agents[key] = AgentSummary(name=key)
        return self.agents[key]

    def span(self, ev: Event) -> CallSpan | None:
        if ev.call is None:
            return None
        if ev.call not in self.spans:
            self.spans[ev.call] = CallSpan(agent=self.who(ev) or "?", call=ev.call, conversation=ev.conversation,
                                           parent=ev.parent)
            self.agent(self.who(ev))
        return self.spans[ev.call]

    def apply(self, ev: Event) -> None:
        t = ev.t - self.t0
        worker = self.workers.get(ev.worker or "")
        if worker is not None and isinstance(ev, AgentStarted) and ev.item is not None:
            worker.items += 1
        if worker is not None and isinstance(ev, CallAdmitted):
            worker.calls += 1
        if isinstance(ev, EngineLoaded):
            self.loads.append(EngineLoad(t=t, slots=ev.slots, n_ctx=ev.n_ctx, pool=ev.pool, reason=ev.reason,
                                         engine=ev.engine))
        elif isinstance(ev, EngineLost):
            self.lost.append(EngineLoss(t=t, engine=ev.engine, reason=ev.reason, remaining=ev.remaining))
        elif isinstance(ev, (StepWarning, MCPWarning)):
            self.warnings.append(ev.warning)
        elif isinstance(ev, ItemLost):
            _item_lost(self.agent(item_label(ev.agent or "?", ev.item)), ev, t)
        elif isinstance(ev, AgentResumed):  # answered from the journal of the run it resumed: no call
            a = self.agent(item_label(ev.agent or "?", ev.item))
            a.started = t if a.started is None else a.started
            a.ended, a.status = t, "done" if ev.outcome == "ok" else ev.outcome
            a.notes.append(f"resumed: answered from run {ev.run}'s journal, not sent again")
        elif isinstance(ev, WorkerStarted):
            self.workers[ev.worker or "?"] = RayWorker(ev.worker or "?", t, ev.engine, ev.slots, ev.pool)
        else:
            self._agent_or_call(ev, t)

    def _agent_or_call(self, ev: Event, t: float) -> None:
        if isinstance(ev, AgentStarted):
            a = self.agent(self.who(ev))
            a.started = t if a.started is None else a.started
        elif isinstance(ev, (ToolLimited, ToolTruncated, OutputRetried)):
            self.agent(self.who(ev)).notes.append(ev.message)
        elif isinstance(ev, (AgentFinished, AgentFailed, AgentCancelled)):
            name = self.who(ev)
            _agent_end(self.agent(name), ev, t, [s for s in self.spans.values()
                                                 if s.agent == name and s.conversation == ev.conversation])
        elif (s := self.span(ev)) is not None:
            self.peak_reported = max(self.peak_reported, _call_event(s, ev, t))


def _add_call(a: AgentSummary, s: CallSpan) -> None:
    """Count call ``s`` into its agent's summary ``a``."""
    a.calls += 1
    a.queued_s += s.wait_s
    if s.first_token is not None and a.first_token is None:
        a.first_token = s.first_token
        a.ttft_s = s.first_token - s.start
    a.prompt_tokens += s.prompt_tokens or 0
    a.completion_tokens += s.completion_tokens or 0
    if s.slot is not None and s.slot not in a.slots:
        a.slots.append(s.slot)
    if s.engine and s.engine not in a.engines:
        a.engines.append(s.engine)
    if s.error and s.error != _RELEASED:  # call.failed is final (retries are inside one call)
        _add_error(a.errors, s.error)
    if a.started is None:
        a.started = s.start


def _lost_conversations(events: list[Event]) -> set[str]:
    """The conversations of map-item attempts whose Ray worker was lost (``item.lost``: same
    worker, agent and item), and those they started; ``events`` sorted by time."""
    gone = {(e.worker, e.agent, e.item) for e in events if isinstance(e, ItemLost)}
    lost: set[str] = set()
    for e in events if gone else ():
        if isinstance(e, AgentStarted) and e.conversation and (
                (e.worker, e.agent, e.item) in gone or (e.parent is not None and e.parent in lost)):
            lost.add(e.conversation)
    return lost


def _item_lost(a: AgentSummary, ev: ItemLost, t: float) -> None:
    """Item ``a`` lost its worker: a note when it runs again elsewhere, else it failed."""
    if ev.retry:
        a.notes.append(ev.message)
    else:
        a.ended, a.status, a.reason = t, "failed", ev.message
        _add_error(a.errors, ev.message)


def _call_event(s: CallSpan, ev: Event, t: float) -> int:
    """Fold one call event into its span; returns the in-flight count it reports (or 0)."""
    s.engine = s.engine or ev.engine
    if isinstance(ev, CallMoved):  # its engine was lost: the request goes on as another call
        s.moved_to, s.rerun, s.error = ev.to_engine, ev.rerun, None
        s.end = t if s.end is None else s.end
    elif isinstance(ev, CallQueued):
        s.queued = t
    elif isinstance(ev, CallAdmitted):
        s.admitted, s.reserved, s.slot = t, ev.tokens, ev.slot
        return ev.in_flight
    elif isinstance(ev, CallFirstToken):
        s.first_token = t if s.first_token is None else s.first_token
    elif isinstance(ev, CallFinished):
        s.end, s.error, s.finish_reason = t, None, ev.finish_reason
        s.prompt_tokens, s.completion_tokens = ev.prompt_tokens, ev.completion_tokens
        s.shared_tokens, s.cached_tokens = ev.shared_tokens, ev.cached_tokens
    elif isinstance(ev, CallFailed):
        s.end, s.error = t, f"{ev.error}: {ev.message}" if ev.message else ev.error
    elif isinstance(ev, CallReleased):
        if s.end is None:
            s.end, s.error = t, _RELEASED
    elif isinstance(ev, CallRetried):  # the attempt that ended is not the call's end
        s.retried, s.end, s.error = True, None, None
    return 0


def _agent_end(a: AgentSummary, ev: Event, t: float, spans: list[CallSpan]) -> None:
    a.ended = t
    outcome = ev.outcome if isinstance(ev, AgentFinished) else "failed" if isinstance(ev, AgentFailed) else "cancelled"
    if isinstance(ev, AgentFinished) and ev.cut_while_thinking:  # truncated, and why: said in the trace summary
        a.notes.append(f"{ev.agent}: truncated at max_tokens {ev.max_tokens}, cut while thinking (no answer)")
    # the worst conversation of an agent (e.g. one called by two steps) stays visible
    seen = [] if a.status == "running" else ["ok" if a.status == "done" else a.status]
    status = worst([*seen, outcome]).value
    a.status = "done" if status == "ok" else status
    reason = getattr(ev, "reason", None) or getattr(ev, "error", None)
    if not reason:
        return
    a.reason = str(reason)
    if isinstance(ev, AgentFailed):
        _add_error(a.errors, a.reason)
    for s in reversed(spans):  # the call that died with it gets the reason
        if s.error == _RELEASED:
            s.error = a.reason if isinstance(ev, AgentFailed) else f"cancelled: {a.reason}"
            break


def _add_error(errors: list[str], error: str) -> None:
    """Append ``error`` unless the same message is already there (with or without a type)."""
    for i, known in enumerate(errors):
        if error in known:
            return
        if known in error:
            errors[i] = error
            return
    errors.append(error)


def _occupancy(span: CallSpan, end_of_trace: float) -> tuple[float, float] | None:
    begin = span.admitted if span.admitted is not None else span.first_token
    if begin is None:
        return None
    return begin, span.end if span.end is not None else max(end_of_trace, begin) + 1e-9


def _peak(spans: list[CallSpan], end_of_trace: float) -> int:
    """Most calls holding a slot at once (admitted and not yet ended)."""
    marks: list[tuple[float, int]] = []
    for span in spans:
        occ = _occupancy(span, end_of_trace)
        if occ:
            marks += [(occ[0], 1), (occ[1], -1)]
    peak = current = 0
    for _, step in sorted(marks, key=lambda m: (m[0], m[1])):  # ends before starts at a tie
        current += step
        peak = max(peak, current)
    return peak


def _assign_lanes(spans: list[CallSpan], end_of_trace: float) -> None:
    """Give spans without an engine slot id the lowest lane free when they were admitted."""
    busy: dict[int, float] = {}  # lane -> until
    for span in sorted(spans, key=lambda s: _occupancy(s, end_of_trace) or (math.inf, 0)):
        occ = _occupancy(span, end_of_trace)
        if occ is None:
            continue
        if span.slot is not None:
            busy[span.slot] = max(busy.get(span.slot, 0.0), occ[1])
            continue
        lane = 0
        while busy.get(lane, -math.inf) > occ[0]:
            lane += 1
        span.slot = lane
        busy[lane] = occ[1]

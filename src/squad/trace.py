"""Run traces: events written as JSON Lines, read back, and summarized per agent and call.

- :class:`JsonlTrace` is an :data:`~squad.events.EventSink` that appends each event as one
  JSON line (the record format is in :mod:`squad.events`); :func:`load_trace` reads it back
  as typed events.
- :func:`summarize` digests events (live or loaded) into a :class:`TraceSummary`: one
  :class:`CallSpan` per engine call, matched by its call id (queue, admission, first token,
  end, release), one :class:`AgentSummary` per agent, the engine loads and the peak number
  of calls holding a slot at once.

``t`` in a trace file is seconds since the trace's first event; ``wall`` is Unix time.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import math
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import IO, Any, Iterable

from squad.errors import UserError
from squad.events import (
    AgentCancelled,
    AgentFailed,
    AgentFinished,
    AgentStarted,
    CallAdmitted,
    CallFailed,
    CallFinished,
    CallFirstToken,
    CallQueued,
    CallReleased,
    CallRetried,
    EngineLoaded,
    Event,
    event_from_record,
)

__all__ = [
    "JsonlTrace",
    "default_trace_path",
    "default_trace_dir",
    "load_trace",
    "summarize",
    "jsonable",
    "TraceSummary",
    "AgentSummary",
    "CallSpan",
    "EngineLoad",
]


# --------------------------------------------------------------------------- writing


def jsonable(value: Any) -> Any:
    """``value`` made JSON-safe: dataclasses and pydantic models become dicts, exceptions
    become ``"TypeName: message"``, paths and enums become strings, anything else unknown
    becomes its ``str()``. Non-finite floats become None."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, BaseException):
        return f"{type(value).__name__}: {value}"
    if isinstance(value, enum.Enum):
        return jsonable(value.value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [jsonable(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    dump = getattr(value, "model_dump", None)  # pydantic models
    if callable(dump):
        try:
            return jsonable(dump())
        except Exception:  # noqa: BLE001
            pass
    return str(value)


def default_trace_path() -> Path:
    """A fresh trace path: ``state_dir()/traces/run-YYYYmmdd-HHMMSS-ffffff.jsonl``
    (the directory is created; the file is not)."""
    from squad.dirs import state_dir

    folder = state_dir() / "traces"
    folder.mkdir(parents=True, exist_ok=True)
    return folder / f"run-{datetime.now():%Y%m%d-%H%M%S-%f}.jsonl"


class JsonlTrace:
    """An :data:`EventSink` that appends each event as one JSON line to ``path``.

    Use as a context manager (``with JsonlTrace(p) as sink: squad(on_event=sink)``) or call
    :meth:`close` yourself. The file is opened on entry (or on the first event), parent
    directories are created, and every line is flushed as it is written, so a crash leaves
    a readable trace. ``t`` in the file is seconds since the first event written.
    Events arriving after :meth:`close` are dropped.
    """

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self._file: IO[str] | None = None
        self._t0: float | None = None
        self._closed = False
        self.count = 0
        """Events written so far."""

    def __enter__(self) -> "JsonlTrace":
        self._open()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _open(self) -> IO[str]:
        if self._file is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = self.path.open("a", encoding="utf-8")
        return self._file

    def __call__(self, event: Event) -> None:
        if self._closed:
            return
        if self._t0 is None:
            self._t0 = event.t
        record = {"kind": event.kind, "t": round(event.t - self._t0, 6), "wall": event.wall,
                  **event.ids(), "data": jsonable(event.data)}
        out = self._open()
        out.write(json.dumps(record, ensure_ascii=False) + "\n")
        out.flush()
        self.count += 1

    def close(self) -> None:
        """Close the file; later events are dropped."""
        self._closed = True
        if self._file is not None:
            self._file.close()
            self._file = None


# --------------------------------------------------------------------------- reading


def load_trace(path: Path | str) -> list[Event]:
    """Read a JSONL trace written by :class:`JsonlTrace` as typed events; ``t`` stays relative
    to its start. Lines of kinds this version does not know are skipped. A torn last line (the run crashed mid-write) is skipped. Raises :class:`UserError` when
    the file is missing or a line is not a trace event.
    """
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise UserError(f"{path}: no such trace file; traces are written to {default_trace_dir()}") from None
    except (IsADirectoryError, UnicodeDecodeError) as exc:
        raise UserError(f"{path}: not a squad trace (JSON Lines) file: {exc}") from None
    events: list[Event] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            event = event_from_record(json.loads(line))
            if event is not None:  # a kind from another version: skipped
                events.append(event)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            if number == len(lines) and events:  # torn last line after a crash
                break
            raise UserError(
                f"{path}:{number}: not a squad trace event ({exc}); expected one JSON object per line "
                'with "kind" and "t"'
            ) from None
    return events


def default_trace_dir() -> Path:
    """Where :func:`default_trace_path` puts traces."""
    from squad.dirs import state_dir

    return state_dir() / "traces"


# --------------------------------------------------------------------------- summarizing


@dataclass
class CallSpan:
    """One engine call (one call id), seconds relative to the trace start.

    ``queued`` is when it entered squad's admission queue (None when admitted at once),
    ``admitted`` when it got a slot and its reservation, ``first_token`` and ``end`` when the
    stream produced its first token and ended (finished, failed or released). ``slot`` is
    squad's slot number; ``conversation``/``parent`` place it in its agent conversation.
    ``error`` is set for a failed call; ``retried`` when it was sent more than once.
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
    """What one agent did: times in seconds from the trace start, tokens from usage."""

    name: str
    started: float | None = None
    ended: float | None = None
    status: str = "running"
    """``running`` (no end event: the run crashed or is still going), ``done``, ``failed``
    or ``cancelled``."""
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
class TraceSummary:
    """A trace digested: per-agent rows, calls as spans, engine loads, peak concurrency."""

    agents: dict[str, AgentSummary]
    calls: list[CallSpan]
    engine_loads: list[EngineLoad]
    max_in_flight: int
    duration_s: float
    events: int

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
    t0 = events[0].t if events else 0.0
    agents: dict[str, AgentSummary] = {}
    loads: list[EngineLoad] = []
    spans: dict[str, CallSpan] = {}
    peak_reported = 0

    def agent(name: str | None) -> AgentSummary:
        key = name or "?"
        if key not in agents:
            agents[key] = AgentSummary(name=key)
        return agents[key]

    def span(ev: Event) -> CallSpan | None:
        if ev.call is None:
            return None
        if ev.call not in spans:
            spans[ev.call] = CallSpan(agent=ev.agent or "?", call=ev.call, conversation=ev.conversation,
                                      parent=ev.parent)
            agent(ev.agent)
        return spans[ev.call]

    for ev in events:
        t = ev.t - t0
        if isinstance(ev, EngineLoaded):
            loads.append(EngineLoad(t=t, slots=ev.slots, n_ctx=ev.n_ctx, pool=ev.pool, reason=ev.reason,
                                    engine=ev.engine))
        elif isinstance(ev, AgentStarted):
            a = agent(ev.agent)
            a.started = t if a.started is None else a.started
        elif isinstance(ev, (AgentFinished, AgentFailed, AgentCancelled)):
            _agent_end(agent(ev.agent), ev, t, [s for s in spans.values()
                                                if s.agent == ev.agent and s.conversation == ev.conversation])
        elif (s := span(ev)) is not None:
            peak_reported = max(peak_reported, _call_event(s, ev, t))

    duration = (events[-1].t - t0) if events else 0.0
    calls = list(spans.values())
    _assign_lanes(calls, duration)
    for s in calls:
        a = agent(s.agent)
        a.calls += 1
        a.queued_s += s.wait_s
        if s.first_token is not None and a.first_token is None:
            a.first_token = s.first_token
            a.ttft_s = s.first_token - s.start
        a.prompt_tokens += s.prompt_tokens or 0
        a.completion_tokens += s.completion_tokens or 0
        if s.slot is not None and s.slot not in a.slots:
            a.slots.append(s.slot)
        if s.error and s.error != _RELEASED:  # call.failed is final (retries are inside one call)
            _add_error(a.errors, s.error)
        if a.started is None:
            a.started = s.start
    for a in agents.values():
        mine = [s for s in calls if s.agent == a.name]
        ends = [s.end for s in mine if s.end is not None]
        if a.ended is None and a.status == "running" and ends and all(s.end is not None for s in mine):
            a.ended = max(ends)
            a.status = "failed" if a.errors else "done"
    return TraceSummary(agents=agents, calls=calls, engine_loads=loads,
                        max_in_flight=max(peak_reported, _peak(calls, duration)), duration_s=duration,
                        events=len(events))


def _call_event(s: CallSpan, ev: Event, t: float) -> int:
    """Fold one call event into its span; returns the in-flight count it reports (or 0)."""
    if isinstance(ev, CallQueued):
        s.queued = t
    elif isinstance(ev, CallAdmitted):
        s.admitted, s.reserved, s.slot = t, ev.tokens, ev.slot
        return ev.in_flight
    elif isinstance(ev, CallFirstToken):
        s.first_token = t if s.first_token is None else s.first_token
    elif isinstance(ev, CallFinished):
        s.end, s.error = t, None
        s.prompt_tokens, s.completion_tokens = ev.prompt_tokens, ev.completion_tokens
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
    status = {AgentFinished: "done", AgentFailed: "failed"}.get(type(ev), "cancelled")
    if a.status != "failed":  # one failed conversation of an agent (e.g. a map item) stays visible
        a.status = status
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

"""Run events: what happened to which agent, when. Sinks receive them as they happen.

Event kinds (``Event.kind``) used across squad:
``engine.loaded`` (data: the read-back plan), ``agent.started``, ``call.queued``
(data: tokens, position), ``call.admitted`` (data: reserved tokens, in_flight, pool_used),
``call.first_token``, ``call.finished`` (data: usage, timings), ``call.failed``
(data: error, retry), ``call.retried``, ``call.released``, ``agent.finished``,
``agent.failed``, ``agent.cancelled`` (data: reason). The runtime also emits
``engine.planned``, ``squad.ready`` and ``engine.replanned`` (data: slots, pool).

Optional data keys that this module understands when present: ``call`` (an id that ties
the events of one call together; without it calls are matched first-in-first-out per
agent), ``slot`` (the engine slot id), ``pool``/``n_ctx``/``slots`` on ``engine.loaded``.

A trace on disk is JSON Lines, one object per event::

    {"kind": "call.admitted", "agent": "style", "t": 0.512, "wall": 1764470000.1, "data": {...}}

``t`` is seconds since the first event of the trace; ``wall`` is Unix time in seconds.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import math
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import IO, Any, Callable, Iterable

from squad.errors import UserError

__all__ = [
    "Event",
    "EventSink",
    "emit_to",
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


@dataclass(frozen=True)
class Event:
    """One run event. ``t`` is ``time.monotonic()`` seconds; ``wall`` is ``time.time()``.

    Events read back by :func:`load_trace` carry ``t`` relative to the trace's first event.
    """

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
        record = {
            "kind": event.kind,
            "agent": event.agent,
            "t": round(event.t - self._t0, 6),
            "wall": event.wall,
            "data": jsonable(event.data),
        }
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
    """Read a JSONL trace written by :class:`JsonlTrace`; ``t`` stays relative to its start.

    A torn last line (the run crashed mid-write) is skipped. Raises :class:`UserError` when
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
            record = json.loads(line)
            events.append(
                Event(
                    kind=str(record["kind"]),
                    agent=record.get("agent"),
                    data=dict(record.get("data") or {}),
                    t=float(record["t"]),
                    wall=float(record.get("wall", 0.0)),
                )
            )
        except (ValueError, KeyError, TypeError) as exc:
            if number == len(lines):  # torn last line after a crash
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
    """One engine call, seconds relative to the trace start.

    ``queued`` is when the call asked for admission (None when it was admitted without a
    ``call.queued`` event), ``admitted`` when it got a slot and its reservation, ``first_token``
    and ``end`` when the stream produced its first token and ended. ``slot`` is the engine
    slot id when the events carry one, else the lowest lane free at admission (squad's view
    of which slot it held). ``error`` is set for failed calls.
    """

    agent: str
    call: str | None = None
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
    slots: int | None
    n_ctx: int | None
    pool: int | None
    data: dict[str, Any]


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


def _find(data: Any, key: str) -> Any:
    """The first value stored under ``key`` in nested dicts (breadth first)."""
    queue = [data]
    while queue:
        item = queue.pop(0)
        if isinstance(item, dict):
            if key in item and item[key] is not None:
                return item[key]
            queue.extend(v for v in item.values() if isinstance(v, dict))
    return None


def _int(value: Any) -> int | None:
    try:
        return int(value) if value is not None else None
    except (TypeError, ValueError):
        return None


class _CallMatcher:
    """Ties call.* events to spans.

    By ``data["call"]`` when present; else by (agent, ``data["slot"]``): admission gives each
    call in flight its own slot number, and the client and admission repeat it on
    ``call.first_token``, ``call.finished`` and ``call.released``. Without either, first in
    first out per agent.
    """

    def __init__(self) -> None:
        self.spans: list[CallSpan] = []

    @staticmethod
    def _id(event: Event) -> str | None:
        call_id = event.data.get("call")
        return None if call_id is None else str(call_id)

    def begin(self, event: Event) -> CallSpan:
        span = CallSpan(agent=event.agent or "?", call=self._id(event))
        self.spans.append(span)
        return span

    def released_before(self, event: Event) -> CallSpan | None:
        """The span admission already released for this ``call.finished`` (the client reports
        a call finished after its reservation is given back), if any. A call already streaming
        on that slot is this event's call instead; one just admitted to the freed slot is not."""
        if any(s.first_token is not None for s in self._open_for(event)):
            return None
        slot = _int(event.data.get("slot"))
        for span in reversed(self.spans):
            if (span.agent == (event.agent or "?") and span.error == _RELEASED
                    and (slot is None or span.slot == slot)):
                return span
        return None

    def _open_for(self, event: Event) -> list[CallSpan]:
        slot = _int(event.data.get("slot"))
        return [s for s in self.spans if s.agent == (event.agent or "?") and s.end is None
                and (slot is None or s.slot == slot)]

    def find(self, event: Event, *, need: str) -> CallSpan:
        """The open span this event belongs to (one whose ``need`` time is unset); a new
        span when none matches (the trace began mid-call)."""
        agent, call_id, slot = event.agent or "?", self._id(event), _int(event.data.get("slot"))
        open_ = [s for s in self.spans if s.agent == agent and s.end is None and getattr(s, need) is None]
        if call_id is not None:
            matches = [s for s in open_ if s.call == call_id]
        elif slot is not None and need != "admitted":
            matches = [s for s in open_ if s.slot == slot] or [
                s for s in open_ if s.slot is None and s.admitted is not None
            ]
        else:
            matches = open_
        return matches[0] if matches else self.begin(event)


_RELEASED = "ended without finishing"
"""Provisional error of a call released by admission before any ``call.finished``."""

_LOADS = ("engine.loaded", "engine.replanned")
"""Kinds that report what a (re)loaded engine applied; ``squad.ready`` counts when the run
had no such event before it (an engine squad attached to rather than launched)."""


def summarize(events: Iterable[Event]) -> TraceSummary:
    """Digest events (live or from :func:`load_trace`) into a :class:`TraceSummary`.

    Times are made relative to the first event. Unknown kinds are ignored. A call that is
    released without ``call.finished`` counts as failed, with the error of its agent's
    ``agent.failed``/``agent.cancelled`` event when one follows.
    """
    events = sorted(events, key=lambda e: e.t)
    t0 = events[0].t if events else 0.0
    agents: dict[str, AgentSummary] = {}
    loads: list[EngineLoad] = []
    calls = _CallMatcher()
    peak_reported = 0

    def agent(name: str | None) -> AgentSummary:
        key = name or "?"
        if key not in agents:
            agents[key] = AgentSummary(name=key)
        return agents[key]

    for ev in events:
        t = ev.t - t0
        kind, data = ev.kind, ev.data
        if kind in _LOADS or (kind == "squad.ready" and not loads):
            loads.append(EngineLoad(t=t, slots=_int(_find(data, "slots")), n_ctx=_int(_find(data, "n_ctx")),
                                    pool=_int(_find(data, "pool")), data=data))
        elif kind == "agent.started":
            a = agent(ev.agent)
            a.started = t if a.started is None else a.started
        elif kind in ("agent.finished", "agent.failed", "agent.cancelled"):
            _agent_end(agent(ev.agent), kind, data, t, calls.spans)
        elif kind == "call.queued":
            calls.begin(ev).queued = t
            agent(ev.agent)
        elif kind == "call.admitted":
            span = calls.find(ev, need="admitted")
            span.admitted = t
            span.reserved = _int(data.get("reserved") or data.get("tokens"))
            span.slot = _int(data.get("slot"))
            peak_reported = max(peak_reported, _int(data.get("in_flight")) or 0)
        elif kind == "call.first_token":
            span = calls.find(ev, need="first_token")
            span.first_token = t
        elif kind in ("call.finished", "call.failed", "call.released"):
            span = calls.released_before(ev) if kind == "call.finished" else None
            span = span or calls.find(ev, need="end")
            if kind == "call.released" and span.admitted is None and span.queued is None:
                calls.spans.remove(span)  # released a call that already ended
                continue
            span.end = t
            usage = data.get("usage") or {}
            if isinstance(usage, dict):
                span.prompt_tokens = _int(usage.get("prompt_tokens"))
                span.completion_tokens = _int(usage.get("completion_tokens"))
            if kind == "call.finished":
                span.error = None
            else:
                span.error = _error_text(data.get("error")) if data.get("error") else _RELEASED
                span.retried = bool(data.get("retry"))
        elif kind == "call.retried":
            for span in reversed(calls.spans):
                if span.agent == (ev.agent or "?") and span.end is None:
                    span.retried = True
                    break

    duration = (events[-1].t - t0) if events else 0.0
    _assign_lanes(calls.spans, duration)
    for span in calls.spans:
        a = agent(span.agent)
        a.calls += 1
        a.queued_s += span.wait_s
        if span.first_token is not None and a.first_token is None:
            a.first_token = span.first_token
            a.ttft_s = span.first_token - span.start
        a.prompt_tokens += span.prompt_tokens or 0
        a.completion_tokens += span.completion_tokens or 0
        if span.slot is not None and span.slot not in a.slots:
            a.slots.append(span.slot)
        if span.error and span.error != _RELEASED and not span.retried:
            _add_error(a.errors, span.error)
        if a.started is None:
            a.started = span.start
    for a in agents.values():
        open_calls = [s for s in calls.spans if s.agent == a.name and s.end is None]
        ends = [s.end for s in calls.spans if s.agent == a.name and s.end is not None]
        if a.ended is None and a.status == "running" and ends and not open_calls:
            a.ended = max(ends)
            a.status = "failed" if a.errors else "done"
    return TraceSummary(
        agents=agents,
        calls=calls.spans,
        engine_loads=loads,
        max_in_flight=max(peak_reported, _peak(calls.spans, duration)),
        duration_s=duration,
        events=len(events),
    )


def _agent_end(a: AgentSummary, kind: str, data: dict[str, Any], t: float, spans: list[CallSpan]) -> None:
    a.ended = t
    a.status = {"agent.finished": "done", "agent.failed": "failed"}.get(kind, "cancelled")
    reason = data.get("reason") or data.get("error")
    if not reason:
        return
    a.reason = _error_text(reason)
    if kind == "agent.failed":
        _add_error(a.errors, a.reason)
    for span in reversed(spans):  # the call that died with it gets the reason
        if span.agent == a.name and span.error == _RELEASED:
            span.error = a.reason if kind == "agent.failed" else f"cancelled: {a.reason}"
            break


def _error_text(error: Any) -> str:
    """An error as trace text: ``"TypeName: message"`` for exceptions, else ``str()``."""
    if error is None:
        return "failed"
    return jsonable(error) if isinstance(error, BaseException) else str(error)


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

"""The live terminal view of a run: one row per agent, slots busy, pool reserved vs n_ctx.

Driven only by :class:`~squad.trace.Event` objects. :class:`ViewState` is a pure state
machine (``apply(event)``), so it is tested without a terminal; :class:`LiveView` draws it
with rich's ``Live`` when stdout is a terminal, prints one plain line per event otherwise,
and prints nothing when turned off (``--quiet``)::

    with live_view(on=not quiet) as sink:
        async with Squad(..., on_event=sink) as squad: ...

Agent states: ``started`` (running, no engine call yet), ``waiting`` (in squad's admission
queue: no slot or no room in the pool), ``prefill`` (admitted, no token yet), ``generating``
(tokens arriving), ``idle`` (between calls), ``retrying`` (a call failed and will be resent), ``done``, ``failed``, ``cancelled``.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from squad.trace import Event, _find, _int

__all__ = ["AgentRow", "ViewState", "LiveView", "live_view"]

_LOAD_KINDS = ("engine.loaded", "engine.replanned", "squad.ready")
"""Events that say what the engine applied (slots, pool)."""

_STYLE = {
    "started": "cyan",
    "waiting": "yellow",
    "prefill": "magenta",
    "generating": "green",
    "idle": "cyan",
    "retrying": "yellow",
    "done": "bold green",
    "failed": "bold red",
    "cancelled": "red",
}


@dataclass
class AgentRow:
    """One agent as the view shows it. Times are seconds (``time.monotonic`` clock of the
    events); token counts are tokens."""

    name: str
    state: str = "started"
    since: float = 0.0
    """When the agent entered ``state``."""
    started: float = 0.0
    calls: int = 0
    waiting: int = 0
    """Its calls in squad's admission queue."""
    held: dict[Any, int] = field(default_factory=dict)
    """Its calls in flight: slot (or a placeholder key) -> tokens reserved in the pool."""
    queue_position: int | None = None
    completion_tokens: int = 0
    tokens_per_s: float | None = None
    ttft_s: float | None = None
    detail: str = ""
    """Failure or cancellation reason."""

    @property
    def in_flight(self) -> int:
        return len(self.held)

    @property
    def reserved(self) -> int:
        """Tokens reserved in the pool by its calls in flight."""
        return sum(self.held.values())


@dataclass
class ViewState:
    """Everything the live view shows, built from events only (no clocks, no I/O).

    ``slots``/``pool`` come from ``engine.loaded`` (the read-back plan); ``pool_used`` is the
    sum of reservations of calls in flight (or ``pool_used`` as reported by admission);
    ``busy`` is calls holding a slot.
    """

    agents: dict[str, AgentRow] = field(default_factory=dict)
    slots: int | None = None
    pool: int | None = None
    pool_used: int = 0
    busy: int = 0
    waiting: int = 0
    loads: int = 0
    planned: tuple[int | None, int | None] | None = None
    """(slots, n_ctx) of the plan the engine is being started with, until it reports."""
    t0: float | None = None
    last: float = 0.0

    def row(self, name: str | None, t: float) -> AgentRow:
        key = name or "?"
        if key not in self.agents:
            self.agents[key] = AgentRow(name=key, since=t, started=t)
        return self.agents[key]

    def apply(self, event: Event) -> None:
        """Fold one event into the state. Unknown kinds are ignored."""
        t, data, kind = event.t, event.data, event.kind
        if self.t0 is None:
            self.t0 = t
        self.last = max(self.last, t)
        if kind == "engine.planned":
            self.planned = (_int(data.get("slots")), _int(data.get("n_ctx")))
            return
        if kind in _LOAD_KINDS:
            self.loads += kind != "squad.ready"
            self.slots = _int(_find(data, "slots")) or self.slots
            self.pool = _int(_find(data, "pool")) or _int(_find(data, "n_ctx")) or self.pool
            return
        if kind.startswith("agent."):
            self._agent_event(kind, self.row(event.agent, t), data, t)
        elif kind.startswith("call."):
            self._call_event(kind, self.row(event.agent, t), data, t)

    def _set(self, row: AgentRow, state: str, t: float) -> None:
        if row.state != state:
            row.state, row.since = state, t

    def _agent_event(self, kind: str, row: AgentRow, data: dict[str, Any], t: float) -> None:
        if kind == "agent.started":
            row.started = t
            self._set(row, "started", t)
        elif kind == "agent.finished":
            self._set(row, "done", t)
        elif kind in ("agent.failed", "agent.cancelled"):
            self._set(row, "failed" if kind == "agent.failed" else "cancelled", t)
            row.detail = str(data.get("reason") or data.get("error") or row.detail)

    def _call_event(self, kind: str, row: AgentRow, data: dict[str, Any], t: float) -> None:
        if kind == "call.queued":
            row.queue_position = _int(data.get("position"))
            row.waiting += 1
            self.waiting += 1
            self._set(row, "waiting", t)
        elif kind == "call.admitted":
            if row.waiting:
                row.waiting -= 1
                self.waiting = max(0, self.waiting - 1)
            reserved = _int(data.get("reserved")) or _int(data.get("tokens")) or 0
            slot = _int(data.get("slot"))
            row.held[slot if slot is not None else f"#{row.calls}"] = reserved
            row.calls += 1
            row.queue_position = None
            self.busy += 1
            self.pool_used += reserved
            self._reported(data)
            self._set(row, "prefill", t)
        elif kind == "call.first_token":
            row.ttft_s = _int_or_float(_find(data, "ttft_s")) or (t - row.since)
            self._set(row, "generating", t)
        elif kind == "call.progress":
            row.completion_tokens = _int(data.get("completion_tokens")) or row.completion_tokens
        elif kind in ("call.finished", "call.failed", "call.released"):
            self._free(row, data)
            if kind == "call.finished":
                self._finished(row, data, t)
            elif kind == "call.failed":
                row.detail = str(data.get("error") or "failed")
                self._set(row, "retrying" if data.get("retry") else "failed", t)
        elif kind == "call.retried":
            row.detail = str(data.get("reason") or data.get("error") or "")
            self._set(row, "retrying", t)

    def _free(self, row: AgentRow, data: dict[str, Any]) -> None:
        """Give back the slot and reservation of the call this event ends (once)."""
        slot = _int(data.get("slot"))
        key = slot if slot in row.held else next(iter(row.held), None) if slot is None else None
        if key is not None:
            self.busy = max(0, self.busy - 1)
            self.pool_used = max(0, self.pool_used - row.held.pop(key))
        elif row.waiting and slot is None and not data.get("retry"):  # ended while still queued
            row.waiting -= 1
            self.waiting = max(0, self.waiting - 1)
        self._reported(data)

    def _reported(self, data: dict[str, Any]) -> None:
        """Admission's own counts, when the event carries them, are the truth."""
        in_flight, pool_used = _int(data.get("in_flight")), _int(data.get("pool_used"))
        if in_flight is not None:
            self.busy = in_flight
        if pool_used is not None:
            self.pool_used = pool_used

    def _finished(self, row: AgentRow, data: dict[str, Any], t: float) -> None:
        usage = data.get("usage")
        if isinstance(usage, dict):
            row.completion_tokens += _int(usage.get("completion_tokens")) or 0
        tps = _int_or_float(_find(data, "tokens_per_s"))
        if tps:
            row.tokens_per_s = tps
        if row.state not in ("done", "failed", "cancelled"):
            self._set(row, "idle" if not row.held else row.state, t)

    # ------------------------------------------------------------------ rendering

    def describe(self, row: AgentRow, now: float) -> str:
        """The state column text for ``row`` at time ``now``."""
        age = max(0.0, now - row.since)
        if row.state == "waiting":
            where = f" #{row.queue_position}" if row.queue_position else ""
            return f"waiting for a slot{where} {age:.1f}s"
        if row.state == "prefill":
            return f"prefill {age:.1f}s"
        if row.state == "generating":
            rate = f", {row.tokens_per_s:.0f} tok/s" if row.tokens_per_s else ""
            return f"generating {age:.1f}s{rate}"
        if row.state in ("failed", "cancelled"):
            return f"{row.state}: {row.detail}" if row.detail else row.state
        if row.state == "done":
            rate = f", {row.tokens_per_s:.0f} tok/s" if row.tokens_per_s else ""
            return f"done in {row.since - row.started:.1f}s{rate}"
        return row.state

    def render(self, now: float | None = None) -> RenderableType:
        """A rich renderable of the state at ``now`` (defaults to the last event's time)."""
        now = self.last if now is None else now
        if self.t0 is None:
            return Text("squad: starting…", style="dim")
        table = Table(box=None, pad_edge=False, show_edge=False, expand=False)
        table.add_column("agent", style="bold")
        table.add_column("state", no_wrap=False)
        table.add_column("calls", justify="right")
        table.add_column("tokens", justify="right")
        table.add_column("reserved", justify="right")
        for row in self.agents.values():
            table.add_row(
                escape(row.name),
                Text(self.describe(row, now), style=_STYLE.get(row.state, "")),
                str(row.calls),
                str(row.completion_tokens or ""),
                str(row.reserved or ""),
            )
        return Group(Text(self.status_line(), style="dim"), table)

    def status_line(self) -> str:
        """``slots 2/4 busy ▮▮▯▯ · 1 waiting · pool 612/4096 tokens reserved (15%)``."""
        parts = []
        if self.slots is None and self.planned is not None:
            return f"starting the engine: {self.planned[0]} slots, context {self.planned[1]} tokens (planned)"
        if self.slots:
            bar = "▮" * min(self.busy, self.slots) + "▯" * max(0, self.slots - self.busy)
            parts.append(f"slots {self.busy}/{self.slots} busy {bar}")
        else:
            parts.append(f"{self.busy} calls in flight")
        parts.append(f"{self.waiting} waiting")
        if self.pool:
            parts.append(f"pool {self.pool_used}/{self.pool} tokens reserved ({100 * self.pool_used // self.pool}%)")
        return " · ".join(parts)

    def line(self, event: Event) -> str | None:
        """One plain log line for ``event`` (after :meth:`apply`), or None for kinds not logged."""
        t = event.t - (self.t0 if self.t0 is not None else event.t)
        name = event.agent or "-"
        data = event.data
        if event.kind in _LOAD_KINDS:
            what = {"squad.ready": "engine ready", "engine.replanned": "engine reloaded"}.get(event.kind, "engine loaded")
            text = f"{what}: {self.slots} slots, pool {self.pool} tokens"
        elif event.kind == "engine.planned":
            text = self.status_line()
        elif event.kind == "agent.started":
            text = "started"
        elif event.kind == "call.queued":
            text = f"waiting for a slot ({_int(data.get('tokens')) or '?'} tokens) · {self.status_line()}"
        elif event.kind == "call.admitted":
            tokens = _int(data.get("reserved")) or _int(data.get("tokens")) or "?"
            text = f"admitted ({tokens} tokens reserved) · {self.status_line()}"
        elif event.kind == "call.first_token":
            text = "first token"
        elif event.kind == "call.finished":
            row = self.agents.get(name)
            rate = f", {row.tokens_per_s:.0f} tok/s" if row and row.tokens_per_s else ""
            text = f"call finished{rate}"
        elif event.kind == "call.failed":
            again = " (will retry)" if data.get("retry") else ""
            text = f"call failed{again}: {data.get('error')}"
        elif event.kind == "call.retried":
            text = f"retrying: {data.get('reason') or data.get('error')}"
        elif event.kind in ("agent.finished", "agent.failed", "agent.cancelled"):
            row = self.agents.get(name)
            text = self.describe(row, event.t) if row else event.kind
        else:
            return None
        return f"[{t:7.2f}s] {name:<14} {text}"


def _int_or_float(value: Any) -> float | None:
    try:
        return float(value) if value is not None else None
    except (TypeError, ValueError):
        return None


class LiveView:
    """An :data:`~squad.trace.EventSink` that shows the run; use as a context manager.

    - ``on=False``: shows nothing (``--quiet``).
    - stdout is a terminal: a rich ``Live`` table redrawn 4 times per second.
    - otherwise: one plain line per event (``[   0.52s] style   admitted ...``).

    Safe to call from any thread; the state is guarded by a lock.
    """

    def __init__(self, on: bool = True, *, console: Console | None = None, live: bool | None = None) -> None:
        self.on = on
        self.console = console or Console()
        self.live_mode = self.console.is_terminal if live is None else live
        self.state = ViewState()
        self._lock = threading.Lock()
        self._live: Live | None = None
        self._clock_offset: float | None = None

    def __enter__(self) -> "LiveView":
        if self.on and self.live_mode:
            self._live = Live(_Renderable(self), console=self.console, refresh_per_second=4, transient=False)
            self._live.__enter__()
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._live is not None:
            self._live.refresh()
            self._live.__exit__(None, None, None)
            self._live = None

    def __call__(self, event: Event) -> None:
        with self._lock:
            self.state.apply(event)
            if self._clock_offset is None:
                self._clock_offset = time.monotonic() - event.t
            if self.on and not self.live_mode:
                text = self.state.line(event)
                if text is not None:
                    self.console.print(text, markup=False, highlight=False, soft_wrap=True)
            if self.on and event.kind in ("engine.planned", "engine.warning"):  # warnings, in both modes
                found = event.data.get("warnings") or ([event.data["warning"]] if event.data.get("warning") else [])
                for warning in found:
                    self.console.print(f"warning: {warning}", markup=False, highlight=False, soft_wrap=True)

    def renderable(self) -> RenderableType:
        with self._lock:
            now = time.monotonic() - (self._clock_offset or 0.0)
            return self.state.render(now=max(now, self.state.last))


class _Renderable:
    """Re-renders the view each time rich refreshes the ``Live`` display."""

    def __init__(self, view: LiveView) -> None:
        self.view = view

    def __rich__(self) -> RenderableType:
        return self.view.renderable()


def live_view(on: bool = True, *, console: Console | None = None) -> LiveView:
    """The view for ``squad run``/``chat``: a context manager whose value is an EventSink."""
    return LiveView(on, console=console)

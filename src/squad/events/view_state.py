"""The state of the live view (:mod:`squad.events.view`), built from events only: rows per agent
(:class:`AgentRow`), engines (:class:`EngineRow`), and :class:`ViewState`, a pure state machine
(``apply(event)``) that also renders itself (a rich table, a status line, one plain line per
event), so it is tested without a terminal.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rich.console import Group, RenderableType
from rich.markup import escape
from rich.table import Table
from rich.text import Text

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
    ClusterConnected,
    ClusterStarting,
    EngineExited,
    EngineLoaded,
    EngineLoading,
    EngineLost,
    EnginePlanned,
    Event,
    ItemLost,
    MapProgress,
    ShareSkipped,
    WorkerFailed,
    WorkerStarted,
    item_label,
)
from squad.events.names import short_url
from squad.events.view_maps import BulkMaps

_RAY = (ClusterStarting, ClusterConnected, WorkerStarted, WorkerFailed, ItemLost)
"""A Ray run's progress: printed as lines in both modes."""

__all__ = ["AgentRow", "EngineRow", "ViewState"]

_STYLE = {
    "started": "cyan",
    "waiting": "yellow",
    "prefill": "magenta",
    "generating": "green",
    "idle": "cyan",
    "retrying": "yellow",
    "done": "bold green",
    "truncated": "bold yellow",
    "empty": "bold yellow",
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
    waiting: set[str] = field(default_factory=set)
    """Its calls (ids) in squad's admission queue."""
    call_ids: set[str] = field(default_factory=set)
    """Every call it made (a retried call counts once)."""
    held: dict[str, int] = field(default_factory=dict)
    """Its calls in flight: call id -> tokens reserved in the pool."""
    queue_position: int | None = None
    completion_tokens: int = 0
    tokens_per_s: float | None = None
    ttft_s: float | None = None
    detail: str = ""
    """Failure or cancellation reason; for a truncated answer its max_tokens."""
    engine: str | None = None
    """The engine of its latest call (base URL)."""

    @property
    def in_flight(self) -> int:
        return len(self.held)

    @property
    def calls(self) -> int:
        return len(self.call_ids)

    @property
    def reserved(self) -> int:
        """Tokens reserved in the pool by its calls in flight."""
        return sum(self.held.values())


@dataclass
class EngineRow:
    """One engine as the view shows it: ``slots``/``pool`` read back, ``busy`` calls holding a
    slot and ``pool_used`` tokens reserved (admission's own counts), ``lost`` why it was taken out."""

    slots: int = 0
    pool: int = 0
    busy: int = 0
    pool_used: int = 0
    lost: str | None = None


_short = short_url


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
    loads: int = 0
    planned: tuple[int | None, int | None] | None = None
    """(slots, n_ctx) of the plan the engine is being started with, until it reports."""
    loading: EngineLoading | None = None
    """The latest ``engine.loading`` while the model loads (None once it reported)."""
    loading_logged: float = float("-inf")
    """``elapsed_s`` of the last loading line printed (plain mode prints one every 10 s)."""
    t0: float | None = None
    last: float = 0.0
    labels: dict[str, str] = field(default_factory=dict)
    """Conversation id -> ``agent[i]`` for map items (from ``agent.started``), so each item
    has its own row."""
    engines: dict[str, EngineRow] = field(default_factory=dict)
    """Each engine by base URL (from ``engine.loaded`` and admission events)."""

    @property
    def several(self) -> bool:
        """More than one engine in the run."""
        return len(self.engines) > 1
    progress: str | None = None
    """A Ray run's latest start-up line, shown until an engine reports."""
    bulk: BulkMaps = field(default_factory=BulkMaps)
    """Large maps: their progress, and their items running now (no row each)."""
    quiet: bool = False
    """The last event applied is shown by its map's progress only (no plain line)."""

    @property
    def waiting(self) -> int:
        """Calls in squad's admission queue, all agents."""
        return sum(len(r.waiting) for r in self.agents.values()) + self.bulk.waiting

    def name(self, event: Event) -> str | None:
        """The row an event belongs to: ``agent[i]`` for a map item's conversation, else the agent."""
        if isinstance(event, AgentStarted) and event.item is not None and event.conversation and event.agent:
            self.labels[event.conversation] = item_label(event.agent, event.item)
        return self.labels.get(event.conversation or "", event.agent)

    def row(self, name: str | None, t: float) -> AgentRow:
        key = name or "?"
        if key not in self.agents:
            self.agents[key] = AgentRow(name=key, since=t, started=t)
        return self.agents[key]

    def apply(self, event: Event) -> None:
        """Fold one event into the state. Kinds the view does not show are ignored."""
        t = event.t
        self.quiet = False
        if self.t0 is None:
            self.t0 = t
        self.last = max(self.last, t)
        if isinstance(event, (EnginePlanned, EngineLoading, EngineLoaded, EngineLost)):
            self._engine_event(event)
        elif isinstance(event, _RAY):
            self.progress = self.ray_text(event)
            if isinstance(event, ItemLost):  # the lost attempt holds nothing any more
                lost = self.row(item_label(event.agent or "?", event.item), t)
                lost.held.clear()
                lost.waiting.clear()
                lost.detail = event.message
                self._set(lost, "retrying" if event.retry else "failed", t)
        elif isinstance(event, AgentResumed):  # answered from the journal of the run it resumes: no call
            resumed = self.row(item_label(event.agent or "?", event.item), t)
            self._set(resumed, "done" if event.outcome == "ok" else event.outcome, t)
            resumed.detail = f"resumed from run {event.run}"
        elif isinstance(event, MapProgress):
            self.bulk.progress[event.agent or ""] = event
        elif self._bulk(event):
            self.quiet = True
        elif isinstance(event, (AgentStarted, AgentFinished, AgentFailed, AgentCancelled)):
            self._agent_event(event, self.row(self.name(event), t), t)
        elif event.call is not None:
            self._call_event(event, self.row(self.name(event), t), t)

    def _engine_event(self, event: EnginePlanned | EngineLoading | EngineLoaded | EngineLost) -> None:
        """The engine rows: what was planned, what loads, what was loaded or lost."""
        if isinstance(event, EnginePlanned):
            self.planned = (event.slots, event.n_ctx)
        elif isinstance(event, EngineLoading):
            self.loading = event
        elif isinstance(event, EngineLoaded):
            self.loads += event.reason != "given"
            self.slots, self.pool, self.loading = event.slots, event.pool, None
            if event.engine:
                row = self.engines.setdefault(event.engine, EngineRow())
                row.slots, row.pool = event.slots, event.pool
                if self.several:
                    self.slots = sum(e.slots for e in self.engines.values() if e.lost is None)
                    self.pool = sum(e.pool for e in self.engines.values() if e.lost is None)
        elif isinstance(event, EngineLost):
            if event.engine:
                self.engines.setdefault(event.engine, EngineRow()).lost = event.reason
                self.slots = sum(e.slots for e in self.engines.values() if e.lost is None)
                self.pool = sum(e.pool for e in self.engines.values() if e.lost is None)

    def _bulk(self, event: Event) -> bool:
        """An item event of a large map, shown by the map's progress only (:mod:`squad.events.view_maps`)."""
        label = self.bulk.item_label(event)
        if self.bulk.take(event):
            if isinstance(event, (CallAdmitted, CallReleased)):
                self._reported(event.in_flight, event.pool_used, event.engine)
            return True
        if label is not None and event.conversation:  # a failed item gets its row
            self.labels[event.conversation] = label
        return False

    def _set(self, row: AgentRow, state: str, t: float) -> None:
        if row.state != state:
            row.state, row.since = state, t

    def _agent_event(self, event: Event, row: AgentRow, t: float) -> None:
        if isinstance(event, AgentStarted):
            row.started = t
            self._set(row, "started", t)
        elif isinstance(event, AgentFinished):  # ok, or a non-answer: truncated, empty
            self._set(row, "done" if event.outcome == "ok" else event.outcome, t)
            if event.outcome == "truncated" and event.max_tokens is not None:
                row.detail = f"at max_tokens {event.max_tokens}" + (", cut while thinking"
                                                                    if event.cut_while_thinking else "")
        elif isinstance(event, AgentFailed):
            self._set(row, "failed", t)
            row.detail = event.error
        elif isinstance(event, AgentCancelled):
            self._set(row, "cancelled", t)
            row.detail = event.reason
        if isinstance(event, (AgentFailed, AgentCancelled)):
            row.waiting.clear()  # a call cancelled while queued emits nothing of its own

    def _call_event(self, event: Event, row: AgentRow, t: float) -> None:
        call = event.call or ""
        if isinstance(event, CallQueued):
            row.queue_position = event.position
            row.waiting.add(call)
            self._set(row, "waiting", t)
        elif isinstance(event, CallAdmitted):
            row.waiting.discard(call)
            row.held[call] = event.tokens
            row.call_ids.add(call)
            row.queue_position = None
            row.engine = event.engine or row.engine
            self._reported(event.in_flight, event.pool_used, event.engine)
            self._set(row, "prefill", t)
        elif isinstance(event, CallFirstToken):
            row.ttft_s = event.ttft_s
            self._set(row, "generating", t)
        elif isinstance(event, CallReleased):
            row.held.pop(call, None)
            self._reported(event.in_flight, event.pool_used, event.engine)
        elif isinstance(event, CallFinished):
            row.held.pop(call, None)
            row.completion_tokens += event.completion_tokens or 0
            row.tokens_per_s = event.tokens_per_s or row.tokens_per_s
            if row.state not in ("done", "truncated", "empty", "failed", "cancelled"):
                self._set(row, "idle" if not row.held else row.state, t)
        elif isinstance(event, CallFailed):
            row.held.pop(call, None)
            row.waiting.discard(call)  # failed while still queued (e.g. a resize made it impossible)
            row.detail = event.error
            self._set(row, "failed", t)
        elif isinstance(event, CallRetried):
            row.detail = event.reason or event.error
            self._set(row, "retrying", t)
        elif isinstance(event, CallMoved):
            row.held.pop(call, None)
            row.waiting.discard(call)
            row.detail = (f"moved to {_short(event.to_engine)}{' and re-run from its start' if event.rerun else ''} "
                          f"(from {_short(event.engine)}, which was lost)")
            self._set(row, "retrying", t)

    def _reported(self, in_flight: int, pool_used: int, engine: str | None = None) -> None:
        """Admission's own counts are the truth for busy slots and the pool (per engine)."""
        if engine is None:
            self.busy, self.pool_used = in_flight, pool_used
            return
        row = self.engines.setdefault(engine, EngineRow())
        row.busy, row.pool_used = in_flight, pool_used
        self.busy = sum(e.busy for e in self.engines.values())
        self.pool_used = sum(e.pool_used for e in self.engines.values())

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
        if row.state in ("truncated", "empty"):
            at = f" {row.detail}" if row.detail else ""
            return f"{row.state}{at} after {row.since - row.started:.1f}s"
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
        if self.several:
            table.add_column("engine")
        for row in self.agents.values():
            table.add_row(
                escape(row.name),
                Text(self.describe(row, now), style=_STYLE.get(row.state, "")),
                str(row.calls),
                str(row.completion_tokens or ""),
                str(row.reserved or ""),
                *([escape(_short(row.engine)) if row.engine else ""] if self.several else []),
            )
        return Group(Text(self.status_line(), style="dim"), table)

    def status_line(self) -> str:
        """``slots 2/4 busy ▮▮▯▯ · 1 waiting · pool 612/4096 tokens reserved (15%)``."""
        parts = []
        if self.slots is None and self.planned is None and self.progress is not None:
            return self.progress
        if self.slots is None and self.planned is not None:
            line = f"starting the engine: {self.planned[0]} slots, context {self.planned[1]} tokens (planned)"
            if self.loading is not None:
                line += f" · {self.loading_text()}"
            return line
        if self.several:
            parts += [f"{_short(url)} lost" if e.lost else f"{_short(url)} {e.busy}/{e.slots} busy"
                      for url, e in self.engines.items()]
        elif self.slots:
            bar = "▮" * min(self.busy, self.slots) + "▯" * max(0, self.slots - self.busy)
            parts.append(f"slots {self.busy}/{self.slots} busy {bar}")
        else:
            parts.append(f"{self.busy} calls in flight")
        parts.append(f"{self.waiting} waiting")
        if self.pool:
            parts.append(f"pool {self.pool_used}/{self.pool} tokens reserved ({100 * self.pool_used // self.pool}%)")
        maps = self.bulk.text()
        return " · ".join(parts + ([maps] if maps else []))

    def loading_text(self) -> str:
        """``loading model.gguf: 12 s of at most 90 s`` (the latest ``engine.loading``)."""
        ev = self.loading
        return "" if ev is None else f"loading {ev.model}: {ev.elapsed_s:.0f} s of at most {ev.timeout_s:.0f} s"

    @staticmethod
    def ray_text(event: Event) -> str:
        """What a Ray run's progress event says (``worker w0@127.0.0.1: engine loaded, 3 slots, ...``)."""
        if isinstance(event, ClusterStarting):
            return ("starting a local Ray cluster on 127.0.0.1" if event.address is None
                    else f"connecting to the Ray cluster at {event.address}")
        if isinstance(event, ClusterConnected):
            return (f"Ray cluster: {event.nodes} node{'s' * (event.nodes != 1)}, starting {event.workers} "
                    f"worker{'s' * (event.workers != 1)}, each with its own engine")
        if isinstance(event, WorkerStarted):
            return (f"worker {event.worker}: engine loaded, {event.slots} slots, pool {event.pool} tokens"
                    f" ({event.engine})")
        if isinstance(event, WorkerFailed):
            return f"worker {event.worker} did not start: {event.reason}"
        if isinstance(event, ItemLost):
            return f"{item_label(event.agent or '?', event.item)}: {event.message}"
        return event.kind

    def line(self, event: Event) -> str | None:
        """One plain log line for ``event`` (after :meth:`apply`), or None for kinds not logged."""
        t = event.t - (self.t0 if self.t0 is not None else event.t)
        name = self.name(event) or event.worker or "-"
        text: str | None
        if self.quiet:
            return None
        if isinstance(event, _RAY):
            text, name = self.ray_text(event), "ray"
        elif isinstance(event, MapProgress):
            text = f"map: {event.message}"
        elif isinstance(event, EngineLoading):
            if event.elapsed_s - self.loading_logged < 10:
                return None
            self.loading_logged = event.elapsed_s
            text = self.loading_text()
        else:
            text = self._engine_text(event)
            if text is None:
                text = self._agent_text(event, name)
        return None if text is None else f"[{t:7.2f}s] {name:<14} {text}"

    def _engine_text(self, event: Event) -> str | None:
        """:meth:`line`'s text of an engine event (None: not one)."""
        if isinstance(event, EngineLoaded) and self.several:
            return f"engine {_short(event.engine)} {event.reason}: {event.slots} slots, pool {event.pool} tokens"
        if isinstance(event, EngineLoaded):
            return f"engine {event.reason}: {self.slots} slots, pool {self.pool} tokens"
        if isinstance(event, EngineLost):
            return f"engine {_short(event.engine)} lost: {event.reason}; {event.remaining} engine(s) left"
        if isinstance(event, CallMoved):
            what = f"call {event.call}" if event.call else "a queued call"
            return (f"{what} moved to {_short(event.to_engine)}{' and re-run from its start' if event.rerun else ''}"
                    f" (from {_short(event.engine)}, which was lost)")
        if isinstance(event, EngineExited):
            return event.message
        if isinstance(event, EnginePlanned):
            return self.status_line()
        return None

    def _agent_text(self, event: Event, name: str) -> str | None:
        """:meth:`line`'s text of an agent or call event (None: a kind not logged)."""
        if isinstance(event, AgentStarted):
            return "started"
        if isinstance(event, CallQueued):
            return f"waiting for a slot ({event.tokens} tokens) · {self.status_line()}"
        if isinstance(event, CallAdmitted):
            where = f" on {_short(event.engine)}" if self.several else ""
            return f"admitted{where} ({event.tokens} tokens reserved) · {self.status_line()}"
        if isinstance(event, CallFirstToken):
            return "first token"
        if isinstance(event, CallFinished):
            rate = f", {event.tokens_per_s:.0f} tok/s" if event.tokens_per_s else ""
            reused = f", {event.cached_tokens} prompt tokens reused" if event.cached_tokens else ""
            shared = f" ({event.shared_tokens} from its fan-out's prefix)" if event.shared_tokens else ""
            return f"call finished{rate}{reused}{shared}"
        if isinstance(event, ShareSkipped):
            return f"shared prefix not prefilled once: {event.reason}"
        if isinstance(event, CallFailed):
            return f"call failed: {event.error}" + (f": {event.message}" if event.message else "")
        if isinstance(event, CallRetried):
            return f"retrying: {event.reason or event.error}"
        if isinstance(event, (AgentFinished, AgentFailed, AgentCancelled)):
            row = self.agents.get(name)
            return self.describe(row, event.t) if row else event.kind
        return None

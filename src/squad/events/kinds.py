"""Every kind of event squad emits, one frozen dataclass each (the table: ``docs/design/events.md``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from squad.events.event import Event

__all__ = [
    "EnginePlanned",
    "EngineLoaded",
    "EngineReplanning",
    "EngineWarning",
    "EngineLoading",
    "EngineExited",
    "EngineLost",
    "MentionDispatched",
    "MentionQueued",
    "AgentStarted",
    "AgentFinished",
    "AgentFailed",
    "AgentCancelled",
    "AgentResumed",
    "CallQueued",
    "CallAdmitted",
    "CallFirstToken",
    "CallFinished",
    "CallFailed",
    "CallRetried",
    "CallReleased",
    "CallMoved",
    "ToolCalled",
    "OutputRetried",
    "ToolLimited",
    "ToolTruncated",
    "AnswerCut",
    "StepWarning",
    "MCPWarning",
    "ClusterStarting",
    "ClusterConnected",
    "WorkerStarted",
    "WorkerFailed",
    "ItemLost",
    "MapProgress",
]


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


@dataclass(frozen=True, kw_only=True)
class EngineLoading(Event):
    """The model is still loading: ``elapsed_s`` of at most ``timeout_s`` seconds (about once a second)."""

    kind: ClassVar[str] = "engine.loading"
    model: str
    elapsed_s: float
    timeout_s: float


@dataclass(frozen=True, kw_only=True)
class EngineExited(Event):
    """A launched engine's process ended by itself mid-run. ``status``: ``"signal 9 SIGKILL"``
    or ``"status 1"``; ``log_path``: its log; ``message``: ``"engine exited (...), log: PATH"``."""

    kind: ClassVar[str] = "engine.exited"
    status: str
    log_path: str
    message: str


@dataclass(frozen=True, kw_only=True)
class EngineLost(Event):
    """One of several engines (``engine``) died and was taken out (:mod:`squad.chat.routing`):
    ``reason`` says how (``"engine exited (signal 9 SIGKILL), log: PATH"``, ``"not answering"``);
    ``remaining``: engines still serving."""

    kind: ClassVar[str] = "engine.lost"
    reason: str
    remaining: int = 0


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
    """``outcome``: ``ok``, ``truncated`` (its last call stopped at ``max_tokens``) or ``empty``
    (:class:`squad.runtime.outcome.Outcome`); ``finish_reason`` of its last call;
    ``cut_while_thinking``: truncated inside the thinking, before any answer."""

    kind: ClassVar[str] = "agent.finished"
    summary: str = ""
    outcome: str = "ok"
    finish_reason: str | None = None
    max_tokens: int | None = None
    cut_while_thinking: bool = False


@dataclass(frozen=True, kw_only=True)
class AgentResumed(Event):
    """A conversation a resumed run did not send again: its answer (``outcome``) was recorded
    when run ``run`` did it (:mod:`squad.runtime.journal`); ``item``: its map item."""

    kind: ClassVar[str] = "agent.resumed"
    run: str
    outcome: str = "ok"
    item: int | None = None


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
    """``position``: calls waiting ahead of it in squad's queue when it asked, by priority then arrival
    (0 = head; the ``fifo`` order exactly; ``program`` and ``backfill`` may admit it sooner)."""

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
    """Times in seconds; tokens from the engine's ``usage``. ``cached_tokens``: prompt tokens the
    engine reused from its cache (its own ``timings.cache_n``; None: it did not say);
    ``shared_tokens``: of those, the ones a fan-out's prefix prefilled once gave it (:mod:`squad.sched.share`;
    0: none), also read from the engine, never from squad's plan."""

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
    cached_tokens: int | None = None
    shared_tokens: int = 0


@dataclass(frozen=True, kw_only=True)
class ShareSkipped(Event):
    """A fan-out's common prefix was not prefilled once (:mod:`squad.sched.share`): ``reason``; its
    members each prefill their own prompt (slower, never a different prompt). ``tokens``: the prefix."""

    kind: ClassVar[str] = "share.skipped"
    reason: str
    tokens: int = 0


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


@dataclass(frozen=True, kw_only=True)
class CallMoved(Event):
    """Call ``call`` could not finish on ``engine`` because that engine was lost; the same
    request goes to ``to_engine`` as a new call. ``rerun``: it had been streaming, so it runs
    again from its start (its cut text never reaches the conversation); False: no token of it had
    arrived (it waited in the lost engine's queue, or the engine died before its first token)."""

    kind: ClassVar[str] = "call.moved"
    to_engine: str
    rerun: bool = False
    reason: str = ""


# --- tools and hand-back ----------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class ToolCalled(Event):
    kind: ClassVar[str] = "tool.called"
    tool: str
    ok: bool


@dataclass(frozen=True, kw_only=True)
class OutputRetried(Event):
    """``agent``'s answer missed its output schema (``problem`` says where and why) and it is
    asked once more with the error shown (:mod:`squad.chat.structured`); ``message`` says so for people."""

    kind: ClassVar[str] = "output.retried"
    problem: str
    message: str = ""


@dataclass(frozen=True, kw_only=True)
class ToolLimited(Event):
    """``agent`` asked for a sub-agent with ``tool`` (``ask_<name>``) past the run's bound:
    ``limit`` is ``depth`` (``max_sub_depth``) or ``calls`` (``max_sub_calls``), ``value`` that
    bound; ``message`` says so for people (views print it as a warning)."""

    kind: ClassVar[str] = "tool.limited"
    tool: str
    limit: str
    value: int
    message: str = ""


@dataclass(frozen=True, kw_only=True)
class ToolTruncated(Event):
    """A result of ``tool`` (the name the model called) was cut to fit ``agent``'s ``budget``
    (tokens): ``result_chars`` long (``result_tokens``, None when too long to count), of which
    ``kept_chars`` (``kept_tokens``) reached the model, ending with a marker; ``room_tokens``:
    the room the round's results had; ``tools_closed``: the next round offers no tools (no room
    for another); ``message`` says so for people (views print it as a warning)."""

    kind: ClassVar[str] = "tool.truncated"
    tool: str
    result_chars: int
    kept_chars: int
    result_tokens: int | None
    kept_tokens: int
    room_tokens: int
    budget: int
    tools_closed: bool = False
    message: str = ""


@dataclass(frozen=True, kw_only=True)
class AnswerCut(Event):
    """A sub-agent answer (``agent``) cut by ``omitted_tokens`` to fit ``main``'s budget."""

    kind: ClassVar[str] = "answer.cut"
    omitted_tokens: int
    room_tokens: int
    main: str
    rule: str = "equal share of the main agent's remaining budget"


# --- recipe steps -----------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class StepWarning(Event):
    """Recipe step ``step`` got a non-answer (``outcome``, :class:`squad.runtime.outcome.Outcome`) from
    ``label`` (the agent, ``agent[i]`` for a map item); ``handling`` is how it flows on
    (``accept``, ``mark`` or ``fail``); ``warning`` is the line shown, with the fix."""

    kind: ClassVar[str] = "step.warning"
    step: str
    label: str
    outcome: str
    handling: str
    warning: str


@dataclass(frozen=True, kw_only=True)
class MCPWarning(Event):
    """MCP server ``server`` (:mod:`squad.mcp`) did what the user should know: ``problem`` is
    ``stdout`` (it wrote a line that is not MCP to stdout, skipped; once per server) or
    ``exited`` (its process ended mid-run); ``warning`` is the line shown."""

    kind: ClassVar[str] = "mcp.warning"
    server: str
    problem: str
    warning: str


# --- Ray fan-out (squad.cluster.ray) ------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class ClusterStarting(Event):
    """A Ray run starts a local cluster on 127.0.0.1 (``address`` None) or connects to ``address``."""

    kind: ClassVar[str] = "cluster.starting"
    address: str | None = None


@dataclass(frozen=True, kw_only=True)
class ClusterConnected(Event):
    """Connected to the Ray cluster: ``nodes`` alive, ``workers`` being started on them."""

    kind: ClassVar[str] = "cluster.connected"
    address: str | None = None
    nodes: int = 0
    workers: int = 0


@dataclass(frozen=True, kw_only=True)
class WorkerStarted(Event):
    """Ray worker ``worker`` on ``node`` is ready: its engine (``engine``) reported ``slots``,
    ``n_ctx`` and ``pool`` (tokens); ``memory``: bytes of KV memory it planned for (its share)."""

    kind: ClassVar[str] = "worker.started"
    node: str
    slots: int
    n_ctx: int
    pool: int
    memory: int = 0


@dataclass(frozen=True, kw_only=True)
class WorkerFailed(Event):
    """Ray worker ``worker`` did not start (``reason``); the run goes on with the others."""

    kind: ClassVar[str] = "worker.failed"
    reason: str


@dataclass(frozen=True, kw_only=True)
class ItemLost(Event):
    """Map item ``item`` of ``agent`` was held by Ray worker ``worker`` when that worker was lost
    (``reason``); ``retry``: it runs again on another worker (else it fails). The events of the lost
    attempt that reached the driver stay in the trace but not in the summary's counts."""

    kind: ClassVar[str] = "item.lost"
    item: int
    reason: str
    retry: bool = True

    @property
    def message(self) -> str:
        """``worker w1@10.0.0.5 lost (reason): run again on another worker``, for people."""
        then = "run again on another worker" if self.retry else "not run again"
        return f"worker {self.worker} lost ({self.reason}): {then}"



@dataclass(frozen=True, kw_only=True)
class MapProgress(Event):
    """A map of ``agent`` over ``total`` items has ``done`` of them finished (``failed`` of those did not
    end in an answer), at ``rate`` items per second since it started (measured: done / seconds), so the
    rest would take ``eta_s`` seconds at that rate (None until one is done). Emitted when the map starts,
    at most once a second while it runs, and when it ends: a map of any size is a handful of lines."""

    kind: ClassVar[str] = "map.progress"
    done: int
    total: int
    failed: int = 0
    rate: float = 0.0
    eta_s: float | None = None

    @property
    def message(self) -> str:
        """``1,234/10,000 items done (3 failed), 56.1/s, about 2m 36s left``, for people."""
        failed = f" ({self.failed:,} failed)" if self.failed else ""
        text = f"{self.done:,}/{self.total:,} items done{failed}"
        if self.done and self.done < self.total:
            text += f", {self.rate:.1f}/s"
            if self.eta_s is not None:
                minutes, seconds = divmod(round(self.eta_s), 60)
                text += f", about {minutes}m {seconds:02d}s left" if minutes else f", about {seconds}s left"
        elif self.done:
            text += f", {self.rate:.1f}/s"
        return text

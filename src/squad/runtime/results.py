"""What a run gives back: one :class:`AgentResult` per agent conversation, one
:class:`RunResult` per main-agent turn.

Runtime objects, so plain dataclasses (not pydantic). An agent that failed or was
cancelled has ``output == ""`` and its ``error`` set; partial text of a failed call is
never an ``output`` and never enters a history. Each result's ``outcome``
(:class:`~squad.runtime.outcome.Outcome`) says whether ``output`` is a real answer: ``ok``, or
``truncated`` (cut at max_tokens), ``empty``, ``failed``, ``cancelled``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from squad.errors import AgentCancelled, AgentRunError, IncompleteAnswer
from squad.runtime.outcome import Outcome, marked, outcome_of

__all__ = [
    "AgentResult",
    "AgentTimings",
    "RunResult",
    "Usage",
    "first_failure",
    "notes_of",
    "cancelled_result",
    "usage_of",
    "timings_of",
    "slot_of",
]

@dataclass(frozen=True)
class Usage:
    """Tokens an agent used, summed over its model calls (tool rounds included)."""

    prompt_tokens: int = 0
    completion_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def __add__(self, other: Usage) -> Usage:
        return Usage(self.prompt_tokens + other.prompt_tokens, self.completion_tokens + other.completion_tokens)


@dataclass(frozen=True)
class AgentTimings:
    """Seconds and rates for one agent conversation.

    - ``queued_s``: time spent waiting in squad's admission queue (all calls summed).
    - ``ttft_s``: time to first token of the first call, from when it was sent (None if none).
    - ``tokens_per_s``: completion tokens per second of generation over all calls (None if unknown).
    - ``total_s``: wall time of the whole conversation, queue included.
    - ``calls``: model calls made (more than 1 with tool rounds).
    """

    queued_s: float = 0.0
    ttft_s: float | None = None
    tokens_per_s: float | None = None
    total_s: float = 0.0
    calls: int = 0


@dataclass
class AgentResult:
    """One agent conversation's outcome.

    ``output`` is the final answer (``""`` on failure, except the text of a truncated or
    empty answer that ``fail_on`` made an :class:`~squad.errors.IncompleteAnswer`, and the raw
    answer of an :class:`~squad.errors.InvalidOutput`);
    ``reasoning`` is kept apart from it. ``output_value``: with an output schema
    (:mod:`squad.chat.structured`), the answer validated into a value (an instance of the pydantic
    model, or the parsed JSON), ``output`` being that value as JSON; else None.
    ``slot`` is the engine slot of the last call when the engine reported it.
    ``error`` is the failure (an :class:`AgentCancelled` when cancelled) and
    ``cancelled_reason`` says why it was cancelled (e.g. ``"cancelled because 'style' failed"``).
    ``history`` is the conversation without the system message, ending with the answer
    (only on success); ``tool_calls`` lists ``(name, arguments, result_text)`` in order;
    ``subs`` are the results of sub-agents it called as ``ask_<name>`` tools;
    ``conversation`` is the id its events carry; ``item`` the index of the map item it
    worked on (``Squad.map``), else None; ``notes`` what the run should tell that is not a
    failure (a sub-agent tool call refused by the run's bound). ``finish_reason`` is its last
    call's (``"length"``: cut at ``max_tokens``, the most tokens each of its calls could generate;
    an answer validated against its output schema is whole: ``"stop"``).
    ``cut_while_thinking``: its last call spent all of ``max_tokens`` thinking (no answer text):
    ``truncated``, shown as ``cut while thinking``. ``resumed``: the id of the run whose
    journal answered it (a resumed run did not send it again, :mod:`squad.runtime.journal`), else None.
    A map item served by a Ray worker (:mod:`squad.cluster.ray`) names it: ``worker`` (its id),
    ``engine`` (that worker's engine URL, on its node) and ``retried`` (why an earlier attempt
    was lost with its worker, when it was sent a second time); None otherwise. On several
    engines (:mod:`squad.chat.routing`) ``engine`` is the base URL of the engine of its last call.
    """

    agent: str
    output: str = ""
    output_value: Any = None
    reasoning: str = ""
    usage: Usage = field(default_factory=Usage)
    timings: AgentTimings = field(default_factory=AgentTimings)
    slot: int | None = None
    error: AgentRunError | None = None
    cancelled_reason: str | None = None
    history: list[dict[str, Any]] = field(default_factory=list)
    tool_calls: list[tuple[str, str, str]] = field(default_factory=list)
    subs: list[AgentResult] = field(default_factory=list)
    conversation: str | None = None
    item: int | None = None
    finish_reason: str | None = None
    max_tokens: int | None = None
    notes: list[str] = field(default_factory=list)
    worker: str | None = None
    engine: str | None = None
    retried: str | None = None
    cut_while_thinking: bool = False
    resumed: str | None = None

    @property
    def ok(self) -> bool:
        """No error (it did not fail and was not cancelled); whether ``output`` is a whole
        answer is :attr:`outcome`."""
        return self.error is None

    @property
    def outcome(self) -> Outcome:
        """``ok``, ``truncated``, ``empty``, ``failed`` or ``cancelled`` (:mod:`squad.runtime.outcome`)."""
        if self.cancelled_reason is not None or isinstance(self.error, AgentCancelled):
            return Outcome.CANCELLED
        if isinstance(self.error, IncompleteAnswer):  # a non-answer a fail_on policy made a failure
            return Outcome(self.error.outcome)
        if self.error is not None:
            return Outcome.FAILED
        return outcome_of(self.finish_reason, self.output)

    @property
    def truncated(self) -> bool:
        """True when the answer stopped at ``max_tokens`` (outcome ``truncated``)."""
        return self.outcome is Outcome.TRUNCATED

    @property
    def marked_output(self) -> str:
        """``output`` as a later reader is given it: unchanged for an answer, else with the
        outcome's visible mark (:func:`squad.runtime.outcome.marked`, e.g. ``... [truncated at
        max_tokens]``, ``[failed: why]``)."""
        detail = self.cancelled_reason or (str(self.error) if self.error is not None else "")
        return marked(self.outcome, self.output, detail, thinking=self.cut_while_thinking)

    @property
    def label(self) -> str:
        """``agent``, or ``agent[item]`` for a map item."""
        return self.agent if self.item is None else f"{self.agent}[{self.item}]"

    def summary(self) -> str:
        """One line: agent, state, tokens, queue wait, ttft, tokens/s, total."""
        t = self.timings
        if self.cancelled_reason is not None:
            state = self.cancelled_reason
        elif self.error is not None:
            state = f"failed: {type(self.error).__name__}: {self.error}"
        elif self.outcome is Outcome.TRUNCATED and self.max_tokens is not None:
            state = f"truncated at max_tokens {self.max_tokens}" + (", cut while thinking"
                                                                    if self.cut_while_thinking else "")
        else:
            state = self.outcome.value
        ttft = f"{t.ttft_s:.2f}s" if t.ttft_s is not None else "-"
        tps = f"{t.tokens_per_s:.1f}" if t.tokens_per_s is not None else "-"
        slot = f" slot {self.slot}" if self.slot is not None else ""
        return (
            f"{self.label}: {state}; {self.usage.prompt_tokens}+{self.usage.completion_tokens} tokens, "
            f"queued {t.queued_s:.2f}s, ttft {ttft}, {tps} tok/s, total {t.total_s:.2f}s{slot}"
        )


@dataclass
class RunResult:
    """One main-agent turn: its answer, its own result, and the sub-agents' results.

    ``history`` is the main agent's conversation after this turn (pass it to the next
    ``Squad.run(..., history=...)`` to keep chatting).
    """

    output: str
    main: AgentResult
    subs: list[AgentResult] = field(default_factory=list)
    history: list[dict[str, Any]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """The main agent did not fail (see :attr:`outcome` for a whole answer)."""
        return self.main.ok

    @property
    def output_value(self) -> Any:
        """The main agent's answer as its output type's value (:attr:`AgentResult.output_value`)."""
        return self.main.output_value

    @property
    def outcome(self) -> Outcome:
        """The main agent's outcome: ``ok`` or ``truncated``/``empty`` (a failure raises)."""
        return self.main.outcome

    @property
    def truncated(self) -> bool:
        """True when the main agent's answer stopped at ``max_tokens``."""
        return self.main.truncated

    @property
    def notes(self) -> list[str]:
        """The notes of every conversation of this turn (:func:`notes_of`)."""
        return notes_of([self.main, *self.subs])

    def summary(self) -> str:
        """The main agent's line, then one indented line per sub-agent."""
        lines = [self.main.summary()]
        lines += [f"  {sub.summary()}" for sub in self.subs]
        return "\n".join(lines)


def notes_of(results: Sequence[AgentResult]) -> list[str]:
    """The ``notes`` of ``results`` and of the sub-agents they called, at any depth, each
    conversation once, in order."""
    seen: set[int] = set()
    found: list[str] = []

    def walk(r: AgentResult) -> None:
        if id(r) in seen:
            return
        seen.add(id(r))
        found.extend(r.notes)
        for sub in r.subs:
            walk(sub)

    for r in results:
        walk(r)
    return found


def first_failure(results: Sequence[AgentResult]) -> AgentRunError | None:
    """The error of the first result that failed on its own (not cancelled), or None."""
    for r in results:
        if r.error is not None and r.cancelled_reason is None:
            return r.error
    return None


def cancelled_result(agent: str, reason: str, total_s: float = 0.0, conversation: str | None = None) -> AgentResult:
    """The result of an agent cancelled for ``reason`` (no output, AgentCancelled error)."""
    return AgentResult(agent=agent, error=AgentCancelled(reason, agent=agent), cancelled_reason=reason,
                       timings=AgentTimings(total_s=total_s), conversation=conversation)


def usage_of(calls: Sequence[Any]) -> Usage:
    """Usage summed over the client's ``ChatResult``s (calls without usage count 0)."""
    total = Usage()
    for c in calls:
        if c.usage is not None:
            total = total + Usage(c.usage.prompt_tokens, c.usage.completion_tokens)
    return total


def timings_of(calls: Sequence[Any], total_s: float) -> AgentTimings:
    """Timings of one conversation from its ``ChatResult``s; ``total_s`` is its wall time."""
    queued = sum(getattr(c.timings, "queued_s", 0.0) or 0.0 for c in calls)
    ttft = getattr(calls[0].timings, "ttft_s", None) if calls else None
    tokens, gen_s = 0, 0.0
    for c in calls:
        tps = getattr(c.timings, "tokens_per_s", None)
        n = c.usage.completion_tokens if c.usage is not None else 0
        if tps and n:
            tokens, gen_s = tokens + n, gen_s + n / tps
    return AgentTimings(queued_s=queued, ttft_s=ttft, tokens_per_s=tokens / gen_s if gen_s else None,
                        total_s=total_s, calls=len(calls))


def slot_of(reply: Any) -> int | None:
    """The slot a ``ChatResult`` was served by, if the client recorded it."""
    slot = getattr(reply, "slot", None)
    return slot if isinstance(slot, int) and slot >= 0 else None



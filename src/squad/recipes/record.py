"""What a recipe run produced: :class:`RecipeRun`, each step's record, the table ``squad run`` shows.

A step's record is ``{"output": text, "outputs": [texts], "error": message or None, "outcome":
ok|truncated|empty|failed|cancelled}`` (plus ``value`` for a step with a schema), as
:mod:`squad.recipes.steps` writes it and later templates read it (``steps.ID.output``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from squad.errors import AgentCancelled
from squad.recipes.model import Step
from squad.runtime.outcome import Outcome, marked
from squad.runtime.results import AgentResult, notes_of

if TYPE_CHECKING:
    from squad.engine.info import EngineInfo
    from squad.runtime.journal import RunJournal
    from squad.sched.plan import EnginePlan

__all__ = ["RecipeRun", "step_table", "entry", "plain", "record_failure", "shown", "outcome_of_error"]


@dataclass
class RecipeRun:
    """What a recipe run produced.

    ``output``: the final text; ``value``: it parsed as JSON when the recipe has an output
    schema (else None); ``steps``: each step's record (see the module docstring);
    ``results``: ``(step id, AgentResult)`` for every agent conversation, in finishing order;
    ``errors``: ``(step id, message)`` of failures a ``collect`` policy let pass;
    ``warnings``: ``(step id, message)`` of non-answers passed on marked or made failures;
    ``notes``: ``(step id, note)`` of what is not a failure but must be said (a sub-agent tool
    call refused by the run's bound, :attr:`AgentResult.notes`);
    ``plan``/``info``: the engine plan (None when attached) and what the engine reported;
    ``workers``: on Ray (:mod:`squad.cluster.ray`), each worker that served map items
    (:meth:`~squad.cluster.ray.WorkerInfo.as_dict` and ``items``, how many it served), else empty;
    ``journal``: the run's journal (:class:`~squad.runtime.journal.RunJournal`; None when not kept),
    whose ``run`` id ``squad run --resume`` takes.
    """

    output: str
    value: Any = None
    steps: dict[str, dict[str, Any]] = field(default_factory=dict)
    results: list[tuple[str, AgentResult]] = field(default_factory=list)
    errors: list[tuple[str, str]] = field(default_factory=list)
    warnings: list[tuple[str, str]] = field(default_factory=list)
    plan: EnginePlan | None = None
    info: EngineInfo | None = None
    workers: list[dict[str, Any]] = field(default_factory=list)
    journal: RunJournal | None = None

    @property
    def resumed(self) -> list[tuple[str, str]]:
        """``(step id, label)`` of every conversation answered from the journal of the run it resumed."""
        return [(sid, r.label) for sid, r in self.results if r.resumed]

    @property
    def notes(self) -> list[tuple[str, str]]:
        steps: dict[str, list[AgentResult]] = {}
        for sid, result in self.results:
            steps.setdefault(sid, []).append(result)
        return [(sid, note) for sid, results in steps.items() for note in notes_of(results)]


def entry(text: str, outcome: Outcome, step: Step | None = None, result: AgentResult | None = None) -> dict[str, Any]:
    """The record of a step that did not fail: ``text`` is what later steps see; a step with a
    schema also keeps the answer's ``value`` (the parsed JSON, for ``steps.ID.value.KEY``)."""
    entry = {"output": text, "outputs": [text], "error": None, "outcome": outcome.value}
    if step is not None and step.schema is not None and result is not None:
        entry["value"] = plain(result.output_value)
    return entry


def plain(value: Any) -> Any:
    """A pydantic value as plain JSON data (dicts and lists), anything else as it is."""
    dump = getattr(value, "model_dump", None)
    return dump(mode="json") if callable(dump) else value


def record_failure(run: RecipeRun, sid: str, output: str, error: BaseException, outcome: Outcome) -> None:
    """The record of a step that failed (and its entry in ``run.errors``)."""
    run.steps[sid] = {"output": output, "outputs": [output], "error": str(error), "outcome": outcome.value}
    run.errors.append((sid, str(error)))


def shown(record: Mapping[str, Any]) -> str:
    """A step's text among its siblings' (a block's outputs): a failed one as its mark."""
    if not record.get("error"):
        return str(record["output"])
    outcome = Outcome(record.get("outcome", "failed"))
    return marked(outcome if outcome is Outcome.CANCELLED else Outcome.FAILED, "", str(record["error"]))


def outcome_of_error(exc: BaseException) -> Outcome:
    if isinstance(exc, AgentCancelled):
        return Outcome.CANCELLED
    return Outcome(getattr(exc, "outcome", "failed"))


def step_table(run: RecipeRun) -> list[Mapping[str, Any]]:
    """One row per agent conversation: step, agent (``name[i]`` for a map item), state (its
    outcome: ``ok``, ``truncated``, ``empty``, ``failed: why``, the cancel reason; a non-answer
    a ``fail`` setting made a failure is ``truncated (failed)``), outcome, queued s, first
    token s, tokens, tok/s, slot and engine (its base URL on several engines or a Ray worker,
    else None), for ``squad run``'s summary; a map item a Ray worker served also has ``worker``
    and ``retried``, one a resumed run answered from its journal ``resumed`` (the run id)
    (:class:`~squad.runtime.results.AgentResult`)."""
    rows: list[Mapping[str, Any]] = []
    for sid, r in run.results:
        t = r.timings
        rows.append({
            "step": sid, "agent": r.label, "state": _state(r), "outcome": r.outcome.value,
            "queued_s": round(t.queued_s, 3), "first_token_s": None if t.ttft_s is None else round(t.ttft_s, 3),
            "prompt_tokens": r.usage.prompt_tokens, "completion_tokens": r.usage.completion_tokens,
            "tokens_per_s": None if t.tokens_per_s is None else round(t.tokens_per_s, 1),
            "slot": r.slot, "engine": r.engine, "total_s": round(t.total_s, 3),
            **({"worker": r.worker, "retried": r.retried} if r.worker or r.retried else {}),
            **({"resumed": r.resumed} if r.resumed else {}),
        })
    return rows


def _state(r: AgentResult) -> str:
    outcome = r.outcome
    if outcome is Outcome.CANCELLED:
        return r.cancelled_reason or str(r.error)
    if outcome is Outcome.FAILED:
        return f"failed: {r.error}"
    return f"{outcome.value} (failed)" if r.error is not None else outcome.value

"""Running a recipe's flow, step by step, on an open squad (:class:`squad.runtime.ops.SquadOps`).

A call step goes to ``Squad.run`` (the main agent: its @mentions run in parallel and are handed
back) or ``Squad.run_agent``; a parallel block's steps run at once (``policy``); a map runs its
prompt once per item (``concurrency`` at a time). Each non-answer flows on as the step's
``non_answers`` says (:mod:`squad.runtime.outcome`), with a :class:`~squad.events.StepWarning`
unless accepted; a step never runs on a failed step's output. Records: :mod:`squad.recipes.record`.
"""

from __future__ import annotations

from typing import Any

import anyio

from squad.errors import AgentCancelled, AgentRunError, IncompleteAnswer, MentionError, RecipeError
from squad.events import StepWarning
from squad.recipes.model import Recipe, Step
from squad.recipes.record import RecipeRun, entry, outcome_of_error, plain, record_failure, shown
from squad.runtime.conversation import incomplete_answer
from squad.runtime.journal import Resumable
from squad.runtime.ops import SquadOps
from squad.runtime.outcome import Outcome, fix_for, marked, worst
from squad.runtime.results import AgentResult
from squad.sched.share import sharing
from squad.templates import template_paths

__all__ = ["execute_flow"]


async def execute_flow(recipe: Recipe, squad: SquadOps, record: RecipeRun | None = None) -> RecipeRun:
    """Run ``recipe.flow`` on an open :class:`~squad.runtime.squad.Squad`, recording each step in
    ``record`` (a new :class:`RecipeRun` if None) as it finishes."""
    run = record if record is not None else RecipeRun(output="")
    for step in recipe.flow:
        await _step(recipe, squad, step, run)
    run.output = run.steps[recipe.flow[-1].id]["output"] if recipe.flow else ""
    return run


async def _step(recipe: Recipe, squad: SquadOps, step: Step, run: RecipeRun) -> None:
    _check_inputs(step, run)
    if step.kind == "parallel":
        await _parallel(recipe, squad, step, run)
    elif step.kind == "map":
        await _map(recipe, squad, step, run)
    else:
        prompt = recipe.render_prompt(step, run.steps, as_sent=True)
        result = await _call(recipe, squad, step, prompt, run, recipe.render_shared(step, run.steps))
        run.steps[step.id] = entry(_passed_on(squad, step, result, run), result.outcome, step, result)


async def _call(recipe: Recipe, squad: SquadOps, step: Step, prompt: str, run: RecipeRun,
                shared: str | None = None) -> AgentResult:
    """One call of ``step``; its result is in ``run.results``. Raises its error when it
    failed, or :class:`~squad.errors.IncompleteAnswer` for a non-answer ``step`` fails on.
    ``shared``: the step's rendered ``shared:`` context."""
    try:
        if step.agent == recipe.main:
            turn = await squad.run(prompt, output_type=step.schema)
            run.results.extend((step.id, r) for r in turn.subs)
            result = turn.main
        else:
            result = await squad.run_agent(step.agent, prompt, output_type=step.schema, shared=shared)
    except MentionError as exc:  # e.g. '@checker {{ x }}' with x empty: nothing to do
        raise RecipeError(f"step '{step.id}': {exc}", **{k: step.loc.get(k) for k in
                                                         ("file", "line", "column", "field")}) from None
    except AgentCancelled:
        raise
    except AgentRunError as exc:  # the row shows the failure; the error goes on as before
        run.results.append((step.id, AgentResult(agent=step.agent, error=exc)))
        raise
    run.results.append((step.id, result))
    if result.outcome in _fail_on(step):
        if isinstance(squad, Resumable):
            squad.forget(result)  # a failure: a resume sends it again
        result.error = incomplete_answer(result)
        _warn(squad, step, result, run)
        raise result.error
    return result


def _fail_on(step: Step) -> frozenset[Outcome]:
    """The non-answers ``step`` turns into failures (``non_answers: {...: fail}``)."""
    return frozenset(o for o in (Outcome.TRUNCATED, Outcome.EMPTY) if step.non_answers.get(o) == "fail")


def _passed_on(squad: SquadOps, step: Step, result: AgentResult, run: RecipeRun) -> str:
    """The text later steps see of ``result`` (one answer of ``step``): the answer; a
    non-answer as ``step.non_answers`` says (warning unless accepted); a failure's mark."""
    outcome = result.outcome
    if result.error is not None:
        _warn(squad, step, result, run)
        return result.marked_output
    if outcome is Outcome.OK or step.non_answers.get(outcome) == "accept":
        return result.output
    _warn(squad, step, result, run)
    return result.marked_output


def _warn(squad: SquadOps, step: Step, result: AgentResult, run: RecipeRun) -> None:
    """A :class:`StepWarning` for a truncated or empty answer (not for other failures: their
    errors are reported as errors)."""
    outcome = result.outcome
    if outcome not in (Outcome.TRUNCATED, Outcome.EMPTY):
        return
    handling = step.non_answers.get(outcome, "mark")
    thinking = result.cut_while_thinking
    what = ("the answer was cut while thinking, at max_tokens" if thinking and outcome is Outcome.TRUNCATED
            else f"the answer stopped at max_tokens ({result.max_tokens})" if outcome is Outcome.TRUNCATED
            else "the model gave an empty answer")
    effect = ("the step fails" if handling == "fail"
              else f"it is passed on marked {marked(outcome, '', thinking=thinking).strip()}")
    warning = (f"step '{step.id}' (agent '{result.label}'): {what}: "
               f"{fix_for(outcome, result.agent, result.max_tokens, thinking=thinking)}; "
               f"{effect} (non_answers.{outcome.value}: {handling})")
    run.warnings.append((step.id, warning))
    squad.emit(StepWarning(agent=result.agent, conversation=result.conversation, step=step.id, label=result.label,
                               outcome=outcome.value, handling=handling, warning=warning))


async def _parallel(recipe: Recipe, squad: SquadOps, step: Step, run: RecipeRun) -> None:
    simple = (all(s.kind == "call" and s.agent != recipe.main for s in step.steps)
              and len({_fail_on(s) for s in step.steps}) == 1 and len({s.schema for s in step.steps}) == 1)
    if simple:  # the runtime's own parallel block: policy, cancel reasons, one operation
        pairs = [(s.agent, recipe.render_prompt(s, run.steps, as_sent=True)) for s in step.steps]
        results = await squad.parallel(pairs, policy=step.policy, check=step.policy == "fail-fast",
                                       fail_on=_fail_on(step.steps[0]), output_type=step.steps[0].schema,
                                       shared=[recipe.render_shared(s, run.steps) for s in step.steps])
        for child, result in zip(step.steps, results):
            run.results.append((child.id, result))
            if result.error is not None:
                _warn(squad, child, result, run)
                record_failure(run, child.id, "", result.error, result.outcome)
            else:
                run.steps[child.id] = entry(_passed_on(squad, child, result, run), result.outcome, child, result)
    else:
        with sharing(_shared_items(recipe, step, run), squad.shared_input):  # squad.sched.share
            async with anyio.create_task_group() as tg:
                for child in step.steps:
                    tg.start_soon(_guarded, recipe, squad, child, run, step.policy)
    outputs = [shown(run.steps[c.id]) for c in step.steps]
    failed = [c.id for c in step.steps if run.steps[c.id].get("error")]
    error = f"all of its steps failed ({', '.join(failed)})" if failed and len(failed) == len(step.steps) else None
    run.steps[step.id] = {"output": "\n\n".join(o for o in outputs if o), "outputs": outputs, "error": error,
                          "outcome": worst(run.steps[c.id]["outcome"] for c in step.steps).value}


def _shared_items(recipe: Recipe, step: Step, run: RecipeRun) -> list[str]:
    """The declared ``shared:`` contexts (e.g. a chunk of one file put first) that two or more
    children of the parallel block ``step`` render the same: each starts those children's system
    messages, so its members may prefill it once (:func:`squad.sched.share.sharing`)."""
    seen: dict[str, int] = {}
    for child in step.steps:
        if not child.shared:
            continue
        try:
            if child.kind == "map":
                items = recipe.items(child, run.steps)
                extra: dict[str, Any] = {"chunks": len(items)} if child.split == "chunks" else {}
                texts = {recipe.render_shared(child, run.steps, item=item, index=i, **extra)
                         for i, item in enumerate(items)}
            else:
                texts = {recipe.render_shared(child, run.steps)}
        except Exception:  # noqa: BLE001 - the step reports its own error when it runs
            continue
        for text in texts - {None}:
            assert text is not None
            seen[text] = seen.get(text, 0) + 1
    return [text for text, n in seen.items() if n > 1]


async def _guarded(recipe: Recipe, squad: SquadOps, step: Step, run: RecipeRun, policy: str) -> None:
    try:
        await _step(recipe, squad, step, run)
    except AgentRunError as exc:
        if policy == "fail-fast":
            raise
        record_failure(run, step.id, "", exc, outcome_of_error(exc))


async def _map(recipe: Recipe, squad: SquadOps, step: Step, run: RecipeRun) -> None:
    items = recipe.items(step, run.steps)
    if not items:
        _empty_map(recipe, squad, step, run)
        return
    extra: dict[str, Any] = {"chunks": len(items)} if step.split == "chunks" else {}
    prompts = [recipe.render_prompt(step, run.steps, as_sent=True, item=item, index=i, **extra)
               for i, item in enumerate(items)]
    shared = [recipe.render_shared(step, run.steps, item=item, index=i, **extra) for i, item in enumerate(items)]
    outputs: list[str] = [""] * len(prompts)
    outcomes: list[Outcome] = [Outcome.OK] * len(prompts)
    values: list[Any] = [None] * len(prompts)
    if step.agent != recipe.main:
        results = await squad.map(step.agent, prompts, max_concurrency=step.concurrency, fail_on=_fail_on(step),
                                  output_type=step.schema, shared=shared)
        for i, result in enumerate(results):
            run.results.append((step.id, result))  # the result's label names the item
            outputs[i], outcomes[i] = _passed_on(squad, step, result, run), result.outcome
            values[i] = result.output_value
            if result.error is not None:
                run.errors.append((f"{step.id}[{i}]", str(result.error)))
    else:
        limiter = anyio.CapacityLimiter(step.concurrency or max(1, len(prompts)))

        async def one(i: int, prompt: str) -> None:
            async with limiter:
                try:
                    result = await _call(recipe, squad, step, prompt, run, shared[i])
                except AgentCancelled:
                    raise
                except AgentRunError as exc:
                    run.errors.append((f"{step.id}[{i}]", str(exc)))
                    outputs[i], outcomes[i] = marked(Outcome.FAILED, "", str(exc)), outcome_of_error(exc)
                    return
                outputs[i], outcomes[i] = _passed_on(squad, step, result, run), result.outcome
                values[i] = result.output_value

        async with anyio.create_task_group() as tg:
            for i, prompt in enumerate(prompts):
                tg.start_soon(one, i, prompt)
    failed = [(sid, message) for sid, message in run.errors if sid.startswith(f"{step.id}[")]
    error = None
    if prompts and len(failed) >= len(prompts):  # say why, not only that: the first item's own error
        error = f"all {len(prompts)} items failed ({failed[0][0]}: {failed[0][1]})"
    run.steps[step.id] = {"output": "\n".join(o for o in outputs if o), "outputs": outputs, "error": error,
                          "outcome": (Outcome.FAILED if error else worst(outcomes)).value}
    if step.schema is not None:  # each item's answer as its value (None where it failed)
        run.steps[step.id]["value"] = [plain(v) for v in values]


def _empty_map(recipe: Recipe, squad: SquadOps, step: Step, run: RecipeRun) -> None:
    """A map over no items: an empty answer (:mod:`squad.runtime.outcome`), never blank text passed on
    unmarked. A row in the run table (outcome ``empty``), and as ``non_answers.empty`` says:
    ``mark`` (the default) passes ``[empty answer]`` on with a warning, ``fail`` fails the step
    (:class:`~squad.errors.IncompleteAnswer`), ``accept`` passes ``""`` on."""
    why = recipe.no_items(step, run.steps) or "it gave no items"
    handling = step.non_answers.get(Outcome.EMPTY, "mark")
    source = ".".join(step.over)
    fix = (f"pass items with -p {step.over[1]}=..." if step.over[0] == "params"
           else f"check step '{step.over[1]}', whose output it maps over")
    problem = f"map step '{step.id}' over {source} has no items ({why}), so there is no answer; {fix}"
    result = AgentResult(agent=step.agent, output="")
    run.results.append((step.id, result))
    if handling == "fail":
        result.error = IncompleteAnswer(problem, agent=step.agent, outcome=Outcome.EMPTY.value)
    if handling != "accept":
        effect = "the step fails" if handling == "fail" else f"it is passed on marked {marked(Outcome.EMPTY, '')}"
        warning = f"{problem}; {effect} (non_answers.empty: {handling})"
        run.warnings.append((step.id, warning))
        squad.emit(StepWarning(agent=step.agent, conversation=None, step=step.id, label=step.agent,
                               outcome=Outcome.EMPTY.value, handling=handling, warning=warning))
    if result.error is not None:
        raise result.error
    text = "" if handling == "accept" else marked(Outcome.EMPTY, "")
    run.steps[step.id] = {"output": text, "outputs": [], "error": None, "outcome": Outcome.EMPTY.value}
    if step.schema is not None:
        run.steps[step.id]["value"] = []


def _check_inputs(step: Step, run: RecipeRun) -> None:
    """A step never runs on the output of a step that failed (policy collect lets the run go
    on, but an empty output must not be passed off as notes to work from).

    Raises :class:`AgentRunError` naming the step, the failed input and its error.
    """
    used = {path[1] for path in template_paths(step.prompt) if len(path) >= 2 and path[0] == "steps"}
    if len(step.over) >= 2 and step.over[0] == "steps":
        used.add(step.over[1])
    for sid in sorted(used):
        error = run.steps.get(sid, {}).get("error")
        if error:
            raise AgentRunError(f"step '{step.id}' uses the output of step '{sid}', which failed: {error}")

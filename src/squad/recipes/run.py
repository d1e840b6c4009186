"""Running a recipe's flow on a :class:`squad.runtime.squad.Squad`.

Each step's record is ``steps[ID] = {"output": text, "outputs": [texts], "error": message or
None, "outcome": ok|truncated|empty|failed|cancelled}`` (plus ``value``, parsed JSON, for a
step with a schema) for later templates: a call step, a parallel block (``fail-fast`` or
``collect``), a map (one output per item, in item order). Non-answers flow on as the step's
``non_answers`` says, never silently. The final output is the last step's ``output``; with an
output schema a miss is :class:`~squad.errors.InvalidOutput` keeping the raw text. MCP servers
start before the engine (:func:`recipe_mcp`) so their tool schemas count in ``auto`` budgets.

Design: docs/design/recipe-flow.md
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping, Protocol, Sequence

import anyio

from squad.errors import AgentCancelled, AgentRunError, MentionError, RecipeError, UserError
from squad.events import StepWarning
from squad.runtime.outcome import Outcome, fix_for, marked, worst
from squad.recipes.model import Recipe, Step
from squad.runtime.results import AgentResult, notes_of
from squad.sched.share import sharing

if TYPE_CHECKING:
    from squad.chat import ChatEngine
    from squad.mcp import MCPServers
    from squad.engine.info import EngineInfo
    from squad.sched.plan import EnginePlan
    from squad.events import EventSink
    from squad.runtime.ops import SquadOps
    from squad.engine.session import EngineSpec

__all__ = ["RecipeRun", "run_recipe", "execute_flow", "step_table", "recipe_mcp"]


class Fanout(Protocol):
    """Where a recipe's maps fan out (:class:`squad.cluster.ray.RayFanout`): :meth:`run` runs the
    whole flow there and returns what it produced."""

    async def run(self, recipe: Recipe, *, engine: Any, on_event: Any = None,
                  record: "RecipeRun | None" = None) -> "RecipeRun": ...


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
    (:meth:`~squad.cluster.ray.WorkerInfo.as_dict` and ``items``, how many it served), else empty.
    """

    output: str
    value: Any = None
    steps: dict[str, dict[str, Any]] = field(default_factory=dict)
    results: list[tuple[str, AgentResult]] = field(default_factory=list)
    errors: list[tuple[str, str]] = field(default_factory=list)
    warnings: list[tuple[str, str]] = field(default_factory=list)
    plan: "EnginePlan | None" = None
    info: "EngineInfo | None" = None
    workers: list[dict[str, Any]] = field(default_factory=list)

    @property
    def notes(self) -> list[tuple[str, str]]:
        steps: dict[str, list[AgentResult]] = {}
        for sid, result in self.results:
            steps.setdefault(sid, []).append(result)
        return [(sid, note) for sid, results in steps.items() for note in notes_of(results)]


async def run_recipe(
    recipe: Recipe,
    *,
    engine: "EngineSpec | EngineInfo | ChatEngine | Sequence[EngineSpec | EngineInfo | ChatEngine] | None" = None,
    on_event: "EventSink | list[EventSink] | None" = None,
    record: RecipeRun | None = None,
    ray: "Fanout | None" = None,
) -> RecipeRun:
    """Plan, launch (or attach, or use ``engine``), run the flow, close the engine.

    ``engine`` defaults to :meth:`Recipe.engine_specs` (the recipe's model and pins, or its
    ``engines:`` list); pass ``recipe.engine_spec().but(...)`` to override some, or a list for
    several engines (:mod:`squad.chat.routing`). ``record``: a :class:`RecipeRun` to
    fill as steps finish (and return); when the run fails it still holds the steps that
    finished. ``ray``: run the maps over a Ray cluster, each worker with its own engine
    launched from ``engine`` (:mod:`squad.cluster.ray`: which steps run where). Raises the failing agent's
    :class:`~squad.errors.AgentRunError` (fail-fast or a step whose output is needed),
    :class:`~squad.errors.UserError` for a final output that misses the schema.
    """
    from squad.runtime.squad import Squad

    engines = list(engine) if isinstance(engine, (list, tuple)) else [engine] if engine else recipe.engine_specs()
    if ray is not None:
        if len(engines) != 1:
            raise UserError("--ray launches one engine per worker from the recipe's engine: a recipe with several "
                            "engines (engines:) runs on this machine; drop --ray, or give the recipe one engine:")
        run = await ray.run(recipe, engine=engines[0], on_event=on_event, record=record)
    else:
        async with recipe_mcp(recipe) as servers, Squad(
            list(recipe.agents.values()), main=recipe.main, engines=engines,
            workload=recipe.workload(), on_event=on_event, variables={"params": recipe.params}, mcp_servers=servers,
            shared_input=recipe.shared_input,
        ) as squad:
            run = await execute_flow(recipe, squad, record)
            run.plan, run.info = squad.session.plan, squad.info
    if recipe.output_schema is not None:
        last, sent = run.steps.get(recipe.flow[-1].id, {}), recipe.flow[-1].schema
        validated = "value" in last and sent is not None and sent.schema == recipe.output_schema
        run.value = last["value"] if validated else recipe.check_output(run.output)
    return run


@asynccontextmanager
async def recipe_mcp(recipe: Recipe) -> "AsyncIterator[MCPServers]":
    """Start ``recipe``'s MCP servers (none: nothing starts), check the MCP tools each agent
    names against what its server lists, and count those tools' schemas into the ``auto``
    budgets (:func:`squad.recipes.budgets.plan_budgets`); the servers stop on exit.

    Raises :class:`~squad.errors.MCPServerError` for a server that does not start, and
    :class:`RecipeError` at the agent's ``tools`` entry for a tool its server does not have.
    """
    from squad.mcp import MCPServers, is_mcp_ref
    from squad.recipes.budgets import plan_budgets

    async with MCPServers(recipe.mcp_servers) as servers:
        if recipe.mcp_servers:
            specs = {}
            for agent in recipe.agents.values():
                subs = [f"ask_{n}" for n in agent.agents] if agent.sub_agent_tools else []
                try:
                    specs[agent.name] = [t.spec() for t in servers.tools_for(
                        agent, taken=[t for t in agent.tools if not is_mcp_ref(t)] + subs).values()]
                except UserError as exc:
                    raise _at_tool(recipe, agent.name, exc) from None
            unset = {n for n, p in recipe.param_specs.items() if p.required and recipe.params.get(n) is None}
            plan_budgets(recipe, unset=unset, tools=specs)
        yield servers


def _at_tool(recipe: Recipe, agent: str, exc: UserError) -> RecipeError:
    """``exc`` (about one of ``agent``'s MCP tools) at that tool's place in the recipe."""
    text = str(exc)
    found = [(ref, loc) for (name, ref), loc in recipe.tool_locs.items() if name == agent]
    for ref, loc in found:
        if f"lists tool {ref!r}" in text:
            return RecipeError(text, **loc)
    if "gets two tools named" in text:  # at the second of the two (the one listed later)
        server_tool = text.rsplit(" and ", 1)[-1].split(";")[0].strip()
        for ref, loc in reversed(found):
            server = ref.split(".", 1)[0]
            if ref == server_tool or (ref.endswith(".*") and server_tool.startswith(f"{server}.")):
                return RecipeError(text, **loc)
        if found:
            return RecipeError(text, **found[-1][1])
    return RecipeError(str(exc), file=str(recipe.path))


async def execute_flow(recipe: Recipe, squad: "SquadOps", record: RecipeRun | None = None) -> RecipeRun:
    """Run ``recipe.flow`` on an open :class:`~squad.runtime.squad.Squad`, recording each step in
    ``record`` (a new :class:`RecipeRun` if None) as it finishes."""
    run = record if record is not None else RecipeRun(output="")
    for step in recipe.flow:
        await _step(recipe, squad, step, run)
    run.output = run.steps[recipe.flow[-1].id]["output"] if recipe.flow else ""
    return run


async def _step(recipe: Recipe, squad: "SquadOps", step: Step, run: RecipeRun) -> None:
    _check_inputs(step, run)
    if step.kind == "parallel":
        await _parallel(recipe, squad, step, run)
    elif step.kind == "map":
        await _map(recipe, squad, step, run)
    else:
        prompt = recipe.render_prompt(step, run.steps, as_sent=True)
        result = await _call(recipe, squad, step, prompt, run)
        run.steps[step.id] = _entry(_passed_on(squad, step, result, run), result.outcome, step, result)


async def _call(recipe: Recipe, squad: "SquadOps", step: Step, prompt: str, run: RecipeRun) -> AgentResult:
    """One call of ``step``; its result is in ``run.results``. Raises its error when it
    failed, or :class:`~squad.errors.IncompleteAnswer` for a non-answer ``step`` fails on."""
    from squad.runtime.squad import incomplete_answer

    try:
        if step.agent == recipe.main:
            turn = await squad.run(prompt, output_type=step.schema)
            run.results.extend((step.id, r) for r in turn.subs)
            result = turn.main
        else:
            result = await squad.run_agent(step.agent, prompt, output_type=step.schema)
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
        result.error = incomplete_answer(result)
        _warn(squad, step, result, run)
        raise result.error
    return result


def _fail_on(step: Step) -> frozenset[Outcome]:
    """The non-answers ``step`` turns into failures (``non_answers: {...: fail}``)."""
    return frozenset(o for o in (Outcome.TRUNCATED, Outcome.EMPTY) if step.non_answers.get(o) == "fail")


def _passed_on(squad: "SquadOps", step: Step, result: AgentResult, run: RecipeRun) -> str:
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


def _warn(squad: "SquadOps", step: Step, result: AgentResult, run: RecipeRun) -> None:
    """A :class:`StepWarning` for a truncated or empty answer (not for other failures: their
    errors are reported as errors)."""
    outcome = result.outcome
    if outcome not in (Outcome.TRUNCATED, Outcome.EMPTY):
        return
    handling = step.non_answers.get(outcome, "mark")
    what = (f"the answer stopped at max_tokens ({result.max_tokens})" if outcome is Outcome.TRUNCATED
            else "the model gave an empty answer")
    effect = ("the step fails" if handling == "fail"
              else f"it is passed on marked {marked(outcome, '').strip()}")
    warning = (f"step '{step.id}' (agent '{result.label}'): {what}: {fix_for(outcome, result.agent, result.max_tokens)}; "
               f"{effect} (non_answers.{outcome.value}: {handling})")
    run.warnings.append((step.id, warning))
    squad.emit(StepWarning(agent=result.agent, conversation=result.conversation, step=step.id, label=result.label,
                               outcome=outcome.value, handling=handling, warning=warning))


async def _parallel(recipe: Recipe, squad: "SquadOps", step: Step, run: RecipeRun) -> None:
    simple = (all(s.kind == "call" and s.agent != recipe.main for s in step.steps)
              and len({_fail_on(s) for s in step.steps}) == 1 and len({s.schema for s in step.steps}) == 1)
    if simple:  # the runtime's own parallel block: policy, cancel reasons, one operation
        pairs = [(s.agent, recipe.render_prompt(s, run.steps, as_sent=True)) for s in step.steps]
        results = await squad.parallel(pairs, policy=step.policy, check=step.policy == "fail-fast",
                                       fail_on=_fail_on(step.steps[0]), output_type=step.steps[0].schema)
        for child, result in zip(step.steps, results):
            run.results.append((child.id, result))
            if result.error is not None:
                _warn(squad, child, result, run)
                _record(run, child.id, "", result.error, result.outcome)
            else:
                run.steps[child.id] = _entry(_passed_on(squad, child, result, run), result.outcome, child, result)
    else:
        with sharing(_shared_items(recipe, step, run), squad.shared_input):  # squad.sched.share
            async with anyio.create_task_group() as tg:
                for child in step.steps:
                    tg.start_soon(_guarded, recipe, squad, child, run, step.policy)
    outputs = [_shown(run.steps[c.id]) for c in step.steps]
    failed = [c.id for c in step.steps if run.steps[c.id].get("error")]
    error = f"all of its steps failed ({', '.join(failed)})" if failed and len(failed) == len(step.steps) else None
    run.steps[step.id] = {"output": "\n\n".join(o for o in outputs if o), "outputs": outputs, "error": error,
                          "outcome": worst(run.steps[c.id]["outcome"] for c in step.steps).value}


def _shared_items(recipe: Recipe, step: Step, run: RecipeRun) -> list[str]:
    """The map items (e.g. chunks of one file) that two or more children of the parallel block
    ``step`` go over: each is text those children's prompts share (:func:`squad.sched.share.sharing`)."""
    seen: dict[str, int] = {}
    for child in step.steps:
        if child.kind != "map":
            continue
        try:
            items = recipe.items(child, run.steps)
        except Exception:  # noqa: BLE001 - the map reports its own error when it runs
            continue
        for item in {str(i) for i in items}:
            seen[item] = seen.get(item, 0) + 1
    return [item for item, n in seen.items() if n > 1]


async def _guarded(recipe: Recipe, squad: "SquadOps", step: Step, run: RecipeRun, policy: str) -> None:
    try:
        await _step(recipe, squad, step, run)
    except AgentRunError as exc:
        if policy == "fail-fast":
            raise
        _record(run, step.id, "", exc, _outcome_of_error(exc))


async def _map(recipe: Recipe, squad: "SquadOps", step: Step, run: RecipeRun) -> None:
    items = recipe.items(step, run.steps)
    if not items:
        _empty_map(recipe, squad, step, run)
        return
    extra = {"chunks": len(items)} if step.split == "chunks" else {}
    prompts = [recipe.render_prompt(step, run.steps, as_sent=True, item=item, index=i, **extra)
               for i, item in enumerate(items)]
    outputs: list[str] = [""] * len(prompts)
    outcomes: list[Outcome] = [Outcome.OK] * len(prompts)
    values: list[Any] = [None] * len(prompts)
    if step.agent != recipe.main:
        results = await squad.map(step.agent, prompts, max_concurrency=step.concurrency, fail_on=_fail_on(step),
                                  output_type=step.schema)
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
                    result = await _call(recipe, squad, step, prompt, run)
                except AgentCancelled:
                    raise
                except AgentRunError as exc:
                    run.errors.append((f"{step.id}[{i}]", str(exc)))
                    outputs[i], outcomes[i] = marked(Outcome.FAILED, "", str(exc)), _outcome_of_error(exc)
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
        run.steps[step.id]["value"] = [_plain(v) for v in values]


def _empty_map(recipe: Recipe, squad: "SquadOps", step: Step, run: RecipeRun) -> None:
    """A map over no items: an empty answer (:mod:`squad.runtime.outcome`), never blank text passed on
    unmarked. A row in the run table (outcome ``empty``), and as ``non_answers.empty`` says:
    ``mark`` (the default) passes ``[empty answer]`` on with a warning, ``fail`` fails the step
    (:class:`~squad.errors.IncompleteAnswer`), ``accept`` passes ``""`` on."""
    from squad.errors import IncompleteAnswer

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
    from squad.templates import template_paths

    used = {path[1] for path in template_paths(step.prompt) if len(path) >= 2 and path[0] == "steps"}
    if len(step.over) >= 2 and step.over[0] == "steps":
        used.add(step.over[1])
    for sid in sorted(used):
        error = run.steps.get(sid, {}).get("error")
        if error:
            raise AgentRunError(f"step '{step.id}' uses the output of step '{sid}', which failed: {error}")


def _entry(text: str, outcome: Outcome, step: Step | None = None, result: AgentResult | None = None) -> dict[str, Any]:
    """The record of a step that did not fail: ``text`` is what later steps see; a step with a
    schema also keeps the answer's ``value`` (the parsed JSON, for ``steps.ID.value.KEY``)."""
    entry = {"output": text, "outputs": [text], "error": None, "outcome": outcome.value}
    if step is not None and step.schema is not None and result is not None:
        entry["value"] = _plain(result.output_value)
    return entry


def _plain(value: Any) -> Any:
    """A pydantic value as plain JSON data (dicts and lists), anything else as it is."""
    dump = getattr(value, "model_dump", None)
    return dump(mode="json") if callable(dump) else value


def _record(run: RecipeRun, sid: str, output: str, error: BaseException, outcome: Outcome) -> None:
    """The record of a step that failed (and its entry in ``run.errors``)."""
    run.steps[sid] = {"output": output, "outputs": [output], "error": str(error), "outcome": outcome.value}
    run.errors.append((sid, str(error)))


def _shown(record: Mapping[str, Any]) -> str:
    """A step's text among its siblings' (a block's outputs): a failed one as its mark."""
    if not record.get("error"):
        return str(record["output"])
    outcome = Outcome(record.get("outcome", "failed"))
    return marked(outcome if outcome is Outcome.CANCELLED else Outcome.FAILED, "", str(record["error"]))


def _outcome_of_error(exc: BaseException) -> Outcome:
    if isinstance(exc, AgentCancelled):
        return Outcome.CANCELLED
    return Outcome(getattr(exc, "outcome", "failed"))


def step_table(run: RecipeRun) -> list[Mapping[str, Any]]:
    """One row per agent conversation: step, agent (``name[i]`` for a map item), state (its
    outcome: ``ok``, ``truncated``, ``empty``, ``failed: why``, the cancel reason; a non-answer
    a ``fail`` setting made a failure is ``truncated (failed)``), outcome, queued s, first
    token s, tokens, tok/s, slot and engine (its base URL on several engines or a Ray worker,
    else None), for ``squad run``'s summary; a map item a Ray worker served also has ``worker``
    and ``retried`` (:class:`~squad.runtime.results.AgentResult`)."""
    rows = []
    for sid, r in run.results:
        t = r.timings
        rows.append({
            "step": sid, "agent": r.label, "state": _state(r), "outcome": r.outcome.value,
            "queued_s": round(t.queued_s, 3), "first_token_s": None if t.ttft_s is None else round(t.ttft_s, 3),
            "prompt_tokens": r.usage.prompt_tokens, "completion_tokens": r.usage.completion_tokens,
            "tokens_per_s": None if t.tokens_per_s is None else round(t.tokens_per_s, 1),
            "slot": r.slot, "engine": r.engine, "total_s": round(t.total_s, 3),
            **({"worker": r.worker, "retried": r.retried} if r.worker or r.retried else {}),
        })
    return rows


def _state(r: AgentResult) -> str:
    outcome = r.outcome
    if outcome is Outcome.CANCELLED:
        return r.cancelled_reason or str(r.error)
    if outcome is Outcome.FAILED:
        return f"failed: {r.error}"
    return f"{outcome.value} (failed)" if r.error is not None else outcome.value

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

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from squad.errors import RecipeError, UserError
from squad.mcp import MCPServers, is_mcp_ref
from squad.recipes.budgets import plan_budgets
from squad.recipes.model import Recipe
from squad.recipes.record import RecipeRun, step_table
from squad.recipes.steps import execute_flow
from squad.runtime.journal import Resumable, RunJournal
from squad.runtime.ops import SquadOps
from squad.runtime.squad import Squad

if TYPE_CHECKING:
    from squad.chat import ChatEngine
    from squad.engine.info import EngineInfo
    from squad.engine.session import EngineSpec
    from squad.events import EventSink

__all__ = ["RecipeRun", "run_recipe", "execute_flow", "step_table", "recipe_mcp"]


class Fanout(Protocol):
    """Where a recipe's maps fan out (:class:`squad.cluster.ray.RayFanout`): :meth:`run` runs the
    whole flow there and returns what it produced."""

    async def run(self, recipe: Recipe, *, engine: Any, on_event: Any = None,
                  record: RecipeRun | None = None) -> RecipeRun: ...


async def run_recipe(
    recipe: Recipe,
    *,
    engine: EngineSpec | EngineInfo | ChatEngine | Sequence[EngineSpec | EngineInfo | ChatEngine] | None = None,
    on_event: EventSink | list[EventSink] | None = None,
    record: RecipeRun | None = None,
    ray: Fanout | None = None,
    journal: RunJournal | None = None,
) -> RecipeRun:
    """Plan, launch (or attach, or use ``engine``), run the flow, close the engine.

    ``engine`` defaults to :meth:`Recipe.engine_specs` (the recipe's model and pins, or its
    ``engines:`` list); pass ``recipe.engine_spec().but(...)`` to override some, or a list for
    several engines (:mod:`squad.chat.routing`). ``record``: a :class:`RecipeRun` to
    fill as steps finish (and return); when the run fails it still holds the steps that
    finished. ``ray``: run the maps over a Ray cluster, each worker with its own engine
    launched from ``engine`` (:mod:`squad.cluster.ray`: which steps run where). ``journal``: record
    every finished call there, and answer the calls it holds from it (a resumed run,
    :func:`squad.recipes.resume.recipe_journal`; not with ``ray``). Raises the failing agent's
    :class:`~squad.errors.AgentRunError` (fail-fast or a step whose output is needed),
    :class:`~squad.errors.UserError` for a final output that misses the schema.
    """
    engines: list[Any] = list(engine) if isinstance(engine,
                                                    (list, tuple)) else [engine] if engine else recipe.engine_specs()
    if ray is not None:
        if journal is not None:
            raise UserError("a run over Ray (--ray) keeps no journal and cannot be resumed: drop --resume, or run "
                            "without --ray")
        if len(engines) != 1:
            raise UserError("--ray launches one engine per worker from the recipe's engine: a recipe with several "
                            "engines (engines:) runs on this machine; drop --ray, or give the recipe one engine:")
        run = await ray.run(recipe, engine=engines[0], on_event=on_event, record=record)
    else:
        try:
            run = await _local(recipe, engines, on_event, record, journal)
        finally:
            if journal is not None:
                journal.close()
    if recipe.output_schema is not None:
        last, sent = run.steps.get(recipe.flow[-1].id, {}), recipe.flow[-1].schema
        validated = "value" in last and sent is not None and sent.schema == recipe.output_schema
        run.value = last["value"] if validated else recipe.check_output(run.output)
    return run


async def _local(recipe: Recipe, engines: list[Any], on_event: Any, record: RecipeRun | None,
                 journal: RunJournal | None) -> RecipeRun:
    """The flow on a squad of this machine (the recipe's MCP servers up first); every finished call
    recorded in ``journal`` and the calls it holds answered from it, when given."""
    if journal is not None and record is not None:
        record.journal = journal
    async with recipe_mcp(recipe) as servers, Squad(
        list(recipe.agents.values()), main=recipe.main, engines=engines,
        workload=recipe.workload(), on_event=on_event, variables={"params": recipe.params}, mcp_servers=servers,
        shared_input=recipe.shared_input,
    ) as squad:
        ops: SquadOps = squad
        if journal is not None:
            info = squad.info
            journal.note_engine(Path(info.model_path).name if info.model_path else info.model_alias or "unknown")
            ops = Resumable(squad, journal)
        run = await execute_flow(recipe, ops, record)
        run.plan, run.info, run.journal = squad.session.plan, squad.info, journal
    return run


@asynccontextmanager
async def recipe_mcp(recipe: Recipe) -> AsyncIterator[MCPServers]:
    """Start ``recipe``'s MCP servers (none: nothing starts), check the MCP tools each agent
    names against what its server lists, and count those tools' schemas into the ``auto``
    budgets (:func:`squad.recipes.budgets.plan_budgets`); the servers stop on exit.

    Raises :class:`~squad.errors.MCPServerError` for a server that does not start, and
    :class:`RecipeError` at the agent's ``tools`` entry for a tool its server does not have.
    """
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

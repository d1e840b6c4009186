"""A recipe's ``auto`` budgets from the real, counted work, and its budgets against its model.

Reads the model's GGUF only when it is already on disk (:mod:`squad.recipes.modelfile`; never
downloads, never starts an engine; without the file run time checks again). A fixed prompt
against a fixed budget is :func:`~squad.recipes.fixed_prompts.check_prompts`.
:func:`plan_budgets`: an ``auto`` budget = max over the agent's steps of (prompt + max_tokens +
:func:`headroom`) plus tool rounds (:data:`TOOL_RESULT_TOKENS` each for results; a
:class:`ToolRoundsWarning` when they cannot fit) and schema retries, rounded up to 256 and
capped by the training context. A prompt too long even alone is a
:class:`~squad.errors.RecipeError` naming the step, the counted tokens and the limit.

Design: docs/design/budgets.md
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence, Set
from typing import Any

from squad.chat.structured import RETRY_TOKENS
from squad.engine.llama import round_ctx
from squad.engine.tokens import GGUFCounter, NotExact
from squad.errors import RecipeError, SquadError
from squad.recipes.fixed_prompts import BYTES_PER_TOKEN, check_prompts, check_size, is_unset, step_loc
from squad.recipes.model import Recipe, RecipeWarning, Step, StepBudget
from squad.recipes.modelfile import chat_counter, engine_template, model_file, n_ctx_train
from squad.runtime.agent import Agent, sub_agent_names
from squad.runtime.mention import parse_mentions, unmark
from squad.runtime.toolroom import MAX_TOOL_ROUNDS
from squad.runtime.turn import agent_tools
from squad.sched.share import with_shared
from squad.templates import AnyValue, template_paths

__all__ = ["model_file", "n_ctx_train", "engine_template", "check_prompts", "plan_budgets", "headroom",
           "HEADROOM_SHARE", "TOOL_RESULT_TOKENS", "tool_rounds", "ToolRoundsWarning", "HEADROOM_MIN",
           "BYTES_PER_TOKEN"]

HEADROOM_SHARE = 0.10
"""Share of (prompt + max_tokens) an auto budget adds for follow-up turns and tool rounds."""

HEADROOM_MIN = 64
"""The least headroom an auto budget adds, in tokens."""

_STAND_IN = " word"
"""One token of stand-in text for an output not known before the run (a space + a common
word is one token in byte-level BPE vocabularies)."""


def headroom(tokens: int) -> int:
    """Headroom in tokens on top of ``tokens`` (prompt + max_tokens): 10 %, at least 64."""
    return max(HEADROOM_MIN, math.ceil(tokens * HEADROOM_SHARE))

def plan_budgets(recipe: Recipe, *, unset: Set[str] = frozenset(),
                 tools: Mapping[str, Sequence[Mapping[str, Any]]] | None = None) -> None:
    """Count every step's prompt and set each ``auto`` agent's budget from it (rule in the
    module docstring). Sets ``recipe.budgets`` (one :class:`StepBudget` per counted step and
    agent) and replaces auto agents in ``recipe.agents`` by copies with the planned budget.
    ``tools``: more tool definitions per agent name (its MCP tools' ``spec()``), counted in
    its prompts. Planning again (with ``tools`` now known) starts from the auto budgets.

    An agent none of whose prompts can be counted (no model file, a tokenizer not reproduced,
    parameters in ``unset``, only called as a tool) keeps ``auto``: the planner shares the
    context (:func:`squad.sched.planner.auto_budget`). Raises :class:`RecipeError` at the step when a
    prompt is too long for the model even alone.
    """
    counter = chat_counter(recipe.model)
    trained = n_ctx_train(recipe.model)
    if counter is None:
        return
    for name in recipe.planned:  # planned before: count again from auto
        recipe.agents[name] = recipe.agents[name].model_copy(update={"budget": "auto"})
    recipe.warnings[:] = [w for w in recipe.warnings if not isinstance(w, ToolRoundsWarning)]  # said again if still so
    extra = {name: list(specs) for name, specs in (tools or {}).items()}
    rows: list[StepBudget] = []
    outputs: dict[str, dict[str, Any]] = {}
    sizes: dict[str, int] = {}
    for step in recipe.flow:
        rows += _plan_step(recipe, step, counter, trained, outputs, sizes, unset, extra)
    best: dict[str, int] = {}
    for row in rows:
        if not row.fixed:
            best[row.agent] = max(best.get(row.agent, 0), row.budget)
    for name, budget in best.items():
        agent = recipe.agents[name]
        recipe.agents[name] = agent.model_copy(update={"budget": max(budget, agent.max_tokens + 1)})
    recipe.budgets = tuple(rows)
    recipe.planned = frozenset(best)


def _plan_step(recipe: Recipe, step: Step, counter: GGUFCounter, trained: int | None,
               outputs: dict[str, dict[str, Any]], sizes: dict[str, int], unset: Set[str],
               extra: Mapping[str, list[Mapping[str, Any]]]) -> list[StepBudget]:
    """Rows for ``step`` (and its children); records its stand-in output for later steps."""
    if step.kind == "parallel":
        rows = []
        for child in step.steps:
            rows += _plan_step(recipe, child, counter, trained, outputs, sizes, unset, extra)
        sizes[step.id] = sum(sizes[c.id] for c in step.steps)
        outputs[step.id] = {"output": _stand_in(sizes[step.id]),
                            "outputs": [outputs[c.id]["output"] for c in step.steps]}
        return rows
    agent = recipe.agents[step.agent]
    refs = template_paths(step.prompt)
    estimated = any(r[0] == "steps" for r in refs) or bool(step.mentions)
    items: list[Any] = [None]
    count = 1
    if step.kind == "map":
        if step.over[0] == "params":
            items = recipe.items(step, outputs) if recipe.params.get(step.over[1]) is not None else []
            count = len(items)
        else:
            items, estimated = [outputs[step.over[1]]["output"]], True
    before = dict(outputs)  # the prompt sees only earlier steps
    sizes[step.id] = agent.max_tokens * max(1, count)
    outputs[step.id] = {"output": _stand_in(sizes[step.id]), "outputs": [_stand_in(agent.max_tokens)] * max(1, count),
                        "value": (AnyValue.many(_stand_in(agent.max_tokens)) if step.kind == "map"
                                  else AnyValue(_stand_in(agent.max_tokens)))}
    if any(is_unset(r, unset) for r in refs) or any(is_unset(r, unset) for r in template_paths(agent.instructions)):
        return []
    worst: dict[str, int] = {}
    extra_tools = extra
    for index, item in enumerate(items):
        values: dict[str, Any] = {"item": item, "index": index} if step.kind == "map" else {}
        if step.kind == "map" and step.split == "chunks":
            values["chunks"] = count
        for name, prompt in _counted(recipe, step, agent, counter, trained, before, values, extra_tools):
            worst[name] = max(worst.get(name, 0), prompt)
    uses_steps = any(r[0] == "steps" for r in refs)
    return [_row(recipe, step, name, prompt, estimated and (name == agent.name or uses_steps), trained, extra)
            for name, prompt in worst.items()]


def _row(recipe: Recipe, step: Step, name: str, prompt: int, est: bool, trained: int | None,
         extra: Mapping[str, list[Mapping[str, Any]]]) -> StepBudget:
    """The budget agent ``name`` needs for ``step`` with a ``prompt`` of that many tokens
    (``est``: an estimate); adds warnings to ``recipe``, raises when it cannot fit at all."""
    who = recipe.agents[name]
    need = prompt + who.max_tokens
    if (step.schema is not None and name == step.agent) or who.output_type is not None:
        need += who.max_tokens + RETRY_TOKENS  # room to ask once more: the missed answer + the error
    if trained is not None and need > trained and not est:
        raise _too_large(step, who, prompt, trained)
    rounds = tool_rounds(who, bool(extra.get(name)))
    loop = rounds * (who.max_tokens + TOOL_RESULT_TOKENS)  # each round: a call, then its results
    budget = round_ctx(need + loop + headroom(need + loop))
    if trained is not None:
        budget = min(budget, trained)
    if who.fixed_budget is not None:
        budget = who.fixed_budget
    if rounds and need + loop > budget and not (trained is not None and need > trained):
        _warn_once(recipe, _rounds_warning(step, who, need, rounds, budget, trained))
    if trained is not None and need > trained and est:
        recipe.warnings.append(RecipeWarning(
            f"step '{step.id}' (agent '{name}') may need ~{need:,} tokens (estimated with earlier outputs at "
            f"their max_tokens), above the model's training context {trained:,}; its budget is capped there",
            **step_loc(step)))
    return StepBudget(step=step.id, agent=name, prompt=prompt, max_tokens=who.max_tokens, budget=budget,
                      estimated=est, fixed=who.fixed_budget is not None, tool_rounds=rounds, tool_tokens=loop,
                      thinking_budget=who.thinking_budget)


def _counted(recipe: Recipe, step: Step, agent: Agent, counter: GGUFCounter, trained: int | None,
             outputs: dict[str, dict[str, Any]], extra: dict[str, Any],
             more_tools: Mapping[str, list[Mapping[str, Any]]]) -> list[tuple[str, int]]:
    """``(agent, prompt tokens)`` for the agent of ``step`` and each sub-agent it @mentions."""
    try:
        marked = recipe.render_prompt(step, outputs, as_sent=True, capped=False, **extra)  # split as the run does
    except SquadError:
        return []
    out: list[tuple[str, int]] = []
    subs_allowance = sum(recipe.agents[m].max_tokens for m in step.mentions)
    sends = [(agent, unmark(marked), subs_allowance)]
    if step.mentions:
        known = sub_agent_names(agent, recipe.agents, recipe.main)
        sends += [(recipe.agents[d.agent], d.text, 0) for d in parse_mentions(marked, known).dispatches]
    for who, text, allowance in sends:
        subs = [recipe.agents[n] for n in sub_agent_names(who, recipe.agents, recipe.main)]
        try:
            system = who.system_prompt(subs, {"params": recipe.params})
            if who is agent:
                system = with_shared(recipe.render_shared(step, outputs, **extra), system)
        except SquadError:
            continue
        check_size(step, who, system + text, trained)
        messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": text}]
        listed: list[dict[str, Any]] = (_tool_specs(who, subs) or []) + [dict(t) for t in more_tools.get(who.name, ())]
        tools = listed or None
        try:
            try:
                prompt = counter.count_chat(messages, tools)
            except NotExact:  # a template that formats tools in C++: count without, an estimate on top
                prompt = counter.count_chat(messages) + (_tools_estimate(counter, tools) if tools else 0)
        except NotExact:
            continue
        out.append((who.name, prompt + allowance))
    return out


TOOL_RESULT_TOKENS = 256
"""Tokens an ``auto`` budget plans for the results of each tool round (on top of ``max_tokens``
for the call); a larger result is cut to the room left at run time (:mod:`squad.runtime.toolroom`)."""


def tool_rounds(agent: Agent, has_more_tools: bool = False) -> int:
    """The tool rounds an ``auto`` budget plans for ``agent``: its ``max_tool_rounds`` (else the
    squad's default, :data:`squad.runtime.toolroom.MAX_TOOL_ROUNDS`) when it has tools (its ``tools``,
    sub-agents as tools, or ``has_more_tools``), else 0."""
    has = bool(agent.tools) or (agent.sub_agent_tools and bool(agent.agents)) or has_more_tools
    return (agent.max_tool_rounds or MAX_TOOL_ROUNDS) if has else 0


class ToolRoundsWarning(RecipeWarning):
    """A budget that cannot hold an agent's tool rounds (made again each time budgets are planned)."""


def _rounds_warning(step: Step, agent: Agent, need: int, rounds: int, budget: int,
                    trained: int | None) -> RecipeWarning:
    """A budget that holds the prompt and the answer but not every tool round: results get cut."""
    per = agent.max_tokens + TOOL_RESULT_TOKENS
    fits = max(0, (budget - need) // per)
    wanted = round_ctx(need + rounds * per + headroom(need + rounds * per))
    fixes = []
    if agent.fixed_budget is not None and (trained is None or wanted <= trained):
        fixes.append(f"raise agents.{agent.name}.budget to {wanted:,}")
    fixes.append(f"set agents.{agent.name}.max_tool_rounds: {max(1, fits)}" if fits < rounds
                 else f"lower agents.{agent.name}.max_tokens")
    why = (f"the model's training context of {trained:,}" if agent.fixed_budget is None and trained is not None
           else f"its budget of {budget:,}")
    return ToolRoundsWarning(
        f"step '{step.id}' (agent '{agent.name}'): its {rounds} tool round(s) need ~{need + rounds * per:,} tokens "
        f"(prompt and answer {need:,} + {rounds} x ({agent.max_tokens} for a call + {TOOL_RESULT_TOKENS} for its "
        f"results)), more than {why} holds; room is left for {fits} round(s), later results are cut to what is left "
        f"(tool_results: cut) or fail the step (tool_results: fail): " + ", or ".join(fixes), **step_loc(step))


def _warn_once(recipe: Recipe, warning: RecipeWarning) -> None:
    """Add ``warning`` unless the same one is there (budgets are planned again once MCP tools are known)."""
    if str(warning) not in {str(w) for w in recipe.warnings}:
        recipe.warnings.append(warning)


TOOL_WORDS_TOKENS = 128
"""Tokens a chat template adds around tool definitions (how to call them), on top of their JSON,
when the counter cannot render that template's tools itself (squad's own templates are exact)."""


def _tools_estimate(counter: GGUFCounter, tools: list[dict[str, Any]]) -> int:
    return counter.count_text(json.dumps(tools, ensure_ascii=False)) + TOOL_WORDS_TOKENS


def _stand_in(tokens: int) -> str:
    return _STAND_IN * tokens


def _tool_specs(agent: Agent, subs: list[Agent]) -> list[dict[str, Any]] | None:
    """The ``ask_<name>`` tool definitions the runtime offers ``agent`` (function tools are
    registered in Python, not known to a recipe)."""
    if not (agent.sub_agent_tools and agent.agents):
        return None
    async def ask(sub: Agent, task: str) -> Any:  # never called: only the schemas are counted
        raise NotImplementedError

    bare = agent.model_copy(update={"tools": ()})
    return [t.spec() for t in agent_tools(bare, {}, [s for s in subs if s.name in agent.agents], ask).values()] or None


def _too_large(step: Step, agent: Agent, prompt: int, trained: int) -> RecipeError:
    need = prompt + agent.max_tokens
    return RecipeError(
        f"step '{step.id}' (agent '{agent.name}') cannot fit in the model even alone: its prompt is {prompt:,} "
        f"tokens (counted with the model's tokenizer) + max_tokens {agent.max_tokens} = {need:,}, above the "
        f"model's training context of {trained:,} tokens; use a model with a bigger context, shorten the input, "
        f"or spread it over a map step (split: chunks)", **step_loc(step))

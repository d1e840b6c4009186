"""A recipe's budgets against its model file, checked before any engine starts.

Reads the model's GGUF only when it is already on disk (never downloads, never starts an
engine; without the file the checks are skipped and run time checks again).
:func:`n_ctx_train`: the training context in tokens. :func:`check_prompts`: a prompt known
before the run, counted exactly, over the agent's budget is a :class:`~squad.errors.RecipeError`.
:func:`plan_budgets`: an ``auto`` budget = max over the agent's steps of (prompt + max_tokens +
:func:`headroom`) plus tool rounds and schema retries, rounded up to 256 and capped by the
training context. A prompt too long even alone (or over :data:`BYTES_PER_TOKEN` bytes per
token) is refused before tokenizing or launching.

Design: docs/design/budgets.md
"""

from __future__ import annotations

import json

import math
from collections.abc import Iterator, Mapping, Sequence, Set
from pathlib import Path
from typing import TYPE_CHECKING, Any

from squad.runtime.agent import Agent, sub_agent_names
from squad.chat.counting import MAX_BYTES_PER_TOKEN
from squad.engine.llama import round_ctx
from squad.errors import ModelError, RecipeError, SquadError
from squad.recipes.model import Recipe, RecipeWarning, Step, StepBudget
from squad.chat.structured import RETRY_TOKENS
from squad.templates import AnyValue, template_paths

if TYPE_CHECKING:
    from squad.engine.tokens import GGUFCounter

__all__ = ["model_file", "n_ctx_train", "check_prompts", "plan_budgets", "headroom", "HEADROOM_SHARE",
           "TOOL_RESULT_TOKENS", "tool_rounds",
           "HEADROOM_MIN", "BYTES_PER_TOKEN"]

HEADROOM_SHARE = 0.10
"""Share of (prompt + max_tokens) an auto budget adds for follow-up turns and tool rounds."""

HEADROOM_MIN = 64
"""The least headroom an auto budget adds, in tokens."""

BYTES_PER_TOKEN = MAX_BYTES_PER_TOKEN
"""A rendered prompt above this many UTF-8 bytes per token of the training context (or of a
fixed budget) is refused without tokenizing (:data:`squad.chat.counting.MAX_BYTES_PER_TOKEN`)."""

_STAND_IN = " word"
"""One token of stand-in text for an output not known before the run (a space + a common
word is one token in byte-level BPE vocabularies)."""


def headroom(tokens: int) -> int:
    """Headroom in tokens on top of ``tokens`` (prompt + max_tokens): 10 %, at least 64."""
    return max(HEADROOM_MIN, math.ceil(tokens * HEADROOM_SHARE))

_RUN_TIME_ROOTS = {"steps", "item", "index", "chunks"}
"""Template variables whose values exist only while the flow runs."""


def model_file(model: str | None) -> Path | None:
    """The GGUF file of ``model`` when it is on disk, else None (never downloads): the
    registry's own resolution (:func:`squad.engine.registry.resolve_model` without pulling).

    ``model`` is a recipe's checked model: None (the default model), a known name or a path.
    """
    from squad.engine.registry import resolve_model

    try:
        return resolve_model(model, pull=False)
    except ModelError:
        return None


def n_ctx_train(model: str | None) -> int | None:
    """The model's training context in tokens, when its file is on disk; else None."""
    try:
        from squad.engine.facts import read_model_facts

        path = model_file(model)
        return None if path is None else read_model_facts(path).n_ctx_train
    except Exception:  # noqa: BLE001 - facts are a bonus check; the planner checks again
        return None


def check_prompts(recipe: Recipe, *, unset: Set[str] = frozenset()) -> None:
    """Raise :class:`RecipeError` at the first fixed prompt its agent's budget cannot hold.

    A call or map step's prompt is fixed when it uses no ``steps.*``, ``item`` or ``index``
    and no parameter in ``unset`` (required ones without a value, as in ``squad recipes
    validate``); the agent's instructions must render from parameters too. Counted are the
    messages the runtime sends that agent (``Squad._converse``): a system message with its
    rendered instructions (sub-agents as ``agents``, parameters as ``params``) when not
    empty, then the prompt as the user message. Tool definitions the agent is offered, and
    the sub-agents' answers handed back to a main agent whose prompt @mentions them, come on
    top: there the count is a lower bound, and the message says so.

    The error names the step, the agent, the prompt tokens, ``max_tokens`` and the budget,
    and the fix: a budget rounded up to 256 tokens that holds both (when the model's
    training context allows it), or a shorter prompt. When the prompt cannot be counted
    exactly (the model file is not on disk, its tokenizer is not reproduced, or
    :class:`~squad.engine.tokens.NotExact`), only a prompt of more than
    :data:`BYTES_PER_TOKEN` bytes per token of the budget is refused.
    """
    fixed = [(step, recipe.agents[step.agent]) for step in _fixed_steps(recipe.flow, unset)]
    fixed = [(s, a) for s, a in fixed if not any(_unset(r, unset) for r in template_paths(a.instructions))]
    fixed = [(s, a) for s, a in fixed if a.fixed_budget is not None]
    if not fixed:
        return
    counter = _counter(recipe.model)
    from squad.engine.tokens import NotExact

    for step, agent in fixed:
        messages = _messages(recipe, step, agent)
        if messages is None:
            continue
        if counter is not None:
            try:
                prompt = counter.count_chat(messages)
            except NotExact:
                pass
            else:
                if prompt + agent.max_tokens > agent.fixed_budget:  # type: ignore[operator]
                    raise _too_small(recipe, step, agent, prompt)
                continue
        _check_bytes(step, agent, messages)


def _check_bytes(step: Step, agent: Agent, messages: list[dict[str, str]]) -> None:
    """Without an exact count: refuse a prompt of more than :data:`BYTES_PER_TOKEN` bytes per
    token of the agent's fixed budget (it cannot fit with any tokenizer)."""
    size = sum(len(m["content"].encode("utf-8", "surrogatepass")) for m in messages)
    budget = agent.fixed_budget or 0
    if size > BYTES_PER_TOKEN * budget:
        raise RecipeError(
            f"step '{step.id}' (agent '{agent.name}'): its prompt is {size:,} bytes (system + user message), more than "
            f"a budget of {budget:,} tokens can hold even at {BYTES_PER_TOKEN} bytes per token; raise "
            f"agents.{agent.name}.budget or shorten the prompt", **_loc(step))


def _fixed_steps(steps: tuple[Step, ...], unset: Set[str]) -> Iterator[Step]:
    for step in steps:
        if step.kind == "parallel":
            yield from _fixed_steps(step.steps, unset)
            continue
        refs = template_paths(step.prompt)
        if any(r[0] in _RUN_TIME_ROOTS or _unset(r, unset) for r in refs):
            continue
        yield step


def _unset(ref: tuple[str, ...], unset: Set[str]) -> bool:
    return ref[0] == "params" and len(ref) > 1 and ref[1] in unset


def _messages(recipe: Recipe, step: Step, agent: Agent) -> list[dict[str, str]] | None:
    """System (when not empty) + user message as the runtime sends them; None when either
    cannot be rendered before the run."""
    subs = [recipe.agents[n] for n in sub_agent_names(agent, recipe.agents, recipe.main)]
    try:
        user = recipe.render_prompt(step, {})
        system = agent.system_prompt(subs, {"params": recipe.params})
    except SquadError:  # e.g. an unset parameter the template cannot render; the run reports it
        return None
    trained = n_ctx_train(recipe.model)
    _check_size(step, agent, system + user, trained)
    return ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": user}]


def _check_size(step: Step, agent: Agent, text: str, trained: int | None) -> None:
    """Refuse text of more than :data:`BYTES_PER_TOKEN` bytes per training-context token."""
    if trained is None:
        return
    size, limit = len(text.encode("utf-8", "surrogatepass")), BYTES_PER_TOKEN * trained
    if size > limit:
        raise RecipeError(
            f"step '{step.id}' (agent '{agent.name}'): its prompt is {size:,} bytes, more than the "
            f"{limit:,} bytes ({BYTES_PER_TOKEN} per token) the model's {trained:,}-token training context "
            f"could ever hold; not counted. Use a model with a bigger context, or split the input over a map "
            f"step (split: chunks)", **_loc(step))


def _loc(step: Step) -> dict[str, Any]:
    return {k: step.loc.get(k) for k in ("file", "line", "column", "field")}


def _counter(model: str | None) -> GGUFCounter | None:
    try:
        from squad.engine.tokens import counter_for_model

        path = model_file(model)
        return None if path is None else counter_for_model(path, template=engine_template(path))
    except Exception:  # noqa: BLE001 - an unreadable file: the planner reports it at run time
        return None


def engine_template(path: Path) -> str | None:
    """The chat template squad will start the engine with for the model file at ``path`` when it
    is not the file's own (:func:`squad.engine.chat_templates.tool_template_for`), so counts made
    before launch match what the engine will count."""
    from squad.engine.chat_templates import tool_template_for
    from squad.engine.facts import read_model_facts

    facts = read_model_facts(path)
    chosen = tool_template_for(facts.chat_template, has_tool_use_template=facts.has_tool_use_template)
    return chosen.text if chosen is not None else None


def _too_small(recipe: Recipe, step: Step, agent: Agent, prompt: int) -> RecipeError:
    need = prompt + agent.max_tokens
    on_top = []
    if agent.tools or (agent.sub_agent_tools and agent.agents):
        on_top.append("its tool definitions")
    if step.mentions:
        on_top.append("the answers of the sub-agents it @mentions")
    bound = "at least " if on_top else ""
    more = f"; {' and '.join(on_top)} come on top" if on_top else ""
    trained = n_ctx_train(recipe.model)
    if trained is None or round_ctx(need) <= trained:
        fix = f"raise agents.{agent.name}.budget to {round_ctx(need)} or shorten the prompt"
    else:
        fix = (f"shorten the prompt (the model's training context is {trained} tokens, so the budget "
               f"can be at most {trained})")
    return RecipeError(
        f"step '{step.id}' (agent '{agent.name}') needs {bound}{need} tokens: its prompt is {bound}{prompt} "
        f"tokens (system + user message, counted with the model's tokenizer{more}) + max_tokens "
        f"{agent.max_tokens}, above the agent's budget of {agent.budget}; {fix}",
        **{k: step.loc.get(k) for k in ("file", "line", "column", "field")})


# --- auto budgets ------------------------------------------------------------------------------


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
    counter = _counter(recipe.model)
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


def _plan_step(recipe: Recipe, step: Step, counter: "GGUFCounter", trained: int | None,
               outputs: dict[str, dict[str, Any]], sizes: dict[str, int], unset: Set[str],
               extra: Mapping[str, list[Mapping[str, Any]]]) -> list[StepBudget]:
    """Rows for ``step`` (and its children); records its stand-in output for later steps."""
    if step.kind == "parallel":
        rows = []
        for child in step.steps:
            rows += _plan_step(recipe, child, counter, trained, outputs, sizes, unset, extra)
        sizes[step.id] = sum(sizes[c.id] for c in step.steps)
        outputs[step.id] = {"output": _stand_in(sizes[step.id]), "outputs": [outputs[c.id]["output"] for c in step.steps]}
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
    if any(_unset(r, unset) for r in refs) or any(_unset(r, unset) for r in template_paths(agent.instructions)):
        return []
    worst: dict[str, int] = {}
    extra_tools = extra
    for index, item in enumerate(items):
        values: dict[str, Any] = {"item": item, "index": index} if step.kind == "map" else {}
        if step.kind == "map" and step.split == "chunks":
            values["chunks"] = count
        for name, prompt in _counted(recipe, step, agent, counter, trained, before, values, extra_tools):
            worst[name] = max(worst.get(name, 0), prompt)
    rows = []
    for name, prompt in worst.items():
        who = recipe.agents[name]
        est = estimated and (name == agent.name or any(r[0] == "steps" for r in refs))
        need = prompt + who.max_tokens
        if (step.schema is not None and name == agent.name) or who.output_type is not None:
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
        rows.append(StepBudget(step=step.id, agent=name, prompt=prompt, max_tokens=who.max_tokens, budget=budget,
                               estimated=est, fixed=who.fixed_budget is not None, tool_rounds=rounds,
                               tool_tokens=loop))
        if rounds and need + loop > budget and not (trained is not None and need > trained):
            _warn_once(recipe, _rounds_warning(step, who, need, rounds, budget, trained))
        if trained is not None and need > trained and est:
            recipe.warnings.append(RecipeWarning(
                f"step '{step.id}' (agent '{name}') may need ~{need:,} tokens (estimated with earlier outputs at "
                f"their max_tokens), above the model's training context {trained:,}; its budget is capped there",
                **_loc(step)))
    return rows


def _counted(recipe: Recipe, step: Step, agent: Agent, counter: "GGUFCounter", trained: int | None,
             outputs: dict[str, dict[str, Any]], extra: dict[str, Any],
             more_tools: Mapping[str, list[Mapping[str, Any]]]) -> list[tuple[str, int]]:
    """``(agent, prompt tokens)`` for the agent of ``step`` and each sub-agent it @mentions."""
    from squad.engine.tokens import NotExact
    from squad.runtime.mention import parse_mentions, unmark

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
        except SquadError:
            continue
        _check_size(step, who, system + text, trained)
        messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": text}]
        tools = (_tool_specs(who, subs) or []) + list(more_tools.get(who.name, ())) or None
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
    from squad.runtime.toolroom import MAX_TOOL_ROUNDS

    has = bool(agent.tools) or (agent.sub_agent_tools and bool(agent.agents)) or has_more_tools
    return (agent.max_tool_rounds or MAX_TOOL_ROUNDS) if has else 0


class ToolRoundsWarning(RecipeWarning):
    """A budget that cannot hold an agent's tool rounds (made again each time budgets are planned)."""


def _rounds_warning(step: Step, agent: Agent, need: int, rounds: int, budget: int, trained: int | None) -> RecipeWarning:
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
        f"(tool_results: cut) or fail the step (tool_results: fail): " + ", or ".join(fixes), **_loc(step))


def _warn_once(recipe: Recipe, warning: RecipeWarning) -> None:
    """Add ``warning`` unless the same one is there (budgets are planned again once MCP tools are known)."""
    if str(warning) not in {str(w) for w in recipe.warnings}:
        recipe.warnings.append(warning)


TOOL_WORDS_TOKENS = 128
"""Tokens a chat template adds around tool definitions (how to call them), on top of their JSON,
when the counter cannot render that template's tools itself (squad's own templates are exact)."""


def _tools_estimate(counter: "GGUFCounter", tools: list[dict[str, Any]]) -> int:
    return counter.count_text(json.dumps(tools, ensure_ascii=False)) + TOOL_WORDS_TOKENS


def _stand_in(tokens: int) -> str:
    return _STAND_IN * tokens


def _tool_specs(agent: Agent, subs: list[Agent]) -> list[dict[str, Any]] | None:
    """The ``ask_<name>`` tool definitions the runtime offers ``agent`` (function tools are
    registered in Python, not known to a recipe)."""
    if not (agent.sub_agent_tools and agent.agents):
        return None
    from squad.runtime.turn import agent_tools

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
        f"or spread it over a map step (split: chunks)", **_loc(step))

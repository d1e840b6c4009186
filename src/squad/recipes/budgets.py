"""A recipe's budgets against its model file, checked before any engine starts.

Both checks read the model's GGUF only when it is already on disk (the recipe's ``.gguf``
path, or a known model where ``squad models pull`` puts it, the default one when the recipe
names none). squad never downloads a model or starts an engine for them; without the file
they are skipped and the planner and the client check again at run time.

- :func:`n_ctx_train`: the model's training context in tokens; a budget above it can never
  be used (checked in :mod:`squad.recipes.check`, at the budget).
- :func:`check_prompts`: a step whose prompt is known before the run (it renders from
  parameter values alone) is counted with the model's own tokenizer
  (:func:`squad.engine.tokens.counter_for_model`, the count llama-server's
  ``/v1/chat/completions/input_tokens`` gives). When prompt + ``max_tokens`` is above the
  agent's budget, the client would refuse the call at run time; here it is a
  :class:`~squad.errors.RecipeError` at the prompt, before anything runs.
"""

from __future__ import annotations

from collections.abc import Iterator, Set
from pathlib import Path
from typing import TYPE_CHECKING

from squad.agent import Agent, sub_agent_names
from squad.engine.llama import round_ctx
from squad.errors import RecipeError, SquadError
from squad.recipes.model import Recipe, Step
from squad.templates import template_paths

if TYPE_CHECKING:
    from squad.engine.tokens import GGUFCounter

__all__ = ["model_file", "n_ctx_train", "check_prompts"]

_RUN_TIME_ROOTS = {"steps", "item", "index", "chunks"}
"""Template variables whose values exist only while the flow runs."""


def model_file(model: str | None) -> Path | None:
    """The GGUF file of ``model`` when it is on disk, else None (never downloads).

    ``model`` is a recipe's checked model: None (the default model), a known name (its file in
    ``cache_dir()/models``) or an absolute path.
    """
    from squad.engine.registry import DEFAULT_MODEL, known_models, model_path

    name = model or DEFAULT_MODEL
    path = model_path(name) if name in known_models() else Path(name)
    return path if path.is_file() else None


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
    training context allows it), or a shorter prompt. Nothing is checked when the model file
    is not on disk, its tokenizer is not reproduced exactly, or a request cannot be counted
    exactly (:class:`~squad.engine.tokens.NotExact`).
    """
    fixed = [(step, recipe.agents[step.agent]) for step in _fixed_steps(recipe.flow, unset)]
    fixed = [(s, a) for s, a in fixed if not any(_unset(r, unset) for r in template_paths(a.instructions))]
    counter = _counter(recipe.model) if fixed else None
    if counter is None:
        return
    from squad.engine.tokens import NotExact

    for step, agent in fixed:
        messages = _messages(recipe, step, agent)
        if messages is None:
            continue
        try:
            prompt = counter.count_chat(messages)
        except NotExact:
            continue
        if prompt + agent.max_tokens > agent.budget:
            raise _too_small(recipe, step, agent, prompt)


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
    return ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": user}]


def _counter(model: str | None) -> GGUFCounter | None:
    try:
        from squad.engine.tokens import counter_for_model

        path = model_file(model)
        return None if path is None else counter_for_model(path)
    except Exception:  # noqa: BLE001 - an unreadable file: the planner reports it at run time
        return None


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

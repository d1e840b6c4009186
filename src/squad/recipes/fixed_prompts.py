"""A recipe's fixed prompts counted against its fixed budgets, before any engine starts.

:func:`check_prompts`: a step whose prompt is known before the run (it renders from parameter
values alone) is counted with the model's own tokenizer (:func:`squad.recipes.modelfile.chat_counter`,
the count llama-server's ``/v1/chat/completions/input_tokens`` gives). When prompt + ``max_tokens``
is above the agent's budget, the client would refuse the call at run time; here it is a
:class:`~squad.errors.RecipeError` at the prompt. Without the model file only a prompt of more
than :data:`BYTES_PER_TOKEN` bytes per token is refused (it cannot fit with any tokenizer).
"""

from __future__ import annotations

from collections.abc import Iterator, Set
from typing import Any

from squad.chat.counting import MAX_BYTES_PER_TOKEN
from squad.engine.llama import round_ctx
from squad.engine.tokens import NotExact
from squad.errors import RecipeError, SquadError
from squad.recipes.model import Recipe, Step
from squad.recipes.modelfile import chat_counter, n_ctx_train
from squad.runtime.agent import Agent, sub_agent_names
from squad.templates import template_paths

__all__ = ["check_prompts", "BYTES_PER_TOKEN", "RUN_TIME_ROOTS", "check_size", "is_unset", "step_loc"]

BYTES_PER_TOKEN = MAX_BYTES_PER_TOKEN
"""A rendered prompt above this many UTF-8 bytes per token of the training context (or of a
fixed budget) is refused without tokenizing (:data:`squad.chat.counting.MAX_BYTES_PER_TOKEN`)."""

RUN_TIME_ROOTS = frozenset({"steps", "item", "index", "chunks"})
"""Template variables whose values exist only while the flow runs."""


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
    fixed = [(s, a) for s, a in fixed if not any(is_unset(r, unset) for r in template_paths(a.instructions))]
    fixed = [(s, a) for s, a in fixed if a.fixed_budget is not None]
    if not fixed:
        return
    counter = chat_counter(recipe.model)
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
            f"agents.{agent.name}.budget or shorten the prompt", **step_loc(step))


def _fixed_steps(steps: tuple[Step, ...], unset: Set[str]) -> Iterator[Step]:
    for step in steps:
        if step.kind == "parallel":
            yield from _fixed_steps(step.steps, unset)
            continue
        refs = template_paths(step.prompt)
        if any(r[0] in RUN_TIME_ROOTS or is_unset(r, unset) for r in refs):
            continue
        yield step


def is_unset(ref: tuple[str, ...], unset: Set[str]) -> bool:
    """Whether template reference ``ref`` reads a parameter in ``unset`` (no value yet)."""
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
    check_size(step, agent, system + user, trained)
    return ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": user}]


def check_size(step: Step, agent: Agent, text: str, trained: int | None) -> None:
    """Refuse text of more than :data:`BYTES_PER_TOKEN` bytes per training-context token."""
    if trained is None:
        return
    size, limit = len(text.encode("utf-8", "surrogatepass")), BYTES_PER_TOKEN * trained
    if size > limit:
        raise RecipeError(
            f"step '{step.id}' (agent '{agent.name}'): its prompt is {size:,} bytes, more than the "
            f"{limit:,} bytes ({BYTES_PER_TOKEN} per token) the model's {trained:,}-token training context "
            f"could ever hold; not counted. Use a model with a bigger context, or split the input over a map "
            f"step (split: chunks)", **step_loc(step))


def step_loc(step: Step) -> dict[str, Any]:
    """``file``/``line``/``column``/``field`` of ``step``'s prompt, for a :class:`RecipeError`."""
    return {k: step.loc.get(k) for k in ("file", "line", "column", "field")}


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

"""A recipe's model file, read only when it is already on disk: the I/O the recipe checks use.

Nothing here downloads a model or starts an engine. The recipe data (:mod:`squad.recipes.model`)
never calls these itself; they are injected where a recipe is loaded (:mod:`squad.recipes.check`)
and planned (:mod:`squad.recipes.budgets`).

- :func:`model_file`: the GGUF path of a recipe's model (None when it is not on disk).
- :func:`n_ctx_train`: the model's training context in tokens.
- :func:`chat_counter`: the model's tokenizer with the chat template squad will start the
  engine with (:func:`engine_template`), for whole prompts.
- :func:`text_counter`: a token count for plain text (a map step's ``split: chunks``): the
  model's own tokenizer, else :func:`~squad.chat.counting.estimate_tokens`.
"""

from __future__ import annotations

from pathlib import Path

from squad.chat.counting import estimate_tokens
from squad.engine.chat_templates import tool_template_for
from squad.engine.facts import read_model_facts
from squad.engine.registry import resolve_model
from squad.engine.tokens import GGUFCounter, counter_for_model
from squad.errors import ModelError
from squad.recipes.chunks import Count

__all__ = ["model_file", "n_ctx_train", "chat_counter", "engine_template", "text_counter"]

def model_file(model: str | None) -> Path | None:
    """The GGUF file of ``model`` when it is on disk, else None (never downloads): the
    registry's own resolution (:func:`squad.engine.registry.resolve_model` without pulling).

    ``model`` is a recipe's checked model: None (the default model), a known name or a path.
    """
    try:
        return resolve_model(model, pull=False)
    except ModelError:
        return None


def n_ctx_train(model: str | None) -> int | None:
    """The model's training context in tokens, when its file is on disk; else None."""
    try:
        path = model_file(model)
        return None if path is None else read_model_facts(path).n_ctx_train
    except Exception:  # noqa: BLE001 - facts are a bonus check; the planner checks again
        return None


def chat_counter(model: str | None) -> GGUFCounter | None:
    """The model's tokenizer for whole chat prompts, with the template the engine will use
    (:func:`engine_template`); None without the file or for a tokenizer not reproduced."""
    try:
        path = model_file(model)
        return None if path is None else counter_for_model(path, template=engine_template(path))
    except Exception:  # noqa: BLE001 - an unreadable file: the planner reports it at run time
        return None


def engine_template(path: Path) -> str | None:
    """The chat template squad will start the engine with for the model file at ``path`` when it
    is not the file's own (:func:`squad.engine.chat_templates.tool_template_for`), so counts made
    before launch match what the engine will count."""
    facts = read_model_facts(path)
    chosen = tool_template_for(facts.chat_template, has_tool_use_template=facts.has_tool_use_template)
    return chosen.text if chosen is not None else None


def text_counter(model: str | None) -> tuple[Count, bool]:
    """``(count, exact)`` for a recipe's checked model (None = the default model): the
    model's own tokenizer when its file is on disk and supported (``exact`` True), else
    :func:`~squad.chat.counting.estimate_tokens`. Never downloads anything."""
    path = model_file(model)
    if path is not None:
        try:
            counter = counter_for_model(path)
        except Exception:  # noqa: BLE001 - an unreadable file: fall back to the estimate
            counter = None
        if counter is not None:
            return counter.count_text, True
    return estimate_tokens, False

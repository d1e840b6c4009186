"""A recipe's budgets against its model file, checked before any engine starts.

The check reads the model's GGUF only when it is already on disk (the recipe's ``.gguf``
path, or a known model where ``squad models pull`` puts it, the default one when the recipe
names none). squad never downloads a model or starts an engine for it; without the file it
is skipped and the planner checks again at run time.

- :func:`n_ctx_train`: the model's training context in tokens; a budget above it can never
  be used (checked in :mod:`squad.recipes.check`, at the budget).
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["model_file", "n_ctx_train"]


def model_file(model: str | None) -> Path | None:
    """The GGUF file of ``model`` when it is on disk, else None (never downloads).

    ``model`` is a recipe's checked model: None (the default model), a known name (its file in
    ``cache_dir()/models``) or an absolute path.
    """
    from squad.engine.models import DEFAULT_MODEL, known_models, model_path

    name = model or DEFAULT_MODEL
    path = model_path(name) if name in known_models() else Path(name)
    return path if path.is_file() else None


def n_ctx_train(model: str | None) -> int | None:
    """The model's training context in tokens, when its file is on disk; else None."""
    try:
        from squad.engine.models import read_model_facts

        path = model_file(model)
        return None if path is None else read_model_facts(path).n_ctx_train
    except Exception:  # noqa: BLE001 - facts are a bonus check; the planner checks again
        return None

"""A recipe run's journal: where it is kept, what identifies the run, which run ``--resume`` means.

Every ``squad run`` keeps a journal (:class:`~squad.runtime.journal.RunJournal`) in
``runs/RECIPE-NAME/`` of squad's state directory (0700; each file 0600). The run's identity
(:func:`recipe_identity`) is a hash of the recipe (its file and the agent files it includes),
one of each parameter's value, and the model it names (after ``--model``); the engine's own
model (the file or name it reports) is checked once the engine is up
(:meth:`~squad.runtime.journal.RunJournal.note_engine`). A resume refuses when any of them
changed, naming which. The last :data:`KEEP_RUNS` journals of a recipe are kept.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.error import YAMLError

from squad.dirs import state_dir
from squad.errors import UserError
from squad.recipes.model import Recipe
from squad.runtime.journal import RunJournal, fingerprint, lock_path

__all__ = ["recipe_identity", "runs_dir", "find_run", "recipe_journal", "LAST", "KEEP_RUNS"]

KEEP_RUNS = 20
"""Journals kept per recipe: a new run removes the oldest beyond these (they hold every answer)."""

LAST = "last"
"""``--resume`` without a value: the last run of the recipe."""


def runs_dir(name: str) -> Path:
    """Where the journals of recipe ``name``'s runs are kept."""
    return state_dir() / "runs" / name


def recipe_identity(recipe: Recipe) -> dict[str, str]:
    """What a run of ``recipe`` is, part by part (``recipe``, ``param:NAME``, ``model``), each a
    hash: a resumed run must match it."""
    texts: list[str] = []
    path = Path(recipe.path)
    try:
        text = path.read_text(encoding="utf-8")
        texts.append(text)
        found = YAML(typ="safe", pure=True).load(text)
        includes = found.get("include", []) if isinstance(found, dict) else []
        for name in includes if isinstance(includes, list) else []:
            try:
                texts.append((path.parent / str(name)).read_text(encoding="utf-8"))
            except OSError:
                texts.append(f"<unreadable {name}>")
    except (OSError, YAMLError):
        texts.append(repr(recipe.flow))
    identity = {"recipe": fingerprint(texts)}
    identity.update({f"param:{name}": fingerprint(_plain(value)) for name, value in recipe.params.items()})
    identity["model"] = fingerprint(str(recipe.model or "default"))
    return identity


def _plain(value: Any) -> Any:
    return str(value) if isinstance(value, Path) else value


def find_run(recipe: Recipe, run: str) -> Path:
    """The journal ``run`` names: :data:`LAST` (the recipe's newest: of this recipe file as it is
    now when there is one, since two recipe files may share a ``name:`` and so a runs folder), a
    run id (a file in :func:`runs_dir`) or a path. Raises :class:`UserError` when there is none."""
    folder = runs_dir(recipe.name)
    if run == LAST:
        found = sorted(folder.glob("*.jsonl"), key=lambda p: p.stat().st_mtime) if folder.is_dir() else []
        if not found:
            raise UserError(f"no run of recipe '{recipe.name}' to resume (none in {folder}); run it without --resume "
                            "first")
        recipe_hash = recipe_identity(recipe)["recipe"]
        same = [p for p in found if _recipe_hash(p) == recipe_hash]
        return (same or found)[-1]  # none of this recipe: the newest, and the resume names what changed
    candidate = Path(run)
    if candidate.suffix == ".jsonl" and candidate.is_file():
        return candidate
    named = folder / f"{run}.jsonl"
    if not named.is_file():
        known = sorted(p.stem for p in folder.glob("*.jsonl"))[-3:] if folder.is_dir() else []
        hint = f"; the last runs: {', '.join(known)}" if known else ""
        raise UserError(f"--resume {run}: no such run of recipe '{recipe.name}' in {folder}{hint}")
    return named


def _recipe_hash(path: Path) -> str | None:
    """The ``recipe`` part of the identity in the header of the journal at ``path`` (None when unreadable)."""
    try:
        with path.open("rb") as f:
            header = json.loads(f.readline())
        return str(header["identity"]["recipe"])
    except (OSError, ValueError, TypeError, KeyError):
        return None


def _prune(folder: Path) -> None:
    """Remove the oldest journals in ``folder`` beyond :data:`KEEP_RUNS`."""
    try:
        found = sorted(folder.glob("*.jsonl"), key=lambda p: p.stat().st_mtime)
    except OSError:
        return
    for old in found[:-KEEP_RUNS]:
        try:
            old.unlink()
            lock_path(old).unlink(missing_ok=True)
        except OSError:
            pass


def recipe_journal(recipe: Recipe, resume: str | None = None) -> RunJournal:
    """A new journal for a run of ``recipe``, or (``resume``: :data:`LAST`, a run id or a path)
    the journal of the run to resume, checked against ``recipe`` as it is now. Raises
    :class:`UserError` (no such run; the recipe, a parameter or the model changed: named)."""
    identity = recipe_identity(recipe)
    if resume is None:
        journal = RunJournal.create(runs_dir(recipe.name), identity, name=recipe.name)
        _prune(runs_dir(recipe.name))
        return journal
    return RunJournal.resume(find_run(recipe, resume), identity)

"""A recipe's parameter values: typed from ``-p`` or the defaults, and stand-ins for checking.

:func:`resolve_params` types the given values (``-p name=value``) and the defaults;
:func:`stand_in` gives a value of a parameter's declared type for rendering a template without
the real one; :func:`params_as_text` keeps a text parameter's default as written (field case F21).
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from squad.errors import RecipeError
from squad.names import normalize
from squad.recipes.load import Located
from squad.recipes.spec import ParamSpec, coerce_param

__all__ = ["resolve_params", "stand_in", "params_as_text"]


def resolve_params(specs: Mapping[str, ParamSpec], given: Mapping[str, Any], located: Located,
                   recipe_dir: Path, *, require: bool, reads: list[tuple[str, str]] | None = None) -> dict[str, Any]:
    """Typed parameter values: given values (relative to the current directory for files),
    else defaults (relative to the recipe). Raises :class:`RecipeError` naming the parameter.
    ``reads`` collects ``(path, why)`` of every file a ``type: file`` parameter read."""
    given = {normalize(k) if isinstance(k, str) else k: v for k, v in given.items()}  # -p 문서=... in any form
    for name in given:
        if name not in specs:
            hint = difflib.get_close_matches(name, list(specs), n=1)
            did = f"; did you mean '{hint[0]}'?" if hint else ""
            have = ", ".join(sorted(specs)) or "none"
            raise RecipeError(f"unknown parameter '{name}'{did} (this recipe takes: {have})", file=located.file)
    values: dict[str, Any] = {}
    for name, spec in specs.items():
        if name in given:
            value = given[name]
            if isinstance(value, list) and spec.type != "list":
                if len(value) != 1:
                    raise RecipeError(f"parameter '{name}' was given {len(value)} times; it takes one value",
                                      file=located.file, field=f"params.{name}")
                value = value[0]
            try:
                values[name] = coerce_param(name, spec, value, Path.cwd())
            except ValueError as exc:
                raise RecipeError(f"{exc} (from -p {name}=...)", file=located.file, field=f"params.{name}") from None
            if spec.type == "file" and reads is not None:
                reads.append((str((Path.cwd() / str(value)).expanduser()), f"parameter '{name}' (type: file, from -p)"))
        elif spec.default is not None:
            try:
                values[name] = coerce_param(name, spec, spec.default, recipe_dir)
            except ValueError as exc:
                raise located.error(f"default: {exc}", ("params", name, "default")) from None
            if spec.type == "file" and reads is not None:
                reads.append((str((recipe_dir / Path(str(spec.default)).expanduser()).resolve()),
                               f"parameter '{name}' (type: file, its default)"))
        elif spec.required and require:
            line, column = located.where(("params", name), key=True)
            what = f" ({spec.description})" if spec.description else ""
            raise RecipeError(f"missing required parameter '{name}'{what}; pass -p {name}=VALUE",
                              file=located.file, line=line, column=column, field=f"params.{name}")
        else:
            values[name] = [] if spec.type == "list" else None
    return values


_STAND_INS: dict[str, Any] = {"string": "1", "file": "1", "int": 1, "number": 1.0, "bool": True, "list": ["1"]}


def stand_in(spec: ParamSpec) -> Any:
    """A value of ``spec``'s declared type for rendering a template without the real one:
    ``"1"`` for text (string, file), 1, 1.0, True, the first choice of an enum, ``["1"]``."""
    if spec.type == "enum":
        return (spec.choices or [""])[0]
    return _STAND_INS[spec.type]



_TEXT_TYPES = {"string", "enum", "file", "list"}


def params_as_text(located: Located) -> None:
    """A text parameter's default and choices as written: ``default: 1.10`` of a string
    parameter is ``"1.10"``, not the float 1.1 YAML reads (field case F21)."""
    params = located.data.get("params")
    if not isinstance(params, dict):
        return
    for name, entry in params.items():
        if not isinstance(entry, dict) or entry.get("type", "string") not in _TEXT_TYPES:
            continue
        base = ("params", name)
        default = entry.get("default")
        if isinstance(default, list):
            entry["default"] = [located.as_text((*base, "default", i), v) for i, v in enumerate(default)]
        elif "default" in entry:
            entry["default"] = located.as_text((*base, "default"), default)
        if isinstance(entry.get("choices"), list):
            entry["choices"] = [located.as_text((*base, "choices", i), v) for i, v in enumerate(entry["choices"])]

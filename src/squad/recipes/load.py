"""Reading recipe YAML strictly: plain data plus the line and column of every node.

- Bytes are decoded as UTF-8 (a BOM is allowed) whatever the locale.
- ruamel.yaml's safe composer builds the node graph; squad turns nodes into plain
  ``dict``/``list``/``str``/``int``/``float``/``bool``/``None`` itself, so:
  YAML 1.2 core schema (``no``/``off``/``yes`` are strings; a ``%YAML 1.1`` directive is
  refused), duplicate keys are errors, keys must be strings, merge keys (``<<``) and
  custom tags (``!!python/...``) are refused, and aliases are counted: expanding more than
  :data:`MAX_NODES` nodes (an alias bomb) or a recursive alias is an error.
- :class:`Located` maps a path such as ``("flow", 2, "agent")`` to its 1-based line and
  column so later checks (pydantic, templates, mentions) can point at the exact spot.

Every problem is a :class:`~squad.errors.RecipeError` with file, line, column and field.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError
from ruamel.yaml import YAML
from ruamel.yaml.error import MarkedYAMLError, YAMLError
from ruamel.yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from squad.errors import RecipeError

__all__ = ["Located", "read_yaml", "MAX_NODES", "field_path", "pydantic_error"]

MAX_NODES = 20_000
"""Most YAML nodes one file may expand to (aliases included); more is an alias bomb."""

_SCALAR_TAGS = {"str", "int", "float", "bool", "null", "timestamp", "binary"}
_DIRECTIVE = re.compile(r"^%YAML\s+(\S+)", re.MULTILINE)

Path_ = tuple[str | int, ...]


def field_path(path: Path_) -> str:
    """``("flow", 2, "agent")`` -> ``flow[2].agent``."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


@dataclass
class Located:
    """Plain data read from ``file`` plus positions: ``values[path]`` and ``keys[path]`` are
    1-based ``(line, column)`` of the value node and of the mapping key that names it;
    ``texts[path]`` is the source text of a number or boolean as written (``1.10`` stays
    ``"1.10"``, where the data holds the float 1.1), for fields that take text (F21)."""

    file: str
    data: Any
    values: dict[Path_, tuple[int, int]] = field(default_factory=dict)
    keys: dict[Path_, tuple[int, int]] = field(default_factory=dict)
    texts: dict[Path_, str] = field(default_factory=dict)

    def as_text(self, path: Path_, value: Any) -> Any:
        """``value`` (found at ``path``) as its source text when it was written as a number or
        boolean; else ``value`` unchanged."""
        return self.texts.get(path, value)

    def where(self, path: Path_, *, key: bool = False) -> tuple[int | None, int | None]:
        """Line and column of ``path`` (the key when ``key``), else of its closest ancestor."""
        table = self.keys if key else self.values
        for cut in range(len(path), -1, -1):
            sub = tuple(path[:cut])
            if sub in table:
                return table[sub]
            if sub in self.values:
                return self.values[sub]
        return None, None

    def error(self, problem: str, path: Path_, *, key: bool = False) -> RecipeError:
        """A :class:`RecipeError` pointing at ``path`` in this file."""
        line, column = self.where(path, key=key)
        return RecipeError(problem, file=self.file, line=line, column=column, field=field_path(path) or None)


def read_yaml(path: Path, *, shown: str | None = None) -> Located:
    """Read one YAML mapping from ``path``; ``shown`` is how the file is named in errors."""
    name = shown or str(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise RecipeError(f"cannot read the file: {exc.strerror or exc}", file=name) from None
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise RecipeError(
            f"not UTF-8 (byte 0x{raw[exc.start]:02x}); save the file as UTF-8", file=name, line=line
        ) from None
    directive = _DIRECTIVE.search(text)
    if directive and directive.group(1) != "1.2":
        line = text[: directive.start()].count("\n") + 1
        raise RecipeError(
            f"recipes are read as YAML 1.2; remove the '%YAML {directive.group(1)}' directive",
            file=name,
            line=line,
            column=1,
        )
    yaml = YAML(typ="safe", pure=True)
    yaml.version = (1, 2)
    try:
        documents = list(yaml.compose_all(text))
    except MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        context = f" ({exc.context})" if exc.context else ""
        raise RecipeError(
            f"YAML syntax: {exc.problem}{context}; check the indentation and quoting here",
            file=name,
            line=mark.line + 1 if mark else None,
            column=mark.column + 1 if mark else None,
        ) from None
    except YAMLError as exc:
        raise RecipeError(f"YAML syntax: {exc}", file=name) from None
    if not documents or (len(documents) == 1 and _blank(documents[0])):
        dashes = any(line.strip() in ("---", "...") for line in text.splitlines())
        what = ("holds only '---'" + (" and comments" if "#" in text else "") if dashes
                else "holds only comments" if text.strip() else "is empty")
        raise RecipeError(f"the file {what}: there is no recipe in it; write one (name, agents, main and flow, "
                          "see docs/recipes.md), or check that this is the file you meant", file=name, line=1)
    if len(documents) != 1 or documents[0] is None:
        raise RecipeError("expected exactly one YAML document holding a mapping; keep one (remove the '---' "
                          "separators and what follows)", file=name, line=1)
    located = Located(file=name, data=None)
    located.data = _Builder(located, yaml).build(documents[0], ())
    if not isinstance(located.data, dict):
        raise located.error("the file must be a mapping (key: value lines) at the top level", ())
    return located


def _blank(node: Node | None) -> bool:
    """A document with nothing in it (only ``---`` or comments): None or an empty plain null."""
    return node is None or (isinstance(node, ScalarNode) and _tag(node) == "null" and node.value in ("", "~", "null"))


class _Builder:
    def __init__(self, located: Located, yaml: YAML) -> None:
        self.located = located
        self.constructor = yaml.constructor
        self.count = 0
        self.active: set[int] = set()

    def build(self, node: Node, path: Path_) -> Any:
        self.count += 1
        if self.count > MAX_NODES:
            raise self.located.error(
                f"the YAML expands to more than {MAX_NODES} nodes (an alias bomb?); write the data out "
                "without nested aliases",
                path[:1],
            )
        self.located.values[path] = (node.start_mark.line + 1, node.start_mark.column + 1)
        if id(node) in self.active:
            raise self.located.error("a YAML alias refers to itself (recursive data)", path)
        self.active.add(id(node))
        try:
            if not isinstance(node, ScalarNode) and _tag(node) not in ("map", "seq"):
                raise self.located.error(
                    f"YAML tag '{node.tag}' is not allowed in a recipe; write plain values", path)
            if isinstance(node, MappingNode):
                return self._mapping(node, path)
            if isinstance(node, SequenceNode):
                return [self.build(item, (*path, i)) for i, item in enumerate(node.value)]
            return self._scalar(node, path)
        finally:
            self.active.discard(id(node))

    def _mapping(self, node: MappingNode, path: Path_) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key_node, value_node in node.value:
            where = (key_node.start_mark.line + 1, key_node.start_mark.column + 1)
            tag = _tag(key_node)
            if tag == "merge":
                raise RecipeError(
                    "YAML merge keys (<<) are not supported; write the keys out or use include:",
                    file=self.located.file, line=where[0], column=where[1], field=field_path(path) or None,
                )
            if not isinstance(key_node, ScalarNode) or tag not in ("str", "int", "float", "bool", "null"):
                raise RecipeError(
                    "a mapping key must be a plain name", file=self.located.file, line=where[0],
                    column=where[1], field=field_path(path) or None,
                )
            key = str(key_node.value)
            if key in out:
                first = self.located.keys[(*path, key)]
                raise RecipeError(
                    f"duplicate key '{key}' (first defined on line {first[0]}); keep one of them",
                    file=self.located.file, line=where[0], column=where[1], field=field_path((*path, key)),
                )
            self.located.keys[(*path, key)] = where
            out[key] = self.build(value_node, (*path, key))
        return out

    def _scalar(self, node: ScalarNode, path: Path_) -> Any:
        tag = _tag(node)
        if tag not in _SCALAR_TAGS:
            raise self.located.error(
                f"YAML tag '{node.tag}' is not allowed in a recipe; write plain values", path
            )
        if tag in ("str", "timestamp", "binary"):
            return str(node.value)
        if tag in ("int", "float", "bool"):
            self.located.texts[path] = str(node.value)
        return self.constructor.construct_object(node, deep=True)


def _tag(node: Node) -> str:
    tag = str(getattr(node.tag, "value", node.tag) or "")
    return tag.removeprefix("tag:yaml.org,2002:")


# --- pydantic errors -> file:line:col + field + what was expected ------------------------

_EXPECTED = {
    "string_type": "expected text",
    "int_type": "expected a whole number",
    "int_parsing": "expected a whole number",
    "int_from_float": "expected a whole number",
    "float_type": "expected a number",
    "float_parsing": "expected a number",
    "bool_type": "expected true or false",
    "bool_parsing": "expected true or false",
    "list_type": "expected a list (- item lines or [a, b])",
    "dict_type": "expected a mapping (key: value lines)",
    "model_type": "expected a mapping (key: value lines)",
    "model_attributes_type": "expected a mapping (key: value lines)",
    "missing": "required key is missing",
}

_BOUNDS = {"greater_than": "above", "greater_than_equal": "at least", "less_than": "below",
           "less_than_equal": "at most"}
_BOUND_KEYS = {"greater_than": "gt", "greater_than_equal": "ge", "less_than": "lt", "less_than_equal": "le"}


def pydantic_error(
    exc: ValidationError, located: Located, base: Path_, model: type[BaseModel] | None = None
) -> RecipeError:
    """The first error in ``exc`` as a :class:`RecipeError` at its place in ``located``.

    ``base`` is the path of the validated data inside the file; ``model`` (the validated
    class) lets unknown keys get a "did you mean" from the model's own field names.
    """
    errors = exc.errors()

    def line_of(err: dict[str, Any]) -> tuple[int, int]:
        line, column = located.where((*base, *err["loc"]), key=err["type"] == "extra_forbidden")
        return (line or 0, column or 0)

    err = min(errors, key=lambda e: (e["type"] != "extra_forbidden", line_of(e)))
    loc: Path_ = (*base, *(p for p in err["loc"] if isinstance(p, (str, int))))
    given = err.get("input")
    kind = err["type"]
    if kind == "extra_forbidden":
        key = str(loc[-1])
        allowed = sorted(_fields_at(model, err["loc"][:-1])) if model else []
        hint = difflib.get_close_matches(key, allowed, n=1)
        did = f"; did you mean '{hint[0]}'?" if hint else ""
        valid = f" (valid keys: {', '.join(allowed)})" if allowed and not hint else ""
        return located.error(f"unknown key '{key}'{did}{valid}", loc, key=True)
    if kind == "missing":
        line, column = located.where(loc[:-1])
        return RecipeError(f"required key '{loc[-1]}' is missing; add {loc[-1]}: ...", file=located.file, line=line,
                           column=column, field=field_path(loc))
    if kind == "literal_error":
        return located.error(f"{err['msg'].replace('Input should be', 'use')}, got {given!r}", loc)
    if kind == "string_pattern_mismatch":
        return located.error(f"{given!r} is not a name: use a letter, then letters, digits, '-' or '_'", loc)
    if kind == "too_short":
        return located.error("needs at least one entry, got none; add one", loc)
    if kind in _BOUNDS:
        limit = (err.get("ctx") or {}).get(_BOUND_KEYS[kind])
        return located.error(f"must be {_BOUNDS[kind]} {limit}, got {given!r}; write a number {_BOUNDS[kind]} {limit}",
                             loc)
    message = _EXPECTED.get(kind) or err["msg"].removeprefix("Value error, ")
    if given is None and "got None" in message or (given is None and kind in _EXPECTED):
        return located.error(_no_value(message, loc, model, base), loc)
    if kind in _EXPECTED and kind != "missing" and not isinstance(given, (dict, list)):
        message += f", got {given!r}"
        if isinstance(given, bool) and kind in ("int_type", "float_type"):
            message += "; true and false are not numbers, write the number"
        elif isinstance(given, str) and kind in ("int_type", "float_type") and _is_number(given):
            message += "; write it without quotes"
        elif kind == "string_type" and isinstance(given, (int, float, bool)):
            message += "; put it in quotes to make it text"
        elif isinstance(given, float) and kind == "int_type":
            message += "; write a whole number"
    return located.error(message, loc)


def _no_value(expected: str, loc: Path_, model: type[BaseModel] | None, base: Path_) -> str:
    """The message for a key written with no value (``key: ~``, ``key: null``, ``key:``)."""
    info = _field_at(model, loc[len(base):]) if model is not None else None
    optional = info is not None and not info.is_required()
    none = "got no value (~, null and nothing after the colon all mean none)"
    if "got None" in expected:  # a message of squad's own, which already says what to write
        return expected.replace("got None", none) + ("; or remove the key to use its default" if optional else "")
    return f"{expected}, {none}; write the value" + (" or remove the key to use its default" if optional else "")


def _field_at(model: type[BaseModel], loc: Path_) -> Any:
    """The pydantic ``FieldInfo`` of the last key of ``loc`` (a path inside ``model``'s data), or None."""
    if not loc or not isinstance(loc[-1], str):
        return None
    names = _fields_at(model, tuple(loc[:-1]))
    if loc[-1] not in names:
        return None
    current: Any = _model_at(model, tuple(loc[:-1]))
    if not (isinstance(current, type) and issubclass(current, BaseModel)):
        return None
    for name, info in current.model_fields.items():
        if (info.alias or name) == loc[-1]:
            return info
    return None


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _fields_at(model: type[BaseModel], loc: tuple[Any, ...]) -> set[str]:
    """Field names of the (nested) pydantic model found by following ``loc`` from ``model``."""
    current = _model_at(model, loc)
    if isinstance(current, type) and issubclass(current, BaseModel):
        return {info.alias or name for name, info in current.model_fields.items()}
    return set()


def _model_at(model: type[BaseModel], loc: tuple[Any, ...]) -> Any:
    """The (nested) type found by following ``loc`` from ``model``."""
    import typing

    current: Any = model
    for part in loc:
        if isinstance(current, type) and issubclass(current, BaseModel) and isinstance(part, str):
            info = current.model_fields.get(part)
            if info is None:
                return set()
            current = info.annotation
        elif isinstance(part, int) or isinstance(part, str):
            args = [a for a in typing.get_args(current) if a is not type(None)]
            current = args[-1] if args else current
            if typing.get_origin(current) in (list, tuple, dict) or isinstance(part, int):
                inner = [a for a in typing.get_args(current) if a is not type(None) and a is not Ellipsis]
                current = inner[-1] if inner else current
        while (typing.get_origin(current) is typing.Union
               or str(typing.get_origin(current)) == "<class 'types.UnionType'>"):
            options = [a for a in typing.get_args(current) if isinstance(a, type) and issubclass(a, BaseModel)]
            if not options:
                break
            current = options[0]
    return current

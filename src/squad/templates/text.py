"""What may reach a prompt from a template: data (text, numbers, lists and mappings of them),
never a Python object's repr (a macro not called, a generator, jinja's ``loop``). A list or
mapping reaches it as JSON (:func:`as_text`: ``{{ params }}`` is ``{"문서": "..."}``, never
``{'문서': '...'}``), and so do ``true``, ``false`` and ``null`` (``{{ params.strict }}`` is
``true``, as the recipe's YAML and the answers' JSON write it, never Python's ``True`` or
``None``), wherever a template turns a value into text: ``{{ ... }}``, ``~``, ``%``,
``.format()``, ``join`` and the filters that print their input."""

from __future__ import annotations

import json
import re
import types
import unicodedata
from collections.abc import Mapping
from typing import Any

import jinja2

from squad.templates.meter import TemplateLimit

__all__ = ["not_text", "refuse_internal", "as_text", "plain", "texts", "is_blank"]

_PLAIN = (str, int, float, type(None))
_HOLDERS = (list, tuple, dict, set, frozenset)
_GENERATED: tuple[type, ...] = (types.GeneratorType, range, type({}.items()), type({}.keys()), type({}.values()), map,
                                filter, zip,
              enumerate, reversed)
_MAX_WALK = 10_000
"""Items of a list or mapping :func:`not_text` looks into (a larger value is data in any case)."""


def not_text(value: Any) -> str | None:
    """Why ``value`` would reach a prompt as a Python object's repr rather than as data (a
    jinja internal such as ``self`` or ``loop``, a function or method not called, a class, a
    generator from ``map``/``select``, a ``range``), with the fix; None for text, numbers,
    booleans, None and lists or mappings of those."""
    stack, seen = [value], 0
    while stack and seen < _MAX_WALK:
        item = stack.pop()
        seen += 1
        if isinstance(item, (*_PLAIN, jinja2.Undefined)):  # an undefined one fails as undefined when printed
            continue
        if isinstance(item, Mapping) and isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
            continue
        if isinstance(item, _HOLDERS):
            stack.extend(item)
            continue
        return _why_not_text(item)
    return None


def _why_not_text(item: Any) -> str:
    shown = re.sub(r" at 0x[0-9a-fA-F]+", "", repr(item))
    shown = shown if len(shown) <= 60 else shown[:57] + "..."
    if isinstance(item, jinja2.runtime.Macro):
        return f"it is the macro '{item.name}' itself ({shown}), not its text; write {item.name}() to call it"
    if isinstance(item, type):
        return f"it is the class {item.__name__!r} itself ({shown}), not a value; call it or drop it"
    if isinstance(item, _GENERATED):
        return (f"it is a lazy sequence ({type(item).__name__}, printed as {shown}), not its items; "
                "add | list at the end of the expression, or | join(', ') for text")
    if callable(item) and not isinstance(item, (jinja2.runtime.TemplateReference, jinja2.runtime.LoopContext)):
        name = getattr(item, "__name__", None)
        what = f"the function or method {name!r}" if name else f"a callable {type(item).__name__} object"
        return f"it is {what} itself ({shown}), not its result; call it: add ()"
    return (f"it is jinja's internal {type(item).__name__} object, which would be sent as {shown}; use a value "
            "instead (params.NAME, steps.ID.output, item, loop.index)")


def refuse_internal(value: Any, what: str) -> None:
    """Raise :class:`TemplateLimit` when ``value`` is not data (:func:`not_text`), naming ``what``."""
    problem = not_text(value)
    if problem is not None:
        raise TemplateLimit(f"{what} does not give text: {problem}")


_CONTAINERS = (list, tuple, dict, set, frozenset)


def plain(value: Any) -> Any:
    """``value`` with every container made JSON's (lists, string keys; a set's items in a fixed order); a value
    that prints itself (its class has its own ``__str__``, like a stand-in) as its text."""
    if isinstance(value, _CONTAINERS) and type(value).__str__ is not object.__str__:
        return str(value)
    if isinstance(value, dict):
        return {_key(k): plain(v) for k, v in value.items()}
    if isinstance(value, (set, frozenset)):
        return sorted((plain(v) for v in value), key=lambda v: json.dumps(v, ensure_ascii=False, default=str))
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


def _key(key: Any) -> Any:
    """A mapping key JSON can write: text, a number, true/false/null as they are; a container as its JSON."""
    if key is None or isinstance(key, (str, int, float, bool)):
        return key
    return as_text(key) if isinstance(key, _CONTAINERS) else str(key)


def as_text(value: Any) -> Any:
    """``value`` as it may reach a prompt: a list, tuple, set or mapping as compact-readable JSON
    (``["a", "b"]``, ``{"a": 1}``; text unescaped, ``true``/``null`` inside), a boolean or None as JSON's
    ``true``/``false``/``null`` (never Python's ``True``/``None``), anything else unchanged (text, numbers;
    jinja prints those itself). A container whose class prints itself is its text."""
    if value is None or isinstance(value, bool):
        return json.dumps(value)
    if not isinstance(value, _CONTAINERS):
        return value
    if type(value).__str__ is not object.__str__:
        return str(value)
    return json.dumps(plain(value), ensure_ascii=False, default=str)


def texts(values: Any) -> Any:
    """:func:`as_text` of each item of a tuple (``"%s %s" % (a, b)``), or of ``values`` itself."""
    if isinstance(values, tuple) and type(values).__str__ is object.__str__:
        return tuple(as_text(v) for v in values)
    return as_text(values)


def is_blank(text: str) -> bool:
    """``text`` shows nothing: only whitespace and invisible format characters (Unicode ``Cf``: zero-width space
    U+200B, joiners, word joiner, a byte-order mark U+FEFF, soft hyphen). A prompt of such text is an empty one."""
    return all(c.isspace() or unicodedata.category(c) == "Cf" for c in text)

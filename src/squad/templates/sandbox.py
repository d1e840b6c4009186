"""The bounded jinja2 sandbox every squad template renders in (field cases F18, F19).

jinja2's immutable sandbox keeps a template away from Python internals but not from the CPU or
memory. :class:`BoundedSandbox` adds limits checked *before* the work is done: no value over
:data:`MAX_VALUE` characters (or list items) beyond the data given, integers up to
:data:`MAX_INT_DIGITS` digits, all values built in one render at most
:data:`~squad.templates.meter.BUILT_FACTOR` times that, at most :data:`MAX_STEPS` steps and
:data:`~squad.templates.meter.RENDER_SECONDS` seconds, output at most ``max_chars``. A bad
template fails at once with a :class:`TemplateLimit` saying what it tried.
:func:`bound` rewrites the parsed template; :func:`metered` sets the :class:`Meter` of one render.

Limits and the meter: :mod:`squad.templates.meter`; what each operator, method and filter may
cost: :mod:`squad.templates.costs`; what may reach the output as text: :mod:`squad.templates.text`.

Design (what each limit checks, and how): docs/design/sandbox.md
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any

import jinja2
from jinja2 import nodes, pass_context
from jinja2.sandbox import MAX_RANGE, ImmutableSandboxedEnvironment

from squad.templates.costs import check_binop, check_str_method, checked_join, counted, guard_filter
from squad.templates.meter import (
    MAX_INT_DIGITS,
    MAX_STEPS,
    MAX_VALUE,
    Meter,
    TemplateLimit,
    current_meter,
    flat_size,
    metered,
    size_of,
)
from squad.templates.text import as_text, not_text, plain, refuse_internal, texts

__all__ = ["BoundedSandbox", "TemplateLimit", "Meter", "metered", "bound", "flat_size", "OUT", "not_text",
           "MAX_VALUE", "MAX_STEPS", "MAX_INT_DIGITS"]


def _range(*args: int) -> range:
    """``range()`` in a template: at most jinja's ``MAX_RANGE`` (100,000) items."""
    current_meter().step()
    items = range(*args)
    if len(items) > MAX_RANGE:
        raise TemplateLimit(f"range() of {len(items):,} items is more than the {MAX_RANGE:,} a template may loop "
                            "over; loop over less")
    return items


@pass_context
def _loop(context: Any, iterable: Any) -> Iterator[Any]:
    """Every ``{% for %}`` iterable: one step per iteration."""
    return counted(iterable, current_meter())


@pass_context
def _concat(context: Any, parts: list[Any]) -> str:
    """``a ~ b ~ c``: refused when the joined text would be too big."""
    meter = current_meter()
    meter.step()
    meter.check(flat_size(parts, meter.max_value), "'~'")
    for part in parts:
        refuse_internal(part, "a part joined with '~'")
    return "".join(str(as_text(p)) for p in parts)


@pass_context
def _out(context: Any, value: Any) -> Any:
    """Every piece of output (text and ``{{ }}``): counted against the output limit."""
    meter = current_meter()
    meter.write(flat_size(value, meter.max_chars - meter.written + 1))
    return value


@pass_context
def _out_value(context: Any, value: Any) -> Any:
    """Every ``{{ ... }}`` output: refused when it is not data (:func:`not_text`), a list or mapping made JSON
    (:func:`~squad.templates.text.as_text`), then counted."""
    refuse_internal(value, "{{ ... }}")
    return _out(context, as_text(value))


_MACRO_STEPS = 4
"""Steps one macro call costs (a call runs a whole template function: ~4 simple steps' time)."""

_LOOP, _CONCAT, _TEXT = "squad:loop", "squad:concat", "squad:text"
"""Names no template can spell (a filter name is an identifier), for :func:`bound`."""

OUT = "squad:out"
"""The filter every ``{{ ... }}`` output passes through (the template's own text passes
through another): an environment may replace it to treat that output as data."""


def _tojson(value: Any, indent: int | None = None) -> str:
    """jinja's ``tojson`` for prompts: the same JSON (keys sorted, ``indent`` as given), text written as it is
    (``리뷰어``, not ``\\ub9ac...``; ``<``, ``&``, ``'`` as written, not jinja's HTML-safe ``\\u003c``), containers
    as :func:`~squad.templates.text.as_text` makes them."""
    data = plain(value)
    try:
        return json.dumps(data, ensure_ascii=False, default=str, sort_keys=True, indent=indent)
    except TypeError:  # keys of mixed kinds (1 and "a") do not sort: as they are
        return json.dumps(data, ensure_ascii=False, default=str, indent=indent)


class BoundedSandbox(ImmutableSandboxedEnvironment):
    """An immutable jinja2 sandbox whose templates cannot exhaust CPU or memory (module
    docstring). Parse with :meth:`parse`, then pass the tree through :func:`bound` before
    compiling it; render inside :func:`metered`."""

    intercepted_binops = frozenset({"*", "**", "+", "%"})

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.globals.pop("lipsum", None)
        self.globals["range"] = _range
        self.filters["tojson"] = _tojson
        self.filters = {name: guard_filter(name, f) for name, f in self.filters.items()}
        self.filters.update({_LOOP: _loop, _CONCAT: _concat, _TEXT: _out, OUT: _out_value})

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        meter = current_meter()
        meter.step()
        check_binop(operator, left, right, meter)
        if operator == "%" and isinstance(left, str):
            right = texts(right)  # "%s" % params: JSON, never a repr
        return super().call_binop(context, operator, left, right)

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805
        meter = current_meter()
        meter.step(_MACRO_STEPS if isinstance(__obj, jinja2.runtime.Macro) else 1)
        bound_to = getattr(getattr(__obj, "__wrapped__", __obj), "__self__", None)
        name = getattr(__obj, "__name__", "")
        if isinstance(bound_to, str):
            if name == "join" and args:
                args = ([as_text(i) for i in checked_join(bound_to, args[0], meter)], *args[1:])
            else:
                check_str_method(name, bound_to, args, kwargs, meter)
            if name in ("format", "format_map"):  # "{}".format(params): JSON, never a repr
                args = tuple(as_text(a) for a in args) if name == "format" else args
                kwargs = {k: as_text(v) for k, v in kwargs.items()}
        result = super().call(__context, __obj, *args, **kwargs)
        meter.build(size_of(result))
        return result

    def getattr(self, obj: Any, attribute: str) -> Any:
        """``obj.attribute``; on a mapping its key comes first, so ``params.items`` is the parameter ``items``,
        not ``dict.items`` (jinja looks at attributes first): every name reaches its value."""
        current_meter().step()
        if isinstance(obj, Mapping) and isinstance(attribute, str):
            try:
                if attribute in obj and not isinstance(obj, jinja2.runtime.Context):
                    return self.getitem(obj, attribute)
            except TypeError:
                pass
        return super().getattr(obj, attribute)

    def getitem(self, obj: Any, argument: Any) -> Any:
        meter = current_meter()
        meter.step()
        result = super().getitem(obj, argument)
        if isinstance(argument, slice):
            meter.build(size_of(result))
        return result


def bound(ast: nodes.Template, env: jinja2.Environment) -> nodes.Template:
    """Rewrite ``ast`` in place so loops, ``~`` and output are counted (module docstring)."""

    def wrap(node: Any, name: str) -> nodes.Filter:
        return nodes.Filter(node, name, [], [], None, None, lineno=node.lineno)

    def concat(node: Any) -> Any:
        if isinstance(node, nodes.Concat):
            return wrap(nodes.List(node.nodes, lineno=node.lineno), _CONCAT)
        return node

    def visit(node: nodes.Node) -> None:
        for child in node.iter_child_nodes():
            visit(child)
        for field in node.fields:
            value = getattr(node, field, None)
            if isinstance(value, list):
                setattr(node, field, [concat(v) for v in value])
            else:
                setattr(node, field, concat(value))
        if isinstance(node, nodes.For):
            node.iter = wrap(node.iter, _LOOP)
        elif isinstance(node, nodes.Output):
            node.nodes = [wrap(n, _TEXT if isinstance(n, nodes.TemplateData) else OUT) for n in node.nodes]

    visit(ast)
    ast.set_environment(env)
    return ast

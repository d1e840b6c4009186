"""The bounded jinja2 sandbox every squad template renders in (field cases F18, F19).

jinja2's immutable sandbox keeps a template away from Python internals but not from the CPU or
memory. :class:`BoundedSandbox` adds limits checked *before* the work is done: no value over
:data:`MAX_VALUE` characters (or list items) beyond the data given, integers up to
:data:`MAX_INT_DIGITS` digits, all values built in one render at most :data:`BUILT_FACTOR` times
that, at most :data:`MAX_STEPS` steps and :data:`RENDER_SECONDS` seconds, output at most
``max_chars``. A bad template fails at once with a :class:`TemplateLimit` saying what it tried.
:func:`bound` rewrites the parsed template; :func:`metered` sets the :class:`Meter` of one render.

Design (what each limit checks, and how): docs/design/sandbox.md
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import math
import re
import time
import types
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import jinja2
from jinja2 import nodes, pass_context
from jinja2.sandbox import MAX_RANGE, ImmutableSandboxedEnvironment

__all__ = ["BoundedSandbox", "TemplateLimit", "Meter", "metered", "bound", "flat_size", "OUT", "not_text",
           "MAX_VALUE", "MAX_STEPS", "MAX_INT_DIGITS"]

MAX_VALUE = 1_000_000
"""Characters (or list items) a template may build beyond the size of the data it was given."""

MAX_STEPS = 250_000
"""Steps one render may take (loop iterations, calls, operators, lookups, filter items)."""

MAX_INT_DIGITS = 4_300
"""Decimal digits an integer may reach in a template (Python's own int -> text limit)."""

BUILT_FACTOR = 10
"""All the values one render builds may hold this many times the single-value limit."""

RENDER_SECONDS = 2.0
"""The most CPU time (of the rendering thread, so a busy machine does not count) one render may
take; a backstop behind the limits above, far above what any template within them needs (a
10,000-line loop renders in ~0.1 s)."""

_MAX_INT_BITS = math.ceil(MAX_INT_DIGITS * math.log2(10))
_FIX = "build less in the template, or pass the text in as a parameter"


class TemplateLimit(Exception):
    """A template tried to build too much or take too long; the message says what and the fix."""


class Meter:
    """One render's account: ``steps`` taken, ``written`` characters of output, against
    ``max_steps``, ``max_chars`` and ``max_value`` (the largest value the template may build)."""

    def __init__(self, *, max_value: int = MAX_VALUE, max_chars: int | None = None,
                 max_steps: int = MAX_STEPS, why: str = "") -> None:
        self.max_value, self.max_steps = max_value, max_steps
        self.max_chars = max_value if max_chars is None else max_chars
        self.why = why
        self.steps = 0
        self.written = 0
        self.built = 0
        self.deadline = time.thread_time() + RENDER_SECONDS

    def step(self, n: int = 1) -> None:
        self.steps += n
        if self.steps > self.max_steps:
            raise TemplateLimit(f"the template takes more than {self.max_steps:,} steps (loops, calls, lookups); "
                                "loop over less, or do the work outside the template")
        if time.thread_time() > self.deadline:
            raise TemplateLimit(f"the template still renders after {RENDER_SECONDS:g} s; loop over less, or do "
                                "the work outside the template")

    def check(self, size: int, what: str) -> None:
        """Refuse ``what`` when it would build ``size`` characters or items, above the limit;
        else count it as built."""
        if size > self.max_value:
            raise TemplateLimit(f"{what} would build {size:,} characters or items, more than the "
                                f"{self.max_value:,} a template may build; {_FIX}")
        self.build(size)

    def build(self, size: int) -> None:
        """Count ``size`` characters or items built; refuse when the render has built too much."""
        self.built += size
        limit = BUILT_FACTOR * self.max_value
        if self.built > limit:
            raise TemplateLimit(f"the template builds more than {limit:,} characters or items in all; {_FIX}")

    def write(self, size: int) -> None:
        self.written += size
        if self.written > self.max_chars:
            raise TemplateLimit(f"the template renders more than {self.max_chars:,} characters{self.why}; "
                                "shorten the text it renders")


_METER: contextvars.ContextVar[Meter | None] = contextvars.ContextVar("squad_template_meter", default=None)


def _meter() -> Meter:
    """The meter of the render in progress; outside one (jinja folding constants while it
    compiles) a fresh meter, so the value limits still hold."""
    return _METER.get() or Meter()


@contextlib.contextmanager
def metered(meter: Meter) -> Iterator[Meter]:
    """Count every render inside the ``with`` block on ``meter``."""
    token = _METER.set(meter)
    try:
        yield meter
    finally:
        _METER.reset(token)


def flat_size(value: Any, cap: int) -> int:
    """About how many characters ``str(value)`` has, computed without building it and without
    walking further than ``cap`` (returns a number above ``cap`` as soon as it knows it is).
    Lists, tuples, dicts and sets are walked (a list holding the same big string many times
    counts it each time); an integer counts its digits; other objects count 16."""
    total, stack = 0, [value]
    while stack and total <= cap:
        item = stack.pop()
        if isinstance(item, str):
            total += len(item)
        elif isinstance(item, bool) or item is None:
            total += 5
        elif isinstance(item, int):
            total += max(1, math.ceil(item.bit_length() / 3.32))
        elif isinstance(item, Mapping):
            total += 2 + 4 * len(item)
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, (list, tuple, set, frozenset, range)):
            total += 2 + 2 * len(item)
            if not isinstance(item, range):
                stack.extend(item)
        else:
            total += 16
    return total


def _size(value: Any) -> int:
    """Shallow size of a built value: characters of a string, items of a collection, else 0."""
    if isinstance(value, (str, list, tuple, dict, set, frozenset)):
        return len(value)
    return 0


def _as_int(value: Any) -> int | None:
    return int(value) if isinstance(value, int) else None


# --- operators -------------------------------------------------------------------------------


def _check_binop(op: str, left: Any, right: Any, meter: Meter) -> None:
    expr = f"'{op}'"
    if op == "**" and isinstance(left, int) and isinstance(right, int) and right > 0 and abs(left) > 1:
        if right * math.log2(abs(left)) > _MAX_INT_BITS:
            raise TemplateLimit(f"{left} ** {right} would have about {int(right * math.log10(abs(left))):,} digits, "
                                f"more than the {MAX_INT_DIGITS:,} a template may compute; {_FIX}")
    if op == "*":
        if isinstance(left, int) and isinstance(right, int):
            if left.bit_length() + right.bit_length() > _MAX_INT_BITS:
                raise TemplateLimit(f"the product would have more than {MAX_INT_DIGITS:,} digits; {_FIX}")
            return
        if isinstance(left, (str, list, tuple)) and isinstance(right, int):
            seq, times = left, right
        elif isinstance(right, (str, list, tuple)) and isinstance(left, int):
            seq, times = right, left
        else:
            return
        if times > 1:
            meter.check(_size(seq) * times, f"{expr} repeating {_size(seq):,} characters or items {times:,} times")
    if op == "+" and isinstance(left, (str, list, tuple)) and isinstance(right, type(left)):
        meter.check(len(left) + len(right), f"{expr} joining two values")
    if op == "%" and isinstance(left, str):
        _refuse_internal(right, "a value formatted with '%'")
        meter.check(_format_size(left, right, meter), f"{expr} formatting")


_WIDTHS = re.compile(r"\d+")


def _format_size(fmt: str, args: Any, meter: Meter) -> int:
    """An upper bound of the size of ``fmt`` formatted with ``args`` (``%`` or ``str.format``):
    every field may hold all of the arguments, every number in ``fmt`` may be a width."""
    fields = fmt.count("%") + fmt.count("{")
    widths = sum(int(n) if len(n) < 12 else 10**12 for n in _WIDTHS.findall(fmt))
    return len(fmt) + widths + fields * flat_size(args, meter.max_value)


# --- calls -------------------------------------------------------------------------------------

_PADS = {"ljust", "rjust", "center", "zfill"}


def _check_str_method(name: str, text: str, args: tuple[Any, ...], kwargs: Mapping[str, Any], meter: Meter) -> None:
    what = f"'{name}()'"
    if name in _PADS and args and isinstance(args[0], int):
        meter.check(args[0], f"{what} padding to width {args[0]:,}")
    elif name == "expandtabs":
        size = _as_int(args[0] if args else kwargs.get("tabsize", 8)) or 8
        meter.check(len(text) + text.count("\t") * size, f"{what} with tab size {size:,}")
    elif name == "replace" and len(args) >= 2 and isinstance(args[0], str) and isinstance(args[1], str):
        meter.check(_replace_size(text, args[0], args[1]), what)
    elif name in ("format", "format_map"):
        meter.check(_format_size(text, (args, dict(kwargs)), meter), what)


def _replace_size(text: str, old: str, new: str) -> int:
    """Characters ``text.replace(old, new)`` gives (an empty ``old`` matches between every two)."""
    hits = text.count(old) if old else len(text) + 1
    return len(text) + hits * max(0, len(new) - len(old))


def _checked_join(sep: str, items: Any, meter: Meter) -> list[Any]:
    """``items`` as a list (counted as it is walked), refused when joining them with ``sep``
    would build too much."""
    listed = _take(items, meter)
    meter.check(flat_size(listed, meter.max_value) + len(sep) * len(listed), "'join'")
    return listed


def _take(items: Any, meter: Meter) -> list[Any]:
    if isinstance(items, (list, tuple)):
        meter.step(len(items))
        return list(items)
    out = []
    for item in items:
        meter.step()
        out.append(item)
        if len(out) > meter.max_value:
            meter.check(len(out), "a list")
    meter.build(len(out))
    return out


# --- filters -------------------------------------------------------------------------------------

_WALKING = {"batch", "dictsort", "groupby", "join", "list", "map", "max", "min", "reject", "rejectattr",
            "reverse", "select", "selectattr", "slice", "sort", "sum", "unique", "tojson", "pprint",
            "string", "xmlattr", "items"}
"""Filters that walk every item of a collection: charged one step per item."""

_FLATTENING = {"string", "tojson", "pprint", "urlize", "xmlattr", "format", "urlencode"}
"""Filters that turn a whole value into text: its flat size is checked first."""

_TO_TEXT = {"string", "format", "indent", "center", "wordwrap", "trim", "title", "upper", "lower", "capitalize"}
"""Filters that print their input's ``str()``: an object that is not data is refused first."""


def _guard_filter(name: str, func: Callable[..., Any]) -> Callable[..., Any]:
    """``func`` (a built-in filter) with its arguments checked and its cost charged."""

    def check(value: Any, args: tuple[Any, ...], kwargs: dict[str, Any], meter: Meter) -> None:
        meter.step()
        if name in _TO_TEXT:
            _refuse_internal(value, f"the '{name}' filter's input")
        if name in _WALKING and isinstance(value, (list, tuple, dict, set)):
            meter.step(len(value))
        if name in _FLATTENING and not isinstance(value, str):
            meter.check(flat_size(value, meter.max_value), f"the '{name}' filter")
        arg = lambda i, key, default=None: args[i] if len(args) > i else kwargs.get(key, default)  # noqa: E731
        text = value if isinstance(value, str) else ""
        if name == "center":
            width = _as_int(arg(0, "width", 80)) or 0
            meter.check(width, f"the 'center' filter (width {width:,})")
        elif name == "indent":
            width = arg(0, "width", 4)
            pad = width if isinstance(width, int) else len(str(width))
            meter.check(len(text) + (text.count("\n") + 1) * pad, f"the 'indent' filter (width {pad:,})")
        elif name == "format":
            meter.check(_format_size(text, (args, kwargs), meter), "the 'format' filter")
        elif name == "replace":
            old, new = str(arg(0, "old", "")), str(arg(1, "new", ""))
            meter.check(_replace_size(text, old, new), "the 'replace' filter")
        elif name == "wordwrap":
            width = max(1, _as_int(arg(0, "width", 79)) or 1)
            wrap = arg(3, "wrapstring") or "\n"
            breaks = len(text) // width + text.count(" ") + text.count("\n") + 1
            meter.check(len(text) + breaks * len(str(wrap)), "the 'wordwrap' filter")
        elif name in ("batch", "slice"):
            count = _as_int(arg(0, "linecount" if name == "batch" else "slices", 1)) or 0
            meter.check(count, f"the '{name}' filter ({count:,} {'items per batch' if name == 'batch' else 'slices'})")
            if name == "slice":
                meter.step(count)

    if name == "join":
        @functools.wraps(func)
        def join(eval_ctx: Any, value: Any, d: str = "", attribute: Any = None) -> str:
            meter = _meter()
            meter.step()
            items = _checked_join(str(d), value if attribute is None else list(value), meter)
            _refuse_internal(items, "an item the 'join' filter joins")
            return func(eval_ctx, items, d, attribute)
        return join

    if name == "sum":
        @functools.wraps(func)
        def total(env: Any, iterable: Any, attribute: Any = None, start: Any = 0) -> Any:
            meter = _meter()
            items = _take(iterable, meter)
            if isinstance(start, (list, tuple, str)) or any(isinstance(i, (list, tuple, str)) for i in items[:1]):
                meter.check(_size(start) + sum(_size(i) for i in items), "the 'sum' filter")
            return func(env, items, attribute, start)
        return total

    pass_arg = jinja2.utils._PassArg.from_obj(func)

    @functools.wraps(func)
    def guarded(*call_args: Any, **kwargs: Any) -> Any:
        meter = _meter()
        lead = 1 if pass_arg is not None else 0
        value = call_args[lead] if len(call_args) > lead else None
        check(value, call_args[lead + 1:], kwargs, meter)
        result = func(*call_args, **kwargs)
        if isinstance(result, str):
            meter.check(len(result) - _size(value), f"the '{name}' filter")
            meter.build(len(result))
        elif isinstance(result, (list, tuple)):
            meter.build(len(result))
        elif isinstance(result, types.GeneratorType):
            return _counted(result, meter)
        return result

    return guarded


def _counted(items: Iterable[Any], meter: Meter) -> Iterator[Any]:
    for item in items:
        meter.step()
        yield item


def _range(*args: int) -> range:
    """``range()`` in a template: at most jinja's ``MAX_RANGE`` (100,000) items."""
    _meter().step()
    items = range(*args)
    if len(items) > MAX_RANGE:
        raise TemplateLimit(f"range() of {len(items):,} items is more than the {MAX_RANGE:,} a template may loop "
                            "over; loop over less")
    return items


@pass_context
def _loop(context: Any, iterable: Any) -> Iterator[Any]:
    """Every ``{% for %}`` iterable: one step per iteration."""
    return _counted(iterable, _meter())


@pass_context
def _concat(context: Any, parts: list[Any]) -> str:
    """``a ~ b ~ c``: refused when the joined text would be too big."""
    meter = _meter()
    meter.step()
    meter.check(flat_size(parts, meter.max_value), "'~'")
    for part in parts:
        _refuse_internal(part, "a part joined with '~'")
    return "".join(str(p) for p in parts)


@pass_context
def _out(context: Any, value: Any) -> Any:
    """Every piece of output (text and ``{{ }}``): counted against the output limit."""
    meter = _meter()
    meter.write(flat_size(value, meter.max_chars - meter.written + 1))
    return value


@pass_context
def _out_value(context: Any, value: Any) -> Any:
    """Every ``{{ ... }}`` output: refused when it is not data (:func:`not_text`), then counted."""
    _refuse_internal(value, "{{ ... }}")
    return _out(context, value)


_PLAIN = (str, int, float, type(None))
_HOLDERS = (list, tuple, dict, set, frozenset)
_GENERATED = (types.GeneratorType, range, type({}.items()), type({}.keys()), type({}.values()), map, filter, zip,
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


def _refuse_internal(value: Any, what: str) -> None:
    problem = not_text(value)
    if problem is not None:
        raise TemplateLimit(f"{what} does not give text: {problem}")


_MACRO_STEPS = 4
"""Steps one macro call costs (a call runs a whole template function: ~4 simple steps' time)."""

_LOOP, _CONCAT, _TEXT = "squad:loop", "squad:concat", "squad:text"
"""Names no template can spell (a filter name is an identifier), for :func:`bound`."""

OUT = "squad:out"
"""The filter every ``{{ ... }}`` output passes through (the template's own text passes
through another): an environment may replace it to treat that output as data."""


class BoundedSandbox(ImmutableSandboxedEnvironment):
    """An immutable jinja2 sandbox whose templates cannot exhaust CPU or memory (module
    docstring). Parse with :meth:`parse`, then pass the tree through :func:`bound` before
    compiling it; render inside :func:`metered`."""

    intercepted_binops = frozenset({"*", "**", "+", "%"})

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.globals.pop("lipsum", None)
        self.globals["range"] = _range
        self.filters = {name: _guard_filter(name, f) for name, f in self.filters.items()}
        self.filters.update({_LOOP: _loop, _CONCAT: _concat, _TEXT: _out, OUT: _out_value})

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        meter = _meter()
        meter.step()
        _check_binop(operator, left, right, meter)
        return super().call_binop(context, operator, left, right)

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805
        meter = _meter()
        meter.step(_MACRO_STEPS if isinstance(__obj, jinja2.runtime.Macro) else 1)
        bound_to = getattr(getattr(__obj, "__wrapped__", __obj), "__self__", None)
        name = getattr(__obj, "__name__", "")
        if isinstance(bound_to, str):
            if name == "join" and args:
                args = (_checked_join(bound_to, args[0], meter), *args[1:])
            else:
                _check_str_method(name, bound_to, args, kwargs, meter)
        result = super().call(__context, __obj, *args, **kwargs)
        meter.build(_size(result))
        return result

    def getattr(self, obj: Any, attribute: str) -> Any:
        _meter().step()
        return super().getattr(obj, attribute)

    def getitem(self, obj: Any, argument: Any) -> Any:
        meter = _meter()
        meter.step()
        result = super().getitem(obj, argument)
        if isinstance(argument, slice):
            meter.build(_size(result))
        return result


def bound(ast: nodes.Template, env: jinja2.Environment) -> nodes.Template:
    """Rewrite ``ast`` in place so loops, ``~`` and output are counted (module docstring)."""

    def wrap(node: nodes.Expr, name: str) -> nodes.Filter:
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

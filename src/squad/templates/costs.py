"""What each operator, string method and filter a template calls may cost, checked before it runs.

:func:`check_binop` (``*``, ``**``, ``+``, ``%``), :func:`check_str_method` (padding, tabs,
``replace``, ``format``), :func:`checked_join` and :func:`guard_filter` (every built-in filter
wrapped: its steps charged, its arguments and result sized) raise
:class:`~squad.templates.meter.TemplateLimit` before a value beyond the limits is built
(:mod:`squad.templates.sandbox`).
"""

from __future__ import annotations

import functools
import math
import re
import types
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import jinja2

from squad.templates.meter import FIX, MAX_INT_DIGITS, Meter, TemplateLimit, as_int, current_meter, flat_size, size_of
from squad.templates.text import as_text, refuse_internal

__all__ = ["check_binop", "format_size", "check_str_method", "replace_size", "checked_join", "take", "guard_filter",
           "counted"]

_MAX_INT_BITS = math.ceil(MAX_INT_DIGITS * math.log2(10))

def check_binop(op: str, left: Any, right: Any, meter: Meter) -> None:
    expr = f"'{op}'"
    if op == "**" and isinstance(left, int) and isinstance(right, int) and right > 0 and abs(left) > 1:
        if right * math.log2(abs(left)) > _MAX_INT_BITS:
            raise TemplateLimit(f"{left} ** {right} would have about {int(right * math.log10(abs(left))):,} digits, "
                                f"more than the {MAX_INT_DIGITS:,} a template may compute; {FIX}")
    if op == "*":
        if isinstance(left, int) and isinstance(right, int):
            if left.bit_length() + right.bit_length() > _MAX_INT_BITS:
                raise TemplateLimit(f"the product would have more than {MAX_INT_DIGITS:,} digits; {FIX}")
            return
        if isinstance(left, (str, list, tuple)) and isinstance(right, int):
            seq, times = left, right
        elif isinstance(right, (str, list, tuple)) and isinstance(left, int):
            seq, times = right, left
        else:
            return
        if times > 1:
            meter.check(size_of(seq) * times, f"{expr} repeating {size_of(seq):,} characters or items {times:,} times")
    if op == "+" and isinstance(left, (str, list, tuple)) and isinstance(right, type(left)):
        meter.check(len(left) + len(right), f"{expr} joining two values")
    if op == "%" and isinstance(left, str):
        refuse_internal(right, "a value formatted with '%'")
        meter.check(format_size(left, right, meter), f"{expr} formatting")


_WIDTHS = re.compile(r"\d+")


def format_size(fmt: str, args: Any, meter: Meter) -> int:
    """An upper bound of the size of ``fmt`` formatted with ``args`` (``%`` or ``str.format``):
    every field may hold all of the arguments, every number in ``fmt`` may be a width."""
    fields = fmt.count("%") + fmt.count("{")
    widths = sum(int(n) if len(n) < 12 else 10**12 for n in _WIDTHS.findall(fmt))
    return len(fmt) + widths + fields * flat_size(args, meter.max_value)


# --- calls -------------------------------------------------------------------------------------

_PADS = {"ljust", "rjust", "center", "zfill"}


def check_str_method(name: str, text: str, args: tuple[Any, ...], kwargs: Mapping[str, Any], meter: Meter) -> None:
    what = f"'{name}()'"
    if name in _PADS and args and isinstance(args[0], int):
        meter.check(args[0], f"{what} padding to width {args[0]:,}")
    elif name == "expandtabs":
        size = as_int(args[0] if args else kwargs.get("tabsize", 8)) or 8
        meter.check(len(text) + text.count("\t") * size, f"{what} with tab size {size:,}")
    elif name == "replace" and len(args) >= 2 and isinstance(args[0], str) and isinstance(args[1], str):
        meter.check(replace_size(text, args[0], args[1]), what)
    elif name in ("format", "format_map"):
        meter.check(format_size(text, (args, dict(kwargs)), meter), what)


def replace_size(text: str, old: str, new: str) -> int:
    """Characters ``text.replace(old, new)`` gives (an empty ``old`` matches between every two)."""
    hits = text.count(old) if old else len(text) + 1
    return len(text) + hits * max(0, len(new) - len(old))


def checked_join(sep: str, items: Any, meter: Meter) -> list[Any]:
    """``items`` as a list (counted as it is walked), refused when joining them with ``sep``
    would build too much."""
    listed = take(items, meter)
    meter.check(flat_size(listed, meter.max_value) + len(sep) * len(listed), "'join'")
    return listed


def take(items: Any, meter: Meter) -> list[Any]:
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


_WALKING = {"batch", "dictsort", "groupby", "join", "list", "map", "max", "min", "reject", "rejectattr",
            "reverse", "select", "selectattr", "slice", "sort", "sum", "unique", "tojson", "pprint",
            "string", "xmlattr", "items"}
"""Filters that walk every item of a collection: charged one step per item."""

_FLATTENING = {"string", "tojson", "pprint", "urlize", "xmlattr", "format", "urlencode"}
"""Filters that turn a whole value into text: its flat size is checked first."""

_TO_TEXT = {"string", "format", "indent", "center", "wordwrap", "trim", "title", "upper", "lower", "capitalize"}
"""Filters that print their input's ``str()``: an object that is not data is refused first."""


def guard_filter(name: str, func: Callable[..., Any]) -> Callable[..., Any]:
    """``func`` (a built-in filter) with its arguments checked and its cost charged."""
    if name == "join":
        return _guard_join(func)
    if name == "sum":
        return _guard_sum(func)
    pass_arg = jinja2.utils._PassArg.from_obj(func)  # noqa: SLF001 - jinja2's pass_context marker has no public reader

    @functools.wraps(func)
    def guarded(*call_args: Any, **kwargs: Any) -> Any:
        meter = current_meter()
        lead = 1 if pass_arg is not None else 0
        value = call_args[lead] if len(call_args) > lead else None
        _check_filter(name, value, call_args[lead + 1:], kwargs, meter)
        if name in _TO_TEXT and len(call_args) > lead:  # it prints its input: a list or mapping as JSON
            rest = call_args[lead + 1:]
            if name == "format":  # "%s"|format(flag): its arguments print too (true, null; JSON, never a repr)
                rest, kwargs = tuple(as_text(a) for a in rest), {k: as_text(v) for k, v in kwargs.items()}
            call_args = (*call_args[:lead], as_text(value), *rest)
        result = func(*call_args, **kwargs)
        if isinstance(result, str):
            meter.check(len(result) - size_of(value), f"the '{name}' filter")
            meter.build(len(result))
        elif isinstance(result, (list, tuple)):
            meter.build(len(result))
        elif isinstance(result, types.GeneratorType):
            return counted(result, meter)
        return result

    return guarded


def _check_filter(name: str, value: Any, args: tuple[Any, ...], kwargs: dict[str, Any], meter: Meter) -> None:
    """Charge filter ``name``'s steps on ``value`` and refuse it when its input or arguments
    would build too much."""
    meter.step()
    if name in _TO_TEXT:
        refuse_internal(value, f"the '{name}' filter's input")
    if name in _WALKING and isinstance(value, (list, tuple, dict, set)):
        meter.step(len(value))
    if name in _FLATTENING and not isinstance(value, str):
        meter.check(flat_size(value, meter.max_value), f"the '{name}' filter")
    arg = lambda i, key, default=None: args[i] if len(args) > i else kwargs.get(key, default)  # noqa: E731
    text = value if isinstance(value, str) else ""
    if name == "center":
        width = as_int(arg(0, "width", 80)) or 0
        meter.check(width, f"the 'center' filter (width {width:,})")
    elif name == "indent":
        indent = arg(0, "width", 4)
        pad = indent if isinstance(indent, int) else len(str(indent))
        meter.check(len(text) + (text.count("\n") + 1) * pad, f"the 'indent' filter (width {pad:,})")
    elif name == "format":
        meter.check(format_size(text, (args, kwargs), meter), "the 'format' filter")
    elif name == "replace":
        old, new = str(arg(0, "old", "")), str(arg(1, "new", ""))
        meter.check(replace_size(text, old, new), "the 'replace' filter")
    elif name == "wordwrap":
        width = max(1, as_int(arg(0, "width", 79)) or 1)
        wrap = arg(3, "wrapstring") or "\n"
        breaks = len(text) // width + text.count(" ") + text.count("\n") + 1
        meter.check(len(text) + breaks * len(str(wrap)), "the 'wordwrap' filter")
    elif name in ("batch", "slice"):
        count = as_int(arg(0, "linecount" if name == "batch" else "slices", 1)) or 0
        meter.check(count, f"the '{name}' filter ({count:,} {'items per batch' if name == 'batch' else 'slices'})")
        if name == "slice":
            meter.step(count)


def _guard_join(func: Callable[..., Any]) -> Callable[..., Any]:
    """The ``join`` filter, refused when the joined text would be too big or holds a non-value."""

    @functools.wraps(func)
    def join(eval_ctx: Any, value: Any, d: str = "", attribute: Any = None) -> str:
        meter = current_meter()
        meter.step()
        items = checked_join(str(d), value if attribute is None else list(value), meter)
        refuse_internal(items, "an item the 'join' filter joins")
        if attribute is None:
            items = [as_text(i) for i in items]  # a list of mappings joins as JSON texts, never reprs
        return func(eval_ctx, items, d, attribute)

    return join


def _guard_sum(func: Callable[..., Any]) -> Callable[..., Any]:
    """The ``sum`` filter, refused when adding texts or lists would build too much."""

    @functools.wraps(func)
    def total(env: Any, iterable: Any, attribute: Any = None, start: Any = 0) -> Any:
        meter = current_meter()
        items = take(iterable, meter)
        if isinstance(start, (list, tuple, str)) or any(isinstance(i, (list, tuple, str)) for i in items[:1]):
            meter.check(size_of(start) + sum(size_of(i) for i in items), "the 'sum' filter")
        return func(env, items, attribute, start)

    return total


def _counted(items: Iterable[Any], meter: Meter) -> Iterator[Any]:
    """``items``, one step charged per item."""
    for item in items:
        meter.step()
        yield item


counted = _counted
"""``_counted``: its name is what a template that prints the generator sees
(``<generator object _counted>``), kept as it was."""

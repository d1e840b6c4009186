"""The one sandboxed jinja2 environment squad renders templates with.

Templates are agent ``instructions`` and recipe step ``prompt`` fields. They are rendered
only after the YAML is parsed, one field at a time, never into raw YAML text (field case F10).

Rules:

- ``{{ expr }}`` and ``{% stmt %}`` are template syntax; nothing else is. Literal braces in
  ordinary text (a JSON example such as ``{"a": {"b": 1}}``) stay as written. jinja's
  ``{# #}`` comment syntax is switched off so ``{#`` in text stays too.
- Undefined variables are errors (``StrictUndefined``), never empty strings.
- The sandbox (:class:`squad.templates.sandbox.BoundedSandbox`, jinja's immutable sandbox) refuses
  private/dunder attributes, unsafe callables and changes to lists and dicts, and bounds
  what a template may cost: the values it builds, the steps it takes and the text it
  renders (field case F18); autoescape is off (prompts are plain text, not HTML).
- Errors are :class:`squad.errors.RecipeError` naming where the template lives and the
  undefined variable or syntax problem. Unknown filters and tests (``{{ x | nosuch }}``,
  ``{% if x is nosuch %}``) are compile errors, found by :func:`check_template` before any
  model call. Anything that fails while rendering (``{{ 10 / 0 }}``, ``{{ "a" + 1 }}``, a
  ``range()`` over the sandbox's ``MAX_RANGE`` of 100000 items, ``{{ 'x' * 10**9 }}``) is a
  :class:`RecipeError` too, never a traceback or a hang.
- ``data=True`` (a recipe prompt as sent): the output of every ``{{ ... }}`` is data, wrapped
  by :func:`squad.templates.marks.as_data`, so only the template's own text can @mention an agent
  (field case F13); :func:`mark_tags` gives the source read the same way, for the checks
  made before rendering. Values inside the template (``{% if x == "a@b" %}``, ``| length``)
  are the plain values.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from typing import Any

import jinja2
from jinja2 import meta, nodes, pass_context

from squad.errors import RecipeError
from squad.templates.marks import as_data
from squad.templates.sandbox import MAX_VALUE, OUT, BoundedSandbox, Meter, TemplateLimit, bound, flat_size, metered

__all__ = ["AnyValue", "render_template", "template_variables", "template_paths", "check_template", "environment",
           "mark_tags"]

_ENV = BoundedSandbox(
    undefined=jinja2.StrictUndefined,
    autoescape=False,
    keep_trailing_newline=True,
    # jinja needs comment delimiters; pick ones that never occur in prose or JSON
    comment_start_string="{#squad-comment",
    comment_end_string="squad-comment#}",
)


class AnyValue(dict):
    """A stand-in for a value not known yet (a step's ``value`` when recipes are checked or
    counted): every key or attribute of it is itself, and it prints as ``text``."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text

    def __missing__(self, key: Any) -> AnyValue:
        return self

    def __str__(self) -> str:
        return self.text

    @classmethod
    def many(cls, text: str) -> list[AnyValue]:
        """A stand-in list (a map's values): one item when iterated, any index readable."""
        return _AnyList([cls(text)])


class _AnyList(list):
    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, int):
            return super().__getitem__(0)
        return super().__getitem__(index)


def environment() -> BoundedSandbox:
    """The shared sandboxed environment (StrictUndefined, autoescape off, bounded)."""
    return _ENV


def _error(problem: str, where: str, loc: Mapping[str, Any] | None) -> RecipeError:
    loc = dict(loc or {})
    loc.setdefault("field", where or None)
    return RecipeError(problem, **loc)


def _line(source: str, lineno: int | None) -> str:
    return f" (template line {lineno})" if lineno and source.count("\n") else ""


def _parse(source: str, where: str, loc: Mapping[str, Any] | None) -> nodes.Template:
    """Parse ``source`` and check every filter and test name it uses exists.

    jinja checks filter/test names only when it compiles, and not at all inside an ``if``
    (there an unknown name fails at render time), so the names are checked here on the AST.
    """
    try:
        ast = _ENV.parse(source)
    except jinja2.TemplateSyntaxError as exc:
        message = (exc.message or "").rstrip(".")
        if re.search(r"unexpected char '\\u200[cd]'", message):  # a Persian or Hindi name's joiner after a dot
            raise _error(f"template syntax error{_line(source, exc.lineno)}: {message}: a name with a zero-width "
                         "joiner (U+200C, U+200D) is not a template name after a dot; write it in brackets, "
                         "params[\"name\"] or steps[\"id\"].output", where, loc) from None
        raise _error(
            f"template syntax error{_line(source, exc.lineno)}: {message}; only "
            f"{{{{ ... }}}} and "
            "{% ... %} are template syntax, write literal braces as plain text",
            where,
            loc,
        ) from None
    for kind, node_type, known in (("filter", nodes.Filter, _ENV.filters), ("test", nodes.Test, _ENV.tests)):
        for node in ast.find_all(node_type):
            if node.name not in known:
                hint = difflib.get_close_matches(node.name, list(known), n=1)
                did = f"; did you mean '{hint[0]}'?" if hint else ""
                raise _error(
                    f"template error{_line(source, node.lineno)}: unknown {kind} '{node.name}'{did}",
                    where,
                    loc,
                )
    return bound(ast, _ENV)


_DATA_ENV: BoundedSandbox | None = None


def _data_env() -> BoundedSandbox:
    """:data:`_ENV` with every ``{{ ... }}`` output wrapped as data (module docstring): the
    sandbox's output filter (:data:`squad.templates.sandbox.OUT`, counting each ``{{ ... }}``) also
    marks it; the template's own text goes through another one and stays as written."""
    global _DATA_ENV
    if _DATA_ENV is None:
        count = _ENV.filters[OUT]

        @pass_context
        def out_as_data(context: Any, value: Any) -> Any:
            return as_data(count(context, value))

        env = _ENV.overlay()
        env.filters = {**_ENV.filters, OUT: out_as_data}
        _DATA_ENV = env
    return _DATA_ENV


def _compile(source: str, where: str, loc: Mapping[str, Any] | None, data: bool = False) -> jinja2.Template:
    """Parse and compile ``source``; every compile-time problem becomes a :class:`RecipeError`."""
    ast = _parse(source, where, loc)
    try:
        return (_data_env() if data else _ENV).from_string(ast)
    except jinja2.TemplateSyntaxError as exc:  # includes TemplateAssertionError
        raise _error(f"template error{_line(source, exc.lineno)}: {exc.message}", where, loc) from None


def check_template(source: str, *, where: str = "", loc: Mapping[str, Any] | None = None) -> None:
    """Raise :class:`RecipeError` if ``source`` is not a valid template: a syntax error, an
    unknown filter or test, or anything else jinja refuses when it compiles the template.
    Does not render (undefined variables and runtime errors are not found here)."""
    if "{{" in source or "{%" in source:
        _compile(source, where, loc)


def render_template(
    source: str,
    variables: Mapping[str, Any],
    *,
    where: str = "",
    loc: Mapping[str, Any] | None = None,
    max_chars: int | None = None,
    why: str = "",
    data: bool = False,
) -> str:
    """Render ``source`` with ``variables`` in the sandbox and return the text.

    ``data=True``: every ``{{ ... }}`` output is marked as data (module docstring).

    ``where`` names the field for error messages (``agents.lead.instructions``); ``loc``
    optionally carries ``file``/``line``/``column`` for :class:`RecipeError`. ``max_chars``
    caps the rendered text in characters (default: the size of ``variables`` plus
    :data:`squad.templates.sandbox.MAX_VALUE`); ``why`` says where a cap comes from, for the message
    (``" (agent 'lead' has a budget of 512 tokens)"``). Text without template syntax is
    returned as it is, whatever its size: the caller checks it against its budget.

    Raises :class:`RecipeError` on a syntax error, an unknown filter or test, an undefined
    variable or attribute (naming it), an operation the sandbox forbids, a template that
    builds too much, takes too many steps or renders more than ``max_chars``
    (:mod:`squad.templates.sandbox`), or any other exception while rendering (``template error:
    division by zero``).
    """
    if "{{" not in source and "{%" not in source:
        return source  # nothing to render: keep the text byte for byte
    template = _compile(source, where, loc, data)
    given = flat_size(variables, 10**12)
    meter = Meter(max_value=MAX_VALUE + given, max_chars=max_chars if max_chars is not None else MAX_VALUE + given,
                  why=why)
    try:
        with metered(meter):
            return template.render(**variables)
    except TemplateLimit as exc:
        raise _error(f"template error: {exc}", where, loc) from None
    except RecursionError:
        raise _error("template error: macros call themselves too deeply; end the recursion sooner", where,
                     loc) from None
    except jinja2.UndefinedError as exc:
        raise _error(_explain_undefined(source, variables, exc), where, loc) from None
    except jinja2.exceptions.SecurityError as exc:
        raise _error(f"template not allowed by the sandbox: {str(exc).rstrip('.')}; templates may not reach "
                     "Python internals or "
                     "change values: remove this expression", where, loc) from None
    except jinja2.TemplateError as exc:
        raise _error(f"template error: {exc}; fix this expression", where, loc) from None
    except Exception as exc:  # noqa: BLE001 - the template's own arithmetic, a bad + ...
        problem = str(exc) or type(exc).__name__
        raise _error(f"template error: {problem} ({type(exc).__name__}); fix this expression", where, loc) from None


def mark_tags(source: str) -> str:
    """``source`` as the mention parser reads it before rendering: every ``{{ ... }}`` marked
    as data (:func:`squad.templates.marks.as_data`), as its output will be, and every ``{% ... %}`` tag
    left out, as it is when rendered (the text on both sides joins). ``source`` unchanged when
    it has no tags or does not lex."""
    if "{{" not in source and "{%" not in source:
        return source
    out: list[str] = []
    tag: list[str] = []
    try:
        for _, kind, value in _ENV.lex(source):
            if kind == "data" or kind.startswith("raw_"):
                out.append(value if kind == "data" else "")
                continue
            tag.append(value)
            if kind == "variable_end":
                out.append(as_data("".join(tag)))
            if kind.endswith("_end"):
                tag = []
    except jinja2.TemplateSyntaxError:
        return source
    if tag:  # a tag left open at the end (a template check_template refuses)
        out.append(as_data("".join(tag)))
    return "".join(out)


def _explain_undefined(source: str, variables: Mapping[str, Any], exc: jinja2.UndefinedError) -> str:
    """Name the first dotted reference that does not resolve, with a near-miss suggestion."""
    for path in sorted(template_paths(source)):
        scope: Any = variables
        for depth, part in enumerate(path):
            if isinstance(scope, Mapping) and part in scope:
                scope = scope[part]
                continue
            if not isinstance(scope, Mapping):
                break  # attribute of a non-mapping: leave it to jinja's message
            name = ".".join(path[: depth + 1])
            keys = sorted(str(k) for k in scope)
            hint = difflib.get_close_matches(part, keys, n=1)
            did = f"; did you mean '{hint[0]}'?" if hint else ""
            have = ", ".join(keys) or "nothing"
            owner = ".".join(path[:depth]) or "this template"
            return f"undefined template variable '{name}'{did} ({owner} has: {have})"
    return f"undefined template variable: {exc.message}; fix this expression"


def template_variables(source: str, *, where: str = "", loc: Mapping[str, Any] | None = None) -> set[str]:
    """Top-level variable names ``source`` reads without defining them (``{"params", "item"}``).

    For static validation before any model call. Raises :class:`RecipeError` on a syntax error
    or an unknown filter or test.
    """
    return set(_free_names(_parse(source, where, loc), source, where, loc))


def _free_names(ast: nodes.Template, source: str, where: str, loc: Mapping[str, Any] | None) -> set[str]:
    # find_undeclared_variables runs jinja's code generator, which can raise compile errors
    try:
        return set(meta.find_undeclared_variables(ast))
    except jinja2.TemplateSyntaxError as exc:
        raise _error(f"template error{_line(source, exc.lineno)}: {exc.message}", where, loc) from None


def template_paths(
    source: str, *, where: str = "", loc: Mapping[str, Any] | None = None
) -> set[tuple[str, ...]]:
    """Dotted references to undeclared variables: ``{{ steps.review.output }}`` gives
    ``("steps", "review", "output")``; ``{{ params["topic"] }}`` gives ``("params", "topic")``;
    a bare ``{{ item }}`` gives ``("item",)``. Dynamic subscripts end the path.

    Only names that :func:`template_variables` reports are included (loop variables and
    ``{% set %}`` names are not). Raises :class:`RecipeError` on a syntax error or an
    unknown filter or test.
    """
    ast = _parse(source, where, loc)
    free = _free_names(ast, source, where, loc)
    found: set[tuple[str, ...]] = set()

    def chain(node: nodes.Node) -> tuple[str, ...] | None:
        if isinstance(node, nodes.Name):
            return (node.name,)
        if isinstance(node, nodes.Getattr):
            head = chain(node.node)
            return head + (node.attr,) if head else None
        if isinstance(node, nodes.Getitem) and isinstance(node.arg, nodes.Const):
            head = chain(node.node)
            return head + (str(node.arg.value),) if head else None
        return None

    def visit(node: nodes.Node) -> None:
        if isinstance(node, (nodes.Name, nodes.Getattr, nodes.Getitem)):
            path = chain(node)
            if path is not None:
                if path[0] in free:
                    found.add(path)
                if isinstance(node, nodes.Getitem):
                    visit(node.arg)
                return
        for child in node.iter_child_nodes():
            visit(child)

    visit(ast)
    return found

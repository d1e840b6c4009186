"""Function tools: plain Python functions (sync or async) the model may call; the tool seam.

:class:`Tool` is what the runtime (:mod:`squad.runtime.turn`) calls and what MCP tools
(:mod:`squad.mcp.tool`) are: it sits below both, so neither imports the other's folder for it
(the old path :mod:`squad.runtime.tools` still answers).

The JSON schema of a tool's arguments comes from pydantic (a model built with
``create_model`` from the function's signature and type hints); parameter descriptions
come from the docstring (Google, NumPy or reST style, parsed by ``docstring_parser``).

A tool never crashes a run: bad JSON, arguments that fail validation and exceptions
raised by the function all become the tool's result text, which goes back to the model
(:class:`ToolError` for a message without the exception's name).
Several tool calls of one model turn run concurrently in one task group; sync functions
run in a worker thread (``anyio.to_thread``).
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
import inspect
import json
from collections.abc import Awaitable, Callable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Annotated, Any, get_type_hints

import anyio
import docstring_parser
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PydanticInvalidForJsonSchema,
    PydanticSchemaGenerationError,
    PydanticUserError,
    ValidationError,
    create_model,
)

from squad.errors import UserError
from squad.names import describe_char, first_bad_char

__all__ = ["Tool", "tool", "ToolOutcome", "ToolError", "run_tool_calls", "arguments_for_history", "tool_text",
           "DEFAULT_TOOL_TIMEOUT"]

DEFAULT_TOOL_TIMEOUT = 60.0
"""Seconds a tool call may take unless its ``@tool(timeout=...)`` says otherwise (a tool that sleeps or hangs
must not hold its agent, and the run, forever)."""


class ToolError(Exception):
    """Raise in a tool to give the model ``error: <message>`` as the result (a refusal the
    model should read as such; any other exception also names its type)."""


@dataclass(frozen=True)
class Tool:
    """A function the model may call.

    - ``name``: the function name the model sees (letters of any script, digits, ``_``, ``-``: the name
      characters of :mod:`squad.names`, so ``ask_리뷰어`` of a sub-agent ``리뷰어`` is one).
    - ``description``: what it does (the docstring's description by default).
    - ``args_model``: pydantic model of the arguments; ``parameters()`` is its JSON schema.
    - ``fn``: the callable, sync or async, called with the validated arguments as keywords.
    """

    name: str
    description: str
    args_model: type[BaseModel]
    fn: Callable[..., Any]
    timeout: float | None = DEFAULT_TOOL_TIMEOUT
    """Seconds one call may take (None: no limit); past it the call is ended and the model reads that it timed
    out. An async function is cancelled; a sync one's worker thread cannot be killed in Python, so it is left to
    finish in the background and its result is dropped."""

    @classmethod
    def from_function(
        cls, fn: Callable[..., Any], *, name: str | None = None, description: str | None = None,
        timeout: float | None = DEFAULT_TOOL_TIMEOUT,
    ) -> Tool:
        """Build a tool from ``fn``'s signature, type hints and docstring.

        Raises :class:`UserError` for ``*args``/``**kwargs`` parameters, a parameter type
        pydantic cannot describe as JSON schema, or a bad name. Parameters without a type hint
        accept any JSON value. Every pydantic constraint (``Annotated[..., Field(...)]``,
        ``x: int = Field(ge=1)``, ``conlist``, ``constr``, nested models, enums, ``Literal``)
        is in :meth:`parameters` and checked before the function is called.
        """
        tool_name = name or fn.__name__
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float))
                                    or not 0 < timeout < float("inf")):
            raise UserError(f"tool {tool_name!r}: timeout must be a positive number of seconds or None, got "
                            f"{timeout!r}")
        bad = first_bad_char(tool_name)
        if not tool_name or bad is not None:
            what = f"{describe_char(bad)} is not allowed; " if bad else ""
            raise UserError(f"tool name {tool_name!r}: {what}use letters (of any script), digits, '_' or '-'")
        doc = docstring_parser.parse(inspect.getdoc(fn) or "")
        param_docs = {p.arg_name: p.description for p in doc.params if p.description}
        args_model = _args_model(fn, tool_name, param_docs)
        text = description
        if text is None:
            text = "\n\n".join(p for p in (doc.short_description, doc.long_description) if p)
        return cls(name=tool_name, description=text or tool_name, args_model=args_model, fn=fn,
                   timeout=None if timeout is None else float(timeout))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Call the underlying function directly (as if undecorated)."""
        return self.fn(*args, **kwargs)

    def parameters(self) -> dict[str, Any]:
        """The JSON schema of the arguments (an ``object`` schema)."""
        schema = self.args_model.model_json_schema()
        schema.pop("title", None)
        for prop in schema.get("properties", {}).values():
            prop.pop("title", None)
        return schema

    def spec(self) -> dict[str, Any]:
        """The OpenAI chat ``tools`` entry for this tool."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters()},
        }

    async def call(self, arguments: str) -> ToolOutcome:
        """Validate ``arguments`` (a JSON object as text) and run the function.

        Never raises for a bad call or a failing function: the outcome carries the error text.
        Cancellation propagates.
        """
        try:
            args = self.args_model.model_validate_json(arguments or "{}")
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or 'arguments'}: {e['msg']}" for e in exc.errors()
            )
            return ToolOutcome(self.name, f"error: bad arguments for {self.name}: {problems}", ok=False)
        kwargs = {k: getattr(args, k) for k in type(args).model_fields}
        value: Any = None
        try:
            with anyio.move_on_after(self.timeout if self.timeout is not None else float("inf")) as scope:
                if inspect.iscoroutinefunction(self.fn):
                    value = await self.fn(**kwargs)
                else:  # abandoned on timeout: a thread cannot be stopped from outside
                    value = await anyio.to_thread.run_sync(lambda: self.fn(**kwargs), abandon_on_cancel=True)
                    if inspect.isawaitable(value):
                        value = await value
        except anyio.get_cancelled_exc_class():
            raise
        except ToolError as exc:
            return ToolOutcome(self.name, f"error: {exc}", ok=False)
        except Exception as exc:  # noqa: BLE001 - a tool error goes back to the model
            return ToolOutcome(self.name, f"error: {self.name} raised {type(exc).__name__}{_said(exc)}", ok=False)
        if scope.cancelled_caught:
            return ToolOutcome(self.name, f"error: {self.name} timed out: it did not finish within its timeout of "
                                          f"{self.timeout:g} s and was stopped; no result", ok=False)
        try:
            text = tool_text(value)
        except Exception as exc:  # noqa: BLE001 - its own __str__ raised, nested too deep to write: the tool's fault
            return ToolOutcome(self.name, f"error: {self.name} returned {_type_name(value)} that cannot be written "
                                          f"as text ({type(exc).__name__}{_said(exc)}): return text, numbers, lists "
                                          "or mappings from the tool", ok=False)
        return ToolOutcome(self.name, text, ok=True)


def _said(exc: BaseException) -> str:
    """``": TEXT"`` of an exception, or ``""`` when it has none or its own ``__str__`` raises."""
    try:
        text = str(exc)
    except Exception:  # noqa: BLE001 - an exception class whose text fails: named by its type alone
        return ""
    return f": {text}" if text else ""


@dataclass(frozen=True)
class ToolOutcome:
    """What one tool call gave back: ``text`` goes to the model; ``ok`` is False for errors."""

    name: str
    text: str
    ok: bool


def tool(fn: Callable[..., Any] | None = None, *, name: str | None = None, description: str | None = None,
         timeout: float | None = DEFAULT_TOOL_TIMEOUT) -> Any:
    """Decorator: ``@tool`` or ``@tool(name=..., description=..., timeout=...)`` turns a function into a
    :class:`Tool` (the decorated name is bound to the Tool; call the function as ``t.fn``). ``timeout``: seconds
    one call may take (:data:`DEFAULT_TOOL_TIMEOUT` unless given; None for no limit)."""
    if fn is None:
        return lambda f: Tool.from_function(f, name=name, description=description, timeout=timeout)
    return Tool.from_function(fn, name=name, description=description, timeout=timeout)


def _args_model(fn: Callable[..., Any], tool_name: str, param_docs: Mapping[str, str]) -> type[BaseModel]:
    """The pydantic model of ``fn``'s arguments, built by pydantic from the signature as a class
    body would be: ``Annotated[...]`` metadata (``Field``, ``conlist``, ``constr``) is kept
    (``include_extras``), a ``Field(...)`` default is the field itself (its constraints and its
    default, or required), and a docstring description is added only where the parameter has none.
    Raises :class:`UserError` for ``*args``/``**kwargs``."""
    hints = get_type_hints(fn, include_extras=True)
    params = list(inspect.signature(fn).parameters.values())
    for param in params:
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise UserError(f"tool {tool_name!r}: *args/**kwargs cannot be described to a model")

    def build(docs: Mapping[str, str]) -> type[BaseModel]:
        fields: dict[str, Any] = {}
        for param in params:
            annotation = hints.get(param.name, Any)
            if param.name in docs:  # first in the metadata, so the parameter's own Field wins
                annotation = Annotated[annotation, Field(description=docs[param.name])]
            fields[param.name] = (annotation, ... if param.default is param.empty else param.default)
        try:
            built = create_model(f"{tool_name}_args", __config__=ConfigDict(extra="forbid"), **fields)
            built.model_json_schema()  # a type without a JSON schema fails here, not at the first request
            return built
        except (PydanticSchemaGenerationError, PydanticInvalidForJsonSchema, PydanticUserError, TypeError) as exc:
            raise UserError(f"tool {tool_name!r}: its parameters cannot be described to a model: {exc}") from None

    model = build({})
    missing = {name: text for name, text in param_docs.items()
               if name in model.model_fields and model.model_fields[name].description is None}
    return build(missing) if missing else model


def tool_text(value: Any) -> str:
    """What the model reads for a tool's return value: text as it is; anything else as JSON (text unescaped) in
    which every value that is not JSON is described (:func:`_describe`), so no Python repr (``b'\\x89PNG'``,
    ``<object at 0x...>``) ever reaches the model."""
    if isinstance(value, str):
        return value
    if isinstance(value, (bytes, bytearray, memoryview)):
        return _bytes_text(bytes(value))
    if isinstance(value, BaseModel):
        return value.model_dump_json()
    try:
        return json.dumps(value, ensure_ascii=False, default=_describe)
    except (TypeError, ValueError):  # a circular structure, a key JSON cannot hold
        return f"[{_type_name(value)} that is not data: return text, numbers, lists or mappings from the tool]"


def _bytes_text(data: bytes) -> str:
    """Bytes that are UTF-8 text as that text; others described by size (never their repr)."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return f"[binary data, {len(data):,} bytes, not UTF-8 text; the tool should return text describing it]"
    if any(ord(c) < 32 and c not in "\t\n\r" for c in text):
        return f"[binary data, {len(data):,} bytes, not printable text; the tool should return text describing it]"
    return text


def _type_name(value: Any) -> str:
    name = type(value).__name__
    return f"an {name}" if name[:1].lower() in "aeiou" else f"a {name}"


def _describe(value: Any) -> Any:
    """A JSON stand-in for a value :func:`json.dumps` cannot write (its ``default``)."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return _bytes_text(bytes(value))
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, (set, frozenset)):
        return sorted(value, key=lambda v: json.dumps(v, ensure_ascii=False, default=str))
    if isinstance(value, (datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, (tuple, list)):
        return list(value)
    if isinstance(value, Mapping):  # MappingProxyType, UserDict, a ChainMap: their data, never their repr
        return dict(value)
    if isinstance(value, (Sequence, AbstractSet)) and not isinstance(value, (str, range)):
        return list(value)  # UserList, deque, array
    own_str: Any = type(value).__str__
    if own_str is not object.__str__ and not callable(value):  # Path, UUID, Decimal: their own text
        return str(value)
    return f"[{_type_name(value)}, not data]"


async def run_tool_calls(
    tools: Mapping[str, Tool],
    calls: Sequence[Any],
    *,
    on_outcome: Callable[[Any, ToolOutcome], Awaitable[None] | None] | None = None,
) -> list[ToolOutcome]:
    """Run the tool calls of one model turn concurrently; outcomes in the calls' order.

    ``calls`` have ``.name`` and ``.arguments`` (JSON text), like the client's ``ToolCall``.
    An unknown tool name becomes an error outcome naming the tools that exist.
    """
    outcomes: list[ToolOutcome | None] = [None] * len(calls)

    async def one(i: int, call: Any) -> None:
        found = tools.get(call.name)
        if found is None:
            have = ", ".join(sorted(tools)) or "none"
            outcome = ToolOutcome(call.name, f"error: no tool named {call.name!r} (tools: {have})", ok=False)
        else:
            outcome = await found.call(call.arguments)
        outcomes[i] = outcome
        if on_outcome is not None:
            maybe = on_outcome(call, outcome)
            if inspect.isawaitable(maybe):
                await maybe

    async with anyio.create_task_group() as tg:
        for i, call in enumerate(calls):
            tg.start_soon(one, i, call)
    return [o for o in outcomes if o is not None]


def arguments_for_history(arguments: Any) -> Any:
    """A tool call's ``arguments`` as they may go back to the engine in a conversation's history:
    ``arguments`` itself when it is a JSON object (as text, str) or an object (dict), else ``"{}"``.

    A reply cut by ``max_tokens`` in the middle of a call leaves its arguments unfinished
    (``'{"city": "Par'``; measured on b11434 with ``finish_reason: length``, often the second
    of two parallel calls). llama-server parses the arguments of every call in the history
    (``common/chat.cpp``, "Failed to parse tool call arguments as JSON") and refuses the whole
    request, counting included, with HTTP 500. The tool itself was given the original text and
    answered with an error, which the model reads in the tool result."""
    if isinstance(arguments, dict):
        return arguments
    try:
        return arguments if isinstance(arguments, str) and isinstance(json.loads(arguments), dict) else "{}"
    except ValueError:
        return "{}"

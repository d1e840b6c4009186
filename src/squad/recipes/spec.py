"""The recipe file format as pydantic models (``extra="forbid"``): what each key may hold.

See ``docs/recipes.md`` for the format with a full example. Agents are validated with
:class:`squad.runtime.agent.Agent` itself (one definition for Python and YAML), so here they are
plain mappings.
"""

from __future__ import annotations

import difflib
import json
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    ValidationInfo,
    field_validator,
    model_validator,
)

from squad.engine.llama import CACHE_TYPES, MAX_SLOTS
from squad.engine.urls import check_engine_url
from squad.names import check_name, normalize
from squad.sched.policy import queue_name
from squad.templates.text import is_blank

__all__ = ["EngineSection", "EngineItem", "ParamSpec", "NonAnswersSpec", "StepSpec", "OutputSpec", "RecipeSpec",
           "AgentFileSpec",
           "PARAM_TYPES", "coerce_param"]

PARAM_TYPES = ("string", "int", "number", "bool", "enum", "list", "file")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class EngineSection(_Strict):
    """``slots``/``ctx``: ``auto`` (the planner decides) or a pinned whole number (``true`` or
    ``2.0`` are not numbers of slots)."""

    slots: Literal["auto"] | StrictInt = "auto"
    ctx: Literal["auto"] | StrictInt = "auto"
    cache_type: Literal[CACHE_TYPES] | None = None  # type: ignore[valid-type]
    gpu_layers: Literal["all"] | Annotated[StrictInt, Field(ge=0)] | None = None
    """``-ngl``: model layers in GPU memory (None: all when a GPU is found, else none)."""
    queue: StrictStr | None = None
    """The order of calls waiting for admission: a name in :data:`squad.sched.policy.QUEUE_POLICIES` (``fifo``,
    ``backfill``, ``program`` and any policy registered there; None: ``program``)."""

    @field_validator("queue")
    @classmethod
    def _known_queue(cls, value: str | None) -> str | None:
        return None if value is None else queue_name(value)

    @model_validator(mode="before")
    @classmethod
    def _no_url(cls, value: object) -> object:
        """``engine:`` sizes the one engine squad launches; a URL belongs in ``engines:`` or ``--url``."""
        if cls is EngineSection and isinstance(value, dict) and {"url", "api_key"} & value.keys():
            key = "url" if "url" in value else "api_key"
            raise ValueError(f"engine: has no {key} (it sizes the engine squad launches); to attach to a running "
                             "server, list it under engines: (engines: [http://HOST:PORT], or - {url: ..., "
                             "api_key: ...}) instead of engine:, or give --url")
        return value

    @field_validator("slots", "ctx", mode="before")
    @classmethod
    def _auto_or_number(cls, value: object, info: ValidationInfo) -> object:
        if isinstance(value, str) and value != "auto":
            raise ValueError(f"{info.field_name} must be auto or a number of "
                             f"{'slots' if info.field_name == 'slots' else 'tokens'}, got {value!r}")
        if value != "auto" and (isinstance(value, bool) or not isinstance(value, int)):
            raise ValueError(f"{info.field_name} must be auto or a whole number, got {value!r}")
        return value

    @model_validator(mode="after")
    def _range(self) -> EngineSection:
        if isinstance(self.slots, int) and not 1 <= self.slots <= MAX_SLOTS:
            raise ValueError(f"slots must be auto or 1..{MAX_SLOTS}, got {self.slots}")
        if isinstance(self.ctx, int) and self.ctx < 256:
            raise ValueError(f"ctx must be auto or at least 256 tokens, got {self.ctx}")
        return self


class EngineItem(EngineSection):
    """One item of ``engines:`` (several engines, :mod:`squad.chat.routing`): a URL string, or a
    mapping. With ``url`` (+ ``api_key``): attach to that server (``slots``/``ctx`` are then
    capacity pins, any number); without: launch one (``model``, default the recipe's ``model:``,
    and the ``engine:`` settings plus ``threads``)."""

    url: str | None = None
    api_key: str | None = None
    model: str | None = None
    threads: Annotated[StrictInt, Field(ge=1)] | None = None

    @model_validator(mode="before")
    @classmethod
    def _url_or_mapping(cls, value: object) -> object:
        """An item written as a plain string is the URL of an engine to attach to."""
        if isinstance(value, str):
            return {"url": value}
        if not isinstance(value, dict):
            raise ValueError(f"expected an engine URL (e.g. http://127.0.0.1:8080) or a mapping (url: ..., or "
                             f"model: ... for an engine squad launches), got {value!r}")
        return value

    @model_validator(mode="after")
    def _range(self) -> EngineItem:
        if self.url is None:
            if self.api_key is not None:
                raise ValueError("api_key is the key of an engine at a url; add url: or remove api_key")
            return EngineSection._range(self)  # noqa: SLF001 - this module's validator
        check_engine_url(self.url)  # a ValueError: reported at the item's file:line
        launch = [k for k in ("model", "cache_type", "gpu_layers", "threads") if getattr(self, k) is not None]
        if launch:
            verb = "sizes or starts" if len(launch) == 1 else "size or start"
            raise ValueError(f"{', '.join(launch)} {verb} an engine squad launches, but this one is at a url "
                             "(it runs as it was started): remove them, or remove url to let squad launch it")
        if self.ctx != "auto" and self.ctx < 1 or self.slots != "auto" and self.slots < 1:
            raise ValueError("slots and ctx pins must be at least 1")
        return self


class ParamSpec(_Strict):
    """One typed parameter, given on the command line as ``-p name=value``."""

    type: Literal[PARAM_TYPES] = "string"  # type: ignore[valid-type]
    description: str = ""
    required: StrictBool = False
    default: Any = None
    choices: list[str] | None = None

    @model_validator(mode="after")
    def _consistent(self) -> ParamSpec:
        if self.type == "enum" and not self.choices:
            raise ValueError("an enum parameter needs choices; add choices: [a, b, ...]")
        if self.type != "enum" and self.choices is not None:
            raise ValueError(f"choices only apply to type enum, not {self.type}")
        if self.required and self.default is not None:
            raise ValueError("a parameter is either required or has a default, not both; remove one")
        return self


HandlingName = Literal["accept", "mark", "fail"]


class NonAnswersSpec(_Strict):
    """``non_answers:``: how a step's truncated or empty answers flow on to later steps and
    the final output (:mod:`squad.runtime.outcome`): ``accept``, ``mark`` or ``fail``. A key left out
    keeps what the enclosing level says (step < parallel block < recipe < the default
    ``mark``). A failed or cancelled step always counts as failed."""

    truncated: HandlingName | None = None
    empty: HandlingName | None = None


class StepSpec(_Strict):
    """One flow step. Exactly one kind:

    - ``prompt`` (+ optional ``agent``): one call; without ``agent`` the prompt goes to the
      main agent and may @mention its sub-agents.
    - ``parallel: [steps]`` (+ ``policy: collect|fail-fast``): the steps at once.
    - ``map: <list>`` + ``prompt`` (+ ``agent``, ``split``, ``concurrency``): the prompt once
      per item, at most ``concurrency`` at a time. ``<list>`` is ``params.NAME`` or
      ``steps.ID.output`` (split into ``lines`` or a ``json`` list) or ``steps.ID.outputs``.
      ``split: chunks`` cuts a text (a text parameter or ``steps.ID.output``) into pieces of
      at most ``chunk_tokens`` tokens, repeating up to ``overlap`` tokens of whole lines
      from the previous piece (:mod:`squad.recipes.chunks`).

    Any step may say how its non-answers flow on (``non_answers:``, :class:`NonAnswersSpec`);
    on a parallel block it applies to the steps inside. A call or map step may give a JSON
    ``schema`` its answers must match (each item's, for a map): it is sent to the engine and
    the answers are validated (:mod:`squad.chat.structured`).

    ``shared`` (a map step, or a step inside a parallel block): context rendered like the prompt and
    put first in the agent's system message, before its own instructions, so the members of the
    fan-out begin the same way and the engine prefills it once (:mod:`squad.sched.share`). A layout
    the author asks for; ``squad plan`` shows it. Without it prompts are sent as written.
    """

    id: str | None = None
    agent: str | None = None
    prompt: str | None = None
    parallel: list[StepSpec] | None = None
    policy: Literal["collect", "fail-fast"] | None = None
    map: str | None = None
    split: Literal["lines", "json", "chunks"] | None = None
    chunk_tokens: StrictInt | None = Field(default=None, ge=1)
    overlap: StrictInt | None = Field(default=None, ge=0)
    concurrency: StrictInt | None = Field(default=None, ge=1, le=64)
    non_answers: NonAnswersSpec | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    shared: str | None = None

    @field_validator("id", mode="before")
    @classmethod
    def _id(cls, value: object) -> object:
        return value if value is None or not isinstance(value, str) else check_name(value, "step id")

    @field_validator("agent", mode="before")
    @classmethod
    def _agent(cls, value: object) -> object:
        return normalize(value) if isinstance(value, str) else value

    @property
    def kind(self) -> Literal["call", "parallel", "map"]:
        if self.parallel is not None:
            return "parallel"
        return "map" if self.map is not None else "call"

    @model_validator(mode="after")
    def _one_kind(self) -> StepSpec:
        if self.parallel is not None:
            extra = [k.rstrip("_") for k in ("agent", "prompt", "map", "split", "chunk_tokens", "overlap",
                                             "concurrency", "shared",
                                              "schema_") if getattr(self, k) is not None]
            if extra:
                raise ValueError("a parallel step holds only id, policy, non_answers and parallel; move "
                                 f"{', '.join(extra)} "
                                 "into its steps")
            if not self.parallel:
                raise ValueError("parallel needs at least one step")
            return self
        if self.policy is not None:
            raise ValueError("policy applies only to a parallel step; remove it, or put the steps under parallel:")
        if self.prompt is None:
            raise ValueError("a step needs a prompt (or parallel: [...])")
        if self.map is None and (self.split is not None or self.concurrency is not None):
            raise ValueError("split and concurrency apply only to a map step")
        if self.split != "chunks":
            if self.chunk_tokens is not None or self.overlap is not None:
                raise ValueError("chunk_tokens and overlap apply only to a map step with split: chunks")
        elif self.chunk_tokens is None:
            raise ValueError("split: chunks needs chunk_tokens: N (the most tokens in one piece, e.g. 1500)")
        elif (self.overlap or 0) >= self.chunk_tokens:
            raise ValueError(f"overlap ({self.overlap}) must be below chunk_tokens ({self.chunk_tokens})")
        return self


class OutputSpec(_Strict):
    """``schema``: a JSON schema the final output (parsed as JSON) must satisfy."""

    schema_: dict[str, Any] = Field(alias="schema")
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class AgentFileSpec(_Strict):
    """A shared agents file pulled in with ``include:``."""

    include: list[str] = []
    agents: dict[str, dict[str, Any]] = {}


class RecipeSpec(_Strict):
    """A whole recipe file. ``mcp``: MCP servers by name, each checked as a
    :class:`squad.mcp.MCPServer` (like agents, one definition for Python and YAML)."""

    name: str
    description: str = ""
    model: str | None = None
    engine: EngineSection = EngineSection()
    engines: list[EngineItem] | None = Field(default=None, min_length=1)
    params: dict[str, ParamSpec] = {}
    include: list[str] = []
    mcp: dict[str, dict[str, Any]] = {}
    agents: dict[str, dict[str, Any]] = {}
    main: str
    flow: list[StepSpec] = Field(min_length=1)
    output: OutputSpec | None = None
    non_answers: NonAnswersSpec | None = None
    shared_input: Literal["prefix", "off", "first", "order"] = "prefix"
    """Whether the prefix a fan-out's agents really begin with is prefilled once (:mod:`squad.sched.share`):
    ``prefix`` (default) or ``off``; ``first`` and ``order`` are old names of the two. No prompt is
    changed for it: put a long common text first with a step's ``shared:``."""

    @field_validator("name", mode="before")
    @classmethod
    def _name(cls, value: object) -> object:
        return check_name(value, "recipe name") if isinstance(value, str) else value

    @field_validator("main", mode="before")
    @classmethod
    def _main(cls, value: object) -> object:
        return normalize(value) if isinstance(value, str) else value

    @field_validator("params", mode="before")
    @classmethod
    def _param_names(cls, value: object) -> object:
        """Parameter names follow :mod:`squad.names` (``문서``, ``max-lines``), kept in NFC."""
        if not isinstance(value, dict):
            return value
        return {check_name(k, "parameter name") if isinstance(k, str) else k: v for k, v in value.items()}



# --- parameter values ----------------------------------------------------------------------

_TRUE = {"true", "yes", "on", "1", "y"}
_FALSE = {"false", "no", "off", "0", "n"}


def _number(name: str, value: Any, kind: type[int] | type[float], what: str) -> int | float:
    """``value`` (a number, or a string of one; never a bool) as ``kind``; ``ValueError`` saying ``what``."""
    allowed = (int, str) if kind is int else (int, float, str)
    if isinstance(value, bool) or not isinstance(value, allowed):
        raise ValueError(f"parameter '{name}' expects {what}, got {value!r}")
    try:
        return kind(str(value).strip())
    except ValueError:
        raise ValueError(f"parameter '{name}' expects {what}, got {value!r}") from None


def coerce_param(name: str, spec: ParamSpec, value: Any, base_dir: Path) -> Any:
    """Turn a value (a ``-p`` string, or a YAML default) into the parameter's type.

    int -> int, number -> float, bool -> bool (true/false/yes/no/on/off/1/0), enum -> one of
    ``choices``, list -> list[str] (a YAML list; or a string: a JSON list ``[...]``, else one
    item per line if multi-line, else comma-separated), file -> the file's UTF-8 text (path
    relative to ``base_dir``), string -> str unchanged. Raises ``ValueError`` saying what
    was expected.
    """
    kind = spec.type
    if kind == "string":
        if isinstance(value, (dict, list)):
            raise ValueError(f"parameter '{name}' expects text, got a {type(value).__name__}")
        return value if isinstance(value, str) else _yaml_text(value)
    if kind == "int":
        return _number(name, value, int, "a whole number")
    if kind == "number":
        return _number(name, value, float, "a number")
    if kind == "bool":
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        if text in _TRUE | _FALSE:
            return text in _TRUE
        raise ValueError(f"parameter '{name}' expects true or false, got {value!r}")
    if kind == "enum":
        text = _yaml_text(value)
        if text not in (spec.choices or []):
            hint = difflib.get_close_matches(text, spec.choices or [], n=1)
            did = f"; did you mean '{hint[0]}'?" if hint else ""
            raise ValueError(f"parameter '{name}' must be one of {', '.join(spec.choices or [])}, got {text!r}{did}")
        return text
    if kind == "list":
        return _as_list(name, value)
    # file
    path = (base_dir / Path(str(value)).expanduser())
    try:
        return path.read_bytes().decode("utf-8-sig")
    except FileNotFoundError:
        raise ValueError(f"parameter '{name}': file not found: {path}; give an existing file (a default is relative to "
                         "the recipe, a -p value to the current directory)") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"parameter '{name}': cannot read {path} as UTF-8 text: {exc}") from None


def _yaml_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return "" if value is None else str(value)


def _as_list(name: str, value: Any) -> list[str]:
    """A list parameter's items. Each item is text that is not blank: a blank one would be a model call on an
    empty prompt, so it is refused naming it, like every other empty input; a JSON object is not a list."""
    if isinstance(value, list):
        if any(isinstance(v, (dict, list)) for v in value):
            raise ValueError(f"parameter '{name}' expects a list of plain values; write one text per item")
        items = [_yaml_text(v) for v in value]
        blank = [i for i, v in enumerate(items) if is_blank(v)]
        if blank:
            which = ", ".join(str(i) for i in blank[:5]) + (", ..." if len(blank) > 5 else "")
            raise ValueError(f"parameter '{name}' has {len(blank)} blank item{'s' if len(blank) > 1 else ''} "
                             f"(at index {which} of {len(items)}): each item becomes a model call, so remove the "
                             "blank ones (an empty list [] gives no calls)")
        return items
    if isinstance(value, dict):
        raise ValueError(f"parameter '{name}' expects a list, got a mapping; write a list such as [\"a\", \"b\"]")
    if not isinstance(value, str):
        raise ValueError(f"parameter '{name}' expects a list, got {value!r}")
    text = value.strip()
    if text.startswith("{"):
        try:
            parsed = json.loads(text)
        except json.JSONDecodeError:
            parsed = None
        if isinstance(parsed, dict):
            raise ValueError(f"parameter '{name}' expects a list, got a JSON object; give a JSON list such as "
                             f"'[\"a\", \"b\"]' (or one item per line)")
    if text.startswith("["):
        try:
            parsed = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"parameter '{name}': not a JSON list ({exc.msg})") from None
        return _as_list(name, parsed)
    parts = text.splitlines() if "\n" in text else text.split(",")
    return [p.strip() for p in parts if p.strip()]

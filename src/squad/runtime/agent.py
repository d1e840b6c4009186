"""Agents: who they are, what they may hold, what they may call.

An :class:`Agent` is a frozen pydantic model with ``extra="forbid"``, so a recipe file and
Python code build the same thing with the same errors; pure data, run by
:mod:`squad.runtime.squad`. Units: ``budget`` is context tokens one conversation may hold
(prompt + answer) or ``"auto"``; ``max_tokens`` tokens one model turn may generate (below a
fixed budget), ``thinking_budget`` the most of ``max_tokens`` one call may spend thinking
(``0``: no thinking; None: the engine's default). Numbers are strict: ``true`` is not 1,
``"256"`` is not 256 (field case F21).
:func:`check_squad` checks a set of agents together (names, sub-agents, cycles).

Design (every field, its unit and default): docs/design/agent.md
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    ValidationError,
    field_validator,
    model_validator,
)

from squad.chat.structured import OutputSchema, output_schema
from squad.errors import UserError
from squad.mcp import is_mcp_ref, split_ref, unknown_server
from squad.names import check_name, describe_char, first_bad_char, name_key, normalize
from squad.templates import render_template

__all__ = ["Agent", "Sampling", "check_squad", "agent_error", "sub_agent_names", "find_cycle",
           "MAX_SUB_DEPTH",
           "MAX_SUB_CALLS"]

MAX_SUB_DEPTH = 2
"""Default levels of sub-agent tool calls in one run: the main agent may ask a sub-agent, and
that one its own; a third level is refused."""

MAX_SUB_CALLS = 8
"""Default sub-agent tool calls in one run, all levels together. Without a bound they multiply:
with 4 tool rounds per turn a 3-level chain made 41 requests."""



class Sampling(BaseModel):
    """Per-call sampling settings, sent to llama-server as request fields.

    ``None`` means "the engine's default". ``stop`` is a list of stop strings.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    temperature: StrictFloat | None = Field(default=None, ge=0)
    top_p: StrictFloat | None = Field(default=None, gt=0, le=1)
    top_k: StrictInt | None = Field(default=None, ge=0)
    min_p: StrictFloat | None = Field(default=None, ge=0, le=1)
    repeat_penalty: StrictFloat | None = Field(default=None, gt=0)
    seed: StrictInt | None = None
    stop: list[str] | None = None

    def as_params(self) -> dict[str, Any]:
        """The fields that are set, as request parameters."""
        return self.model_dump(exclude_none=True)


class Agent(BaseModel):
    """One agent's definition (see the module docstring for each field)."""

    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)

    name: str
    """A name by :mod:`squad.names` (letters of any script, digits, ``_``, ``-``; what ``@name`` can spell), kept
    in NFC."""
    description: str = ""
    instructions: str = ""
    budget: int | Literal["auto"] = Field(default="auto", description="context tokens this agent may hold, or auto")
    max_tokens: StrictInt = Field(default=256, gt=0, description="tokens one turn may generate")
    thinking_budget: int | None = Field(default=None, ge=0, strict=True,
                                        description="of max_tokens, the most one call may spend thinking; 0: none")
    sampling: Sampling = Field(default_factory=Sampling)
    tools: tuple[str, ...] = ()
    agents: tuple[str, ...] = ()
    sub_agent_tools: StrictBool = True
    tool_choice: str = Field(default="auto", description="auto, required, or the name of a tool to call first")
    parallel_tool_calls: StrictBool = True
    output_type: OutputSchema | None = Field(default=None, description="the schema its answers must match")
    max_sub_depth: int | None = Field(default=None, ge=1, strict=True,
                                      description="levels of sub-agent tool calls in a run it starts")
    max_sub_calls: int | None = Field(default=None, ge=1, strict=True,
                                      description="sub-agent tool calls in a run it starts")
    tool_results: Literal["cut", "fail"] = Field(default="cut",
                                                 description="a tool result over the room left: cut or fail")
    max_tool_rounds: int | None = Field(default=None, ge=1, strict=True,
                                        description="model rounds of one turn that may call tools")

    @field_validator("name", mode="before")
    @classmethod
    def _name(cls, value: Any) -> Any:
        return check_name(value, "agent name")

    @field_validator("agents", mode="before")
    @classmethod
    def _sub_names(cls, value: Any) -> Any:
        """Sub-agent names in NFC, like the names they refer to."""
        if isinstance(value, (list, tuple)):
            return tuple(normalize(v) if isinstance(v, str) else v for v in value)
        return value

    @field_validator("tool_choice", mode="before")
    @classmethod
    def _tool_choice(cls, value: Any) -> Any:
        """A tool name (``ask_리뷰어`` of a sub-agent), ``SERVER.TOOL`` or ``SERVER.*``: name characters, ``.``
        and ``*``."""
        if isinstance(value, str):
            value = normalize(value)
            bad = first_bad_char(value, ".*")
            if bad is not None or not value:
                what = f"{describe_char(bad)} is not allowed" if bad else "it is empty"
                raise ValueError(f"tool_choice {value!r} is not a tool name: {what}; use auto, required or a tool's "
                                 "name")
        return value

    @field_validator("output_type", mode="before")
    @classmethod
    def _output_schema(cls, value: Any) -> Any:
        return output_schema(value)

    @field_validator("budget", mode="before")
    @classmethod
    def _auto_or_number(cls, value: Any) -> Any:
        if value == "auto" or (isinstance(value, int) and not isinstance(value, bool)):
            return value
        if isinstance(value, str) and value.strip().isdigit():
            return int(value)
        raise ValueError(f"expected auto or a whole number of tokens, got {value!r}; write auto or a "
                         "number such as 2048")

    @model_validator(mode="after")
    def _check(self) -> Agent:
        if isinstance(self.budget, bool) or (isinstance(self.budget, int) and self.budget < 1):
            raise ValueError(f"budget must be auto or a positive number of tokens, got {self.budget!r}")
        if isinstance(self.budget, int) and self.max_tokens >= self.budget:
            raise ValueError(
                f"max_tokens ({self.max_tokens}) must be below budget ({self.budget}) so the "
                f"prompt has room: raise budget or lower max_tokens"
            )
        if self.thinking_budget is not None and self.thinking_budget >= self.max_tokens:
            raise ValueError(
                f"thinking_budget ({self.thinking_budget}) must be below max_tokens ({self.max_tokens}): the "
                f"thinking is generated within max_tokens and the answer needs room after it; lower "
                f"thinking_budget or raise max_tokens")
        if self.name in self.agents:
            raise ValueError(f"agent {self.name!r} lists itself in agents; remove {self.name!r} from its agents")
        for field in ("tools", "agents"):
            values = getattr(self, field)
            dupes = sorted({v for v in values if values.count(v) > 1})
            if dupes:
                raise ValueError(f"{field} lists {', '.join(dupes)} more than once")
        return self

    @property
    def fixed_budget(self) -> int | None:
        """``budget`` when the user fixed it (tokens), None when it is ``auto``."""
        return None if self.budget == "auto" else int(self.budget)

    @classmethod
    def build(cls, **fields: Any) -> Agent:
        """Like ``Agent(**fields)`` but raises :class:`~squad.errors.UserError` with a readable
        message instead of pydantic's ``ValidationError``."""
        try:
            return cls(**fields)
        except ValidationError as exc:
            raise agent_error(exc, fields.get("name")) from None

    def system_prompt(self, sub_agents: Sequence[Agent] = (), variables: Mapping[str, Any] | None = None) -> str:
        """Render ``instructions`` with the sandboxed template environment.

        Raises the template module's error (a :class:`~squad.errors.UserError`) for an unknown
        variable or a syntax error; the message names this agent.
        """
        values: dict[str, Any] = {
            "name": self.name,
            "description": self.description,
            "agents": [{"name": a.name, "description": a.description} for a in sub_agents],
        }
        values.update(variables or {})
        return render_template(self.instructions, values, where=f"agent {self.name!r} instructions")


def agent_error(exc: ValidationError, name: Any = None) -> UserError:
    """Turn a pydantic error about an agent into one readable :class:`UserError`."""
    who = f"agent {name!r}" if isinstance(name, str) else "agent"
    lines = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "(agent)"
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "string_pattern_mismatch":
            msg = "use letters, digits, '-' or '_'"
        lines.append(f"{loc}: {msg}")
    return UserError(f"{who} is invalid: " + "; ".join(lines))


def check_squad(agents: Sequence[Agent], tool_names: Sequence[str] = (),
                mcp_servers: Sequence[str] = ()) -> dict[str, Agent]:
    """Check that agents work together: unique names, known sub-agents and tools, no cycles.
    An MCP tool (``server.tool``) must name one of ``mcp_servers``; whether the server has
    that tool is checked when it has started (:meth:`squad.mcp.MCPServers.tools_for`).

    Returns the agents by name. Raises :class:`UserError` naming the agent and what to fix.
    """
    by_name: dict[str, Agent] = {}
    by_key: dict[str, str] = {}
    for agent in agents:
        if agent.name in by_name:
            raise UserError(f"two agents are named {agent.name!r}: names must be unique")
        if (other := by_key.get(name_key(agent.name))) is not None:
            how = "in case" if other.casefold() == agent.name.casefold() else \
                "in case or in invisible joiners (U+200C, U+200D)"
            raise UserError(f"agents {other!r} and {agent.name!r} differ only {how}, so they cannot both be "
                            "@mentioned (a mention ignores both): rename one")
        by_name[agent.name], by_key[name_key(agent.name)] = agent, agent.name
    known_tools = set(tool_names)
    for agent in agents:
        check_tool_choice(agent, by_name)
        for sub in agent.agents:
            if sub not in by_name:
                raise UserError(
                    f"agent {agent.name!r} lists sub-agent {sub!r}, which is not in the squad "
                    f"(agents: {', '.join(sorted(by_name))})"
                )
        for tool in agent.tools:
            if is_mcp_ref(tool):  # server.tool or server.*
                if split_ref(tool)[0] not in mcp_servers:
                    raise UserError(unknown_server(agent.name, tool, mcp_servers))
                continue
            if tool not in known_tools:
                have = ", ".join(sorted(known_tools)) or "none"
                raise UserError(
                    f"agent {agent.name!r} lists tool {tool!r}, which is not registered "
                    f"(registered tools: {have}); pass it with tools=[...]"
                )
    _check_cycles(by_name)
    return by_name


def check_tool_choice(agent: Agent, by_name: Mapping[str, Agent]) -> None:
    """A named choice must be one of the agent's tools or ``ask_<agent>`` of a squad member it may
    call (a main agent without ``agents`` may call every other one, so any member counts)."""
    choice = agent.tool_choice
    subs = (agent.agents or [n for n in by_name if n != agent.name]) if agent.sub_agent_tools else []
    offered = [*agent.tools, *(f"ask_{a}" for a in subs)]
    if choice == "auto":
        return
    if choice == "required":
        if not offered:
            raise UserError(f"agent {agent.name!r} has tool_choice required but no tools to call: give it tools "
                            "(or sub-agents), or use tool_choice auto")
        return
    if is_mcp_ref(choice):  # SERVER.TOOL: listed itself or through SERVER.*
        server = split_ref(choice)[0]
        if choice in agent.tools or f"{server}.*" in agent.tools:
            return
    if choice not in offered:
        if not offered:
            raise UserError(f"agent {agent.name!r} has tool_choice {choice!r} but no tools: give it that tool, "
                            "or use tool_choice auto")
        raise UserError(f"agent {agent.name!r} has tool_choice {choice!r}, which is not one of its tools "
                        f"({', '.join(offered)}): use auto, required or one of those names")


def sub_agent_names(agent: Agent, squad: Mapping[str, Agent], main: str) -> list[str]:
    """The sub-agents ``agent`` may call (by @mention or as tools), in order: its ``agents``;
    for the main agent ``main`` when it declares none, every other agent of ``squad``."""
    if agent.agents:
        return list(agent.agents)
    if agent.name == main:
        return [n for n in squad if n != agent.name]
    return []


def find_cycle(agents: Mapping[str, Agent]) -> list[str] | None:
    """The first cycle of sub-agent calls among ``agents`` (by name), as the path that closes
    it (``["a", "b", "a"]``: a lists b, b lists a), or None. Sub-agents not in ``agents`` are
    ignored."""
    state: dict[str, int] = {}

    def visit(name: str, path: list[str]) -> list[str] | None:
        if state.get(name) == 2:
            return None
        if state.get(name) == 1:
            return [*path[path.index(name):], name]
        state[name] = 1
        for sub in agents[name].agents:
            if sub in agents:
                found = visit(sub, [*path, name])
                if found:
                    return found
        state[name] = 2
        return None

    for name in agents:
        found = visit(name, [])
        if found:
            return found
    return None


def _check_cycles(by_name: Mapping[str, Agent]) -> None:
    cycle = find_cycle(by_name)
    if cycle:
        raise UserError(f"sub-agents form a cycle: {' -> '.join(cycle)}; an agent cannot (indirectly) call itself")

"""One MCP server as declared (in Python or a recipe's ``mcp:``) and how agents name its tools.

An agent's tool entry ``SERVER.TOOL`` (or ``SERVER.*``) names an MCP tool (:func:`is_mcp_ref`,
:func:`split_ref`); the model sees it under :func:`model_name`. :func:`unknown_server` and
:func:`unknown_tool` are the messages for a name that does not resolve.
"""

from __future__ import annotations

import difflib
import re
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

__all__ = ["MCPServer", "SERVER_NAME", "is_mcp_ref", "split_ref", "model_name", "unknown_server", "unknown_tool",
           "resolve_cwd"]

SERVER_NAME = r"^[A-Za-z][A-Za-z0-9_-]*$"
"""A server name: a letter, then letters, digits, ``-`` or ``_``."""

_PYTHON = ("python", "python3")
"""Commands that mean "the Python running squad" (so a server written with the SDK finds it)."""

def _not_a_template(text: str) -> str:
    if "{{" in text or "{%" in text:
        raise ValueError(f"{text!r}: a server's command, args and env are used as written, never rendered as "
                         "templates (no parameter reaches a server's command line); write the value itself")
    return text


_Plain = Annotated[str, AfterValidator(_not_a_template)]
"""Text used as written: a template tag in it is refused, not rendered."""


class MCPServer(BaseModel):
    """One MCP server (module docstring). Exactly one of ``command`` and ``url``.

    - ``name``: how agents name its tools (``name.tool``).
    - ``command``, ``args``: the program squad starts; ``python``/``python3`` is the Python
      running squad. ``env``: extra environment variables (the server inherits only the SDK's
      safe set: ``HOME``, ``LOGNAME``, ``PATH``, ``SHELL``, ``TERM``, ``USER``). ``cwd``: its
      working directory (default: squad's; a recipe's: the recipe's folder).
    - ``url``: a streamable-HTTP endpoint (``http://`` or ``https://``, e.g.
      ``http://127.0.0.1:8000/mcp``).
    - ``timeout``: seconds one tool call may take; ``start_timeout``: seconds to start and
      list tools.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=SERVER_NAME, max_length=64)
    command: _Plain | None = None
    args: tuple[_Plain, ...] = ()
    env: dict[str, _Plain] = Field(default_factory=dict)
    cwd: str | None = None
    url: str | None = None
    timeout: float = Field(default=30.0, gt=0, description="seconds one tool call may take")
    start_timeout: float = Field(default=30.0, gt=0, description="seconds to start and list tools")

    @model_validator(mode="after")
    def _one_kind(self) -> MCPServer:
        if (self.command is None) == (self.url is None):
            raise ValueError("give a command (a server squad starts) or a url (a streamable-HTTP server), not both")
        if self.url is not None:
            if self.args or self.env or self.cwd is not None:
                raise ValueError("args, env and cwd are for a server squad starts (command), not for a url")
            if not re.match(r"^https?://", self.url):
                raise ValueError(f"url must start with http:// or https://, got {self.url!r}")
        elif not self.command.strip():  # type: ignore[union-attr]
            raise ValueError("command is empty")
        return self

    @property
    def kind(self) -> str:
        """``stdio`` (a command squad starts) or ``http`` (a url)."""
        return "stdio" if self.command is not None else "http"

    def where(self) -> str:
        """The command line or the URL, for messages."""
        if self.url is not None:
            return self.url
        return " ".join([self.command or "", *self.args])

    def argv(self) -> list[str]:
        """The command and its arguments as run (``python`` is the running interpreter)."""
        command = sys.executable if self.command in _PYTHON else str(self.command)
        return [command, *self.args]


def is_mcp_ref(tool: str) -> bool:
    """True for an agent's tool entry naming an MCP tool (``server.tool``, ``server.*``);
    function tool names never hold a dot."""
    return "." in tool


def split_ref(ref: str) -> tuple[str, str]:
    """``"notes.add"`` -> ``("notes", "add")``; ``"notes.*"`` -> ``("notes", "*")``."""
    server, _, tool = ref.partition(".")
    return server, tool


def model_name(tool: str) -> str:
    """The name the model sees for an MCP tool: characters other than letters, digits, ``_``
    and ``-`` become ``_`` (what an OpenAI function name may hold)."""
    return re.sub(r"[^A-Za-z0-9_-]", "_", tool)[:64] or "_"


def unknown_server(agent: str, ref: str, servers: Iterable[str]) -> str:
    """The message for ``agent``'s tool entry ``ref`` naming a server not among ``servers``."""
    have = ", ".join(servers) or "none"
    return (f"agent {agent!r} lists tool {ref!r}, but there is no MCP server {split_ref(ref)[0]!r} "
            f"(MCP servers: {have}); declare it in mcp: (a recipe) or mcp_servers=[...] (Python)")


def unknown_tool(agent: str, ref: str, tools: Sequence[str]) -> str:
    """The message for ``agent``'s tool entry ``ref`` naming a tool its server (with ``tools``) lacks."""
    server, tool = split_ref(ref)
    hint = difflib.get_close_matches(tool, list(tools), n=1)
    did = f"; did you mean '{server}.{hint[0]}'?" if hint else ""
    return (f"agent {agent!r} lists tool {ref!r}, but MCP server {server!r} has no tool {tool!r}{did} "
            f"(its tools: {', '.join(tools) or 'none'}; {server}.* names them all)")


def resolve_cwd(server: MCPServer, base: Path) -> MCPServer:
    """``server`` with its ``cwd`` made absolute against ``base`` (a recipe's folder, which is
    also the default)."""
    if server.command is None:
        return server
    cwd = base if server.cwd is None else (base / Path(server.cwd).expanduser())
    return server.model_copy(update={"cwd": str(cwd.resolve())})

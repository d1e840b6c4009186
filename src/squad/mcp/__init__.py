"""MCP servers: tools agents call from Model Context Protocol servers, through the official
``mcp`` SDK (``mcp.Client``; its ``stdio_client`` and ``streamable_http_client`` transports).

:class:`MCPServer` declares one server (a ``command`` squad starts, never template-rendered, or
a streamable-HTTP ``url``); an agent names tools as ``SERVER.TOOL`` or ``SERVER.*``.
:class:`MCPServers` opens a squad's servers, each within ``start_timeout`` seconds (else
:class:`~squad.errors.MCPServerError` with its stderr's end). :meth:`MCPTool.call` never raises
for the model's or the server's faults: they come back as result text starting ``error:``.
A stdio server's process group joins :mod:`squad.children`, so nothing it started outlives squad.

Design: docs/design/mcp.md
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import re
import sys
import tempfile
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Annotated, Any

import anyio
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from squad import children
from squad.engine.process import describe_exit
from squad.errors import MCPServerError, UserError
from squad.events import EventSink, MCPWarning, emit_to
from squad.runtime.tools import Tool, ToolOutcome

if TYPE_CHECKING:
    from squad.runtime.agent import Agent

__all__ = ["MCPServer", "MCPServers", "MCPTool", "is_mcp_ref", "split_ref", "model_name", "SERVER_NAME"]

SERVER_NAME = r"^[A-Za-z][A-Za-z0-9_-]*$"
"""A server name: a letter, then letters, digits, ``-`` or ``_``."""

_PYTHON = ("python", "python3")
"""Commands that mean "the Python running squad" (so a server written with the SDK finds it)."""

_STDERR_TAIL = 20
"""Lines of a server's stderr quoted in an error."""

_NOISE_SHOWN = 80
"""Characters of a non-MCP stdout line quoted in a warning."""


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
    def _one_kind(self) -> "MCPServer":
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


class _AnyArguments(BaseModel):
    model_config = ConfigDict(extra="allow")


@dataclass(frozen=True)
class MCPTool(Tool):
    """A tool of an open MCP server. ``parameters()`` is the server's own JSON schema;
    ``remote`` its name on the server; ``server`` the server's name. Arguments are checked
    against the schema before the call (``args_model`` is unused)."""

    server: str = ""
    remote: str = ""
    schema: Mapping[str, Any] = field(default_factory=dict)
    connection: "_Connection | None" = field(default=None, compare=False, repr=False)

    def parameters(self) -> dict[str, Any]:
        schema = dict(self.schema)
        schema.setdefault("type", "object")
        return schema

    def schema_problem(self) -> str | None:
        """Why the input schema is not a valid JSON schema, or None (checked once per tool)."""
        return self._problem

    @functools.cached_property
    def _problem(self) -> str | None:
        import jsonschema

        try:
            jsonschema.validators.validator_for(self.schema).check_schema(self.schema)
        except jsonschema.SchemaError as exc:
            return exc.message
        return None

    @functools.cached_property
    def _validator(self) -> Any:
        import jsonschema

        return jsonschema.validators.validator_for(self.schema)(self.schema)

    async def call(self, arguments: str) -> ToolOutcome:
        """Check ``arguments`` (JSON text) and call the tool; every failure is the result text."""
        try:
            args = json.loads(arguments or "{}")
        except json.JSONDecodeError as exc:
            return ToolOutcome(self.name, f"error: bad arguments for {self.name}: not JSON ({exc.msg})", ok=False)
        if not isinstance(args, dict):
            return ToolOutcome(self.name, f"error: bad arguments for {self.name}: give a JSON object", ok=False)
        problem = self._invalid(args)
        if problem is not None:
            return ToolOutcome(self.name, f"error: bad arguments for {self.name}: {problem}", ok=False)
        assert self.connection is not None, "an MCPTool comes from an open server"
        return await self.connection.call(self, args)

    def _invalid(self, args: dict[str, Any]) -> str | None:
        if self.schema_problem() is not None:
            return None  # the server checks its own arguments
        errors = sorted(self._validator.iter_errors(args), key=lambda e: list(e.path))
        if not errors:
            return None
        return "; ".join(f"{'.'.join(map(str, e.path)) or 'arguments'}: {e.message}" for e in errors[:5])


# --- open servers -------------------------------------------------------------------------------

_OPENING: ContextVar["_Connection | None"] = ContextVar("squad_mcp_opening", default=None)
"""The server being opened. Set while the SDK's stdio transport starts, so its spawn and the
tasks it starts (its stdout reader) see which server they serve."""


class _StdoutNoise(logging.Filter):
    """Takes the SDK's record of a stdout line that is not MCP (logged with its traceback by
    ``mcp.client.stdio``, from the server's reader task) off the log and gives the line to the
    server's :class:`_Connection`; records of servers squad did not open pass."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        connection = _OPENING.get()
        if connection is None or not isinstance(exc, ValueError):
            return True
        connection.wrote_noise(_bad_line(exc))
        return False


def _bad_line(exc: ValueError) -> str:
    """The line a parse error was about (pydantic keeps it as the error's input)."""
    errors = getattr(exc, "errors", None)
    if callable(errors):
        found = [e.get("input") for e in errors()]
        if found and isinstance(found[0], str):
            return found[0]
        if found:
            return json.dumps(found[0], default=str)
    return str(exc)


def _hook_spawn() -> None:
    """Make the SDK's stdio spawn join :mod:`squad.children` (module docstring): each server
    process group is adopted by the guard as it starts and recorded for :func:`children.stop_group`;
    its process is kept to notice an exit mid-run. Also takes non-MCP stdout lines off the SDK's
    log (:class:`_StdoutNoise`)."""
    from mcp.client import stdio

    logger = logging.getLogger(stdio.__name__)
    if not any(isinstance(f, _StdoutNoise) for f in logger.filters):
        logger.addFilter(_StdoutNoise())

    spawn = getattr(stdio, "_create_platform_compatible_process", None)
    if spawn is None:
        raise RuntimeError("this mcp SDK version starts stdio servers differently; install the version squad "
                           "pins (pip install 'mcp>=2.0,<3')")
    if getattr(spawn, "squad_hook", False):
        return

    async def adopted(*args: Any, **kwargs: Any) -> Any:
        process = await spawn(*args, **kwargs)
        children.adopt(process.pid)  # its own session: pid == process group id
        connection = _OPENING.get()
        if connection is not None:
            connection.pids.append(process.pid)
            connection.process = process
        return process

    adopted.squad_hook = True  # type: ignore[attr-defined]
    stdio._create_platform_compatible_process = adopted


class _Connection:
    """One open server: its client, its tools by remote name, its process group and process,
    its stderr, the non-MCP lines it wrote to stdout (``noise``: the first, ``noise_lines``:
    how many) and how it exited mid-run (``exited``, or None)."""

    def __init__(self, server: MCPServer, stderr: IO[str] | None, warn: "Callable[[str, str, str], None]") -> None:
        self.server, self.stderr, self._warn = server, stderr, warn
        self.client: Any = None
        self.pids: list[int] = []
        self.process: Any = None
        self.tools: dict[str, MCPTool] = {}
        self.noise: str | None = None
        self.noise_lines = 0
        self.exited: str | None = None

    def wrote_noise(self, line: str) -> None:
        """A stdout line that is not MCP: the first is warned about, the others counted (a blank
        line is skipped without a word)."""
        if not line.strip():
            return
        self.noise_lines += 1
        if self.noise is not None:
            return
        self.noise = line
        self._warn(self.server.name, "stdout",
                   f"MCP server '{self.server.name}' wrote text that is not MCP to stdout: {self.noise_quote()}; "
                   "squad skipped it (a stdio server may write only MCP messages to stdout: send its logs and "
                   "banners to stderr)")

    def noise_quote(self) -> str:
        """The first non-MCP line's first bytes, quoted (``'Starting...'``)."""
        line = (self.noise or "").strip()
        return repr(line if len(line) <= _NOISE_SHOWN else line[:_NOISE_SHOWN] + "...")

    async def watch_exit(self, closing: anyio.Event) -> None:
        """Wait for the server's process to end; an end before ``closing`` is set is warned about."""
        if self.process is None:
            return
        code = await self.process.wait()
        if closing.is_set():
            return
        self.exited = describe_exit(code)
        tail = stderr_tail(self.stderr, 3)
        said = f"; its stderr ends: {' | '.join(tail.splitlines())}" if tail else ""
        self._warn(self.server.name, "exited",
                   f"MCP server '{self.server.name}' exited mid-run ({self.exited}): calls of its tools fail from "
                   f"now on{said}")

    async def list_tools(self) -> None:
        cursor = None
        while True:
            page = await self.client.list_tools(cursor=cursor)
            for t in page.tools:
                self.tools[t.name] = MCPTool(
                    name=model_name(t.name), description=t.description or t.name, args_model=_AnyArguments,
                    fn=_never, server=self.server.name, remote=t.name, schema=dict(t.input_schema or {}),
                    connection=self)
            cursor = page.next_cursor
            if not cursor:
                return

    async def call(self, tool: MCPTool, args: dict[str, Any]) -> ToolOutcome:
        s = self.server
        what = f"{tool.name} (MCP server '{s.name}')"
        try:
            with anyio.fail_after(s.timeout):
                result = await self.client.call_tool(tool.remote, args)
        except TimeoutError:
            return ToolOutcome(tool.name, f"error: {what} did not answer within {s.timeout:g} s", ok=False)
        except Exception as exc:  # noqa: BLE001 - a broken server is the tool's result, never a crash
            tail = stderr_tail(self.stderr)
            more = f"; its stderr ends: {tail}" if tail else ""
            gone = f" (the server exited mid-run, {self.exited})" if self.exited else ""
            return ToolOutcome(tool.name, f"error: {what} failed: {_describe(exc)}{gone}{more}", ok=False)
        text = result_text(result)
        if result.is_error:
            return ToolOutcome(tool.name, f"error: {text or 'the tool reported an error'}", ok=False)
        return ToolOutcome(tool.name, text, ok=True)

    async def sweep(self) -> None:
        for pid in self.pids:
            await children.stop_group(pid)


async def _never(**_: Any) -> None:
    raise AssertionError("MCPTool.call talks to the server")


class MCPServers:
    """A squad's MCP servers: ``async with MCPServers(servers) as open_servers:`` starts each
    (module docstring) and lists its tools; closing stops them all (also on cancellation).

    ``tools[name]``: the tools of server ``name`` by their names on the server, once open.
    Raises :class:`UserError` for two servers with one name, :class:`MCPServerError` on entry
    for a server that does not start.

    ``warnings``: the :class:`~squad.events.MCPWarning` events so far (a server's non-MCP
    stdout, an exit mid-run); :meth:`listen` sends them, and each later one, to a sink.
    """

    def __init__(self, servers: Sequence[MCPServer] = ()) -> None:
        seen: set[str] = set()
        for server in servers:
            if server.name in seen:
                raise UserError(f"two MCP servers are named {server.name!r}: names must be unique")
            seen.add(server.name)
        self.servers: dict[str, MCPServer] = {s.name: s for s in servers}
        self._connections: dict[str, _Connection] = {}
        self._opening: _Connection | None = None
        self._group: Any = None
        self._closing = anyio.Event()
        self.warnings: list[MCPWarning] = []
        self._sinks: list[EventSink] = []

    def listen(self, sink: EventSink) -> None:
        """Give ``sink`` the warnings so far and each later one (until :meth:`unlisten`)."""
        self._sinks.append(sink)
        for event in self.warnings:
            emit_to([sink], event)

    def unlisten(self, sink: EventSink) -> None:
        """Stop giving warnings to ``sink``."""
        if sink in self._sinks:
            self._sinks.remove(sink)

    def _warn(self, server: str, problem: str, warning: str) -> None:
        event = MCPWarning(server=server, problem=problem, warning=warning)
        self.warnings.append(event)
        emit_to(list(self._sinks), event)

    @property
    def names(self) -> list[str]:
        return list(self.servers)

    @property
    def tools(self) -> dict[str, dict[str, MCPTool]]:
        return {name: c.tools for name, c in self._connections.items()}

    def pids(self) -> dict[str, list[int]]:
        """Process ids of the stdio servers squad started, by server name."""
        return {name: list(c.pids) for name, c in self._connections.items() if c.pids}

    def __bool__(self) -> bool:
        return bool(self.servers)

    async def __aenter__(self) -> "MCPServers":
        """Start the servers one after another; each is served by a task of one task group
        (the SDK's client must be entered and left in one task)."""
        group = anyio.create_task_group()
        await group.__aenter__()
        self._group = group
        try:
            for server in self.servers.values():
                self._opening = None
                try:
                    with anyio.fail_after(server.start_timeout):
                        self._connections[server.name] = await group.start(self._serve, server)
                except TimeoutError:
                    raise _failed(server, None, f"no answer within start_timeout={server.start_timeout:g} s",
                                  self._opening) from None
        except BaseException:
            await self.aclose()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Stop every server, also under cancellation: the SDK stops each (stdin closed, then its
        process group signalled, shielded); then what the server left is stopped
        (:func:`squad.children.stop_group`, shielded)."""
        group, self._group = self._group, None
        self._connections.clear()
        if group is not None:
            self._closing.set()  # each task leaves its client; the SDK's shutdown is shielded
            await group.__aexit__(None, None, None)

    async def _serve(self, server: MCPServer, *, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
        """Open ``server``, report its :class:`_Connection` and hold it open until closing.
        Raises :class:`MCPServerError` before it is reported; never after (a server that dies
        mid-run fails its tool calls, not the squad)."""
        from mcp import Client, StdioServerParameters
        from mcp.client.stdio import stdio_client
        from mcp.client.streamable_http import streamable_http_client

        with contextlib.ExitStack() as files:
            stderr: IO[str] | None = None
            if server.command is not None:
                _hook_spawn()
                stderr = files.enter_context(tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace"))
                argv = server.argv()
                params = StdioServerParameters(command=argv[0], args=argv[1:], env=dict(server.env) or None,
                                               cwd=server.cwd, encoding_error_handler="replace")  # bytes that are
                # not UTF-8 make a line that is not MCP (warned about), not a reader that stops
                transport: Any = stdio_client(params, errlog=stderr)
            else:
                transport = streamable_http_client(server.url or "")
            connection = self._opening = _Connection(server, stderr, self._warn)
            connection.client = Client(transport)
            token = _OPENING.set(connection)  # the SDK's reader task keeps it: noise is the server's
            reported = False
            try:
                try:
                    async with connection.client:
                        _OPENING.reset(token)
                        await connection.list_tools()
                        task_status.started(connection)
                        reported = True
                        async with anyio.create_task_group() as watch:
                            watch.start_soon(connection.watch_exit, self._closing)
                            await self._closing.wait()
                            watch.cancel_scope.cancel()
                except OSError as exc:
                    if reported:
                        return
                    raise _failed(server, stderr, f"cannot run {server.argv()[0]!r}: {exc.strerror or exc}",
                                  connection) from None
                except Exception as exc:  # noqa: BLE001 - the SDK's errors, often in exception groups
                    if reported:
                        return
                    raise _failed(server, stderr, _describe(exc), connection) from None
            finally:
                await connection.sweep()

    # --- agents' tools --------------------------------------------------------------------------

    def tools_for(self, agent: "Agent", taken: Collection[str] = (), server: str | None = None) -> dict[str, MCPTool]:
        """The MCP tools ``agent`` names in its ``tools`` (of ``server`` only, if given), by
        the name the model sees.

        ``taken``: names its other tools already use (function tools, ``ask_<name>``).
        Raises :class:`UserError` for an undeclared server, a tool the server does not have
        (naming the ones it has), a tool whose input schema is not a valid JSON schema (the
        model could not be told its arguments) or two tools with one name.
        """
        out: dict[str, MCPTool] = {}
        origin: dict[str, str] = {name: "another of its tools" for name in taken}
        for ref in agent.tools:
            if not is_mcp_ref(ref) or (server is not None and split_ref(ref)[0] != server):
                continue
            server_name, tool = split_ref(ref)
            if server_name not in self.servers:
                raise UserError(unknown_server(agent.name, ref, self.names))
            have = self._connections[server_name].tools if server_name in self._connections else {}
            if tool == "*":
                chosen = list(have.values())
            elif tool in have:
                chosen = [have[tool]]
            else:
                raise UserError(unknown_tool(agent.name, ref, list(have)))
            for t in chosen:
                problem = t.schema_problem()
                if problem is not None:
                    raise UserError(f"agent {agent.name!r} lists tool {ref!r}, but the input schema MCP server "
                                    f"{server_name!r} gives for {t.remote!r} is not a valid JSON schema ({problem}); "
                                    "fix the server or leave the tool out")
                if t.name in origin and origin[t.name] != f"{t.server}.{t.remote}":
                    raise UserError(
                        f"agent {agent.name!r} gets two tools named {t.name!r}: {origin[t.name]} and "
                        f"{t.server}.{t.remote}; list only one of them in its tools")
                origin[t.name] = f"{t.server}.{t.remote}"
                out[t.name] = t
        choice = agent.tool_choice
        if is_mcp_ref(choice) and (server is None or split_ref(choice)[0] == server):
            chosen_server, chosen = split_ref(choice)
            if not any(t.server == chosen_server and t.remote == chosen for t in out.values()):
                have = ", ".join(f"{t.server}.{t.remote}" for t in out.values()) or "none"
                raise UserError(f"agent {agent.name!r} has tool_choice {choice!r}, but that is not one of the MCP "
                                f"tools it gets ({have}); name one of those, or use auto or required")
        return out


def _failed(server: MCPServer, stderr: IO[str] | None, why: str,
            connection: "_Connection | None" = None) -> MCPServerError:
    """The error of a server that did not start, with the end of its stderr and, when it wrote
    to stdout what is not MCP, that text (the likely reason)."""
    tail = stderr_tail(stderr)
    stated = f"\nits stderr ends:\n{tail}" if tail else ("\nit wrote nothing to stderr" if stderr else "")
    fix = ("check the command and run it yourself to see it start" if server.url is None
           else "check that the server is running and the url ends with its MCP path (often /mcp)")
    if connection is not None and connection.noise is not None:
        lines = f" ({connection.noise_lines} lines)" if connection.noise_lines > 1 else ""
        why += (f"; it wrote text that is not MCP to stdout{lines}, first {connection.noise_quote()}, where only "
                "MCP messages may go")
        fix = ("make the server write its logs and banners to stderr (or turn them off with its own flag), "
               "then run it again")
    return MCPServerError(f"MCP server '{server.name}' ({server.where()}) did not start: {why}; {fix}{stated}",
                          server=server.name, stderr=tail)


def unknown_server(agent: str, ref: str, servers: Iterable[str]) -> str:
    have = ", ".join(servers) or "none"
    return (f"agent {agent!r} lists tool {ref!r}, but there is no MCP server {split_ref(ref)[0]!r} "
            f"(MCP servers: {have}); declare it in mcp: (a recipe) or mcp_servers=[...] (Python)")


def unknown_tool(agent: str, ref: str, tools: Sequence[str]) -> str:
    import difflib

    server, tool = split_ref(ref)
    hint = difflib.get_close_matches(tool, list(tools), n=1)
    did = f"; did you mean '{server}.{hint[0]}'?" if hint else ""
    return (f"agent {agent!r} lists tool {ref!r}, but MCP server {server!r} has no tool {tool!r}{did} "
            f"(its tools: {', '.join(tools) or 'none'}; {server}.* names them all)")


def result_text(result: Any) -> str:
    """A ``CallToolResult`` as the text the model reads: its text blocks and text resources
    (after a ``[resource: URI, MIME]`` line) joined by newlines; content that is not text
    (images, audio, binary resources, resource links) described, never dumped:
    ``[image: image/png, 1,000 bytes, not shown]``,
    ``[resource: file:///logo.png, image/png, 1,000 bytes, binary, not shown]``,
    ``[resource link: file:///q3.pdf (q3.pdf), application/pdf, 48,213 bytes]``.
    The structured content as JSON when there is no block."""
    parts = [_block_text(block) for block in result.content or ()]
    if not parts and result.structured_content is not None:
        return json.dumps(result.structured_content, default=str)
    return "\n".join(parts)


def _block_text(block: Any) -> str:
    kind = getattr(block, "type", "") or "content"
    if kind == "text":
        return str(block.text)
    if kind == "resource":
        res = block.resource
        if isinstance(getattr(res, "text", None), str):
            return f"[{_about('resource', res.uri, res.mime_type)}]\n{res.text}"
        size = _decoded_size(getattr(res, "blob", None))
        return f"[{_about('resource', res.uri, res.mime_type, size)}, binary, not shown]"
    if kind == "resource_link":
        name = getattr(block, "name", None)
        uri = f"{block.uri} ({name})" if name and not str(block.uri).endswith(name) else block.uri
        return f"[{_about('resource link', uri, block.mime_type, getattr(block, 'size', None))}]"
    size = _decoded_size(getattr(block, "data", None))
    return f"[{_about(kind, None, getattr(block, 'mime_type', None), size)}, not shown]"


def _about(kind: str, uri: Any, mime: str | None, size: int | None = None) -> str:
    """``kind: URI, MIME, N bytes`` with what is known (URIs past 200 characters cut)."""
    said = [str(uri) if len(str(uri)) <= 200 else str(uri)[:200] + "..."] if uri is not None else []
    said.append(mime or "type not given")
    if size is not None:
        said.append(f"{size:,} bytes")
    return f"{kind}: {', '.join(said)}"


def _decoded_size(data: Any) -> int | None:
    """Bytes a base64 text decodes to (None for no text)."""
    if not isinstance(data, str):
        return None
    body = "".join(data.split()).rstrip("=")
    return len(body) * 3 // 4


def stderr_tail(stderr: IO[str] | None, lines: int = _STDERR_TAIL) -> str:
    """The last ``lines`` lines a stdio server wrote to stderr ("" for none)."""
    if stderr is None:
        return ""
    try:
        stderr.flush()
        stderr.seek(0)
        text = stderr.read()
        stderr.seek(0, 2)
    except (OSError, ValueError):
        return ""
    return "\n".join(text.strip().splitlines()[-lines:])


def _describe(exc: BaseException) -> str:
    """An exception (or the first leaf of an exception group) as ``Type: message``."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    message = str(exc) or type(exc).__name__
    return message if type(exc).__name__ in message else f"{type(exc).__name__}: {message}"


def resolve_cwd(server: MCPServer, base: Path) -> MCPServer:
    """``server`` with its ``cwd`` made absolute against ``base`` (a recipe's folder, which is
    also the default)."""
    if server.command is None:
        return server
    cwd = base if server.cwd is None else (base / Path(server.cwd).expanduser())
    return server.model_copy(update={"cwd": str(cwd.resolve())})

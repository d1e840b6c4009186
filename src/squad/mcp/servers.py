"""A squad's MCP servers opened together (:class:`MCPServers`) and the tools each agent gets."""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Collection, Sequence
from typing import IO, Any, Protocol

import anyio

from squad.errors import UserError
from squad.events import EventSink, MCPWarning, emit_to
from squad.mcp.connection import OPENING, Connection, describe, failed, hook_spawn
from squad.mcp.server import MCPServer, is_mcp_ref, split_ref, unknown_server, unknown_tool
from squad.mcp.tool import MCPTool

__all__ = ["MCPServers", "ToolUser"]


class ToolUser(Protocol):
    """What :meth:`MCPServers.tools_for` reads of an agent (:class:`squad.runtime.agent.Agent`)."""

    @property
    def name(self) -> str: ...

    @property
    def tools(self) -> Sequence[str]: ...

    @property
    def tool_choice(self) -> str: ...


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
        self._connections: dict[str, Connection] = {}
        self._opening: Connection | None = None
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

    async def __aenter__(self) -> MCPServers:
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
                    raise failed(server, None, f"no answer within start_timeout={server.start_timeout:g} s",
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
        """Open ``server``, report its :class:`Connection` and hold it open until closing.
        Raises :class:`MCPServerError` before it is reported; never after (a server that dies
        mid-run fails its tool calls, not the squad)."""
        from mcp.client.stdio import stdio_client
        from mcp.client.streamable_http import streamable_http_client

        from mcp import Client, StdioServerParameters

        with contextlib.ExitStack() as files:
            stderr: IO[str] | None = None
            if server.command is not None:
                hook_spawn()
                stderr = files.enter_context(tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace"))
                argv = server.argv()
                params = StdioServerParameters(command=argv[0], args=argv[1:], env=dict(server.env) or None,
                                               cwd=server.cwd, encoding_error_handler="replace")  # bytes that are
                # not UTF-8 make a line that is not MCP (warned about), not a reader that stops
                transport: Any = stdio_client(params, errlog=stderr)
            else:
                transport = streamable_http_client(server.url or "")
            connection = self._opening = Connection(server, stderr, self._warn)
            connection.client = Client(transport)
            token = OPENING.set(connection)  # the SDK's reader task keeps it: noise is the server's
            reported = False
            try:
                try:
                    async with connection.client:
                        OPENING.reset(token)
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
                    raise failed(server, stderr, f"cannot run {server.argv()[0]!r}: {exc.strerror or exc}",
                                  connection) from None
                except Exception as exc:  # noqa: BLE001 - the SDK's errors, often in exception groups
                    if reported:
                        return
                    raise failed(server, stderr, describe(exc), connection) from None
            finally:
                await connection.sweep()

    def tools_for(self, agent: ToolUser, taken: Collection[str] = (), server: str | None = None) -> dict[str, MCPTool]:
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
            chosen_server, chosen_tool = split_ref(choice)
            if not any(t.server == chosen_server and t.remote == chosen_tool for t in out.values()):
                gets = ", ".join(f"{t.server}.{t.remote}" for t in out.values()) or "none"
                raise UserError(f"agent {agent.name!r} has tool_choice {choice!r}, but that is not one of the MCP "
                                f"tools it gets ({gets}); name one of those, or use auto or required")
        return out

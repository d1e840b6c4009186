"""One open MCP server: the SDK's client, the server's process group, its stderr and stdout noise.

The SDK's ``stdio_client`` spawns the server in a session of its own; :func:`hook_spawn` makes
that spawn join :mod:`squad.children` (the guard stops it if squad is killed; on close
:func:`squad.children.stop_group` stops what the server left behind). A stdout line that is not
MCP is taken off the SDK's log (:class:`StdoutNoise`) and warned about once; an exit mid-run is
warned about too. :func:`failed` is the error of a server that did not start.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from contextvars import ContextVar
from typing import IO, Any

import anyio

from squad import children
from squad.engine.process import describe_exit
from squad.errors import MCPServerError
from squad.mcp.server import MCPServer, model_name
from squad.mcp.tool import AnyArguments, MCPTool, never_called, result_text
from squad.tools import ToolOutcome

__all__ = ["Connection", "StdoutNoise", "OPENING", "hook_spawn", "failed", "stderr_tail", "describe"]

_STDERR_TAIL = 20
"""Lines of a server's stderr quoted in an error."""

_NOISE_SHOWN = 80
"""Characters of a non-MCP stdout line quoted in a warning."""


OPENING: ContextVar[Connection | None] = ContextVar("squad_mcp_opening", default=None)
"""The server being opened. Set while the SDK's stdio transport starts, so its spawn and the
tasks it starts (its stdout reader) see which server they serve."""


class StdoutNoise(logging.Filter):
    """Takes the SDK's record of a stdout line that is not MCP (logged with its traceback by
    ``mcp.client.stdio``, from the server's reader task) off the log and gives the line to the
    server's :class:`Connection`; records of servers squad did not open pass."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        connection = OPENING.get()
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


def hook_spawn() -> None:
    """Make the SDK's stdio spawn join :mod:`squad.children` (module docstring): each server
    process group is adopted by the guard as it starts and recorded for :func:`children.stop_group`;
    its process is kept to notice an exit mid-run. Also takes non-MCP stdout lines off the SDK's
    log (:class:`StdoutNoise`)."""
    from mcp.client import stdio

    logger = logging.getLogger(stdio.__name__)
    if not any(isinstance(f, StdoutNoise) for f in logger.filters):
        logger.addFilter(StdoutNoise())

    spawn = getattr(stdio, "_create_platform_compatible_process", None)
    if spawn is None:
        raise RuntimeError("this mcp SDK version starts stdio servers differently; install the version squad "
                           "pins (pip install 'mcp>=2.0,<3')")
    if getattr(spawn, "squad_hook", False):
        return

    async def adopted(*args: Any, **kwargs: Any) -> Any:
        process = await spawn(*args, **kwargs)
        children.adopt(process.pid)  # its own session: pid == process group id
        connection = OPENING.get()
        if connection is not None:
            connection.pids.append(process.pid)
            connection.process = process
        return process

    adopted.squad_hook = True  # type: ignore[attr-defined]
    stdio._create_platform_compatible_process = adopted  # noqa: SLF001 - the SDK's stdio spawn has no public hook


class Connection:
    """One open server: its client, its tools by remote name, its process group and process,
    its stderr, the non-MCP lines it wrote to stdout (``noise``: the first, ``noise_lines``:
    how many) and how it exited mid-run (``exited``, or None)."""

    def __init__(self, server: MCPServer, stderr: IO[str] | None, warn: Callable[[str, str, str], None]) -> None:
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
        """Read the server's tools (every page) into :attr:`tools`."""
        cursor = None
        while True:
            page = await self.client.list_tools(cursor=cursor)
            for t in page.tools:
                self.tools[t.name] = MCPTool(
                    name=model_name(t.name), description=t.description or t.name, args_model=AnyArguments,
                    fn=never_called, server=self.server.name, remote=t.name, schema=dict(t.input_schema or {}),
                    connection=self)
            cursor = page.next_cursor
            if not cursor:
                return

    async def call(self, tool: MCPTool, args: dict[str, Any]) -> ToolOutcome:
        """Call ``tool`` with checked ``args``; a timeout or a broken server is the result text."""
        s = self.server
        what = f"{tool.name} (MCP server '{s.name}')"
        try:
            with anyio.fail_after(s.timeout):
                result = await self.client.call_tool(tool.remote, args)
        except TimeoutError:
            return ToolOutcome(tool.name, f"error: {what} timed out: it did not answer within its timeout of "
                                          f"{s.timeout:g} s", ok=False)
        except Exception as exc:  # noqa: BLE001 - a broken server is the tool's result, never a crash
            tail = stderr_tail(self.stderr)
            more = f"; its stderr ends: {tail}" if tail else ""
            gone = f" (the server exited mid-run, {self.exited})" if self.exited else ""
            return ToolOutcome(tool.name, f"error: {what} failed: {describe(exc)}{gone}{more}", ok=False)
        text = result_text(result)
        if result.is_error:
            return ToolOutcome(tool.name, f"error: {text or 'the tool reported an error'}", ok=False)
        return ToolOutcome(tool.name, text, ok=True)

    async def sweep(self) -> None:
        """Stop what is left of the server's process groups (:func:`squad.children.stop_group`)."""
        for pid in self.pids:
            await children.stop_group(pid)


def failed(server: MCPServer, stderr: IO[str] | None, why: str,
            connection: Connection | None = None) -> MCPServerError:
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


def describe(exc: BaseException) -> str:
    """An exception (or the first leaf of an exception group) as ``Type: message``."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    message = str(exc) or type(exc).__name__
    return message if type(exc).__name__ in message else f"{type(exc).__name__}: {message}"

"""MCP servers: tools agents call from Model Context Protocol servers, through the official
``mcp`` SDK (``mcp.Client``; its ``stdio_client`` and ``streamable_http_client`` transports).

:class:`MCPServer` declares one server (a ``command`` squad starts, never template-rendered, or
a streamable-HTTP ``url``); an agent names tools as ``SERVER.TOOL`` or ``SERVER.*``.
:class:`MCPServers` opens a squad's servers, each within ``start_timeout`` seconds (else
:class:`~squad.errors.MCPServerError` with its stderr's end). :meth:`MCPTool.call` never raises
for the model's or the server's faults: they come back as result text starting ``error:``.
A stdio server's process group joins :mod:`squad.children`, so nothing it started outlives squad.

Modules: :mod:`~squad.mcp.server` (the declaration, tool references), :mod:`~squad.mcp.tool`
(a tool's call and result text), :mod:`~squad.mcp.connection` (one open server: process group,
stderr, stdout noise), :mod:`~squad.mcp.servers` (a squad's servers, each agent's tools).

Design: docs/design/mcp.md
"""

from __future__ import annotations

from squad.mcp.connection import StdoutNoise as _StdoutNoise  # noqa: F401 - tests reach it here
from squad.mcp.connection import stderr_tail
from squad.mcp.server import (
                              SERVER_NAME,
                              MCPServer,
                              is_mcp_ref,
                              model_name,
                              resolve_cwd,
                              split_ref,
                              unknown_server,
                              unknown_tool,
)
from squad.mcp.servers import MCPServers
from squad.mcp.tool import MCPTool, result_text

__all__ = ["MCPServer", "MCPServers", "MCPTool", "is_mcp_ref", "split_ref", "model_name", "SERVER_NAME",
           "unknown_server", "unknown_tool", "resolve_cwd", "result_text", "stderr_tail"]

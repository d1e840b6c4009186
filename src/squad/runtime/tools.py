"""The tool seam's old path: everything here is :mod:`squad.tools` (moved below the runtime and MCP,
issue 33), the same objects."""

from squad.tools import (
    DEFAULT_TOOL_TIMEOUT,
    Tool,
    ToolError,
    ToolOutcome,
    arguments_for_history,
    run_tool_calls,
    tool,
    tool_text,
)

__all__ = ["Tool", "tool", "ToolOutcome", "ToolError", "run_tool_calls", "arguments_for_history", "tool_text",
           "DEFAULT_TOOL_TIMEOUT"]

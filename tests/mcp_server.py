"""An MCP server for squad's tests (the official SDK's MCPServer): tools that answer, fail,
hang, start a child process and read the environment.

    python tests/mcp_server.py              # stdio
    python tests/mcp_server.py --http PORT  # streamable HTTP on 127.0.0.1:PORT/mcp
"""

import argparse
import os
import subprocess
import sys
import time

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

server = MCPServer("testing")


@server.tool()
def echo(text: str) -> str:
    """Give the text back."""
    return f"echo: {text}"


@server.tool()
def add(a: int, b: int) -> int:
    """Add two whole numbers."""
    return a + b


@server.tool()
def fail(message: str) -> str:
    """Fail with a message."""
    raise ToolError(message)


@server.tool()
def slow(seconds: float) -> str:
    """Sleep, then answer."""
    time.sleep(seconds)
    return "awake"


@server.tool()
def spawn_child() -> str:
    """Start a long sleep as a child of the server; return its pid and the server's."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    return f"{child.pid} {os.getpid()}"


@server.tool()
def env(name: str) -> str:
    """An environment variable of the server ("" when unset)."""
    return os.environ.get(name, "")


@server.tool(name="dotted.name")
def dotted() -> str:
    """A tool whose name the model cannot spell as is."""
    return "dotted"


@server.tool()
def big(chars: int) -> str:
    """Words, about ``chars`` characters of them (a result larger than an agent's room)."""
    return " ".join(f"w{i}" for i in range(chars // 3 + 1))[:chars]


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--http", type=int)
    parser.add_argument("--fail", action="store_true", help="write to stderr and exit 3 at once")
    args = parser.parse_args()
    if args.fail:
        print("notes server: cannot open the database /nonexistent/notes.db", file=sys.stderr)
        sys.exit(3)
    if args.http:
        server.run(transport="streamable-http", host="127.0.0.1", port=args.http)
    else:
        server.run()

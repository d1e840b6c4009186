"""MCP servers that misbehave on stdout, for squad's tests (the official SDK's MCPServer).

    python tests/mcp_noisy_server.py before     # prints a banner to stdout, then serves
    python tests/mcp_noisy_server.py beside     # serves; its tool writes to stdout too
    python tests/mcp_noisy_server.py only       # prints to stdout and never answers
    python tests/mcp_noisy_server.py only-exit  # prints to stdout and exits 1
    python tests/mcp_noisy_server.py once       # serves one tool call, then exits
    python tests/mcp_noisy_server.py bytes      # writes bytes that are not UTF-8 to stdout, then serves
"""

import os
import sys
import threading
import time

MODE = sys.argv[1] if len(sys.argv) > 1 else "before"

if MODE in ("before", "only", "only-exit"):
    print("Starting noisy server v1.0 on stdio...", flush=True)
if MODE == "only":
    print("listening for requests (not really)", flush=True)
    while True:
        time.sleep(60)
if MODE == "only-exit":
    sys.exit(1)
if MODE == "bytes":
    os.write(1, b"\x89PNG\r\x1a\xff\xfe binary\n")

from mcp.server.mcpserver import MCPServer  # noqa: E402 - the banner comes first, as in servers that print one

server = MCPServer("noisy")
PROTOCOL_OUT = os.dup(1)
"""The real stdout. This SDK sends a tool's own print() to stderr; servers in other languages or
on other SDKs do not, which is what writing here directly stands for."""


@server.tool()
def echo(text: str) -> str:
    """Give the text back."""
    if MODE == "beside":
        os.write(PROTOCOL_OUT, f"DEBUG echo called with {text}\n".encode())  # print() on the protocol's stdout
    if MODE == "once":  # answer, then end once the answer is out (a server that crashes after its first call)
        threading.Timer(0.5, lambda: os._exit(0)).start()
    return f"echo: {text}"


if __name__ == "__main__":
    server.run()

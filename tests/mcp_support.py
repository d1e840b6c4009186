"""The MCP test server (``tests/mcp_server.py``) on streamable HTTP, as a fixture: import
``http_server`` into a test module (127.0.0.1 only; stopped after the test)."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from squad import children
from squad.engine.process import free_port

SERVER = Path(__file__).parent / "mcp_server.py"


@pytest.fixture
def http_server():
    """The test server on streamable HTTP, 127.0.0.1 only; its URL."""
    port = free_port()
    proc = children.start([sys.executable, str(SERVER), "--http", str(port)], stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                break
        time.sleep(0.1)
    yield f"http://127.0.0.1:{port}/mcp"
    children.stop_pid(proc.pid)
    proc.wait()

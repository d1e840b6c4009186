"""An MCP server from the ecosystem, run unchanged: ``mcp-server-time`` from PyPI (in the
test extra), started as ``python -m mcp_server_time``. squad lists its tools with their own
schemas, calls them, checks arguments against the schema before the call, and has nothing
to warn about (it writes only MCP to stdout)."""

from __future__ import annotations

import json

import pytest

from squad.mcp import MCPServer, MCPServers

pytest.importorskip("mcp_server_time", reason="mcp-server-time is in the test extra: pip install -e '.[test]'")
pytestmark = pytest.mark.anyio

CLOCK = MCPServer(name="clock", command="python", args=("-m", "mcp_server_time", "--local-timezone", "UTC"),
                  start_timeout=120)


async def test_mcp_server_time_runs_unchanged(capfd):
    async with MCPServers([CLOCK]) as servers:
        tools = servers.tools["clock"]
        assert {"get_current_time", "convert_time"} <= set(tools)
        assert tools["get_current_time"].parameters()["required"] == ["timezone"]
        now = await tools["get_current_time"].call('{"timezone": "Europe/Paris"}')
        missing = await tools["get_current_time"].call("{}")
        converted = await tools["convert_time"].call(json.dumps(
            {"source_timezone": "UTC", "time": "12:00", "target_timezone": "Asia/Tokyo"}))
    assert now.ok and json.loads(now.text)["timezone"] == "Europe/Paris"
    assert not missing.ok and missing.text == ("error: bad arguments for get_current_time: arguments: "
                                               "'timezone' is a required property")
    assert converted.ok and json.loads(converted.text)["target"]["datetime"].startswith("20")
    assert servers.warnings == []
    out, err = capfd.readouterr()
    assert "Traceback" not in err and "Traceback" not in out

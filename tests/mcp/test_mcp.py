"""MCP tools (squad.mcp): real servers written with the official SDK, over stdio and over
streamable HTTP on 127.0.0.1; the model's side is scripted (ScriptedEngine), so what is
proven here is squad's: listing, calling, errors as results, process ownership."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import anyio
import psutil
import pytest
from pydantic import ValidationError

from launch_support import gone, wait_gone
from mcp_support import http_server  # noqa: F401 - a fixture
from squad import children
from squad.chat import ChatResult, ToolCall
from squad.errors import MCPServerError, UserError
from squad.events import ToolCalled
from squad.mcp import MCPServer, MCPServers, model_name
from squad.runtime.agent import Agent
from squad.runtime.squad import Squad
from squad.testing import ScriptedEngine

pytestmark = pytest.mark.anyio
HERE = Path(__file__).resolve().parents[1]
SERVER = HERE / "mcp_server.py"
STDIO = MCPServer(name="t", command="python", args=(str(SERVER),))


def calls(*pairs: tuple[str, dict]) -> ChatResult:
    return ChatResult(content="", tool_calls=[ToolCall(f"c{i}", name, json.dumps(args))
                                              for i, (name, args) in enumerate(pairs)], finish_reason="tool_calls")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- a tool call through squad, stdio and HTTP -------------------------------------------------


@pytest.mark.parametrize("kind", ["stdio", "http"])
async def test_an_agent_calls_an_mcp_tool_and_gets_its_result(kind, request):
    server = STDIO if kind == "stdio" else MCPServer(name="t", url=request.getfixturevalue("http_server"))
    events = []
    engine = ScriptedEngine(calls(("add", {"a": 2, "b": 40}), ("echo", {"text": "hi"})), "the sum is 42")
    agent = Agent(name="calc", tools=["t.add", "t.echo"])
    async with Squad([agent], engine=engine, mcp_servers=[server], on_event=events.append) as sq:
        result = await sq.run("add 2 and 40")
    assert result.output == "the sum is 42"
    offered = {t["function"]["name"]: t["function"] for t in engine.requests[0].tools}
    assert set(offered) == {"add", "echo"}
    assert offered["add"]["parameters"]["required"] == ["a", "b"]  # the server's own schema
    assert offered["add"]["description"] == "Add two whole numbers."
    sent = [m for m in engine.requests[1].messages if m["role"] == "tool"]
    assert [m["content"] for m in sent] == ["42", "echo: hi"]
    assert [(e.tool, e.ok) for e in events if isinstance(e, ToolCalled)] == [("add", True), ("echo", True)]


async def test_a_server_star_offers_every_tool_and_odd_names_are_made_callable():
    async with MCPServers([STDIO]) as servers:
        tools = servers.tools_for(Agent(name="a", tools=["t.*"]))
        assert {"echo", "add", "fail", "slow", "spawn_child", "env", "dotted_name"} <= set(tools)
        assert tools["dotted_name"].remote == "dotted.name"
        assert (await tools["dotted_name"].call("{}")).text == "dotted"
    assert model_name("a/b.c") == "a_b_c"


# --- failures are the tool's result, never a crash -------------------------------------------


async def test_tool_errors_bad_arguments_and_timeouts_go_back_as_text():
    slow = STDIO.model_copy(update={"timeout": 0.5})
    async with MCPServers([slow]) as servers:
        t = servers.tools["t"]
        failed = await t["fail"].call('{"message": "the disk is full"}')
        assert not failed.ok and failed.text.startswith("error:") and "the disk is full" in failed.text
        late = await t["slow"].call('{"seconds": 5}')
        assert not late.ok and late.text == ("error: slow (MCP server 't') timed out: it did not answer within its "
                                             "timeout of 0.5 s")
        missing = await t["add"].call('{"a": 1}')
        assert missing.text == "error: bad arguments for add: arguments: 'b' is a required property"
        wrong = await t["add"].call('{"a": "one", "b": 2}')
        assert "bad arguments for add: a: 'one' is not of type 'integer'" in wrong.text
        assert (await t["add"].call("{not json")).text.startswith("error: bad arguments for add: not JSON")
        assert (await t["add"].call("[1, 2]")).text == "error: bad arguments for add: give a JSON object"
        assert (await t["add"].call('{"a": 1, "b": 2}')).text == "3"  # the server still answers


async def test_a_server_that_dies_mid_run_fails_the_call_not_the_squad():
    engine = ScriptedEngine(calls(("echo", {"text": "x"})), "went on without it")
    async with Squad([Agent(name="a", tools=["t.echo"])], engine=engine, mcp_servers=[STDIO]) as sq:
        for pid in sq.mcp.pids()["t"]:
            os.kill(pid, signal.SIGKILL)
        result = await sq.run("echo x")
    assert result.output == "went on without it"
    tool_text = next(m["content"] for m in engine.requests[1].messages if m["role"] == "tool")
    assert tool_text.startswith("error: echo (MCP server 't') failed:")


# --- a server that does not start -------------------------------------------------------------


async def test_a_command_that_cannot_run_names_the_server():
    bad = MCPServer(name="notes", command="/nonexistent/notes-server", args=("--db", "x"))
    with pytest.raises(MCPServerError) as info:
        async with MCPServers([bad]):
            pass
    assert info.value.server == "notes"
    assert str(info.value).startswith("MCP server 'notes' (/nonexistent/notes-server --db x) did not start: "
                                      "cannot run '/nonexistent/notes-server'")


async def test_a_server_that_exits_at_start_shows_its_stderr_and_no_engine_starts():
    bad = MCPServer(name="notes", command="python", args=(str(SERVER), "--fail"))
    engine = ScriptedEngine()
    with pytest.raises(MCPServerError) as info:
        async with Squad([Agent(name="a", tools=["notes.echo"])], engine=engine, mcp_servers=[bad]):
            pass
    assert "MCP server 'notes'" in str(info.value) and "did not start" in str(info.value)
    assert "cannot open the database /nonexistent/notes.db" in str(info.value)
    assert info.value.stderr.endswith("cannot open the database /nonexistent/notes.db")
    assert engine.requests == []


async def test_a_url_that_does_not_answer_names_the_server():
    bad = MCPServer(name="web", url=f"http://127.0.0.1:{free_port()}/mcp", start_timeout=10)
    with pytest.raises(MCPServerError) as info:
        async with MCPServers([bad]):
            pass
    assert str(info.value).startswith(f"MCP server 'web' ({bad.url}) did not start: ")


async def test_a_server_that_never_answers_is_cut_at_its_start_timeout(tmp_path):
    mute = tmp_path / "mute.py"
    mute.write_text("import time\ntime.sleep(60)\n")
    with pytest.raises(MCPServerError, match=r"no answer within start_timeout=1 s"):
        async with MCPServers([MCPServer(name="mute", command="python", args=(str(mute),), start_timeout=1)]):
            pass


# --- declaring servers and naming their tools -------------------------------------------------


@pytest.mark.parametrize(("fields", "message"), [
    ({}, "give a command (a server squad starts) or a url"),
    ({"command": "x", "url": "http://127.0.0.1:1/mcp"}, "give a command (a server squad starts) or a url"),
    ({"url": "ftp://host/mcp"}, "url must start with http:// or https://"),
    ({"url": "http://h/mcp", "args": ["a"]}, "args, env and cwd are for a server squad starts"),
    ({"command": "python", "args": ["server.py", "{{ params.db }}"]}, "never rendered as templates"),
    ({"command": "python", "env": {"DB": "{% if x %}y{% endif %}"}}, "never rendered as templates"),
    ({"command": "x", "timeout": 0}, "greater than 0"),
])
def test_bad_server_declarations(fields, message):
    with pytest.raises(ValidationError, match=re.escape(message)):
        MCPServer(name="s", **fields)


def test_an_agent_naming_an_undeclared_server_is_refused_before_anything_starts():
    with pytest.raises(UserError, match=r"agent 'a' lists tool 'notes.add', but there is no MCP server 'notes' "
                                        r"\(MCP servers: t\)"):
        Squad([Agent(name="a", tools=["notes.add"])], engine=ScriptedEngine(), mcp_servers=[STDIO])
    with pytest.raises(UserError, match="two MCP servers are named 't'"):
        MCPServers([STDIO, STDIO])


async def test_a_tool_the_server_does_not_have_is_refused_at_open_with_its_tools():
    with pytest.raises(UserError) as info:
        async with Squad([Agent(name="a", tools=["t.ech"])], engine=ScriptedEngine(), mcp_servers=[STDIO]):
            pass
    said = "agent 'a' lists tool 't.ech', but MCP server 't' has no tool 'ech'; did you mean 't.echo'?"
    assert said in str(info.value)


async def test_two_tools_with_one_name_are_refused():
    other = MCPServer(name="u", command="python", args=(str(SERVER),))
    agent = Agent(name="a", tools=["t.echo", "u.echo"])
    with pytest.raises(UserError, match="agent 'a' gets two tools named 'echo': t.echo and u.echo"):
        async with Squad([agent], engine=ScriptedEngine(), mcp_servers=[STDIO, other]):
            pass


async def test_env_reaches_the_server_and_squads_own_environment_does_not(monkeypatch):
    monkeypatch.setenv("SQUAD_TEST_SECRET", "do-not-pass")
    server = STDIO.model_copy(update={"env": {"NOTES_DB": "/tmp/notes.db"}})
    async with MCPServers([server]) as servers:
        env = servers.tools["t"]["env"]
        assert (await env.call('{"name": "NOTES_DB"}')).text == "/tmp/notes.db"
        assert (await env.call('{"name": "SQUAD_TEST_SECRET"}')).text == ""


# --- no server process is left behind --------------------------------------------------------


async def test_closing_stops_the_server_and_what_it_started():
    async with MCPServers([STDIO]) as servers:
        [server_pid] = servers.pids()["t"]
        child, reported = map(int, (await servers.tools["t"]["spawn_child"].call("{}")).text.split())
        assert reported == server_pid and not gone(child)
    assert gone(server_pid) and wait_gone(child, 10)


async def test_cancelling_the_squad_stops_the_servers():
    engine = ScriptedEngine(calls(("slow", {"seconds": 30})))
    pids: list[int] = []
    with anyio.CancelScope() as scope:
        async with Squad([Agent(name="a", tools=["t.*"])], engine=engine, mcp_servers=[STDIO]) as sq:
            pids += sq.mcp.pids()["t"]
            scope.deadline = anyio.current_time() + 2  # cancelled in the call, however slow the start was
            await sq.run("sleep")
    assert pids and all(wait_gone(p, 10) for p in pids)


_HOLDER = textwrap.dedent("""
    import sys, anyio
    from squad.mcp import MCPServer, MCPServers

    async def main():
        server = MCPServer(name="t", command="python", args=[sys.argv[1]])
        async with MCPServers([server]) as servers:
            child = (await servers.tools["t"]["spawn_child"].call("{}")).text
            print(child, flush=True)
            await anyio.sleep(300)

    try:
        anyio.run(main)
    except KeyboardInterrupt:
        sys.exit(130)
""")


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGKILL, -9), (signal.SIGINT, 130)])
def test_no_server_process_outlives_squad_killed_or_interrupted(sig, code):
    """SIGKILL: the guard (squad.children) stops the server's group; Ctrl-C: squad closes it."""
    env = {**os.environ, "PYTHONPATH": str(HERE.parent / "src")}
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER, str(SERVER)], stdout=subprocess.PIPE, text=True,
                              env=env)
    try:
        line = holder.stdout.readline()
        child, server = map(int, line.split())
        assert not gone(server) and not gone(child)
        holder.send_signal(sig)
        assert holder.wait(30) == code
        assert wait_gone(server, 15), "the MCP server outlived squad"
        assert wait_gone(child, 15), "a process the MCP server started outlived squad"
    finally:
        if holder.poll() is None:
            holder.kill()
        holder.wait()
        holder.stdout.close()
        for p in psutil.Process().children(recursive=True):
            if p.pid != children.guard_pid():
                p.kill()

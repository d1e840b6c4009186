"""MCP tools with the REAL llama-server and the default model (kept small: 2 shared cores).

What each test proves:

- ``squad run recipes/notes.yaml``, the shipped MCP recipe, runs end to end on the real engine
  with the real stdio server from examples/ (started before the engine, stopped after), and
  leaves no engine or MCP server process after the run, after Ctrl-C and after SIGKILL.
- The round trip through real MCP servers (stdio and streamable HTTP) and the real engine:
  the model's first round is scripted (the built-in model's own chat template cannot carry
  tools on this branch), the call runs on the real server, its result goes to the real engine
  as a ``tool`` message with the server's schemas offered, and the engine answers.
- The model's own call (``tool_choice="required"``): the engine renders the server's tools with
  squad's tool template for the built-in model, parses the model's call into ``tool_calls``, and
  squad runs it on the real server (stdio and streamable HTTP).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from launch_support import THREADS, gone, wait_gone
from mcp_support import http_server  # noqa: F401 - a fixture
from squad.chat import ChatRequest, ChatResult, ToolCall
from squad.engine.session import EngineSession, EngineSpec
from squad.mcp import MCPServer
from squad.runtime.agent import Agent
from squad.runtime.squad import Squad

pytestmark = [pytest.mark.engine]
ROOT = Path(__file__).resolve().parents[2]
SERVER = Path(__file__).resolve().parents[1] / "mcp_server.py"
TINY = dict(budget=768, max_tokens=24, sampling={"temperature": 0.0, "seed": 1})


class FirstRoundCalls:
    """The real engine's ChatEngine, except that a request offering tools is answered once
    with ``call`` (the model's first round, scripted); every other request goes to the engine."""

    def __init__(self, real, call: ToolCall) -> None:
        self.real, self.engine, self.admission = real, real.engine, real.admission
        self.pending = [call]
        self.sent: list[ChatRequest] = []

    async def count(self, messages, tools=None):
        return await self.real.count(messages, tools)

    async def complete(self, request: ChatRequest) -> ChatResult:
        if self.pending and request.tools:
            return ChatResult(content="", tool_calls=[self.pending.pop()], finish_reason="tool_calls")
        self.sent.append(request)
        return await self.real.complete(request)

    async def aclose(self) -> None:
        pass


@pytest.mark.anyio
@pytest.mark.parametrize("kind", ["stdio", "http"])
async def test_an_mcp_result_goes_to_the_real_engine_as_a_tool_message(kind, request, llama_server_path,
                                                                       default_model_path):
    server = (MCPServer(name="t", command="python", args=(str(SERVER),)) if kind == "stdio"
              else MCPServer(name="t", url=request.getfixturevalue("http_server")))
    agent = Agent(name="calc", instructions="You answer with the number you are given.", tools=["t.add"], **TINY)
    spec = EngineSpec(model=default_model_path, binary=llama_server_path, threads=THREADS, slots=1, ctx=1024)
    async with EngineSession(spec) as session:
        chat = FirstRoundCalls(session.chat, ToolCall("call_1", "add", json.dumps({"a": 19, "b": 23})))
        async with Squad([agent], engine=chat, mcp_servers=[server]) as sq:
            result = await sq.run("What is 19 + 23? Use the add tool.")
    [answering] = chat.sent  # the round after the tool result, on the real engine
    tool_messages = [m for m in answering.messages if m["role"] == "tool"]
    assert tool_messages == [{"role": "tool", "tool_call_id": "call_1", "content": "42"}]
    assert {t["function"]["name"] for t in answering.tools} == {"add"}  # the server's schema, offered again
    assert answering.tools[0]["function"]["parameters"]["required"] == ["a", "b"]
    assert result.main.usage.prompt_tokens > 0 and result.output.strip()  # the real engine answered
    assert result.main.tool_calls == [("add", '{"a": 19, "b": 23}', "42")]


@pytest.mark.anyio
@pytest.mark.parametrize("kind", ["stdio", "http"])
async def test_the_models_own_mcp_call_where_the_engine_renders_tools(kind, request, llama_server_path,
                                                                      default_model_path):
    server = (MCPServer(name="t", command="python", args=(str(SERVER),)) if kind == "stdio"
              else MCPServer(name="t", url=request.getfixturevalue("http_server")))
    agent = Agent(name="calc", instructions="Use the add tool, then give the sum.", tools=["t.add"],
                  tool_choice="required", **TINY)
    spec = EngineSpec(model=default_model_path, binary=llama_server_path, threads=THREADS, slots=1, ctx=1024)
    async with Squad([agent], engine=spec, mcp_servers=[server]) as sq:
        if not sq.info.template_has_tools:
            pytest.skip("the engine's chat template drops tools for this model")
        result = await sq.run("What is 19 + 23?")
    assert result.main.tool_calls and result.main.tool_calls[0][0] == "add"  # the engine's own tool_calls
    name, arguments, answer = result.main.tool_calls[0]
    args = json.loads(arguments)
    if set(args) == {"a", "b"} and all(type(v) is int for v in args.values()):  # a call ran on the server
        assert answer == str(args["a"] + args["b"])


# --- the shipped recipe through the CLI --------------------------------------------------------


def _squad_run(tmp_path: Path, llama_server_path: Path, *extra: str) -> subprocess.Popen:
    env = {**os.environ, "SQUAD_STATE_DIR": str(tmp_path / "state"), "PYTHONPATH": str(ROOT / "src")}
    return subprocess.Popen(
        [sys.executable, "-m", "squad", "run", str(ROOT / "recipes" / "notes.yaml"), "--llama-server",
         str(llama_server_path), "-t", str(THREADS), "--trace", str(tmp_path / "trace.jsonl"), *extra],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)


def _cmd(p: psutil.Process) -> str:
    try:
        return " ".join(p.cmdline())
    except psutil.Error:  # ended (or a zombie) meanwhile
        return ""


def _servers_of(proc: subprocess.Popen, timeout: float) -> tuple[set[int], str, str]:
    """Runs ``proc`` to its end; returns the pids of the MCP notes servers seen among its descendants, its stdout and
    stderr. Descendants, not every notes server on the machine: other test files start their own meanwhile."""
    done: dict[str, str] = {}
    reader = threading.Thread(target=lambda: done.update(zip(("out", "err"), proc.communicate(timeout=timeout),
                                                             strict=True)), daemon=True)
    reader.start()
    seen: set[int] = set()
    try:
        squad = psutil.Process(proc.pid)
        while proc.poll() is None:
            with contextlib.suppress(psutil.Error):
                seen |= {p.pid for p in squad.children(recursive=True) if "mcp_notes.py" in _cmd(p)}
            time.sleep(0.05)
    except psutil.NoSuchProcess:
        pass
    reader.join(timeout)
    return seen, done.get("out", ""), done.get("err", "")


def test_the_shipped_mcp_recipe_runs_and_leaves_nothing(tmp_path, llama_server_path, default_model_path):
    proc = _squad_run(tmp_path, llama_server_path)
    servers, out, err = _servers_of(proc, 600)
    assert proc.returncode == 0, err
    assert out.strip()
    events = [json.loads(line) for line in (tmp_path / "trace.jsonl").read_text().splitlines()]
    assert [e for e in events if e.get("kind") == "agent.finished"]
    assert servers, "no MCP server was seen under squad run"
    assert [pid for pid in servers if not wait_gone(pid, 10)] == []


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGKILL, -9)])
def test_no_engine_or_mcp_server_outlives_squad_run(sig, code, tmp_path, llama_server_path, default_model_path):
    proc = _squad_run(tmp_path, llama_server_path)
    try:
        squad = psutil.Process(proc.pid)
        deadline = time.monotonic() + 120
        engine = server = None
        while time.monotonic() < deadline and engine is None:  # servers start first, then the engine
            kids = squad.children(recursive=True)
            server = next((p for p in kids if "mcp_notes.py" in _cmd(p)), None)  # its own, not another test's
            engine = next((p for p in kids if "llama-server" in _cmd(p) and "--version" not in _cmd(p)), None)
            time.sleep(0.1)
        assert server is not None and engine is not None, proc.stderr.read() if proc.poll() is not None else ""
        proc.send_signal(sig)
        assert proc.wait(60) == code
        assert wait_gone(server.pid, 20), "the MCP server outlived squad"
        assert wait_gone(engine.pid, 20), "the engine outlived squad"
    finally:
        if proc.poll() is None:
            proc.kill()
        if server is not None and not gone(server.pid):
            server.kill()

"""MCP stdio servers that write to stdout what is not MCP (before, beside or instead of the
protocol) or exit mid-run (``tests/mcp_noisy_server.py``, the official SDK): never a traceback;
one warning line per server that names it and quotes the line; a server that only prints fails
saying so; an exit mid-run is warned about (event, live view, summary). The model's side is
scripted (ScriptedEngine, or the fake engine over HTTP for ``squad run``)."""

from __future__ import annotations

import io
import json
import logging
from pathlib import Path

import anyio
import pytest
from rich.console import Console

from cli_support import squad, state  # noqa: F401  (fixture)
from squad.chat import ChatResult, ToolCall
from squad.errors import MCPServerError
from squad.events import MCPWarning
from squad.events.summary import summarize
from squad.events.view import LiveView
from squad.mcp import MCPServer, MCPServers, _StdoutNoise
from squad.runtime.agent import Agent
from squad.runtime.squad import Squad
from squad.testing import FakeEngine, Reply, ScriptedEngine

pytestmark = pytest.mark.anyio
NOISY = Path(__file__).resolve().parents[1] / "mcp_noisy_server.py"
BANNER = "'Starting noisy server v1.0 on stdio...'"


def noisy(mode: str, **fields: object) -> MCPServer:
    return MCPServer(name="noisy", command="python", args=(str(NOISY), mode), **fields)


def echo(text: str) -> ChatResult:
    return ChatResult(content="", tool_calls=[ToolCall("c0", "echo", json.dumps({"text": text}))],
                      finish_reason="tool_calls")


def no_traceback(capfd: pytest.CaptureFixture[str]) -> None:
    out, err = capfd.readouterr()
    assert "Traceback" not in err and "Failed to parse" not in err, err
    assert "Traceback" not in out, out


async def test_a_banner_before_the_protocol_is_one_warning_not_a_traceback(capfd):
    events = []
    engine = ScriptedEngine(echo("hi"), "done")
    async with Squad([Agent(name="a", tools=["noisy.echo"])], engine=engine, mcp_servers=[noisy("before")],
                     on_event=events.append) as sq:
        result = await sq.run("echo hi")
    assert result.output == "done"
    assert [m["content"] for m in engine.requests[1].messages if m["role"] == "tool"] == ["echo: hi"]
    [warning] = [e for e in events if isinstance(e, MCPWarning)]
    assert (warning.server, warning.problem) == ("noisy", "stdout")
    assert warning.warning.startswith(f"MCP server 'noisy' wrote text that is not MCP to stdout: {BANNER}; ")
    assert "send its logs and banners to stderr" in warning.warning and "\n" not in warning.warning
    no_traceback(capfd)


async def test_text_beside_the_protocol_is_skipped_and_warned_once_per_server(capfd):
    async with MCPServers([noisy("beside")]) as servers:
        tool = servers.tools["noisy"]["echo"]
        first = await tool.call('{"text": "one"}')
        second = await tool.call('{"text": "two"}')
    assert (first.ok, first.text, second.ok, second.text) == (True, "echo: one", True, "echo: two")
    [warning] = servers.warnings
    assert "'DEBUG echo called with one'" in warning.warning
    no_traceback(capfd)


async def test_bytes_that_are_not_utf8_are_a_line_that_is_not_mcp_not_a_stopped_reader(capfd):
    async with MCPServers([noisy("bytes", start_timeout=120)]) as servers:
        out = await servers.tools["noisy"]["echo"].call('{"text": "x"}')
    assert out.ok and out.text == "echo: x"
    [warning] = servers.warnings
    assert "PNG" in warning.warning and "binary" in warning.warning
    no_traceback(capfd)


async def test_a_server_that_only_prints_fails_saying_what_it_wrote(capfd):
    with pytest.raises(MCPServerError) as info:
        async with MCPServers([noisy("only", start_timeout=10)]):
            pass
    text = str(info.value)
    assert text.startswith("MCP server 'noisy' (python ")
    assert "did not start: no answer within start_timeout=10 s" in text
    assert f"it wrote text that is not MCP to stdout (2 lines), first {BANNER}" in text
    assert "make the server write its logs and banners to stderr" in text
    no_traceback(capfd)


async def test_a_server_that_prints_and_exits_fails_when_it_exits_not_at_its_start_timeout(capfd):
    with pytest.raises(MCPServerError) as info:
        async with MCPServers([noisy("only-exit", start_timeout=600)]):
            pass
    text = str(info.value)
    assert "did not start: " in text and "start_timeout" not in text  # the exit ended the wait
    assert f"it wrote text that is not MCP to stdout, first {BANNER}" in text
    no_traceback(capfd)


async def test_a_server_that_exits_mid_run_is_warned_about_in_events_view_and_summary(capfd):
    events = []
    engine = ScriptedEngine(echo("one"), "first", echo("two"), "second")
    async with Squad([Agent(name="a", tools=["noisy.echo"])], engine=engine, mcp_servers=[noisy("once")],
                     on_event=events.append) as sq:
        assert (await sq.run("echo one")).output == "first"
        with anyio.fail_after(60):  # the server ends itself just after its first answer
            while not any(isinstance(e, MCPWarning) for e in events):
                await anyio.sleep(0.05)
        assert (await sq.run("echo two")).output == "second"
    [warning] = [e for e in events if isinstance(e, MCPWarning)]
    assert warning.problem == "exited"
    assert warning.warning == "MCP server 'noisy' exited mid-run (status 0): calls of its tools fail from now on"
    tool_texts = [m["content"] for r in engine.requests for m in r.messages if m["role"] == "tool"]
    assert tool_texts[0] == "echo: one"
    assert tool_texts[-1].startswith("error: echo (MCP server 'noisy') failed: ")
    assert "(the server exited mid-run, status 0)" in tool_texts[-1]
    assert warning.warning in summarize(events).warnings
    for live in (False, True):
        out = io.StringIO()
        with LiveView(on=True, console=Console(file=out, width=200), live=live) as view:
            for event in events:
                view(event)
        assert f"warning: {warning.warning}" in out.getvalue(), live
    no_traceback(capfd)


async def test_closing_the_squad_is_not_an_exit_mid_run():
    events = []
    async with Squad([Agent(name="a", tools=["noisy.echo"])], engine=ScriptedEngine(),
                     mcp_servers=[noisy("once")], on_event=events.append):
        pass
    assert not [e for e in events if isinstance(e, MCPWarning)]


def test_the_sdks_other_log_records_still_pass():
    record = logging.LogRecord("mcp.client.stdio", logging.ERROR, __file__, 1, "something else", None,
                               (ValueError, ValueError("x"), None))
    assert _StdoutNoise().filter(record)  # logged where no squad server is being served


RECIPE = """\
name: noisy
mcp:
  noisy:
    command: python
    args: [{server}, before]
agents:
  a: {{instructions: "You echo.", budget: 1024, max_tokens: 16, tools: [noisy.echo]}}
main: a
flow:
  - prompt: "echo hi"
"""


@pytest.mark.parametrize("quiet", [False, True])
def test_squad_run_says_it_in_one_line_live_and_in_the_summary(capsys, tmp_path, state, quiet):
    fe = FakeEngine(slots=2, n_ctx=4096)
    anyio.run(fe.start)
    try:
        fe.script(Reply(tool_calls=[{"name": "echo", "arguments": '{"text": "hi"}'}]),
                  Reply(content="said hi", finish_reason="stop"))
        path = tmp_path / "noisy.yaml"
        path.write_text(RECIPE.format(server=json.dumps(str(NOISY))), encoding="utf-8")
        code, out, err = squad(capsys, "run", path, "--url", fe.base_url, *(["-q"] if quiet else []))
    finally:
        anyio.run(fe.stop)
    assert code == 0, err
    assert out.strip() == "said hi"
    assert "Traceback" not in err and "Failed to parse" not in err, err
    said = [line for line in err.splitlines() if "wrote text that is not MCP" in line]
    if quiet:
        assert said == []
    else:  # the live line and the summary's, each one line naming the server and the text
        assert len(said) == 2 and all("MCP server 'noisy'" in line and BANNER in line for line in said), err



# --- content that is not text: described with its MIME type, URI and size, never dumped -------------------------

CONTENT = MCPServer(name="c", command="python",
                    args=(str(Path(__file__).resolve().parents[1] / "mcp_content_server.py"),))


async def test_content_that_is_not_text_is_described_not_dumped():
    async with MCPServers([CONTENT]) as servers:
        tools = servers.tools["c"]
        got = {name: (await tools[name].call("{}")).text for name in ("picture", "sound", "blob", "note", "link")}
    assert got == {
        "picture": "a caption\n[image: image/png, 1,000 bytes, not shown]",
        "sound": "[audio: audio/wav, 7 bytes, not shown]",
        "blob": "[resource: file:///data/logo.png, image/png, 1,000 bytes, binary, not shown]",
        "note": "[resource: file:///notes/1.txt, text/plain]\nbuy tea",
        "link": "[resource link: file:///reports/q3.pdf, application/pdf, 48,213 bytes]",
    }


def test_what_a_server_leaves_out_is_said_so():
    import mcp_types as types

    from squad.mcp import result_text

    blob = types.BlobResourceContents(uri="s3://bucket/" + "k" * 300, blob="AAAA")
    link = types.ResourceLink(type="resource_link", uri="db://rows/7", name="row 7")
    result = types.CallToolResult(content=[types.EmbeddedResource(type="resource", resource=blob), link])
    lines = result_text(result).splitlines()
    assert lines[0] == f"[resource: s3://bucket/{'k' * 188}..., type not given, 3 bytes, binary, not shown]"
    assert lines[1] == "[resource link: db://rows/7 (row 7), type not given]"


@pytest.mark.parametrize("command", [["recipes", "validate", "--check-mcp"], ["plan", "--check-mcp"]])
def test_check_mcp_says_it_in_one_line(capsys, tmp_path, state, command):
    path = tmp_path / "noisy.yaml"
    path.write_text(RECIPE.format(server=json.dumps(str(NOISY))), encoding="utf-8")
    code, out, err = squad(capsys, *command, path)
    assert code == 0, err
    said = [line for line in (out + err).splitlines() if "wrote text that is not MCP" in line]
    assert len(said) == 1 and "MCP server 'noisy'" in said[0] and BANNER in said[0], out + err
    assert "Traceback" not in out + err and "Failed to parse" not in out + err

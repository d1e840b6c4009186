"""Tool calls on models whose template has no tools: the template squad picks by chat format,
the argv that passes it, ``tool_choice`` (first round only), and the prefilled call prefix.
The real engine proves the round trip in tests/runtime/test_tools_real.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from squad.chat import ChatRequest, ChatResult, ToolCall
from squad.chat.client import EngineClient
from squad.engine.chat_templates import (
    CHATML_TOOLS,
    GRANITE_TOOLS,
    PHI3_TOOLS,
    chat_format,
    describe,
    handles_tools,
    known_template,
    tool_template_for,
)
from squad.engine.info import EngineInfo
from squad.engine.session import with_chat_template
from squad.errors import UserError
from squad.events import Origin
from squad.runtime.agent import Agent, check_squad
from squad.runtime.squad import Squad
from squad.runtime.tools import tool
from squad.sched.plan import EnginePlan
from squad.testing import ScriptedEngine

pytestmark = pytest.mark.anyio

SMOLLM2 = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ "
           "'<|im_start|>system\n"
           "You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif "
           "%}{{'<|im_start|>' + "
           "message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if "
           "add_generation_prompt %}"
           "{{ '<|im_start|>assistant\n' }}{% endif %}")
QWEN_LIKE = ("{%- if tools %}<|im_start|>system\n{% for t in tools %}{{ t | tojson }}{% endfor "
             "%}<|im_end|>\n{% endif %}"
             "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}{% if m.tool_calls %}{% for c in "
             "m.tool_calls %}"
             "<tool_call>{{ c.function.name }}</tool_call>{% endfor %}{% endif %}<|im_end|>\n{% endfor %}")
PHI_LIKE = "{% for m in messages %}<|{{ m.role }}|>\n{{ m.content }}<|end|>\n{% endfor %}<|assistant|>\n"
GRANITE_LIKE = ("{%- if tools %}<|start_of_role|>available_tools<|end_of_role|>{{ tools | tojson }}<|end_of_text|>\n"
                "{% endif %}{% for m in messages %}<|start_of_role|>{{ m.role }}<|end_of_role|>{{ m.content }}"
                "<|end_of_text|>\n{% endfor %}<|start_of_role|>assistant<|end_of_role|>")
CHATML_LISTS_TOOLS = ("{%- if tools %}<|im_start|>system\nList of tools: {{ tools | tojson }}<|im_end|>\n{% endif %}"
                      "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}")
LLAMA3_LIKE = ("{% for m in messages %}<|start_header_id|>{{ m.role }}<|end_header_id|>\n\n{{ m.content }}<|eot_id|>"
               "{% endfor %}")


# --- which template the engine gets ------------------------------------------------------------


@pytest.mark.parametrize(("source", "tool_use", "expected"), [
    (SMOLLM2, False, CHATML_TOOLS),      # ChatML without tools: squad's ChatML tool template
    (QWEN_LIKE, False, None),            # ChatML that handles tools: the model's own
    (SMOLLM2, True, None),               # a separate tool_use template: the model's own
    (LLAMA3_LIKE, False, None),          # no tools but a format squad ships none for
    ("{{ messages }} tools are mentioned", False, None),  # mentions tools: never replaced
    (None, False, CHATML_TOOLS),         # no template in the file: the engine falls back to ChatML without tools
    (PHI_LIKE, False, PHI3_TOOLS),       # Phi-3 without tools (Phi-3.5's own): squad's Phi-3 tool template
    (GRANITE_LIKE, False, GRANITE_TOOLS),  # Granite listing tools but rendering no call: squad's Granite template
    (CHATML_LISTS_TOOLS, False, None),   # ChatML listing tools its own way (LFM2): the model's own
])
def test_the_template_is_chosen_by_chat_format_and_never_replaces_one_with_tools(source, tool_use, expected) -> None:
    assert tool_template_for(source, has_tool_use_template=tool_use) == expected


def test_squads_template_is_chatml_and_carries_tools_and_calls() -> None:
    text = CHATML_TOOLS.text
    assert chat_format(text) == "chatml" and handles_tools(text) is True
    assert handles_tools(SMOLLM2) is False and handles_tools(QWEN_LIKE) is True
    assert known_template(text + "\n") == CHATML_TOOLS and known_template(SMOLLM2) is None
    assert describe(text).startswith("squad:chatml-tools")
    assert "no tools" in describe(SMOLLM2)


def test_squads_template_renders_plain_chatml_without_tools() -> None:
    """Without tools the conversation is the same ChatML the model was trained on."""
    from squad.engine.chat_templates import _render

    msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "yo"}, {"role": "user", "content": "again"}]
    assert _render(CHATML_TOOLS.text, messages=msgs) == (
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nyo<|im_end|>\n"
        "<|im_start|>user\nagain<|im_end|>\n<|im_start|>assistant\n")


def test_squads_template_renders_tools_calls_and_results() -> None:
    from squad.engine.chat_templates import _render

    tools = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]
    msgs = [{"role": "user", "content": "2+3?"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"id": "1", "type": "function", "function": {"name": "add", "arguments": {"a": 2}}},
                {"id": "2", "type": "function", "function": {"name": "add", "arguments": '{"a": 3}'}}]},
            {"role": "tool", "tool_call_id": "1", "content": "5"},
            {"role": "tool", "tool_call_id": "2", "content": "6"}]
    text = _render(CHATML_TOOLS.text, messages=msgs, tools=tools)
    assert '<tools>\n{"type": "function", "function": {"name": "add"' in text
    assert ('<|im_start|>assistant\n<tool_call>\n{"name": "add", "arguments": {"a": 2}}\n</tool_call>\n'
            '<tool_call>\n{"name": "add", "arguments": {"a": 3}}\n</tool_call><|im_end|>\n') in text
    assert ("<|im_start|>user\n<tool_response>\n5\n</tool_response>\n<tool_response>\n6\n</tool_response>"
            "<|im_end|>\n") in text


def test_the_plan_passes_the_template_file_with_jinja_and_says_why() -> None:
    plan = with_chat_template(EnginePlan.simple("m.gguf", slots=1, n_ctx=1024), SMOLLM2)
    args = plan.server_args()
    at = args.index("--chat-template-file")
    assert args[at - 1] == "--jinja" and Path(args[at + 1]) == CHATML_TOOLS.path and CHATML_TOOLS.path.is_file()
    assert plan.template_name == "squad:chatml-tools" and any("no tools section" in r for r in plan.reasons)
    own = with_chat_template(EnginePlan.simple("m.gguf", slots=1, n_ctx=1024), QWEN_LIKE)
    assert "--chat-template-file" not in own.server_args() and own.chat_template is None
    assert own != plan  # another template is another engine (a reload)


# --- tool_choice ---------------------------------------------------------------------------------


@tool
def lookup(q: str) -> str:
    """Look something up."""
    return f"found {q}"


@tool
def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


def called(name: str, arguments: str = "{}") -> ChatResult:
    return ChatResult(content="", tool_calls=[ToolCall("c1", name, arguments)], finish_reason="tool_calls")


@pytest.mark.parametrize(("choice", "first_tools", "first_choice"), [
    ("auto", {"lookup", "add"}, None),
    ("required", {"lookup", "add"}, "required"),
    ("add", {"add"}, "required"),  # a named choice: only that tool, required
])
async def test_a_forced_choice_applies_to_the_first_round_only(choice, first_tools, first_choice) -> None:
    engine = ScriptedEngine(called("add", '{"a": 2, "b": 3}'), called("lookup", '{"q": "x"}'), "5, found x")
    agent = Agent(name="calc", tools=["lookup", "add"], tool_choice=choice, max_tokens=16)
    async with Squad([agent], engine=engine, tools=[lookup, add]) as sq:
        result = await sq.run_agent("calc", "go")
    first, second, third = engine.requests
    assert {t["function"]["name"] for t in first.tools} == first_tools and first.tool_choice == first_choice
    assert second.tool_choice is None and {t["function"]["name"] for t in second.tools} == {"lookup", "add"}
    assert third.tool_choice is None
    assert [c[0] for c in result.tool_calls] == ["add", "lookup"] and result.output == "5, found x"


async def test_a_named_sub_agent_tool_can_be_forced() -> None:
    engine = ScriptedEngine(called("ask_helper", '{"task": "t"}'), "helped", "done")
    agents = [Agent(name="lead", agents=["helper"], tool_choice="ask_helper", max_tokens=16),
              Agent(name="helper", max_tokens=16)]
    async with Squad(agents, engine=engine) as sq:
        result = await sq.run_agent("lead", "go")
    assert [t["function"]["name"] for t in engine.requests[0].tools] == ["ask_helper"]
    assert engine.requests[0].tool_choice == "required" and result.output == "done"


async def test_parallel_tool_calls_false_runs_only_the_first_call() -> None:
    two = ChatResult(content="", tool_calls=[ToolCall("c1", "add", '{"a": 1, "b": 1}'),
                                             ToolCall("c2", "add", '{"a": 1, "b": 1}')], finish_reason="tool_calls")
    engine = ScriptedEngine(two, "2")
    agent = Agent(name="calc", tools=["add"], parallel_tool_calls=False, max_tokens=16)
    async with Squad([agent], engine=engine, tools=[add]) as sq:
        result = await sq.run_agent("calc", "go")
    assert engine.requests[0].parallel_tool_calls is False
    assert len(result.tool_calls) == 1 and len(result.history[1]["tool_calls"]) == 1


@pytest.mark.parametrize(("fields", "error"), [
    ({"tools": ["add"], "tool_choice": "lookup"}, r"tool_choice 'lookup', which is not one of its tools \(add\)"),
    ({"tool_choice": "required"}, "tool_choice required but no tools"),
    ({"tools": ["add"], "tool_choice": "ask_nobody"}, "not one of its tools"),
    ({"tools": ["add"], "tool_choice": "bad name!"}, None),  # refused by the field's pattern
])
def test_a_tool_choice_that_cannot_be_met_is_a_clear_error(fields, error) -> None:
    if error is None:
        with pytest.raises(UserError, match="tool_choice"):
            Agent.build(name="calc", **fields)
        return
    with pytest.raises(UserError, match=error):
        check_squad([Agent(name="calc", **fields)], ["add", "lookup"])


# --- the prefilled call prefix -------------------------------------------------------------------


def _client(template: str | None) -> EngineClient:
    info = EngineInfo(base_url="http://127.0.0.1:9", api_key=None, slots=1, n_ctx=1024, kv_unified=False, pool=1024,
                      chat_template=template)
    return EngineClient(info, admission=None, counter=None)


@pytest.mark.parametrize(("template", "choice", "prefilled"), [
    (CHATML_TOOLS.text, "required", True),   # squad's template: the forced turn starts inside a call
    (CHATML_TOOLS.text, None, False),        # auto: the model decides
    (QWEN_LIKE, "required", True),           # a Hermes-style family template: its own opener (measured:
                                             # b11434's required alone let the model write text)
    (QWEN_LIKE, None, False),
    (PHI_LIKE, "required", False),           # no known call opener: llama.cpp's required as is
])
async def test_a_forced_choice_on_squads_template_prefills_the_call_prefix(template, choice, prefilled) -> None:
    client = _client(template)
    req = ChatRequest(origin=Origin(agent="a", conversation="c"), messages=[{"role": "user", "content": "hi"}],
                      max_tokens=8, tools=[lookup.spec()], tool_choice=choice)
    sent = client.transport.messages(req)
    assert (sent[-1] == {"role": "assistant", "content": "<tool_call>\n"}) is prefilled
    assert sent[:1] == req.messages
    await client.aclose()


async def test_a_call_cut_by_max_tokens_keeps_valid_json_in_the_history() -> None:
    """A reply that ran out of max_tokens inside a call's arguments: the tool answers with the
    error, and the history sent next holds ``{}`` (llama-server parses every call's arguments in
    the history and answers HTTP 500 to unfinished JSON)."""
    cut = ChatResult(content="", tool_calls=[ToolCall("c1", "lookup", '{"q": "weather_a_b_b_b')],
                     finish_reason="length")
    engine = ScriptedEngine(cut, "sorry")
    agent = Agent(name="a", tools=["lookup"], max_tokens=16)
    async with Squad([agent], engine=engine, tools=[lookup]) as sq:
        result = await sq.run_agent("a", "go")
    sent = engine.requests[1].messages
    assert sent[-2]["tool_calls"][0]["function"]["arguments"] == "{}"
    assert sent[-1]["role"] == "tool" and sent[-1]["content"].startswith("error: bad arguments for lookup")
    assert result.output == "sorry"


def test_the_template_file_ships_in_the_wheel() -> None:
    """pyproject's package-data names the template, so an installed squad has the file."""
    import tomllib

    data = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    patterns = data["tool"]["setuptools"]["package-data"]["squad.engine"]
    for shipped in (CHATML_TOOLS, PHI3_TOOLS, GRANITE_TOOLS):
        assert any(shipped.path.match(p) for p in patterns), shipped.name


# --- a named choice of an MCP tool (SERVER.TOOL) -----------------------------------------------


def test_an_mcp_tool_may_be_the_named_choice_when_the_agent_lists_it() -> None:
    for tools in (["notes.add_note"], ["notes.*"]):
        check_squad([Agent(name="a", tools=tools, tool_choice="notes.add_note")], mcp_servers=["notes"])
    with pytest.raises(UserError, match=r"tool_choice 'web.search', which is not one of its tools"):
        check_squad([Agent(name="a", tools=["notes.*"], tool_choice="web.search")], mcp_servers=["notes"])


def test_the_named_mcp_choice_is_sent_as_the_tool_the_model_sees() -> None:
    from squad.mcp import MCPTool
    from squad.runtime.turn import forced_choice

    add = MCPTool(name="add_note", description="add", args_model=None, fn=None, server="notes", remote="add_note",
                  schema={"type": "object", "properties": {"text": {"type": "string"}}})
    other = MCPTool(name="list_notes", description="list", args_model=None, fn=None, server="notes",
                    remote="list_notes", schema={"type": "object"})
    tools = {"add_note": add, "list_notes": other}
    specs, choice = forced_choice(Agent(name="a", tools=["notes.*"], tool_choice="notes.add_note"), tools,
                                  [t.spec() for t in tools.values()])
    assert choice == "required" and [s["function"]["name"] for s in specs] == ["add_note"]


def test_a_model_file_without_a_template_gets_squads_chatml_tool_template():
    """llama-server falls back to ChatML without tools for a GGUF with no template (gemma3-270m)."""
    from squad.engine.chat_templates import CHATML_TOOLS, ENGINE_FALLBACK, handles_tools, tool_template_for

    assert handles_tools(ENGINE_FALLBACK) is False
    assert tool_template_for(None) is CHATML_TOOLS
    assert tool_template_for(None, has_tool_use_template=True) is None
    plan = with_chat_template(EnginePlan.simple("m.gguf", slots=1, n_ctx=1024), None)
    assert plan.chat_template == CHATML_TOOLS.path
    assert any("the model file has none" in r for r in plan.reasons)


@pytest.mark.parametrize(("marker", "prefix"), [
    ("[TOOL_CALLS]", "[TOOL_CALLS]"),
    ("<|start_header_id|>", '{"name": "'),
    ("<tool_call>\n<function=", "<tool_call>\n<function="),
    ("<｜tool▁calls▁begin｜>", "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>"),
    ("<|channel|>", None),  # gpt-oss: a prefilled channel header is refused by b11434 (HTTP 400)
])
def test_family_call_openers(marker, prefix) -> None:
    from squad.engine.chat_templates import call_prefix

    assert call_prefix("{{ '" + marker + "' }}") == prefix


def test_squad_plan_says_a_named_tool_choice_narrows_the_first_round(tmp_path, capsys, monkeypatch):
    """The one place squad offers other tool definitions than the agent's (I2) is shown by ``squad plan``."""
    import json as _json

    from cli_support import squad

    monkeypatch.setenv("COLUMNS", "200")
    path = tmp_path / "tc.yaml"
    path.write_text("name: tc\nagents:\n  lead: {budget: 1024, max_tokens: 32, agents: [helper], "
                    "tool_choice: ask_helper}\n  helper: {budget: 512, max_tokens: 32}\nmain: lead\nflow:\n"
                    "  - prompt: hi\n")
    code, out, err = squad(capsys, "plan", path, "--json")
    assert code == 0, err
    said = _json.loads(out)["tool_choice"]
    assert len(said) == 1 and said[0].startswith("agent 'lead' (tool_choice: ask_helper): the first round")
    code, out, err = squad(capsys, "plan", path)
    assert code == 0 and "offers only the tool ask_helper" in " ".join(out.split()), out

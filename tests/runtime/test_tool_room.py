"""Tool results are held to the room an agent has left (squad.runtime.toolroom): cut visibly or
failed by choice, never an AdmissionError. The model is the HTTP fake (FakeEngine: one word
is one token) behind squad's real client, which refuses any call over the agent's budget;
MCP tools come from squad's own test server (tests/mcp_server.py)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from squad.chat import ChatResult, ToolCall
from squad.errors import ToolResultTooLarge
from squad.events import ToolTruncated
from squad.events.summary import summarize
from squad.events.view import ViewState
from squad.mcp import MCPServer
from squad.runtime.agent import Agent
from squad.runtime.squad import Squad
from squad.runtime.toolroom import CUT_MARK
from squad.runtime.tools import tool
from squad.testing import FakeEngine, Reply, ScriptedEngine
from squad.testing.counting import count_tokens

pytestmark = pytest.mark.anyio
SERVER = Path(__file__).resolve().parents[1] / "mcp_server.py"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def words(n: int) -> str:
    return " ".join(f"w{i}" for i in range(n))


def text_of(chars: int) -> str:
    """About ``chars`` characters of words (the fake counts one token per word)."""
    return words(chars // 3 + 1)[:chars]


SIZE = {"n": 0}


@tool
def fetch(page: str) -> str:
    """Fetch a page.

    Args:
        page: its name
    """
    return text_of(SIZE["n"])


def call_then_answer(name: str, args: dict) -> list[Reply]:
    return [Reply(tool_calls=[{"name": name, "arguments": json.dumps(args)}]), Reply(content="done")]


def fits(fe: FakeEngine, budget: int, max_tokens: int) -> None:
    for body in fe.requests:
        assert count_tokens(body["messages"], body.get("tools")) + max_tokens <= budget


@pytest.mark.parametrize("budget", [512, 4096])
@pytest.mark.parametrize("chars", [40, 600, 3_000, 50_000])
async def test_a_function_tool_result_of_any_size_fits_or_is_cut_visibly(budget, chars):
    SIZE["n"] = chars
    events = []
    agent = Agent(name="reader", tools=["fetch"], budget=budget, max_tokens=32)
    async with FakeEngine(slots=1, n_ctx=8192) as fe:
        fe.script(*call_then_answer("fetch", {"page": "home"}))
        async with Squad([agent], engine=fe.info, tools=[fetch], on_event=events.append) as sq:
            result = await sq.run("read the home page")
        assert result.output == "done" and result.ok
        fits(fe, budget, 32)
        sent = next(m for m in fe.requests[1]["messages"] if m["role"] == "tool")["content"]
    cuts = [e for e in events if isinstance(e, ToolTruncated)]
    whole = text_of(chars)
    if sent == whole:
        assert not cuts  # fits: passed whole, no event
        return
    assert len(cuts) == 1 and cuts[0].tool == "fetch" and cuts[0].result_chars == len(whole)
    dropped = len(whole) - cuts[0].kept_chars
    assert sent.endswith(CUT_MARK.format(tool="fetch", dropped=dropped, total=len(whole)))
    assert whole.startswith(sent.rsplit("\n", 1)[0]) if cuts[0].kept_chars else True
    assert cuts[0].budget == budget and "fetch" in cuts[0].message and f"{len(whole):,} characters" in cuts[0].message
    assert any("tool 'fetch'" in n for n in result.main.notes)  # the run's notes (squad run prints them)


async def test_small_and_large_budgets_cut_differently_and_large_keeps_more():
    SIZE["n"] = 50_000
    kept = {}
    for budget in (512, 4096):
        events = []
        async with FakeEngine(slots=1, n_ctx=8192) as fe:
            fe.script(*call_then_answer("fetch", {"page": "p"}))
            agent = Agent(name="reader", tools=["fetch"], budget=budget, max_tokens=32)
            async with Squad([agent], engine=fe.info, tools=[fetch], on_event=events.append) as sq:
                await sq.run("read it")
        (cut,) = [e for e in events if isinstance(e, ToolTruncated)]
        assert cut.kept_tokens <= cut.room_tokens < budget
        kept[budget] = cut.kept_tokens
    assert kept[4096] > 5 * kept[512] > 0


async def test_an_auto_budget_is_bounded_by_the_engine_context():
    SIZE["n"] = 50_000
    events = []
    async with FakeEngine(slots=1, n_ctx=2048) as fe:
        fe.script(*call_then_answer("fetch", {"page": "p"}))
        async with Squad([Agent(name="reader", tools=["fetch"], max_tokens=32)], engine=fe.info, tools=[fetch],
                         on_event=events.append) as sq:
            result = await sq.run("read it")
        assert result.output == "done"
        fits(fe, 2048, 32)
    assert [e.budget for e in events if isinstance(e, ToolTruncated)] == [2048]


async def test_several_results_of_one_round_share_the_room():
    @tool
    def short() -> str:
        """A short answer."""
        return "just a few words here"

    SIZE["n"] = 20_000
    events = []
    async with FakeEngine(slots=1, n_ctx=8192) as fe:
        fe.script(Reply(tool_calls=[{"name": "fetch", "arguments": '{"page": "a"}'},
                                    {"name": "short", "arguments": "{}"},
                                    {"name": "fetch", "arguments": '{"page": "b"}'}]), Reply(content="done"))
        agent = Agent(name="reader", tools=["fetch", "short"], budget=1024, max_tokens=32)
        async with Squad([agent], engine=fe.info, tools=[fetch, short], on_event=events.append) as sq:
            await sq.run("read both")
        fits(fe, 1024, 32)
        results = [m["content"] for m in fe.requests[1]["messages"] if m["role"] == "tool"]
    assert results[1] == "just a few words here"  # the short one is whole
    cuts = [e for e in events if isinstance(e, ToolTruncated)]
    assert [c.tool for c in cuts] == ["fetch", "fetch"]
    assert abs(cuts[0].kept_tokens - cuts[1].kept_tokens) <= 2  # equal shares


async def test_later_rounds_keep_room_and_the_loop_closes_when_none_is_left():
    SIZE["n"] = 50_000
    events = []
    async with FakeEngine(slots=1, n_ctx=8192) as fe:
        fe.responder = lambda body: (Reply(tool_calls=[{"name": "fetch", "arguments": '{"page": "x"}'}])
                                     if body.get("tools") and body.get("tool_choice") != "none"
                                     else Reply(content="answer"))
        agent = Agent(name="reader", tools=["fetch"], budget=768, max_tokens=32)
        async with Squad([agent], engine=fe.info, tools=[fetch], on_event=events.append) as sq:
            result = await sq.run("keep reading")
        assert result.output == "answer" and result.ok
        fits(fe, 768, 32)
        assert fe.requests[-1].get("tool_choice") == "none"  # the last round offers none: the model answers
    cuts = [e for e in events if isinstance(e, ToolTruncated)]
    assert cuts and cuts[-1].tools_closed


async def test_fail_mode_fails_the_turn_with_a_fix_the_user_can_apply():
    SIZE["n"] = 50_000
    async with FakeEngine(slots=1, n_ctx=8192) as fe:
        fe.script(*call_then_answer("fetch", {"page": "p"}))
        agent = Agent(name="reader", tools=["fetch"], budget=512, max_tokens=32, tool_results="fail")
        async with Squad([agent], engine=fe.info, tools=[fetch]) as sq:
            with pytest.raises(ToolResultTooLarge) as caught:
                await sq.run("read it")
    assert caught.value.tool == "fetch" and caught.value.agent == "reader"
    message = str(caught.value)
    assert "tool 'fetch' returned 50,000 characters" in message and "tool_results: cut" in message
    assert "shorten the prompt" not in message


@pytest.mark.parametrize("trained", [1024, 8192])
async def test_fail_mode_never_suggests_a_budget_above_the_training_context(trained):
    SIZE["n"] = 7_000  # ~1,000 tokens: a budget of ~1,280 would hold it
    async with FakeEngine(slots=1, n_ctx=8192, n_ctx_train=trained) as fe:
        fe.script(*call_then_answer("fetch", {"page": "p"}))
        agent = Agent(name="reader", tools=["fetch"], budget=1024, max_tokens=32, tool_results="fail")
        async with Squad([agent], engine=fe.info, tools=[fetch]) as sq:
            with pytest.raises(ToolResultTooLarge) as caught:
                await sq.run("read it")
    message = str(caught.value)
    assert "return less" in message
    if trained == 1024:
        assert "raise agents.reader.budget" not in message
    else:
        budget = int(re.search(r"raise agents\.reader\.budget to ([\d,]+\d)", message).group(1).replace(",", ""))
        assert 1024 < budget <= trained


@pytest.mark.parametrize("chars", [30, 3_000, 50_000])
async def test_an_mcp_tool_result_is_cut_the_same_way(chars):
    events = []
    server = MCPServer(name="t", command="python", args=(str(SERVER),))
    async with FakeEngine(slots=1, n_ctx=8192) as fe:
        fe.script(*call_then_answer("big", {"chars": chars}))
        agent = Agent(name="reader", tools=["t.big"], budget=512, max_tokens=32)
        async with Squad([agent], engine=fe.info, mcp_servers=[server], on_event=events.append) as sq:
            result = await sq.run("get it")
        assert result.output == "done"
        fits(fe, 512, 32)
        sent = next(m for m in fe.requests[1]["messages"] if m["role"] == "tool")["content"]
    cuts = [e for e in events if isinstance(e, ToolTruncated)]
    if chars <= 30:
        assert not cuts and len(sent) == chars
    else:
        assert [c.tool for c in cuts] == ["big"] and cuts[0].result_chars == chars
        assert "[squad cut this result of tool 'big'" in sent


async def test_the_view_and_the_summary_say_which_tool_was_cut():
    SIZE["n"] = 3_000
    events = []
    async with FakeEngine(slots=1, n_ctx=8192) as fe:
        fe.script(*call_then_answer("fetch", {"page": "p"}))
        agent = Agent(name="reader", tools=["fetch"], budget=512, max_tokens=32)
        async with Squad([agent], engine=fe.info, tools=[fetch], on_event=events.append) as sq:
            await sq.run("read it")
    from io import StringIO

    from rich.console import Console

    from squad.events.view import LiveView

    out = StringIO()
    with LiveView(True, console=Console(file=out, width=300), live=False) as view:
        for e in events:
            view(e)
    assert "warning: agent 'reader': the result of tool 'fetch' (3,000 characters" in out.getvalue()
    notes = [n for a in summarize(events).agents.values() for n in a.notes]
    assert any("tool 'fetch'" in n for n in notes)
    assert ViewState  # the state applies the event without error (it went through view above)


async def test_scripted_engine_rounds_never_exceed_the_budget():
    """The same rule on the in-process fake: every request it gets fits the budget."""
    SIZE["n"] = 10_000
    engine = ScriptedEngine(ChatResult(content="", tool_calls=[ToolCall("a", "fetch", '{"page": "x"}')],
                                       finish_reason="tool_calls"),
                            ChatResult(content="", tool_calls=[ToolCall("b", "fetch", '{"page": "y"}')],
                                       finish_reason="tool_calls"), "ok")
    async with Squad([Agent(name="r", tools=["fetch"], budget=600, max_tokens=20)], engine=engine,
                     tools=[fetch]) as sq:
        result = await sq.run("go")
    assert result.output == "ok"
    for req in engine.requests:
        assert count_tokens(req.messages, req.tools) + req.max_tokens <= 600


# --- auto budgets plan every tool round (squad.recipes.budgets) --------------------------------


def clock_recipe(tmp_path: Path, *, extra: str = "", max_tokens: int = 96) -> Path:
    """The field case's shape: an MCP agent in two steps, the second using the first's output."""
    path = tmp_path / "clock.yaml"
    path.write_text(
        "name: clock\n"
        f"mcp:\n  t:\n    command: python\n    args: [{json.dumps(str(SERVER))}]\n"
        "agents:\n  clock:\n    instructions: You answer with your tools.\n"
        f"    max_tokens: {max_tokens}\n    tools: [t.echo, t.big]\n{extra}"
        "main: clock\nflow:\n"
        "  - id: now\n    agent: clock\n    prompt: Echo the word tick.\n"
        "  - id: say\n    agent: clock\n    prompt: 'Say this in one sentence: {{ steps.now.output }}'\n")
    return path


async def plan_with_mcp(path: Path):
    from squad.recipes import load_recipe, recipe_mcp

    recipe = load_recipe(path)
    async with recipe_mcp(recipe):
        pass
    return recipe


async def test_an_auto_budget_holds_every_tool_round_with_the_tool_schemas(default_model_path, tmp_path):
    from squad.recipes.budgets import TOOL_RESULT_TOKENS

    recipe = await plan_with_mcp(clock_recipe(tmp_path))
    rows = [r for r in recipe.budgets if r.agent == "clock"]
    assert {r.tool_rounds for r in rows} == {4}
    for r in rows:
        assert r.tool_tokens == 4 * (96 + TOOL_RESULT_TOKENS)
        assert r.budget >= r.prompt + 96 + r.tool_tokens  # the whole loop, not only the first round
    assert recipe.agents["clock"].fixed_budget == max(r.budget for r in rows)
    assert not [w for w in recipe.warnings if "tool round" in str(w)]


async def test_max_tool_rounds_plans_fewer_rounds(default_model_path, tmp_path):
    full = await plan_with_mcp(clock_recipe(tmp_path))
    one = await plan_with_mcp(clock_recipe(tmp_path, extra="    max_tool_rounds: 1\n"))
    assert {r.tool_rounds for r in one.budgets} == {1}
    assert one.agents["clock"].fixed_budget < full.agents["clock"].fixed_budget


async def test_a_fixed_budget_that_cannot_hold_the_rounds_is_warned_with_fixes_that_apply(default_model_path,
                                                                                           tmp_path):
    recipe = await plan_with_mcp(clock_recipe(tmp_path, extra="    budget: 1024\n"))
    warned = [str(w) for w in recipe.warnings if "tool round" in str(w)]
    assert len(warned) == 2  # one per step, said once although planned twice (before and with MCP)
    assert "clock.yaml:" in warned[0] and "room is left for" in warned[0]
    budget = int(re.search(r"raise agents\.clock\.budget to ([\d,]+\d)", warned[0]).group(1).replace(",", ""))
    assert 1024 < budget <= 8192  # the model's training context
    assert "agents.clock.max_tool_rounds:" in warned[0]


async def test_rounds_above_the_training_context_warn_without_an_impossible_budget(default_model_path, tmp_path):
    recipe = await plan_with_mcp(clock_recipe(tmp_path, max_tokens=1800))
    warned = [str(w) for w in recipe.warnings if "tool round" in str(w)]
    assert warned and all("training context of 8,192" in w for w in warned)
    assert not any("raise agents.clock.budget" in w for w in warned)
    assert all("max_tool_rounds: " in w for w in warned)
    assert recipe.agents["clock"].fixed_budget == 8192


def test_plan_and_validate_with_check_mcp_show_the_rounds_and_warn(default_model_path, tmp_path):
    from typer.testing import CliRunner

    from squad.cli import app

    path = clock_recipe(tmp_path, extra="    budget: 1024\n")
    runner = CliRunner()
    validate = runner.invoke(app, ["recipes", "validate", "--check-mcp", str(path)])
    assert validate.exit_code == 0, validate.output
    assert "tool round(s) need" in validate.output and "OK" in validate.output
    plan = runner.invoke(app, ["plan", "--check-mcp", str(path), "--json"])
    assert plan.exit_code == 0, plan.output
    data = json.loads(plan.stdout[plan.stdout.index("{"):])
    assert {s["tool_rounds"] for s in data["steps"]} == {4}
    assert any("tool round(s) need" in w for w in data["recipe_warnings"])
    shown = runner.invoke(app, ["plan", "--check-mcp", str(clock_recipe(tmp_path))])
    assert "tool rounds" in shown.output and "4 x 352" in shown.output


def test_binary_mcp_content_is_described_not_dumped():
    import base64

    import mcp.types as t

    from squad.mcp import result_text

    blob = base64.b64encode(b"x" * 1000).decode()
    result = t.CallToolResult(content=[
        t.TextContent(type="text", text="see attached"),
        t.EmbeddedResource(type="resource", resource=t.BlobResourceContents(
            uri="file:///a.pdf", mime_type="application/pdf", blob=blob)),
        t.ImageContent(type="image", data=base64.b64encode(b"y" * 77).decode(), mime_type="image/png"),
        t.ResourceLink(type="resource_link", name="b", uri="file:///b.txt", mime_type="text/plain", size=12)])
    assert result_text(result).splitlines() == [
        "see attached", "[resource: file:///a.pdf, application/pdf, 1,000 bytes, binary, not shown]",
        "[image: image/png, 77 bytes, not shown]", "[resource link: file:///b.txt (b), text/plain, 12 bytes]"]
    assert blob not in result_text(result)


async def test_a_result_that_fits_only_without_another_round_is_kept_whole_and_the_tools_close():
    from squad.runtime.toolroom import fit_results

    chat = ScriptedEngine()
    messages = [{"role": "user", "content": "go"}, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "a", "type": "function", "function": {"name": "fetch", "arguments": "{}"}}]}]
    frame = count_tokens([*messages, {"role": "tool", "tool_call_id": "a", "content": ""}])
    text = words(100)
    limit = 32 + frame + 4 + 100  # exactly room for the result when no further round is offered
    fitted = await fit_results(chat, messages, [("a", "fetch", text)], limit=limit, max_tokens=32,
                               tools=[fetch.spec()], agent="r")
    assert fitted.texts == [text] and not fitted.cuts and not fitted.tools_open
    roomy = await fit_results(chat, messages, [("a", "fetch", text)], limit=limit + 500, max_tokens=32,
                              tools=[fetch.spec()], agent="r")
    assert roomy.texts == [text] and roomy.tools_open  # room for another round: tools stay offered
    cut = await fit_results(chat, messages, [("a", "fetch", words(2000))], limit=limit + 500, max_tokens=32,
                            tools=[fetch.spec()], agent="r")
    assert cut.cuts and cut.tools_open  # cut, leaving room for one more round
    assert count_tokens([*messages, {"role": "tool", "tool_call_id": "a", "content": cut.texts[0]}],
                        [fetch.spec()]) + 32 + 32 + 48 <= limit + 500


@pytest.mark.parametrize("trained", [512, 8192])
async def test_an_over_budget_call_never_suggests_a_budget_above_the_training_context(trained):
    from squad.errors import AdmissionError

    async with FakeEngine(slots=1, n_ctx=8192, n_ctx_train=trained) as fe:
        async with Squad([Agent(name="a", budget=400, max_tokens=32)], engine=fe.info) as sq:
            with pytest.raises(AdmissionError) as caught:
                await sq.run(words(600))
    assert ("raise its budget to" in str(caught.value)) is (trained == 8192)

"""Field case F11 and its kind: no non-answer (truncated, empty, failed, cancelled) reaches a
later step, a lead or a user unmarked; each shows as itself in the table, the view and the trace.

Fake-engine tests prove every kind through a recipe under every ``non_answers`` setting;
the real engine proves that a call cut by ``max_tokens`` is ``truncated`` in the result and
the trace (``test_truncated_on_the_real_engine``)."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import anyio
import pytest
from rich.console import Console

from launch_support import THREADS
from squad.chat import ChatResult, Usage
from squad.errors import AgentRunError, IncompleteAnswer, UserError
from squad.events import AgentFinished, StepWarning
from squad.events.summary import summarize
from squad.events.view import LiveView, ViewState
from squad.recipes import load_recipe, run_recipe, step_table
from squad.runtime.agent import Agent
from squad.runtime.outcome import Outcome, marked, outcome_of, worst
from squad.runtime.results import AgentResult
from squad.runtime.squad import Squad
from squad.testing import FakeEngine, Reply, ScriptedEngine

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


# --- the one rule -------------------------------------------------------------------------------


@pytest.mark.parametrize("finish, text, outcome", [
    ("stop", "1. a\n2. b", Outcome.OK),
    ("length", "1. a\n2. b", Outcome.TRUNCATED),
    ("length", "", Outcome.TRUNCATED),
    ("stop", "  \n", Outcome.EMPTY),
    (None, "", Outcome.EMPTY),
])
def test_outcome_of_a_finished_call(finish, text, outcome):
    assert outcome_of(finish, text) is outcome


def test_marks_are_visible_and_an_answer_is_unchanged():
    assert marked(Outcome.OK, "done.") == "done."
    assert marked(Outcome.TRUNCATED, "1. a\n2. b\n") == "1. a\n2. b [truncated at max_tokens]"
    assert marked(Outcome.EMPTY, "") == "[empty answer]"
    assert marked(Outcome.FAILED, "", "ContextExceeded: pool") == "[failed: ContextExceeded: pool]"
    assert marked(Outcome.CANCELLED, "", "cancelled because 'x' failed") == "[cancelled: cancelled because 'x' failed]"
    assert worst(["ok", "empty", "truncated"]) is Outcome.TRUNCATED and worst([]) is Outcome.OK
    assert worst(["truncated", "failed", "cancelled"]) is Outcome.FAILED


def test_agent_result_states():
    cut = AgentResult(agent="w", output="1. a", finish_reason="length", max_tokens=12)
    assert cut.outcome == "truncated" and cut.truncated and cut.ok  # no error, but not a whole answer
    assert "truncated at max_tokens 12" in cut.summary() and ": ok;" not in cut.summary()
    assert cut.marked_output == "1. a [truncated at max_tokens]"
    assert AgentResult(agent="w", output="", finish_reason="stop").outcome is Outcome.EMPTY
    assert AgentResult(agent="w", output="fine", finish_reason="stop").outcome is Outcome.OK
    failed = AgentResult(agent="w", error=AgentRunError("boom"))
    assert failed.outcome is Outcome.FAILED and failed.marked_output == "[failed: boom]"
    made = AgentResult(agent="w", output="1. a", finish_reason="length",
                       error=IncompleteAnswer("cut", outcome="truncated"))
    assert made.outcome is Outcome.TRUNCATED and not made.ok


# --- recipes: a later step consuming each non-answer under each setting -------------------------

TWO_STEPS = """\
name: f11
agents:
  writer: {instructions: "You are writer.", budget: 1024, max_tokens: 12}
  editor: {instructions: "You are editor.", budget: 1024, max_tokens: 64}
main: editor
SETTING
flow:
  - id: draft
    agent: writer
    prompt: "Write a ten-step numbered list."
  - id: edit
    agent: editor
    prompt: "Shorten: {{ steps.draft.output }}"
"""

CUT = ChatResult(content="1. Open the box.\n2. Take out", finish_reason="length", usage=Usage(10, 12))
REPLIES = {"truncated": CUT, "empty": ChatResult(content="", finish_reason="stop", usage=Usage(10, 0))}


def who(request) -> str:
    return request.messages[0]["content"].removeprefix("You are ").rstrip(".")


def scripted(writer_reply) -> ScriptedEngine:
    def respond(request):
        return writer_reply if who(request) == "writer" else "edited"
    return ScriptedEngine(responder=respond, slots=2, n_ctx=4096)


def recipe_with(tmp_path: Path, setting: str, text: str = TWO_STEPS):
    path = tmp_path / "r.yaml"
    path.write_text(text.replace("SETTING", setting), encoding="utf-8")
    return load_recipe(path)


def edit_prompt(engine: ScriptedEngine) -> str | None:
    return next((r.messages[-1]["content"] for r in engine.requests if who(r) == "editor"), None)


@pytest.mark.parametrize("kind", ["truncated", "empty"])
@pytest.mark.parametrize("where", ["default", "recipe", "step"])
async def test_mark_is_the_default_and_the_later_step_sees_it(tmp_path, kind, where):
    setting = {"default": "", "recipe": f"non_answers: {{{kind}: mark}}"}.get(where, "")
    text = TWO_STEPS if where != "step" else TWO_STEPS.replace(
        "    agent: writer\n", f"    agent: writer\n    non_answers: {{{kind}: mark}}\n")
    recipe = recipe_with(tmp_path, setting, text)
    engine, events = scripted(REPLIES[kind]), []
    run = await run_recipe(recipe, engine=engine, on_event=events.append)
    mark = "[truncated at max_tokens]" if kind == "truncated" else "[empty answer]"
    assert edit_prompt(engine).endswith(mark)
    assert run.steps["draft"]["outcome"] == kind and run.steps["draft"]["output"].endswith(mark)
    assert not run.errors and run.output == "edited"
    [(sid, warning)] = run.warnings
    assert sid == "draft" and "step 'draft' (agent 'writer')" in warning
    if kind == "truncated":
        assert "raise max_tokens of agent 'writer' (now 12)" in warning
    assert [e.step for e in events if isinstance(e, StepWarning)] == ["draft"]
    rows = {row["step"]: row for row in step_table(run)}
    assert rows["draft"]["state"] == kind and rows["draft"]["outcome"] == kind and rows["edit"]["state"] == "ok"


@pytest.mark.parametrize("kind", ["truncated", "empty"])
async def test_accept_passes_the_text_as_it_is_without_a_warning(tmp_path, kind):
    recipe = recipe_with(tmp_path, f"non_answers: {{{kind}: accept}}")
    engine = scripted(REPLIES[kind])
    run = await run_recipe(recipe, engine=engine)
    assert edit_prompt(engine) == "Shorten: " + REPLIES[kind].content
    assert not run.warnings and not run.errors
    assert {row["step"]: row["state"] for row in step_table(run)}["draft"] == kind  # still shown as what it is


@pytest.mark.parametrize("kind", ["truncated", "empty"])
async def test_fail_stops_the_run_before_the_later_step(tmp_path, kind):
    recipe = recipe_with(tmp_path, f"non_answers: {{{kind}: fail}}")
    engine = scripted(REPLIES[kind])
    with pytest.raises(IncompleteAnswer, match="agent 'writer'") as info:
        await run_recipe(recipe, engine=engine)
    assert info.value.outcome == kind
    assert edit_prompt(engine) is None  # the editor never worked from the fragment


async def test_a_step_setting_overrides_the_recipes(tmp_path):
    text = TWO_STEPS.replace("    agent: writer\n", "    agent: writer\n    non_answers: {truncated: accept}\n")
    recipe = recipe_with(tmp_path, "non_answers: {truncated: fail}", text)
    engine = scripted(CUT)
    run = await run_recipe(recipe, engine=engine)
    assert edit_prompt(engine) == "Shorten: " + CUT.content and not run.errors


@pytest.mark.parametrize("setting, where, field, message", [
    ("non_answers: {truncated: maybe}", "recipe", "non_answers.truncated",
     "use 'accept', 'mark' or 'fail', got 'maybe'"),
    ("non_answers: {truncted: fail}", "step", "flow[0].non_answers.truncted",
     "unknown key 'truncted'; did you mean 'truncated'?"),
    ("non_answers: {failed: mark}", "step", "flow[0].non_answers.failed", "unknown key 'failed'"),
])
def test_a_bad_setting_is_a_file_line_error(tmp_path, setting, where, field, message):
    from squad.errors import RecipeError

    text = TWO_STEPS.replace("SETTING", setting) if where == "recipe" else TWO_STEPS.replace("SETTING", "").replace(
        "    agent: writer\n", f"    agent: writer\n    {setting}\n")
    path = tmp_path / "bad.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(RecipeError) as info:
        load_recipe(path)
    assert info.value.field == field and message in info.value.problem and info.value.line is not None


BLOCK = """\
name: blocks
agents:
  writer: {instructions: "You are writer.", budget: 1024, max_tokens: 12}
  other: {instructions: "You are other.", budget: 1024, max_tokens: 64}
  editor: {instructions: "You are editor.", budget: 1024, max_tokens: 64}
main: editor
flow:
  - id: both
    policy: POLICY
    SETTING
    parallel:
      - {id: draft, agent: writer, prompt: "Write a list."}
      - {id: notes, agent: other, prompt: "Write notes."}
  - id: edit
    agent: editor
    prompt: "Merge: {{ steps.FIELD.output }}"
"""


def block(tmp_path: Path, *, policy: str = "collect", setting: str = "", field: str = "both"):
    text = BLOCK.replace("POLICY", policy).replace("FIELD", field)
    text = text.replace("    SETTING\n", f"    {setting}\n" if setting else "")
    return recipe_with(tmp_path, "", text)


async def test_a_failed_step_shows_as_its_mark_in_the_block_output(tmp_path):
    engine = scripted(AgentRunError("the engine answered HTTP 500: boom"))
    run = await run_recipe(block(tmp_path), engine=engine)
    assert run.steps["both"]["outputs"] == ["[failed: the engine answered HTTP 500: boom]", "edited"]
    assert edit_prompt(engine) == "Merge: [failed: the engine answered HTTP 500: boom]\n\nedited"
    assert [sid for sid, _ in run.errors] == ["draft"]  # squad run exits 1
    assert {row["step"]: row["state"] for row in step_table(run)}["draft"].startswith("failed: ")


async def test_a_failed_step_used_directly_fails_the_later_step(tmp_path):
    engine = scripted(AgentRunError("boom"))
    with pytest.raises(AgentRunError, match="step 'edit' uses the output of step 'draft', which failed: boom"):
        await run_recipe(block(tmp_path, field="draft"), engine=engine)
    assert edit_prompt(engine) is None


async def test_truncated_in_a_block_is_marked_there_too(tmp_path):
    engine = scripted(CUT)
    run = await run_recipe(block(tmp_path), engine=engine)
    assert run.steps["both"]["outputs"][0].endswith("Take out [truncated at max_tokens]")
    assert run.steps["both"]["outcome"] == "truncated"


async def test_fail_in_a_fail_fast_block_cancels_the_siblings(tmp_path):
    """``fail`` makes a truncated answer a failure like any other: under fail-fast its siblings
    are cancelled with the reason (the block policies decide, not a second mechanism)."""
    events: list = []
    engine = ScriptedEngine(responder=lambda r: CUT if who(r) == "writer" else "edited", slots=2, n_ctx=4096,
                            delay=lambda r: 0.0 if who(r) == "writer" else 5.0)
    recipe = block(tmp_path, policy="fail-fast", setting="non_answers: {truncated: fail}")
    with anyio.fail_after(4):  # the sibling's 5 s call is cancelled, not waited for
        with pytest.raises(IncompleteAnswer, match="stopped at max_tokens \\(12\\)"):
            await run_recipe(recipe, engine=engine, on_event=events.append)
    cancelled = [e for e in events if e.kind == "agent.cancelled"]
    assert [(e.agent, e.reason) for e in cancelled] == [("other", "cancelled because 'writer' failed")]
    assert [e.outcome for e in events if isinstance(e, AgentFinished)] == ["truncated"]  # the trace says why


MAP = """\
name: fan
params:
  xs: {type: list, default: [x0, x1, x2]}
agents:
  summarizer: {instructions: "You are summarizer.", budget: 512, max_tokens: 8}
  writer: {instructions: "You are writer.", budget: 1024, max_tokens: 64}
main: writer
SETTING
flow:
  - id: summaries
    map: params.xs
    agent: summarizer
    prompt: "Summarize {{ item }}"
  - id: combine
    agent: writer
    prompt: "Facts:\\n{{ steps.summaries.output }}"
"""


def map_engine() -> ScriptedEngine:
    def respond(request):
        if who(request) == "writer":
            return "combined"
        item = request.messages[-1]["content"].split()[-1]
        if item == "x1":
            return ChatResult(content=f"about {item} and", finish_reason="length", usage=Usage(5, 8))
        if item == "x2":
            return AgentRunError("boom")
        return f"about {item}."
    return ScriptedEngine(responder=respond, slots=3, n_ctx=4096)


async def test_map_items_are_marked_and_named_agent_i(tmp_path):
    engine, events = map_engine(), []
    run = await run_recipe(recipe_with(tmp_path, "", MAP), engine=engine, on_event=events.append)
    assert run.steps["summaries"]["outputs"] == ["about x0.", "about x1 and [truncated at max_tokens]",
                                                 "[failed: boom]"]
    writer_prompt = [r.messages[-1]["content"] for r in engine.requests if who(r) == "writer"][0]
    assert "about x1 and [truncated at max_tokens]" in writer_prompt and "[failed: boom]" in writer_prompt
    [(sid, warning)] = run.warnings
    assert sid == "summaries" and "(agent 'summarizer[1]')" in warning and "(now 8)" in warning
    states = {row["agent"]: row["state"] for row in step_table(run) if row["step"] == "summaries"}
    assert states == {"summarizer[0]": "ok", "summarizer[1]": "truncated", "summarizer[2]": "failed: boom"}
    assert [sid for sid, _ in run.errors] == ["summaries[2]"]


async def test_map_items_under_fail(tmp_path):
    engine = map_engine()
    run = await run_recipe(recipe_with(tmp_path, "non_answers: {truncated: fail}", MAP), engine=engine)
    assert [sid for sid, _ in run.errors] == ["summaries[1]", "summaries[2]"]
    assert run.steps["summaries"]["outputs"][1] == "about x1 and [truncated at max_tokens]"  # a failure, shown
    assert {row["agent"]: row["state"] for row in step_table(run)}["summarizer[1]"] == "truncated (failed)"


# --- the Python API: results and hand-backs -----------------------------------------------------


def lead_and_subs() -> list[Agent]:
    return [Agent(name="lead", instructions="You are lead.", agents=["a", "b", "c"], budget=2048, max_tokens=32),
            Agent(name="a", instructions="You are a.", budget=512, max_tokens=8),
            Agent(name="b", instructions="You are b.", budget=512, max_tokens=8),
            Agent(name="c", instructions="You are c.", budget=512, max_tokens=8)]


async def test_hand_back_marks_every_non_answer_and_the_result_says_truncated():
    replies = {"a": ChatResult(content="half an", finish_reason="length", usage=Usage(5, 8)),
               "b": ChatResult(content="", finish_reason="stop", usage=Usage(5, 0)),
               "c": AgentRunError("boom"),
               "lead": ChatResult(content="merged but", finish_reason="length", usage=Usage(50, 32))}
    engine = ScriptedEngine(responder=lambda r: replies[who(r)], slots=4, n_ctx=8192)
    async with Squad(lead_and_subs(), engine=engine) as sq:
        result = await sq.run("@a @b @c go")
    handed = [r.messages[-1]["content"] for r in engine.requests if who(r) == "lead"][0]
    assert "[@a]\nhalf an [truncated at max_tokens]" in handed
    assert "[@b]\n[empty answer]" in handed
    assert "[@c]\n[failed: boom]" in handed
    assert result.outcome == "truncated" and result.truncated and result.output == "merged but"
    assert {s.agent: s.outcome.value for s in result.subs} == {"a": "truncated", "b": "empty", "c": "failed"}


async def test_ask_tool_results_are_marked():
    agents = [Agent(name="lead", instructions="You are lead.", agents=["a"], sub_agent_tools=True, budget=2048),
              Agent(name="a", instructions="You are a.", budget=512, max_tokens=8)]
    from squad.chat import ToolCall

    script = [ChatResult(content="", tool_calls=[ToolCall("t1", "ask_a", '{"task": "x"}')], finish_reason="tool_calls"),
              ChatResult(content="half an", finish_reason="length"), "done"]
    engine = ScriptedEngine(*script, slots=2, n_ctx=8192)
    async with Squad(agents, engine=engine) as sq:
        result = await sq.run_agent("lead", "go")
    tool_message = [m for m in engine.requests[-1].messages if m["role"] == "tool"][0]
    assert tool_message["content"] == "half an [truncated at max_tokens]"
    assert result.outcome is Outcome.OK


async def test_fail_on_in_python():
    engine = ScriptedEngine(responder=lambda r: CUT, slots=2, n_ctx=4096)
    agents = [Agent(name="writer", instructions="You are writer.", budget=1024, max_tokens=12)]
    async with Squad(agents, engine=engine) as sq:
        assert (await sq.run_agent("writer", "x")).truncated
        with pytest.raises(IncompleteAnswer, match="agent 'writer' stopped at max_tokens \\(12\\)"):
            await sq.run_agent("writer", "x", fail_on=["truncated"])
        results = await sq.map("writer", ["x", "y"], fail_on={Outcome.TRUNCATED})
        assert all(isinstance(r.error, IncompleteAnswer) and r.outcome == "truncated" for r in results)
        with pytest.raises(UserError, match="fail_on"):
            await sq.run_agent("writer", "x", fail_on=["failed"])


# --- rendering: the live view, the trace and squad trace show ------------------------------------


async def run_with_events(tmp_path: Path) -> tuple[list, str]:
    out = io.StringIO()
    events: list = []
    view = LiveView(console=Console(file=out, width=300), live=False)
    with view:
        await run_recipe(recipe_with(tmp_path, "", MAP), engine=map_engine(), on_event=[events.append, view])
    return events, out.getvalue()


async def test_view_shows_truncated_and_prints_the_warning(tmp_path):
    events, log = await run_with_events(tmp_path)
    state = ViewState()
    for e in events:
        state.apply(e)
    rows = {name: row for name, row in state.agents.items()}
    assert rows["summarizer[1]"].state == "truncated"
    assert state.describe(rows["summarizer[1]"], state.last).startswith("truncated at max_tokens 8 after")
    assert rows["summarizer[0]"].state == "done" and rows["summarizer[2]"].state == "failed"
    assert "warning: step 'summaries' (agent 'summarizer[1]'): the answer stopped at max_tokens (8)" in log
    assert "summarizer[1]  truncated at max_tokens 8" in log


async def test_trace_and_trace_show_say_truncated(tmp_path):
    from typer.testing import CliRunner

    from squad.cli import app
    from squad.events.jsonl import JsonlTrace, load_trace

    path = tmp_path / "run.jsonl"
    with JsonlTrace(path) as trace:
        await run_recipe(recipe_with(tmp_path, "", MAP), engine=map_engine(), on_event=trace)
    records = [json.loads(line) for line in path.read_text().splitlines()]
    finished = {r["data"]["outcome"] for r in records if r["kind"] == "agent.finished"}
    assert finished == {"ok", "truncated"}  # the events carry it
    summary = summarize(load_trace(path))
    assert {n: a.status for n, a in summary.agents.items()} == {
        "summarizer[0]": "done", "summarizer[1]": "truncated", "summarizer[2]": "failed", "writer": "done"}
    assert len(summary.warnings) == 1 and "summarizer[1]" in summary.warnings[0]
    shown = CliRunner().invoke(app, ["trace", "show", str(path)], terminal_width=300)
    assert shown.exit_code == 0, shown.output
    line = next(ln for ln in shown.output.splitlines() if ln.lstrip().startswith("summarizer[1]"))
    assert "truncated" in line and " done " not in line
    assert "warning step 'summaries' (agent 'summarizer[1]')" in shown.output


async def test_squad_run_table_and_json_on_the_fake_engine(tmp_path):
    """F11 end to end: ``squad run`` against an engine whose writer is cut at max_tokens."""
    recipe = tmp_path / "r.yaml"
    recipe.write_text(TWO_STEPS.replace("SETTING", ""), encoding="utf-8")
    env_cmd = [sys.executable, "-m", "squad", "run", str(recipe), "--trace", str(tmp_path / "t.jsonl")]
    async with FakeEngine(slots=2, n_ctx=4096) as fe:
        fe.responder = lambda body: (Reply(content="1. Open the box. 2. Take out the parts. " * 4)
                                     if "writer" in body["messages"][0]["content"] else Reply(content="edited"))
        shown = await anyio.run_process([*env_cmd, "--url", fe.base_url], check=False)
        as_json = await anyio.run_process([*env_cmd, "--url", fe.base_url, "--json"], check=False)
    err = shown.stderr.decode()
    assert shown.returncode == 0, err
    assert shown.stdout.decode().strip() == "edited"
    assert "warning: step 'draft' (agent 'writer'): the answer stopped at max_tokens (12)" in err
    row = next(ln for ln in err.splitlines() if ln.lstrip().startswith("draft"))
    assert "truncated" in row and " ok " not in row
    data = json.loads(as_json.stdout)
    assert data["steps"]["draft"]["outcome"] == "truncated"
    assert data["steps"]["draft"]["output"].endswith("[truncated at max_tokens]")
    assert [a["state"] for a in data["agents"]] == ["truncated", "ok"]
    assert data["warnings"][0]["step"] == "draft"


# --- the real engine ------------------------------------------------------------------------------


@pytest.mark.engine
async def test_truncated_on_the_real_engine(tmp_path, llama_server_path, default_model_path):
    """A real llama-server call cut by max_tokens ends with finish_reason length: the result,
    the agent.finished event, the trace summary and the next step all say truncated."""
    from squad.engine.session import EngineSpec
    from squad.events.jsonl import JsonlTrace, load_trace

    text = TWO_STEPS.replace("SETTING", "").replace("max_tokens: 12", "max_tokens: 8, sampling: {temperature: 0}")
    text = text.replace("max_tokens: 64", "max_tokens: 8")
    recipe = recipe_with(tmp_path, "", text)
    path = tmp_path / "run.jsonl"
    with JsonlTrace(path) as trace:
        run = await run_recipe(recipe, engine=EngineSpec(model=default_model_path, binary=llama_server_path,
                                                         threads=THREADS, slots=1), on_event=trace)
    draft = next(r for sid, r in run.results if sid == "draft")
    assert draft.truncated and draft.finish_reason == "length" and draft.usage.completion_tokens == 8
    assert run.steps["draft"]["output"].endswith("[truncated at max_tokens]")
    assert {row["step"]: row["state"] for row in step_table(run)}["draft"] == "truncated"
    summary = summarize(load_trace(path))
    assert summary.agents["writer"].status == "truncated"
    assert any(c.finish_reason == "length" for c in summary.calls if c.agent == "writer")
    assert any("step 'draft' (agent 'writer')" in w for w in summary.warnings)

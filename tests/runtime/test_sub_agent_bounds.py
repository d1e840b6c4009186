"""Sub-agent tool calls (ask_<name>) have a per-run bound on depth and on total calls.

Without one, calls multiply: with 4 tool rounds per turn a 3-level chain made 41 requests.
When a bound is hit the tool refuses with a clear result to the model, the run emits
``tool.limited`` (the live view prints it as a warning, ``squad trace show`` lists it) and the
result says so (``RunResult.notes``, ``RecipeRun.notes``). A normal chain is unaffected.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rich.console import Console

from squad import Agent, Squad
from squad.chat import ChatResult, ToolCall
from squad.errors import RecipeError, UserError
from squad.events import ToolLimited
from squad.events.jsonl import JsonlTrace, load_trace
from squad.events.summary import summarize
from squad.events.view import LiveView
from squad.recipes import load_recipe, run_recipe
from squad.runtime.agent import MAX_SUB_CALLS, MAX_SUB_DEPTH
from squad.testing import ScriptedEngine

pytestmark = pytest.mark.anyio


def ask(sub: str, *subs: str) -> ChatResult:
    """One model turn asking ``sub`` (and ``subs``) at once."""
    calls = [ToolCall(id=f"t{i}", name=f"ask_{name}", arguments=json.dumps({"task": "dig deeper"}))
             for i, name in enumerate((sub, *subs))]
    return ChatResult(content="", tool_calls=calls)


def chain(*names: str, **lead: object) -> list[Agent]:
    """names[0] -> names[1] -> ... each may call the next as a tool."""
    agents = []
    for i, name in enumerate(names):
        nxt = names[i + 1:i + 2]
        extra = lead if i == 0 else {}
        agents.append(Agent(name=name, instructions=f"You are {name}.", max_tokens=16, agents=nxt, **extra))
    return agents


def greedy(*names: str):
    """Every agent with a sub-agent asks it whenever tools are offered; the last one answers."""
    following = dict(zip(names, names[1:]))

    def respond(req):
        if req.tools and req.tool_choice != "none" and req.agent in following:
            return ask(following[req.agent])
        tools = [m for m in req.messages if m["role"] == "tool"]
        return f"{req.agent} answers after {len(tools)} tool results"

    return respond


def tool_results(request) -> list[str]:
    return [m["content"] for m in request.messages if m["role"] == "tool"]


async def test_defaults_are_stated():
    assert (MAX_SUB_DEPTH, MAX_SUB_CALLS) == (2, 8)
    async with Squad(chain("a"), engine=ScriptedEngine()) as sq:
        assert (sq.max_sub_depth, sq.max_sub_calls) == (2, 8)


async def test_a_normal_two_level_chain_is_unaffected():
    replies = iter([ask("helper"), ask("helper"), ChatResult(content="done")])
    scripted = ScriptedEngine(responder=lambda req: next(replies) if req.agent == "lead" else "42")
    events = []
    async with Squad(chain("lead", "helper"), engine=scripted, on_event=events.append) as sq:
        result = await sq.run("what is x?")
    assert result.output == "done" and [s.agent for s in result.subs] == ["helper", "helper"]
    assert result.notes == [] and not any(isinstance(e, ToolLimited) for e in events)
    assert all("refused" not in t for r in scripted.requests for t in tool_results(r))


async def test_the_three_level_chain_that_made_41_requests_is_bounded_and_says_so():
    scripted = ScriptedEngine(responder=greedy("a", "b", "c"))
    events = []
    async with Squad(chain("a", "b", "c"), engine=scripted, on_event=events.append) as sq:
        result = await sq.run("go")
    sub_calls = [r for r in scripted.requests if r.agent != "a" and r.messages[-1]["role"] == "user"]
    assert len(sub_calls) == MAX_SUB_CALLS  # conversations started by ask_ tools
    assert len(scripted.requests) < 41
    refused = [t for r in scripted.requests for t in tool_results(r) if t.startswith("error: refused")]
    assert refused and all("max_sub_calls=8" in t and "answer with what you have" in t for t in refused)
    limited = [e for e in events if isinstance(e, ToolLimited)]
    assert len(limited) == 1 and (limited[0].limit, limited[0].value) == ("calls", 8)  # once per limit per run
    assert len(result.notes) == 1 and "max_sub_calls=8" in result.notes[0] and "refused" in result.notes[0]
    assert result.output.startswith("a answers")


async def test_depth_is_bounded_and_the_deepest_agent_is_told():
    scripted = ScriptedEngine(responder=greedy("a", "b", "c", "d"))
    events = []
    async with Squad(chain("a", "b", "c", "d"), engine=scripted, on_event=events.append,
                     max_sub_calls=50, max_tool_rounds=1) as sq:
        result = await sq.run("go")
    assert "d" not in [r.agent for r in scripted.requests]  # c (depth 2) may not ask d (depth 3)
    c_final = next(r for r in scripted.requests if r.agent == "c" and tool_results(r))
    assert tool_results(c_final) == [
        "error: refused: sub-agents may be called only 2 level(s) deep in this run (max_sub_depth=2); "
        "do this part yourself"]
    limited = [e for e in events if isinstance(e, ToolLimited)]
    assert [(e.agent, e.tool, e.limit, e.value) for e in limited] == [("c", "ask_d", "depth", 2)]
    assert result.notes == [limited[0].message] and "c asked sub-agent d 3 level(s) deep" in limited[0].message


async def test_calls_in_one_round_count_one_by_one():
    lead = Agent(name="lead", max_tokens=16, agents=("x", "y", "z"))
    agents = [lead] + [Agent(name=n, max_tokens=16) for n in "xyz"]
    replies = iter([ask("x", "y", "z"), ChatResult(content="merged")])
    scripted = ScriptedEngine(responder=lambda req: next(replies) if req.agent == "lead" else "fine")
    async with Squad(agents, engine=scripted, max_sub_calls=2) as sq:
        result = await sq.run("all three")
    assert sorted(s.agent for s in result.subs) == ["x", "y"]
    assert sum(t.startswith("error: refused") for t in tool_results(scripted.requests[-1])) == 1
    assert len(result.notes) == 1


async def test_an_agents_own_bounds_replace_the_squads_for_runs_it_starts():
    scripted = ScriptedEngine(responder=greedy("lead", "helper"))
    async with Squad(chain("lead", "helper", max_sub_calls=1), engine=scripted) as sq:
        result = await sq.run_agent("lead", "go")
    assert [s.agent for s in result.subs] == ["helper"] and len(result.notes) == 1
    assert "max_sub_calls=1" in result.notes[0]


async def test_each_map_item_is_its_own_run():
    scripted = ScriptedEngine(responder=greedy("lead", "helper"), slots=3)
    async with Squad(chain("lead", "helper"), engine=scripted, max_sub_calls=2) as sq:
        results = await sq.map("lead", ["one", "two", "three"])
    assert [len(r.subs) for r in results] == [2, 2, 2]
    assert all(len(r.notes) == 1 for r in results)


@pytest.mark.parametrize("bad", [0, -1, True, 1.5, "3"])
async def test_bad_bounds_are_user_errors(bad):
    with pytest.raises(UserError, match="max_sub_calls must be a whole number of at least 1"):
        Squad(chain("a"), engine=ScriptedEngine(), max_sub_calls=bad)
    with pytest.raises(UserError, match="max_sub_depth"):
        Agent.build(name="a", max_sub_depth=bad)


async def test_the_view_and_the_trace_show_the_limit(tmp_path: Path):
    console = Console(record=True, width=200)
    trace = tmp_path / "t.jsonl"
    scripted = ScriptedEngine(responder=greedy("lead", "helper"))
    with JsonlTrace(trace) as tracer, LiveView(console=console, live=False) as view:
        async with Squad(chain("lead", "helper"), engine=scripted, on_event=[tracer, view], max_sub_calls=1) as sq:
            await sq.run("go")
    assert "warning: lead asked sub-agent helper after this run's 1 sub-agent calls" in console.export_text()
    summary = summarize(load_trace(trace))
    assert len(summary.agents["lead"].notes) == 1 and "max_sub_calls=1" in summary.agents["lead"].notes[0]


RECIPE = """\
name: bounded
agents:
  lead: {{instructions: You lead., max_tokens: 16, budget: 1024, agents: [helper]{bounds}}}
  helper: {{instructions: You help., max_tokens: 16, budget: 512}}
main: lead
flow:
  - id: ask
    prompt: go
"""


async def test_a_recipe_sets_the_bound_on_its_agent_and_its_run_states_it(tmp_path: Path):
    path = tmp_path / "r.yaml"
    path.write_text(RECIPE.format(bounds=", max_sub_calls: 2"))
    run = await run_recipe(load_recipe(path), engine=ScriptedEngine(responder=greedy("lead", "helper")))
    assert [r.agent for _, r in run.results].count("helper") == 2
    assert len(run.notes) == 1 and run.notes[0][0] == "ask" and "max_sub_calls=2" in run.notes[0][1]


@pytest.mark.parametrize(("bounds", "message"), [
    (", max_sub_calls: true", "max_sub_calls"),
    (", max_sub_depth: 0", "max_sub_depth"),
    (", max_sub_calls: lots", "max_sub_calls"),
])
def test_bad_recipe_bounds_are_file_line_errors(tmp_path: Path, bounds, message):
    path = tmp_path / "r.yaml"
    path.write_text(RECIPE.format(bounds=bounds))
    with pytest.raises(RecipeError) as info:
        load_recipe(path)
    assert info.value.line == 3 and message in str(info.value)


def test_the_plan_follows_the_depth_bound(tmp_path: Path):
    from squad.sched.workload import Call, Delegate

    text = """\
name: deep
agents:
  a: {{max_tokens: 16, budget: 512, agents: [b]{bound}}}
  b: {{max_tokens: 16, budget: 512, agents: [c]}}
  c: {{max_tokens: 16, budget: 512, agents: [d]}}
  d: {{max_tokens: 16, budget: 512}}
main: a
flow:
  - prompt: go
"""
    path = tmp_path / "deep.yaml"
    path.write_text(text.format(bound=""))
    assert load_recipe(path).workload().items[0] == Delegate(Call("a", 512), Delegate(Call("b", 512), Call("c", 512)))
    path.write_text(text.format(bound=", max_sub_depth: 3"))
    assert load_recipe(path).workload().items[0] == Delegate(
        Call("a", 512), Delegate(Call("b", 512), Delegate(Call("c", 512), Call("d", 512))))

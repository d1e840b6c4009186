"""Thinking as a budget (issue 32, item 1): an agent's ``thinking_budget`` is planned inside its
``max_tokens``, sent as each engine kind reads it, shown by ``squad plan``; an answer cut while
thinking is ``truncated`` ("cut while thinking"), never a failure unless ``non_answers`` says so;
the thinking never reaches a hand-back or a later prompt.

The fake engine cuts the thinking at ``thinking_budget_tokens`` as llama-server does; the real
engine's proof is ``tests/engine/test_thinking_real.py``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cli_support import squad
from squad.chat import ChatResult, ToolCall
from squad.engine.kinds import KINDS, THINKING, thinking_fields
from squad.engine.llama import THINKING_BUDGET_FIELD
from squad.errors import ReasoningBudgetExhausted, RecipeError, UserError
from squad.events import AgentFinished, StepWarning
from squad.events.summary import summarize
from squad.events.view import ViewState
from squad.recipes import load_recipe, run_recipe
from squad.runtime.agent import Agent
from squad.runtime.outcome import THINKING_MARK, Outcome
from squad.runtime.results import AgentResult
from squad.runtime.squad import Squad
from squad.testing import FakeEngine, Reply

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


# --- the setting ---------------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(max_tokens=st.integers(1, 5000), budget=st.one_of(st.none(), st.integers(-3, 6000)))
def test_a_thinking_budget_is_planned_inside_max_tokens(max_tokens, budget):
    """Accepted exactly when 0 <= budget < max_tokens; a refusal names both numbers."""
    fields = {"name": "t", "max_tokens": max_tokens, **({"thinking_budget": budget} if budget is not None else {})}
    if budget is None or 0 <= budget < max_tokens:
        assert Agent.build(**fields).thinking_budget == budget
    else:
        with pytest.raises(UserError, match="thinking_budget") as err:
            Agent.build(**fields)
        if budget >= 0:
            assert f"({budget})" in str(err.value) and f"({max_tokens})" in str(err.value)


@pytest.mark.parametrize("value", [True, "4", 2.0])
def test_a_thinking_budget_is_a_whole_number(value):
    with pytest.raises(UserError, match="thinking_budget"):
        Agent.build(name="t", max_tokens=64, thinking_budget=value)


@settings(max_examples=40, deadline=None)
@given(kind=st.sampled_from(KINDS), budget=st.one_of(st.none(), st.integers(0, 10**6)))
def test_each_kind_gets_the_budget_as_it_reads_it_or_says_it_cannot(kind, budget):
    fields = thinking_fields(kind, budget)
    if budget is None:
        assert fields == {}  # nothing sent: the request is what it was before the setting existed
    elif fields is None:  # a kind that cannot take it: the runtime warns
        assert kind not in THINKING or (kind == "ollama" and budget > 0)
    else:
        assert kind in THINKING and fields  # said in words for `squad engine info`
        assert all(v == budget for v in fields.values() if isinstance(v, int))  # never more than asked
    assert thinking_fields("llama.cpp", budget) == ({} if budget is None else {THINKING_BUDGET_FIELD: budget})


# --- what a cut answer is ------------------------------------------------------------------------


@settings(max_examples=100, deadline=None)
@given(finish=st.sampled_from(["stop", "length", "tool_calls"]), content=st.sampled_from(["", " \n", "an answer"]),
       reasoning=st.sampled_from(["", "some thought"]), calls=st.booleans())
def test_cut_while_thinking_is_exactly_a_length_stop_with_thinking_and_nothing_else(finish, content, reasoning,
                                                                                   calls):
    result = ChatResult(content=content, reasoning=reasoning, finish_reason=finish,
                        tool_calls=[ToolCall("c1", "f", "{}")] if calls else [])
    assert result.cut_while_thinking == (finish == "length" and bool(reasoning) and not content.strip() and not calls)
    agent = AgentResult(agent="t", output=content, reasoning=reasoning, finish_reason=finish, max_tokens=9,
                        cut_while_thinking=result.cut_while_thinking)
    assert agent.outcome is not Outcome.FAILED and agent.error is None  # never a failure by itself
    if result.cut_while_thinking:
        assert agent.outcome is Outcome.TRUNCATED and agent.marked_output == THINKING_MARK
        assert "cut while thinking" in agent.summary()
    assert not reasoning or reasoning not in agent.marked_output  # the thinking is never handed on


async def test_squad_sends_the_budget_and_the_fake_engine_honours_it():
    """What squad sent (the request body) and how it classified the answer; the same agent without
    a budget spends all of max_tokens thinking and is truncated, cut while thinking, not an error."""
    thought = " ".join(f"t{i}" for i in range(40))
    async with FakeEngine() as fe:
        fe.responder = lambda body: Reply(reasoning=thought, content="four")
        agents = [Agent(name="capped", max_tokens=20, thinking_budget=5),
                  Agent(name="free", max_tokens=20), Agent(name="off", max_tokens=20, thinking_budget=0)]
        async with Squad(agents, engine=fe.info) as sq:
            capped = await sq.run_agent("capped", "2+2?")
            free = await sq.run_agent("free", "2+2?")
            off = await sq.run_agent("off", "2+2?")
    assert [r.get(THINKING_BUDGET_FIELD) for r in fe.requests] == [5, None, 0]  # one call each, in order
    assert all(r["max_tokens"] == 20 for r in fe.requests)  # the budget never raises the reservation
    assert (capped.output, capped.outcome, capped.cut_while_thinking) == ("four", Outcome.OK, False)
    assert capped.reasoning.split() == thought.split()[:5]
    assert (off.output, off.reasoning, off.outcome) == ("four", "", Outcome.OK)
    assert free.outcome is Outcome.TRUNCATED and free.cut_while_thinking and free.error is None
    assert free.output == "" and thought.split()[0] not in free.marked_output
    assert all("reasoning_content" not in m and "t1" not in str(m.get("content")) for m in free.history)


# --- recipes: non_answers decides --------------------------------------------------------------

RECIPE = """\
name: think
agents:
  thinker: {{instructions: "Think.", budget: 512, max_tokens: 12{extra}}}
  writer: {{instructions: "Write.", budget: 1024, max_tokens: 16}}
main: writer
flow:
  - id: solve
    agent: thinker
    prompt: "2+2?"
{setting}
  - id: report
    agent: writer
    prompt: "Report: {{{{ steps.solve.output }}}}"
"""


def recipe(tmp_path: Path, extra: str = "", setting: str = "") -> Path:
    path = tmp_path / "think.yaml"
    path.write_text(RECIPE.format(extra=extra, setting=f"    {setting}" if setting else ""))
    return path


async def test_a_cut_in_thinking_flows_on_marked_with_a_warning_and_the_thinking_stays_out(tmp_path):
    events: list = []
    async with FakeEngine() as fe:
        fe.responder = lambda body: (Reply(reasoning="secret " * 30, content="x") if "2+2?" in json.dumps(body)
                                     else Reply(content="reported"))
        run = await run_recipe(load_recipe(recipe(tmp_path)), engine=fe.info, on_event=events.append)
    assert run.steps["solve"]["outcome"] == "truncated" and run.steps["solve"]["output"] == THINKING_MARK
    assert run.output == "reported" and not run.errors
    report = fe.requests[-1]
    assert THINKING_MARK in report["messages"][-1]["content"] and "secret" not in json.dumps(report)
    finished = [e for e in events if isinstance(e, AgentFinished) and e.agent == "thinker"]
    assert finished and finished[0].cut_while_thinking and finished[0].outcome == "truncated"
    warned = [e.warning for e in events if isinstance(e, StepWarning)]
    assert warned and "cut while thinking" in warned[0] and "thinking_budget" in warned[0]
    state = ViewState()
    for e in events:
        state.apply(e)
    assert any("cut while thinking" in row.detail for row in state.agents.values())
    assert any("cut while thinking" in n for a in summarize(events).agents.values() for n in a.notes)


async def test_non_answers_fail_makes_a_cut_in_thinking_the_run_s_error(tmp_path):
    async with FakeEngine() as fe:
        fe.responder = lambda body: Reply(reasoning="hmm " * 30)
        with pytest.raises(ReasoningBudgetExhausted, match="while thinking") as err:
            await run_recipe(load_recipe(recipe(tmp_path, setting="non_answers: {truncated: fail}")), engine=fe.info)
    assert err.value.outcome == "truncated" and err.value.partial == ""  # the thinking is not the partial answer
    assert len(fe.requests) == 1  # the report step never ran


async def test_a_budget_sent_from_a_recipe_and_a_cut_answer_after_it_is_a_plain_truncation(tmp_path):
    async with FakeEngine() as fe:
        fe.responder = lambda body: (Reply(reasoning="hmm " * 30, content="w " * 30) if "2+2?" in json.dumps(body)
                                     else Reply(content="ok"))
        run = await run_recipe(load_recipe(recipe(tmp_path, extra=", thinking_budget: 4")), engine=fe.info)
    assert fe.requests[0][THINKING_BUDGET_FIELD] == 4 and THINKING_BUDGET_FIELD not in fe.requests[1]
    solve = dict(run.results)["solve"]
    assert solve.outcome is Outcome.TRUNCATED and not solve.cut_while_thinking  # cut in the answer, after thinking
    assert run.steps["solve"]["output"].endswith("[truncated at max_tokens]")


def test_a_budget_not_below_max_tokens_is_a_recipe_error_at_the_agent(tmp_path):
    with pytest.raises(RecipeError, match="thinking_budget \\(12\\) must be below max_tokens \\(12\\)"):
        load_recipe(recipe(tmp_path, extra=", thinking_budget: 12"), require_params=False)


def test_squad_plan_shows_the_thinking_budget(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    path = recipe(tmp_path, extra=", thinking_budget: 4")
    code, out, err = squad(capsys, "plan", path, "--json", "--ctx", "4096")
    assert code == 0, err
    rows = {r["agent"]: r for r in json.loads(out)["steps"]}
    assert rows["thinker"]["thinking_budget"] == 4 and rows["thinker"]["max_tokens"] == 12
    assert rows["writer"]["thinking_budget"] is None
    code, out, err = squad(capsys, "plan", path, "--ctx", "4096")
    assert code == 0 and "thinking" in out and "<= 4" in out, out


# --- a budget for a model that does not think ------------------------------------------------------------------

SMOLLM2_LIKE = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
                "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
                "{% endif %}")
QWEN3_LIKE = SMOLLM2_LIKE + "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>{% endif %}"


@pytest.mark.parametrize("template, warned", [(SMOLLM2_LIKE, True), (QWEN3_LIKE, False), (None, False)])
async def test_a_budget_for_a_model_that_does_not_think_is_warned_once(template, warned):
    """An engine whose chat template has no thinking gets one warning for the whole run, naming the first agent
    with a budget and what to do; a template that thinks, or one not known, none. The budget is still sent
    (harmless) and the calls run as before."""
    import dataclasses

    from squad.events import EngineWarning

    events: list = []
    async with FakeEngine() as fe:
        info = dataclasses.replace(fe.info, chat_template=template)
        agents = [Agent(name="a", max_tokens=8, thinking_budget=4), Agent(name="b", max_tokens=8, thinking_budget=0),
                  Agent(name="c", max_tokens=8)]
        async with Squad(agents, engine=info, on_event=events.append) as sq:
            for name in ("c", "a", "b", "a"):
                result = await sq.run_agent(name, "2+2?")
                assert result.error is None
    said = [e.warning for e in events if isinstance(e, EngineWarning) and "thinking_budget" in e.warning]
    if not warned:
        assert said == []
        return
    assert len(said) == 1, said
    assert said[0].startswith("agent 'a': thinking_budget 4 has no effect:") and "does not think" in said[0]
    assert "Drop thinking_budget" in said[0]
    assert [r.get(THINKING_BUDGET_FIELD) for r in fe.requests] == [None, 4, 0, 4]  # still sent as asked

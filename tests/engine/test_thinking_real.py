"""Thinking budgets on the REAL llama-server, with a family that thinks (issue 32, item 1).

The Qwen3.5 stand-in (:func:`squad.testing.tiny_models.tiny_model`: Qwen3.5's tokenizer and chat
template, random weights) opens ``<think>`` in its generation prompt, so every call starts
thinking and random weights rarely end it: the worst case a thinking budget is for. The tests
assert what squad sent (the request bodies its transport built), what the engine did with it
(thinking tokens counted by the engine's own ``/tokenize``) and how squad classified the answer,
never what the model wrote. Runs on whichever engine ``squad engine install`` gave (the prebuilt
xllamacpp b11549 or the b11434 source build: both read ``thinking_budget_tokens``)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from launch_support import THREADS
from squad.chat.transport import LlamaServerTransport
from squad.engine.launcher import Launcher
from squad.engine.llama import THINKING_BUDGET_FIELD
from squad.engine.session import EngineSpec, plan_engine
from squad.errors import ReasoningBudgetExhausted
from squad.events import AgentFinished
from squad.recipes import load_recipe, run_recipe
from squad.runtime.agent import Agent
from squad.runtime.outcome import THINKING_MARK, Outcome
from squad.runtime.squad import Squad
from squad.testing.tiny_models import tiny_model

pytestmark = [pytest.mark.engine, pytest.mark.anyio]

SEED = {"temperature": 0.0, "seed": 1}
PROMPT = "Think, then answer: 2+2?"


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
async def engine(llama_server_path, tmp_path_factory):
    plan = plan_engine(EngineSpec(model=tiny_model("qwen3.5"), slots=2, ctx=4096), None)
    async with Launcher(plan, binary=llama_server_path, threads=THREADS,
                        log_dir=tmp_path_factory.mktemp("logs-thinking")) as launched:
        assert launched.info is not None
        yield launched.info


@pytest.fixture
def sent(monkeypatch) -> list[dict[str, Any]]:
    """Every request body squad's transport built in the test (what squad sent)."""
    bodies: list[dict[str, Any]] = []
    build = LlamaServerTransport._body

    def spy(self, *args):  # the request, and what the admitted layer hands the transport
        body = build(self, *args)
        bodies.append(body)
        return body

    monkeypatch.setattr(LlamaServerTransport, "_body", spy)
    return bodies


async def _tokens(info, text: str) -> int:
    """``text``'s tokens by the engine's own tokenizer."""
    headers = {"Authorization": f"Bearer {info.api_key}"} if info.api_key else {}
    async with httpx.AsyncClient(base_url=info.base_url, headers=headers, timeout=60) as http:
        r = await http.post("/tokenize", json={"content": text})
        assert r.status_code == 200, r.text
        return len(r.json()["tokens"])


@pytest.mark.timeout(300)
async def test_the_budget_is_sent_and_the_engine_ends_the_thinking_there(engine, sent):
    agents = [Agent(name="free", instructions="Think.", max_tokens=48, sampling=SEED),
              Agent(name="capped", instructions="Think.", max_tokens=48, thinking_budget=3, sampling=SEED),
              Agent(name="off", instructions="Think.", max_tokens=48, thinking_budget=0, sampling=SEED)]
    async with Squad(agents, engine=engine) as sq:
        free = await sq.run_agent("free", PROMPT)
        capped = await sq.run_agent("capped", PROMPT)
        off = await sq.run_agent("off", PROMPT)
    assert [b["extra_body"].get(THINKING_BUDGET_FIELD) for b in sent] == [None, 3, 0]
    assert all(b["max_tokens"] == 48 for b in sent)  # the budget is inside max_tokens, never added to it
    thought = {r.agent: await _tokens(engine, r.reasoning) if r.reasoning else 0 for r in (free, capped, off)}
    if thought["free"] <= 3:
        pytest.skip(f"the stand-in ended its thinking by itself within 3 tokens ({thought}): nothing to cap")
    # the engine forced the end of the thinking at the budget (+1: a token the tokenizer may split differently)
    assert thought["capped"] <= 3 + 1 and thought["off"] <= 1, thought
    for r in (free, capped, off):  # whatever it wrote, the thinking is never the answer nor in the history
        assert not r.reasoning.strip() or r.reasoning.strip() not in r.marked_output
        assert all("reasoning_content" not in m for m in r.history)
        assert r.error is None and r.outcome is not Outcome.FAILED


@pytest.mark.timeout(300)
async def test_a_call_cut_while_thinking_is_truncated_not_a_failure(engine, sent):
    events: list = []
    agent = Agent(name="thinker", instructions="Think.", max_tokens=24, sampling=SEED)
    async with Squad([agent], engine=engine, on_event=events.append) as sq:
        result = await sq.run_agent("thinker", PROMPT)
    assert THINKING_BUDGET_FIELD not in sent[0]["extra_body"]
    if result.output.strip() or not result.reasoning:
        pytest.skip("the stand-in closed its thinking within 24 tokens: no cut inside it to classify")
    assert result.finish_reason == "length" and result.usage.completion_tokens == 24  # max_tokens covers thinking
    assert result.error is None and result.outcome is Outcome.TRUNCATED and result.cut_while_thinking
    assert result.marked_output == THINKING_MARK and "cut while thinking" in result.summary()
    finished = [e for e in events if isinstance(e, AgentFinished)]
    assert finished[-1].outcome == "truncated" and finished[-1].cut_while_thinking


RECIPE = """\
name: think
agents:
  thinker: {instructions: "Think.", budget: 1024, max_tokens: 24, sampling: {temperature: 0.0, seed: 1}}
  writer: {instructions: "Write.", budget: 1024, max_tokens: 4, thinking_budget: 0,
           sampling: {temperature: 0.0, seed: 1}}
main: writer
flow:
  - id: solve
    agent: thinker
    prompt: "Think, then answer: 2+2?"
SETTING
  - id: report
    agent: writer
    prompt: "Report: {{ steps.solve.output }}"
"""


@pytest.mark.timeout(300)
async def test_a_recipe_passes_a_cut_in_thinking_on_marked_or_fails_as_non_answers_says(engine, sent, tmp_path):
    path = tmp_path / "think.yaml"
    path.write_text(RECIPE.replace("SETTING\n", ""))
    run = await run_recipe(load_recipe(path), engine=engine)
    solve = dict(run.results)["solve"]
    if not solve.cut_while_thinking:
        pytest.skip("the stand-in closed its thinking within 24 tokens: no cut inside it")
    report = sent[-1]
    assert report["extra_body"][THINKING_BUDGET_FIELD] == 0
    assert report["messages"][-1]["content"] == f"Report: {THINKING_MARK}"  # the mark, never the thinking
    assert run.steps["solve"]["outcome"] == "truncated" and not run.errors
    path.write_text(RECIPE.replace("SETTING\n", "    non_answers: {truncated: fail}\n"))
    sent.clear()
    with pytest.raises(ReasoningBudgetExhausted, match="while thinking"):
        await run_recipe(load_recipe(path), engine=engine)
    assert len(sent) == 1  # the report step never ran


@pytest.mark.timeout(300)
async def test_a_budget_for_the_built_in_model_that_does_not_think_is_warned_once(llama_server_path,
                                                                                  default_model_path, sent,
                                                                                  tmp_path):
    """SmolLM2 (the built-in model) does not think: the engine's own chat template (``/props``) says so, and a
    run whose agents have thinking budgets gets one warning naming the model; the budget is sent as asked. The
    Qwen3.5 stand-in, which thinks, gets none (the engine fixture above)."""
    from squad.events import EngineWarning

    plan = plan_engine(EngineSpec(model=str(default_model_path), slots=1, ctx=1024), None)
    events: list = []
    agents = [Agent(name="a", instructions="Answer.", max_tokens=4, thinking_budget=2, sampling=SEED),
              Agent(name="b", instructions="Answer.", max_tokens=4, thinking_budget=1, sampling=SEED)]
    async with Launcher(plan, binary=llama_server_path, threads=THREADS, log_dir=tmp_path / "logs") as launched:
        assert launched.info is not None and launched.info.chat_template  # what the engine applies
        async with Squad(agents, engine=launched.info, on_event=events.append) as sq:
            await sq.run_agent("a", PROMPT)
            await sq.run_agent("b", PROMPT)
    said = [e.warning for e in events if isinstance(e, EngineWarning) and "thinking_budget" in e.warning]
    assert len(said) == 1 and said[0].startswith("agent 'a': thinking_budget 2 has no effect")
    assert "SmolLM2" in said[0] and "does not think" in said[0]
    assert [b["extra_body"].get(THINKING_BUDGET_FIELD) for b in sent] == [2, 1]


@pytest.mark.timeout(300)
async def test_a_model_that_thinks_gets_no_such_warning(engine, sent):
    from squad.events import EngineWarning

    events: list = []
    agent = Agent(name="capped", instructions="Think.", max_tokens=8, thinking_budget=2, sampling=SEED)
    async with Squad([agent], engine=engine, on_event=events.append) as sq:
        await sq.run_agent("capped", PROMPT)
    assert not [e for e in events if isinstance(e, EngineWarning) and "thinking_budget" in e.warning]
    assert sent[0]["extra_body"][THINKING_BUDGET_FIELD] == 2

"""Tool calls on the real engine with the default model (SmolLM2-135M, whose own ChatML template
has no tools): squad starts llama-server with its ChatML tool template, the engine parses the
model's calls into its own ``tool_calls``, squad runs them and sends the results back.

A 135M model is not a reliable tool caller, so these tests force the first call
(``tool_choice``) and assert what squad and the engine do, not how good the answer is;
bench/tools.py measures how often the calls are right."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from launch_support import THREADS
from squad.engine.chat_templates import CHATML_TOOLS
from squad.engine.session import EngineSpec
from squad.events import Event
from squad.runtime.agent import Agent
from squad.runtime.squad import Squad
from squad.runtime.tools import tool

pytestmark = [pytest.mark.engine, pytest.mark.anyio]

SAMPLING = {"temperature": 0.0, "seed": 1}
CALLED: list[str] = []


@tool
def get_weather(city: str) -> str:
    """The current weather of a city.

    Args:
        city: the city's name
    """
    CALLED.append(city)
    return f"{city}: 21 C and sunny"


AGENTS = [
    Agent(name="helper", instructions="You answer questions. Use the tools when they help.", budget=2048,
          max_tokens=48, tools=["get_weather"], tool_choice="required", parallel_tool_calls=False, sampling=SAMPLING),
    # the same lead with three seeds: SmolLM2-135M sometimes fills the forced call with other keys than `task`
    # or writes a task too long for max_tokens (both seen in CI, with -t 1), which squad answers with the validation
    # error; one seed of three (at temperature 0.5: greedy decoding ignores the seed) must call it right
    *(Agent(name=f"lead{seed}", instructions="You answer questions. Ask the weather sub-agent about the weather.",
            budget=2048, max_tokens=256, agents=["weather"], tool_choice="ask_weather", parallel_tool_calls=False,
            sampling={"temperature": 0.5, "seed": seed}) for seed in (1, 2, 3)),
    Agent(name="weather", description="knows the weather of any city",
          instructions="You describe a city's weather in one short sentence.", budget=1024, max_tokens=24,
          sampling=SAMPLING),
]


def _object(arguments: str) -> dict:
    """A tool call's arguments as a dict ({} when they are not a JSON object)."""
    try:
        value = json.loads(arguments or "{}")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


@pytest.mark.timeout(900)  # five to seven model calls on 2 shared cores
async def test_function_and_sub_agent_tools_round_trip_through_the_engines_tool_calls(
    llama_server_path: Path, default_model_path: Path
) -> None:
    CALLED.clear()
    events: list[Event] = []
    spec = EngineSpec(model=default_model_path, binary=llama_server_path, threads=THREADS)
    async with Squad(AGENTS, engine=spec, tools=[get_weather], on_event=events.append) as sq:
        # the template squad chose is the one the engine applies, read back from /props
        async with httpx.AsyncClient(base_url=sq.info.base_url,
                                     headers={"Authorization": f"Bearer {sq.info.api_key}"}) as http:
            props = (await http.get("/props")).json()
        assert props["chat_template"].strip() == CHATML_TOOLS.text.strip()
        assert props["chat_template_caps"]["supports_tool_calls"] is True
        assert sq.info.template_has_tools is True and sq.info.template_name.startswith("squad:chatml-tools")

        helper = await sq.run_agent("helper", "What is the weather in Paris?")
        for seed in (1, 2, 3):
            lead = await sq.run_agent(f"lead{seed}", "Weather in Oslo?")
            first = lead.history[1]["tool_calls"][0]
            assert first["function"]["name"] == "ask_weather"  # forced by tool_choice
            if "task" in _object(first["function"]["arguments"]):
                break
            # a call without `task` (other keys, or JSON cut at max_tokens): squad ran no sub-agent and told the
            # model what was wrong
            assert lead.history[2]["role"] == "tool" and "bad arguments for ask_weather" in lead.history[2]["content"]
            assert not lead.subs

    # a function tool: the call came as the engine's tool_calls (its random ids, no text parsed)
    asked = helper.history[1]
    assert asked["role"] == "assistant" and not asked["content"] and len(asked["tool_calls"]) == 1
    call = asked["tool_calls"][0]
    assert call["function"]["name"] == "get_weather" and len(call["id"]) >= 16
    assert json.loads(call["function"]["arguments"]) == {"city": CALLED[0]} and CALLED[0]
    assert helper.history[2] == {"role": "tool", "tool_call_id": call["id"], "content": f"{CALLED[0]}: 21 C and sunny"}
    assert helper.history[-1]["role"] == "assistant" and helper.output.strip()
    assert helper.tool_calls[0][:1] == ("get_weather",)
    assert not any(e.kind == "engine.warning" and "tools" in e.data.get("warning", "") for e in events)

    # a sub-agent as a tool: ask_weather ran the weather agent, its answer went back as the tool result
    sub_call = lead.history[1]["tool_calls"][0]
    assert sub_call["function"]["name"] == "ask_weather" and json.loads(sub_call["function"]["arguments"])["task"], (
        "no seed of three made SmolLM2 fill ask_weather's `task`", [lead.history[1]])
    assert len(lead.subs) == 1 and lead.subs[0].agent == "weather" and lead.subs[0].output.strip()
    assert lead.history[2]["role"] == "tool" and lead.history[2]["content"].strip()
    assert lead.history[-1]["role"] == "assistant" and lead.output.strip()
    tool_events = [e for e in events if e.kind == "tool.called"]
    assert {e.data["tool"] for e in tool_events} == {"get_weather", "ask_weather"}


async def test_a_tool_that_never_returns_is_ended_and_the_model_reads_that_it_timed_out(
    llama_server_path: Path, default_model_path: Path
) -> None:
    """Issue 32: a tool that never returns held its agent forever. With ``@tool(timeout=...)`` the call is ended
    and the tool message the engine gets next says it timed out (the forced call pins what the model does)."""
    import anyio

    @tool(timeout=1.0)
    async def lookup(key: str) -> str:
        """Look a key up.

        Args:
            key: what to look up
        """
        await anyio.Event().wait()  # never returns
        return "never"

    events: list[Event] = []
    agent = Agent(name="조회", instructions="You answer questions. Use the tools.", budget=2048, max_tokens=48,
                  tools=["lookup"], tool_choice="lookup", parallel_tool_calls=False, max_tool_rounds=1,
                  sampling=SAMPLING)
    async with Squad([agent], tools=[lookup], on_event=events.append,
                     engine=EngineSpec(model=default_model_path, binary=llama_server_path, threads=THREADS)) as sq:
        with anyio.fail_after(600):  # a guard for the test: without the timeout this would hang
            result = await sq.run("What is the value of the key 'alpha'?")
    called = [e for e in events if e.kind == "tool.called"]
    assert called and called[0].tool == "lookup" and not called[0].ok
    tool_messages = [m for m in result.main.history if m.get("role") == "tool"]
    assert tool_messages and tool_messages[0]["content"] == (
        "error: lookup timed out: it did not finish within its timeout of 1 s and was stopped; no result")
    assert result.main.ok  # the turn went on to an answer

"""Tool calls on the second built-in model, ``gemma3-270m`` (the Gemma 3 270M *base* model).

Its GGUF has no chat template, so llama-server b11434 would fall back to ChatML without tools
and drop tool definitions; squad starts the engine with its ChatML tool template instead
(:data:`squad.engine.chat_templates.ENGINE_FALLBACK`). Measured result, pinned here:

- ``tool_choice="required"``: the engine's grammar (plus squad's call prefill) makes even a base
  model write a well-formed call; the engine returns it as ``tool_calls``, squad runs the tool.
- The answer after the tool result is not a usable answer: a base model does not follow ChatML
  (``<|im_end|>`` is not a special token of Gemma's vocabulary, so it is written as text and the
  turn runs to ``max_tokens``). With ``tool_choice`` auto it does not call tools at all.
"""

from __future__ import annotations

import json

import httpx
import pytest

from launch_support import THREADS
from squad.engine.registry import resolve_model
from squad.engine.session import EngineSpec
from squad.errors import SquadError
from squad.runtime.agent import Agent
from squad.runtime.squad import Squad
from squad.runtime.tools import tool

pytestmark = [pytest.mark.engine, pytest.mark.anyio]

CITIES: list[str] = []


@tool
def get_weather(city: str) -> str:
    """The current weather of a city.

    Args:
        city: the city's name
    """
    CITIES.append(city)
    return f"{city}: 21 C and sunny"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.timeout(600)
async def test_gemma3_forced_tool_call_goes_through_squads_chatml_template(llama_server_path):
    try:
        gemma = resolve_model("gemma3-270m", pull=True)
    except SquadError as exc:
        pytest.skip(f"gemma3-270m not available: {exc}")
    CITIES.clear()
    agent = Agent(name="helper", instructions="You answer questions. Use the tools when they help.", budget=2048,
                  max_tokens=32, tools=["get_weather"], tool_choice="required", parallel_tool_calls=False,
                  sampling={"temperature": 0.0, "seed": 1})
    spec = EngineSpec(model=gemma, binary=llama_server_path, threads=THREADS, ctx=4096)
    async with Squad([agent], engine=spec, tools=[get_weather]) as sq:
        async with httpx.AsyncClient(base_url=sq.info.base_url,
                                     headers={"Authorization": f"Bearer {sq.info.api_key}"}) as http:
            props = (await http.get("/props")).json()
        assert props["chat_template_caps"]["supports_tool_calls"] is True
        assert sq.info.template_name.startswith("squad:chatml-tools")
        result = await sq.run_agent("helper", "What is the weather in Paris?")
    call = result.history[1]["tool_calls"][0]
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": CITIES[0]} and CITIES[0]
    assert result.history[2]["role"] == "tool"

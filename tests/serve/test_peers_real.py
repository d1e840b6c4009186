"""The frameworks people already run, pointed at ``squad serve`` unchanged (the ``peers`` extra):
the OpenAI Agents SDK (its Responses model and its chat-completions model), pydantic-ai,
LangChain ``ChatOpenAI`` + a LangGraph ReAct agent, LiteLLM and the Anthropic SDK. For each:
a plain answer, a streamed one, a round trip through a tool the model is made to call
(``required`` / Anthropic ``any``), and structured output; then 8 concurrent runs on the
``-c 2048 -np 4`` engine directly and through serve, counted. A framework that is not
installed is skipped (``pip install -e '.[peers]'``). The real engine, SmolLM2-135M."""

from __future__ import annotations

import json
import os
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import httpx
import psutil
import pytest
from pydantic import BaseModel

from serve_support import squad_serve

pytestmark = [pytest.mark.engine, pytest.mark.timeout(1200)]  # several model calls each, on 2 shared cores
os.environ.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "1")  # no trace export to the internet
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no model cost map download

KEY = "peers-test-key-0123456789abcdef"
ASK = "What is the weather in Paris? Use the tool."
TRIP = "A trip to Paris for 3 days. Give the city and the number of days."


class Trip(BaseModel):
    city: str
    days: int


@pytest.fixture(scope="module")
def served(tmp_path_factory, llama_server_path, default_model_path):
    """``squad serve -c 2048 -np 4 -t THREADS`` on a free port: ``(url, pid)``."""
    state = tmp_path_factory.mktemp("state")
    with squad_serve(state, KEY, llama_server_path, default_model_path, ctx=2048, slots=4) as (url, proc):
        yield url, proc.pid


def clients_of(url: str) -> dict:
    return httpx.get(url + "/squad/status", headers={"Authorization": f"Bearer {KEY}"}, timeout=10).json()["clients"]


def weather_log() -> tuple[list[str], Callable[[str], str]]:
    calls: list[str] = []

    def get_weather(city: str) -> str:
        """The weather in a city."""
        calls.append(city)
        return f"It is sunny in {city}."

    return calls, get_weather


# -- the OpenAI Agents SDK ---------------------------------------------------------------------------


RUN_TIMEOUT = 900
"""Read timeout (s) of each client in the 8 concurrent runs. A request that is not streamed gets no
byte while it waits in squad serve's queue (a JSON answer cannot start early, squad.serve.early),
and on the 2 shared cores 8 runs of ~700 tokens on a 2,048-token pool can queue the last one past
300 s: seen as 2 of 8 Agents SDK clients leaving at load average 11."""


def _agents_model(kind: str, base_url: str, key: str, timeout: float = 300):
    agents = pytest.importorskip("agents")
    import openai

    client = openai.AsyncOpenAI(base_url=base_url, api_key=key, max_retries=0, timeout=timeout)
    cls = agents.OpenAIResponsesModel if kind == "responses" else agents.OpenAIChatCompletionsModel
    return cls(model="any", openai_client=client)


INCOMPLETE = pytest.mark.xfail(strict=False, reason=(
    "squad serve now ends a Responses answer cut at max_output_tokens with response.incomplete, as OpenAI does "
    "(issue 28); the Agents SDK raises ModelBehaviorError on it, and this test's answers reach their cap"))


@pytest.mark.parametrize("kind", [pytest.param("responses", marks=INCOMPLETE), "chat"])
def test_openai_agents_sdk(served, kind):
    agents = pytest.importorskip("agents")
    from agents import Agent, ModelSettings, Runner, function_tool

    url, _ = served
    model = _agents_model(kind, url + "/v1", KEY)

    async def main() -> None:
        plain = Agent(name=f"plain-{kind}", instructions="Answer briefly.", model=model,
                      model_settings=ModelSettings(max_tokens=32))
        assert (await Runner.run(plain, "Say hello.")).final_output
        streamed = Runner.run_streamed(plain, "Count to five.")
        deltas = 0
        async for event in streamed.stream_events():
            deltas += getattr(getattr(event, "data", None), "type", "") in ("response.output_text.delta",)
        assert streamed.final_output and deltas >= 2
        calls, get_weather = weather_log()
        tooled = Agent(name=f"tool-{kind}", instructions="Use the tool, then answer.", model=model,
                       tools=[function_tool(get_weather)],
                       model_settings=ModelSettings(tool_choice="required", max_tokens=96))
        try:
            done = await Runner.run(tooled, ASK, max_turns=3)
            assert done.final_output
        except agents.MaxTurnsExceeded:  # the tool result went back; a 135M model may call again
            pass
        assert calls and all(isinstance(c, str) for c in calls)
        structured = Agent(name=f"trip-{kind}", instructions="Answer as JSON.", model=model, output_type=Trip,
                           model_settings=ModelSettings(max_tokens=64))
        trip = (await Runner.run(structured, TRIP)).final_output
        assert isinstance(trip, Trip)

    anyio.run(main)
    assert clients_of(url)["127.0.0.1"]["completed"] >= 5


# -- pydantic-ai -------------------------------------------------------------------------------------------


def test_pydantic_ai(served):
    pytest.importorskip("pydantic_ai")
    from pydantic_ai import Agent
    from pydantic_ai.exceptions import ModelRequestRejectedError
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    url, _ = served
    model = OpenAIChatModel("any", provider=OpenAIProvider(base_url=url + "/v1", api_key=KEY))

    async def main() -> None:
        plain = Agent(model, instructions="Answer briefly.", model_settings={"max_tokens": 32})
        assert (await plain.run("Say hello.")).output
        async with plain.run_stream("Count to five.") as stream:
            parts = [t async for t in stream.stream_text(delta=True)]
        assert "".join(parts)
        calls, get_weather = weather_log()
        # pydantic-ai makes the model call a tool (tool_choice required) when only structured
        # output may end the run: the weather tool, then its final_result tool
        tooled = Agent(model, instructions="Call get_weather, then give the result.", output_type=Trip,
                       tools=[get_weather], model_settings={"max_tokens": 96}, retries=3)
        try:
            result = await tooled.run(ASK + " Then give the city and days=1.")
        except ModelRequestRejectedError as exc:
            # SmolLM2 missed the schema three times and pydantic-ai's retries grew the history past what one
            # request may hold on this 2,048-token engine (seen in CI: 2,037 + 96): squad serve's own refusal,
            # which names the fix, is the right answer then
            assert "one request may hold at most" in str(exc) and "lower max_tokens" in str(exc), exc
            result = None
        assert result is None or isinstance(result.output, Trip)
        structured = Agent(model, instructions="Answer with the trip.", output_type=Trip,
                           model_settings={"max_tokens": 64}, retries=3)
        assert isinstance((await structured.run(TRIP)).output, Trip)
        assert result is None or calls or any(m.kind == "response" for m in result.all_messages())

    anyio.run(main)


# -- LangChain + LangGraph -----------------------------------------------------------------------------------


def test_langchain_and_a_langgraph_agent(served):
    pytest.importorskip("langchain_openai")
    pytest.importorskip("langgraph")
    from langchain_core.messages import HumanMessage, ToolMessage
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI
    from langgraph.prebuilt import create_react_agent

    url, _ = served
    llm = ChatOpenAI(model="any", base_url=url + "/v1", api_key=KEY, max_tokens=48, max_retries=0, timeout=300)
    assert llm.invoke("Say hello.").content
    assert "".join(c.content for c in llm.stream("Count to five."))
    calls, get_weather = weather_log()
    weather = tool(get_weather)
    forced = llm.bind_tools([weather], tool_choice="required")
    asked = HumanMessage(ASK)
    ai = forced.invoke([asked])
    assert ai.tool_calls and ai.tool_calls[0]["name"] == "get_weather"
    result = weather.invoke(ai.tool_calls[0]["args"])
    answer = llm.bind_tools([weather]).invoke([asked, ai, ToolMessage(result, tool_call_id=ai.tool_calls[0]["id"])])
    assert answer.content or answer.tool_calls
    trip = llm.with_structured_output(Trip, method="json_schema").invoke(TRIP)
    assert isinstance(trip, Trip)
    agent = create_react_agent(llm, [weather])
    state = agent.invoke({"messages": [asked]}, {"recursion_limit": 6})
    assert state["messages"][-1].type in ("ai", "tool")


# -- LiteLLM ----------------------------------------------------------------------------------------------------


def test_litellm(served):
    litellm = pytest.importorskip("litellm")
    url, _ = served
    common = dict(model="openai/any", api_base=url + "/v1", api_key=KEY, max_tokens=48, num_retries=0)
    asked = [{"role": "user", "content": "Say hello."}]
    assert litellm.completion(messages=asked, **common).choices[0].message.content
    chunks = list(litellm.completion(messages=asked, stream=True, **common))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                               "parameters": {"type": "object",
                                                              "properties": {"city": {"type": "string"}},
                                                              "required": ["city"]}}}]
    messages = [{"role": "user", "content": ASK}]
    first = litellm.completion(messages=messages, tools=tools, tool_choice="required", **common).choices[0].message
    assert first.tool_calls and first.tool_calls[0].function.name == "get_weather"
    city = json.loads(first.tool_calls[0].function.arguments).get("city", "?")
    messages += [first.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": first.tool_calls[0].id, "content": f"It is sunny in {city}."}]
    # all of first's calls go back, also one cut by max_tokens (squad.serve.forcing.repair_history)
    assert litellm.completion(messages=messages, tools=tools, **common).choices[0].message
    trip = litellm.completion(messages=[{"role": "user", "content": TRIP}], response_format=Trip, **common)
    Trip.model_validate_json(trip.choices[0].message.content)


# -- the Anthropic SDK ----------------------------------------------------------------------------------------------


def test_anthropic_sdk(served):
    anthropic = pytest.importorskip("anthropic")
    url, _ = served
    client = anthropic.Anthropic(base_url=url, api_key=KEY, max_retries=0, timeout=300)
    done = client.messages.create(model="any", max_tokens=32, messages=[{"role": "user", "content": "Say hello."}])
    assert done.content[0].text
    with client.messages.stream(model="any", max_tokens=32, messages=[{"role": "user", "content": "Count."}]) as s:
        assert "".join(s.text_stream)
    tools = [{"name": "get_weather", "description": "The weather in a city",
              "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]
    messages: list[dict[str, Any]] = [{"role": "user", "content": ASK}]
    first = client.messages.create(model="any", max_tokens=96, messages=messages, tools=tools,
                                   tool_choice={"type": "any"})
    uses = [b for b in first.content if b.type == "tool_use"]
    # sampled: the model may add a second call, which max_tokens then cuts (stop_reason max_tokens)
    assert uses and uses[0].name == "get_weather" and first.stop_reason in ("tool_use", "max_tokens")
    messages += [{"role": "assistant", "content": [b.model_dump() for b in first.content]},
                 {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                               "content": f"It is sunny in {use.input.get('city', '?')}."}
                                              for use in uses]}]
    assert client.messages.create(model="any", max_tokens=48, messages=messages, tools=tools).content is not None
    # structured output the Messages way b11434 can serve: a tool forced by name, its input the object
    schema = Trip.model_json_schema()
    got = client.messages.create(model="any", max_tokens=64, messages=[{"role": "user", "content": TRIP}],
                                 tools=[{"name": "trip", "description": "The trip", "input_schema": schema}],
                                 tool_choice={"type": "tool", "name": "trip"})
    Trip.model_validate([b for b in got.content if b.type == "tool_use"][0].input)


# -- 8 concurrent runs, directly and through serve -----------------------------------------------------------


def _words(i: int) -> str:
    return "Repeat these words: " + " ".join(f"w{i}x{k}" for k in range(120))  # ~650 prompt tokens


def _runner(name: str) -> Callable[[str, str, int], Awaitable[None]]:
    """One run of ``name`` against ``url`` (no /v1) with ``key``: ~650 prompt tokens, 48 generated
    (ignore_eos); raises when the framework reports an error."""
    body = {"ignore_eos": True}

    async def agents_run(url: str, key: str, i: int, kind: str) -> None:
        from agents import Agent, ModelSettings, Runner

        agent = Agent(name=f"a{i}", model=_agents_model(kind, url + "/v1", key, RUN_TIMEOUT),
                      model_settings=ModelSettings(max_tokens=48, extra_body=body))
        await Runner.run(agent, _words(i))

    async def pydantic_ai_run(url: str, key: str, i: int) -> None:
        from pydantic_ai import Agent
        from pydantic_ai.models.openai import OpenAIChatModel
        from pydantic_ai.providers.openai import OpenAIProvider

        model = OpenAIChatModel("any", provider=OpenAIProvider(base_url=url + "/v1", api_key=key))
        await Agent(model, model_settings={"max_tokens": 48, "extra_body": body, "timeout": RUN_TIMEOUT}).run(_words(i))

    async def langchain_run(url: str, key: str, i: int) -> None:
        from langchain_openai import ChatOpenAI

        llm = ChatOpenAI(model="any", base_url=url + "/v1", api_key=key, max_tokens=48, max_retries=0,
                         timeout=RUN_TIMEOUT, extra_body=body)
        await llm.ainvoke(_words(i))

    async def litellm_run(url: str, key: str, i: int) -> None:
        import litellm

        await litellm.acompletion(model="openai/any", api_base=url + "/v1", api_key=key, max_tokens=48,
                                  num_retries=0, messages=[{"role": "user", "content": _words(i)}], extra_body=body,
                                  timeout=RUN_TIMEOUT)

    async def anthropic_run(url: str, key: str, i: int) -> None:
        import anthropic

        async with anthropic.AsyncAnthropic(base_url=url, api_key=key, max_retries=0, timeout=RUN_TIMEOUT) as client:
            await client.messages.create(model="any", max_tokens=48, extra_body=body,
                                         messages=[{"role": "user", "content": _words(i)}])

    return {"agents-responses": lambda u, k, i: agents_run(u, k, i, "responses"),
            "agents-chat": lambda u, k, i: agents_run(u, k, i, "chat"),
            "pydantic-ai": pydantic_ai_run, "langchain": langchain_run, "litellm": litellm_run,
            "anthropic": anthropic_run}[name]


PEERS = {"agents-responses": "agents", "agents-chat": "agents", "pydantic-ai": "pydantic_ai",
         "langchain": "langchain_openai", "litellm": "litellm", "anthropic": "anthropic"}


@pytest.mark.timeout(1200)
@pytest.mark.parametrize("name", [pytest.param(n, marks=INCOMPLETE) if n == "agents-responses" else n for n in PEERS])
def test_eight_concurrent_runs_fail_directly_and_complete_through_serve(served, name):
    pytest.importorskip(PEERS[name])
    url, pid = served
    # the source build's process is named llama-server; the prebuilt engine runs as `python .../squad-llama-server`
    (child,) = [c for c in psutil.Process(pid).children(recursive=True)
                if "llama-server" in c.name() or any(part.endswith("llama-server") for part in c.cmdline()[:2])]
    engine_key = child.environ()["LLAMA_API_KEY"]  # squad serve's secret; read here only to go around it
    engine = httpx.get(url + "/squad/status", headers={"Authorization": f"Bearer {KEY}"}).json()["engine"]["url"]
    run = _runner(name)

    async def eight(base: str, key: str) -> tuple[int, int]:
        done = [False] * 8

        async def one(i: int) -> None:
            try:
                await run(base, key, i)
                done[i] = True
            except Exception:  # noqa: BLE001 - each framework raises its own kind; counted
                pass

        async with anyio.create_task_group() as tg:
            for i in range(8):
                tg.start_soon(one, i)
        return sum(done), 8 - sum(done)

    direct = anyio.run(eight, engine, engine_key)
    through = anyio.run(eight, url, KEY)
    print(f"{name}: direct {direct[0]} completed / {direct[1]} failed; through serve {through[0]} / {through[1]}")
    assert direct[1] > 0, direct
    assert through == (8, 0), through

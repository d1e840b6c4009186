"""Structured output (squad.chat.structured) without an engine: what is sent, how answers are
validated, the one retry with the error shown, the answering round without tools, sub-agent
answers handed back as JSON, and the errors. The real engine: tests/chat/test_structured_real.py."""

from __future__ import annotations

import json

import pytest
from pydantic import BaseModel, field_validator

from squad.chat import ChatResult, ToolCall
from squad.chat.structured import OutputInvalid, OutputSchema
from squad.errors import InvalidOutput, UserError
from squad.events import OutputRetried
from squad.runtime.agent import Agent
from squad.runtime.squad import Squad
from squad.runtime.tools import tool
from squad.testing import ScriptedEngine

pytestmark = pytest.mark.anyio


class City(BaseModel):
    city: str
    country: str


class Shouting(BaseModel):
    word: str

    @field_validator("word")
    @classmethod
    def _upper(cls, value: str) -> str:
        if value != value.upper():
            raise ValueError("must be upper case")
        return value


CITY_SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}, "country": {"type": "string"}},
               "required": ["city", "country"]}


@tool
def population(city: str) -> int:
    """The population of a city."""
    return 2_100_000


# --- OutputSchema ------------------------------------------------------------------------------


def test_a_pydantic_model_a_type_and_a_dict_each_make_a_schema() -> None:
    model = OutputSchema.of(City)
    assert model.name == "City" and model.schema["required"] == ["city", "country"]
    assert model.response_format() == {"type": "json_schema",
                                       "json_schema": {"name": "City", "schema": model.schema, "strict": True}}
    assert model.parse('{"city": "Paris", "country": "France"}') == City(city="Paris", country="France")
    assert OutputSchema.of(list[int]).parse("[1, 2]") == [1, 2]
    assert OutputSchema.of(CITY_SCHEMA).parse(' {"city": "Lyon", "country": "France"}\n') == {"city": "Lyon",
                                                                                               "country": "France"}
    assert OutputSchema.of(City) == OutputSchema.of(City) and hash(OutputSchema.of(City)) == hash(OutputSchema.of(City))


@pytest.mark.parametrize(("spec", "text", "where"), [
    (City, '{"city": "Paris"}', "at country: Field required"),
    (City, "Paris is the capital", "Invalid JSON"),
    (Shouting, '{"word": "hi"}', "must be upper case"),
    (CITY_SCHEMA, '{"city": 3, "country": "F"}', "at city: 3 is not of type 'string'"),
    (CITY_SCHEMA, "Paris, France", "not JSON"),
    (CITY_SCHEMA, "", "not JSON"),
])
def test_a_miss_says_where_and_why(spec, text, where) -> None:
    with pytest.raises(OutputInvalid, match=where):
        OutputSchema.of(spec).parse(text)


def test_a_bad_output_type_is_a_clear_user_error() -> None:
    with pytest.raises(UserError, match="not a valid JSON schema"):
        OutputSchema.of({"type": "nope"})
    with pytest.raises(UserError, match="output_type must be a pydantic model class"):
        OutputSchema.of(object())
    with pytest.raises(UserError, match="not str"):  # never evaluated as Python (pydantic would)
        OutputSchema.of("__import__('os').getcwd() and int")
    with pytest.raises(UserError, match="not a type pydantic can validate"):
        OutputSchema.of(type("Opaque", (), {}))
    with pytest.raises(ValueError, match="output_type"):
        Agent(name="a", output_type={"type": 7})


# --- one agent, no tools -----------------------------------------------------------------------


async def test_the_schema_is_sent_and_the_answer_comes_back_typed() -> None:
    engine = ScriptedEngine('{"city": "Paris", "country": "France"}')
    async with Squad([Agent(name="geo", output_type=City, max_tokens=32)], engine=engine) as sq:
        result = await sq.run("Largest city of France?")
    [req] = engine.requests
    assert req.response_format == OutputSchema.of(City).response_format() and req.tools is None
    assert result.output_value == City(city="Paris", country="France")
    assert json.loads(result.output) == {"city": "Paris", "country": "France"}
    assert result.main.history[-1] == {"role": "assistant", "content": result.output}


async def test_a_miss_is_asked_once_more_with_the_error_and_the_retry_leaves_no_trace_in_history() -> None:
    events = []
    engine = ScriptedEngine('{"word": "hi"}', '{"word": "HI"}')
    async with Squad([Agent(name="loud", output_type=Shouting, max_tokens=16)], engine=engine,
                     on_event=events.append) as sq:
        result = await sq.run("Say hi")
    assert result.output_value == Shouting(word="HI")
    retry = engine.requests[1]
    assert retry.response_format is not None
    assert retry.messages[-2] == {"role": "assistant", "content": '{"word": "hi"}'}
    assert "must be upper case" in retry.messages[-1]["content"] and retry.messages[-1]["role"] == "user"
    [retried] = [e for e in events if isinstance(e, OutputRetried)]
    assert retried.agent == "loud" and "must be upper case" in retried.problem
    assert [m["role"] for m in result.main.history] == ["user", "assistant"]
    assert result.main.usage.completion_tokens > 0 and result.main.timings.calls == 2


async def test_two_misses_raise_invalid_output_keeping_the_raw_text() -> None:
    engine = ScriptedEngine('{"word": "hi"}', '{"word": "still low"}')
    async with Squad([Agent(name="loud", output_type=Shouting, max_tokens=16)], engine=engine) as sq:
        with pytest.raises(InvalidOutput, match="also when asked again") as caught:
            await sq.run("Say hi")
    assert caught.value.raw == '{"word": "still low"}' and caught.value.agent == "loud"
    assert len(engine.requests) == 2  # once more, not a loop


async def test_an_answer_cut_at_max_tokens_says_so_and_how_to_fix_it() -> None:
    cut = ChatResult(content='{"city": "Par', finish_reason="length")
    engine = ScriptedEngine(cut, cut)
    async with Squad([Agent(name="geo", output_type=City, max_tokens=4)], engine=engine) as sq:
        with pytest.raises(InvalidOutput, match="raise its max_tokens") as caught:
            await sq.run("?")
    assert "cut at max_tokens" in str(caught.value) and caught.value.raw == '{"city": "Par'


async def test_run_agent_parallel_and_map_take_an_output_type_for_the_call() -> None:
    answer = '{"city": "Oslo", "country": "Norway"}'
    engine = ScriptedEngine(responder=lambda req: answer)
    async with Squad([Agent(name="geo", max_tokens=32)], engine=engine) as sq:
        one = await sq.run_agent("geo", "?", output_type=CITY_SCHEMA)
        many = await sq.map("geo", ["a", "b"], output_type=City)
        both = await sq.parallel([("geo", "a"), ("geo", "b")], output_type=City)
        plain = await sq.run_agent("geo", "?")
    assert one.output_value == {"city": "Oslo", "country": "Norway"}
    assert [r.output_value for r in many + both] == [City(city="Oslo", country="Norway")] * 4
    assert plain.output_value is None and engine.requests[-1].response_format is None
    assert all(r.response_format is not None for r in engine.requests[:-1])


# --- with tools: the schema only in the answering round -------------------------------------


def _call(name: str, args: str) -> ChatResult:
    return ChatResult(content="", tool_calls=[ToolCall("c1", name, args)], finish_reason="tool_calls")


async def test_tool_rounds_go_without_the_schema_and_a_prose_answer_is_asked_again_under_it() -> None:
    engine = ScriptedEngine(_call("population", '{"city": "Paris"}'), "Paris has about 2.1 million people.",
                            '{"city": "Paris", "country": "France"}')
    agent = Agent(name="geo", tools=["population"], output_type=City, max_tokens=32)
    async with Squad([agent], engine=engine, tools=[population]) as sq:
        result = await sq.run("Paris?")
    first, second, answering = engine.requests
    assert first.tools and first.response_format is None
    assert second.tools and second.response_format is None
    # the answering round offers no tool (tool_choice none) but lists the same ones: the prefix stays
    assert answering.tools == first.tools and answering.tool_choice == "none"
    assert answering.response_format is not None
    assert answering.messages == second.messages  # the prose answer was dropped, not kept
    assert result.output_value == City(city="Paris", country="France")
    assert result.main.tool_calls == [("population", '{"city": "Paris"}', "2100000")]


async def test_a_tool_round_answer_that_already_validates_is_taken_as_it_is() -> None:
    engine = ScriptedEngine('{"city": "Rome", "country": "Italy"}')
    agent = Agent(name="geo", tools=["population"], output_type=City, max_tokens=32)
    async with Squad([agent], engine=engine, tools=[population]) as sq:
        result = await sq.run("Rome?")
    assert len(engine.requests) == 1 and result.output_value.city == "Rome"


# --- sub-agents hand back JSON ----------------------------------------------------------------


async def test_a_structured_sub_agent_hands_back_json_as_a_tool_and_by_mention() -> None:
    def respond(req):
        if req.agent == "geo":
            return ' {\n  "city": "Bern",\n  "country": "Switzerland"\n}'
        if req.tools and req.tool_choice != "none" and not any(m["role"] == "tool" for m in req.messages):
            return _call("ask_geo", '{"task": "capital of Switzerland"}')
        return "done"

    engine = ScriptedEngine(responder=respond)
    lead = Agent(name="lead", agents=["geo"], max_tokens=32)
    geo = Agent(name="geo", description="geography", output_type=City, max_tokens=32)
    async with Squad([lead, geo], engine=engine) as sq:
        result = await sq.run("What is the capital of Switzerland?")
        mentioned = await sq.run("@geo capital of Switzerland?")
    [tool_msg] = [m for m in engine.requests[2].messages if m["role"] == "tool"]
    assert json.loads(tool_msg["content"]) == {"city": "Bern", "country": "Switzerland"}
    assert tool_msg["content"] == '{"city":"Bern","country":"Switzerland"}'
    assert result.subs[0].output_value == City(city="Bern", country="Switzerland")
    assert '{"city":"Bern","country":"Switzerland"}' in engine.requests[-1].messages[-1]["content"]
    assert mentioned.subs[0].output_value.city == "Bern"

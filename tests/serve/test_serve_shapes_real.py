"""The API shapes clients check, through the real SDKs (openai, anthropic) against ``squad serve``
on the real engine (squad.serve.shapes): the Responses stream helper, ``incomplete`` at
``max_output_tokens``, Messages ``stop_sequence`` and ``msg_`` ids, the request's ``model``
echoed, one tool call when parallel calls are off, Messages ``output_config.format`` through
``messages.parse``, chat ``logprobs`` not streamed; and every answer of a range of requests,
streamed and not, valid under the SDKs' own models. What the model writes is pinned (temperature
0, forced tools) or compared with the engine's own answer; the tests assert what squad serve
shapes. One ``-c 2048 -np 4`` engine for the module."""

from __future__ import annotations

import json

import anthropic
import httpx
import openai
import pytest
from pydantic import BaseModel, ValidationError

from api_shapes_support import check_answer, check_events, sse
from serve_support import squad_serve

pytestmark = [pytest.mark.engine, pytest.mark.timeout(900)]

KEY = "serve-shapes-test-key-0123456789"
H = {"Authorization": f"Bearer {KEY}", "anthropic-version": "2023-06-01"}
CITY = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
NAMES = ("get_weather", "get_time")
CHAT_TOOLS = [{"type": "function", "function": {"name": n, "description": "Of a city", "parameters": CITY}}
              for n in NAMES]
RESP_TOOLS = [{"type": "function", "name": n, "description": "Of a city", "parameters": CITY} for n in NAMES]
MSG_TOOLS = [{"name": n, "description": "Of a city", "input_schema": CITY} for n in NAMES]
TWO = "What is the weather in Paris and in Rome, and the time in Tokyo?"
T0 = {"temperature": 0, "seed": 1}


@pytest.fixture(scope="module")
def served(tmp_path_factory, llama_server_path, default_model_path):
    with squad_serve(tmp_path_factory.mktemp("state"), KEY, llama_server_path, default_model_path) as (url, _):
        yield url


@pytest.fixture
def oai(served):
    with openai.OpenAI(base_url=served + "/v1", api_key=KEY, max_retries=0, timeout=600) as client:
        yield client


@pytest.fixture
def claude(served):
    with anthropic.Anthropic(base_url=served, api_key=KEY, max_retries=0, timeout=600) as client:
        yield client


def test_the_responses_stream_helper_works_and_a_cut_answer_is_incomplete(oai):
    with oai.responses.stream(model="my-model", input="Write a long story about dragons.", max_output_tokens=4,
                              extra_body=T0) as stream:
        events = list(stream)
    assert [e.sequence_number for e in events] == list(range(len(events)))
    last = events[-1]
    assert last.type == "response.incomplete" and last.response.status == "incomplete"
    assert last.response.incomplete_details.reason == "max_output_tokens" and last.response.model == "my-model"
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert last.response.output[0].content[0].text == text
    whole = oai.responses.create(model="my-model", input="Write a long story about dragons.", max_output_tokens=4,
                                 extra_body=T0)
    assert whole.status == "incomplete" and whole.incomplete_details.reason == "max_output_tokens"
    assert whole.output_text == text and whole.model == "my-model"
    # a forced call that ends before the limit: completed, and the helper gives the final response
    with oai.responses.stream(model="my-model", input=TWO, tools=RESP_TOOLS, tool_choice="required",
                              max_output_tokens=200, extra_body=T0) as stream:
        final = stream.get_final_response()
    assert final.status == "completed" and final.model == "my-model"
    assert [o.name for o in final.output if o.type == "function_call"][0] in NAMES


def test_messages_stop_sequence_ids_and_model(served, claude):
    body = {"model": "claude-x", "max_tokens": 40, "stop_sequences": [" "], "temperature": 0,
            "messages": [{"role": "user", "content": "Write two sentences about cats."}]}
    whole = claude.messages.create(**{k: v for k, v in body.items() if k != "temperature"}, extra_body=T0)
    with claude.messages.stream(**{k: v for k, v in body.items() if k != "temperature"}, extra_body=T0) as stream:
        streamed = stream.get_final_message()
    for message in (whole, streamed):
        assert message.id.startswith("msg_") and message.model == "claude-x"
        if message.stop_sequence is None:
            pytest.skip(f"the model wrote no space in {message.content}")
        assert message.stop_reason == "stop_sequence" and message.stop_sequence == " "


@pytest.mark.parametrize("stream", [False, True])
def test_one_tool_call_when_parallel_calls_are_off(served, oai, claude, stream):
    """SmolLM2 asked for two cities under a forced tool choice writes 2-3 calls; with parallel calls
    off each API's answer holds one."""
    messages = [{"role": "user", "content": TWO}]
    if stream:
        with oai.chat.completions.stream(model="m", messages=messages, tools=CHAT_TOOLS, tool_choice="required",
                                         parallel_tool_calls=False, max_tokens=120, **T0) as s:
            chat_calls = s.get_final_completion().choices[0].message.tool_calls
        with oai.responses.stream(model="m", input=TWO, tools=RESP_TOOLS, tool_choice="required",
                                  parallel_tool_calls=False, max_output_tokens=120, extra_body=T0) as s:
            events = list(s)
        resp_calls = [o for o in events[-1].response.output if o.type == "function_call"]
        with claude.messages.stream(model="c", max_tokens=120, messages=messages, tools=MSG_TOOLS,
                                    tool_choice={"type": "any", "disable_parallel_tool_use": True},
                                    extra_body=T0) as s:
            uses = [b for b in s.get_final_message().content if b.type == "tool_use"]
    else:
        chat_calls = oai.chat.completions.create(model="m", messages=messages, tools=CHAT_TOOLS, tool_choice="required",
                                                 parallel_tool_calls=False, max_tokens=120,
                                                 **T0).choices[0].message.tool_calls
        resp_calls = [o for o in oai.responses.create(model="m", input=TWO, tools=RESP_TOOLS, tool_choice="required",
                                                      parallel_tool_calls=False, max_output_tokens=120,
                                                      extra_body=T0).output if o.type == "function_call"]
        uses = [b for b in claude.messages.create(model="c", max_tokens=120, messages=messages, tools=MSG_TOOLS,
                                                  tool_choice={"type": "any", "disable_parallel_tool_use": True},
                                                  extra_body=T0).content if b.type == "tool_use"]
    assert len(chat_calls) == 1 and len(resp_calls) == 1 and len(uses) == 1
    assert chat_calls[0].function.name in NAMES and resp_calls[0].name in NAMES and uses[0].name in NAMES


class Pet(BaseModel):
    name: str
    age: int


@pytest.mark.parametrize("stream", [False, True])
def test_messages_parse_gets_its_output_format(claude, stream):
    """``output_config.format`` goes to the engine as a forced tool and comes back as the one text
    block ``messages.parse`` reads, holding the call's JSON object. Whether that object has every
    field of the schema is the engine's tool-call grammar's and the model's: measured, SmolLM2
    fills it alone on a cold engine, and after other requests once answered ``{}``, once a call cut by
    max_tokens (then the SDK's own validation of the text is what fails, not the shape)."""
    ask = {"model": "claude-x", "max_tokens": 100, "output_format": Pet, "extra_body": T0,
           "messages": [{"role": "user", "content": "My pet is a dog named Rex, 3 years old."}]}
    try:
        if stream:
            with claude.messages.stream(**ask) as s:
                message = s.get_final_message()
        else:
            message = claude.messages.parse(**ask)
    except ValidationError as exc:  # the text block came and the SDK read it; the model's JSON did not fit the
        # schema, or was cut by max_tokens mid-call (measured: SmolLM2 once repeated "SQUAD_" to the limit)
        assert exc.title == "Pet" and all(e["type"] in ("missing", "json_invalid") for e in exc.errors()), exc
        return
    assert [b.type for b in message.content] == ["text"] and message.model == "claude-x"
    assert isinstance(message.parsed_output, Pet), message.content
    assert isinstance(json.loads(message.content[0].text), dict)


def test_chat_logprobs_not_streamed(oai):
    done = oai.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=5,
                                       logprobs=True, top_logprobs=2, **T0)
    assert len(done.choices[0].logprobs.content) == done.usage.completion_tokens
    assert all(len(t.top_logprobs) == 2 for t in done.choices[0].logprobs.content)


CASES = [
    ("chat", "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 12}),
    ("chat", "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 20,
                                      "stop": [" "], "logprobs": True}),
    ("chat", "/v1/chat/completions", {"messages": [{"role": "user", "content": TWO}], "max_tokens": 120,
                                      "tools": CHAT_TOOLS, "tool_choice": "required"}),
    ("completion", "/v1/completions", {"prompt": "Once upon a time", "max_tokens": 6}),
    ("responses", "/v1/responses", {"input": "hi", "max_output_tokens": 3}),
    ("responses", "/v1/responses", {"input": TWO, "max_output_tokens": 120, "tools": RESP_TOOLS,
                                    "tool_choice": "required", "instructions": "Use the tools."}),
    ("messages", "/v1/messages", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 20,
                                  "stop_sequences": [" "], "system": "Be brief."}),
    ("messages", "/v1/messages", {"messages": [{"role": "user", "content": TWO}], "max_tokens": 120,
                                  "tools": MSG_TOOLS, "tool_choice": {"type": "any"}}),
]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(("kind", "path", "case"), CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_every_answer_is_valid_under_the_sdks_own_models(served, kind, path, case, stream):
    """Each field the SDK's response and event models declare as required is there, with its type."""
    body = {"model": "the-model", **case, **T0, "stream": stream}
    r = httpx.post(served + path, headers=H, json=body, timeout=600)
    assert r.status_code == 200, r.text
    if not stream:
        answer = r.json()
        check_answer(kind, answer)
        assert answer["model"] == "the-model"
        return
    events = sse(r.text)
    check_events(kind, events)
    models = [e.get("model") or (e.get("response") or e.get("message") or {}).get("model") for e in events]
    assert set(models) - {None} == {"the-model"}

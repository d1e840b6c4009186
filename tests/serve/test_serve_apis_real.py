"""Every generation API llama-server b11434 serves, through ``squad serve`` on the real engine:
OpenAI Responses and Anthropic Messages, streamed and not, admitted (a burst that overflows
the engine directly completes through serve) and released on a disconnect; tool calls forced
for ``required`` and a named tool in each API's own shape (chat ``tool_calls``, Responses
``function_call`` items, Messages ``tool_use`` blocks), streamed too; structured output for
chat ``response_format`` and Responses ``text.format``; the count endpoints and embeddings
passed on. One ``-c 2048 -np 4`` engine for the module (the squad serve CLI as a process)."""

from __future__ import annotations

import json
import time

import anyio
import httpx
import openai
import psutil
import pytest

from serve_support import squad_serve

pytestmark = [pytest.mark.engine, pytest.mark.timeout(900)]  # forced calls of up to 96 tokens, on 2 shared cores

KEY = "serve-apis-test-key-0123456789"
H = {"Authorization": f"Bearer {KEY}"}
WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
CHAT_TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                                "parameters": WEATHER}},
              {"type": "function", "function": {"name": "get_time", "description": "Time in a city",
                                                "parameters": WEATHER}}]
RESP_TOOLS = [{"type": "function", "name": t["function"]["name"], "description": t["function"]["description"],
               "parameters": WEATHER} for t in CHAT_TOOLS]
MSG_TOOLS = [{"name": t["function"]["name"], "description": t["function"]["description"], "input_schema": WEATHER}
             for t in CHAT_TOOLS]
ASK = "What is the weather in Paris?"



ENDS = ("response.completed", "response.incomplete")
"""How a Responses stream ends: ``incomplete`` when cut at max_output_tokens (squad serve mends the engine's
``completed`` into OpenAI's own, :mod:`squad.serve.shapes`); the engine alone says ``completed``."""

@pytest.fixture(scope="module")
def served(tmp_path_factory, llama_server_path, default_model_path):
    """``squad serve -c 2048 -np 4 -t THREADS`` on a free port; yields ``(url, pid)``; stopped with SIGINT."""
    state = tmp_path_factory.mktemp("state")
    with squad_serve(state, KEY, llama_server_path, default_model_path, ctx=2048, slots=4) as (url, proc):
        yield url, proc.pid


def status(url: str) -> dict:
    return httpx.get(url + "/squad/status", headers=H, timeout=10).json()


def engine_of(url: str, pid: int) -> tuple[str, str]:
    """The engine's URL and key (squad serve's secret; read here only to go around it)."""
    # the source build's process is named llama-server; the prebuilt engine runs as `python .../squad-llama-server`
    (child,) = [c for c in psutil.Process(pid).children(recursive=True)
                if "llama-server" in c.name() or any(part.endswith("llama-server") for part in c.cmdline()[:2])]
    return status(url)["engine"]["url"], child.environ()["LLAMA_API_KEY"]


def sse(lines: list[str]) -> list[dict]:
    return [json.loads(line[6:]) for line in lines if line.startswith("data: ") and line != "data: [DONE]"]


def settled(url: str) -> dict:
    """/squad/status once nothing is reserved and no engine slot is busy (10 s at most)."""
    deadline = time.monotonic() + 10
    while True:
        now = status(url)
        busy = sum(1 for s in httpx.get(url + "/slots", headers=H, timeout=10).json() if s.get("is_processing"))
        if now["admission"]["reserved"] == 0 and busy == 0:
            return now
        assert time.monotonic() < deadline, (now, busy)
        time.sleep(0.05)


@pytest.mark.parametrize("prompt", ["Reply with only this emoji: \U0001F389",
                                    "Write the Korean word \uc548\ub155\ud558\uc138\uc694 and nothing else."])
def test_a_messages_stream_whose_first_token_ends_inside_a_character_starts_with_message_start(served, prompt):
    """b11434 sends no ``message_start`` when the first generated token ends inside a UTF-8
    character (SmolLM2 at temperature 0 answers these with an emoji, with Hangul); the anthropic
    SDK then refuses the stream. Through squad serve it starts with one (squad.serve.stream_start)."""
    anthropic = pytest.importorskip("anthropic")
    url, pid = served
    body = {"model": "any", "max_tokens": 8, "temperature": 0, "messages": [{"role": "user", "content": prompt}],
            "stream": True}
    engine, engine_key = engine_of(url, pid)
    with httpx.stream("POST", engine + "/v1/messages", headers={"Authorization": f"Bearer {engine_key}"},
                      json=body, timeout=600) as r:
        direct = [e["type"] for e in sse(list(r.iter_lines()))]
    if direct[0] == "message_start":
        pytest.skip(f"the engine started this answer with message_start itself: {direct[:3]}")
    with httpx.stream("POST", url + "/v1/messages", headers={**H, "anthropic-version": "2023-06-01"}, json=body,
                      timeout=600) as r:
        events = sse(list(r.iter_lines()))
    assert events[0]["type"] == "message_start", events[:3]
    assert events[0]["message"]["usage"]["input_tokens"] > 0 and events[0]["message"]["id"].startswith("msg_")
    client = anthropic.Anthropic(base_url=url, api_key=KEY, max_retries=0, timeout=600)
    with client.messages.stream(model="any", max_tokens=8, extra_body={"temperature": 0},
                                messages=[{"role": "user", "content": prompt}]) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text and any(ord(c) > 127 for c in text), text
    assert final.content[0].text == text and final.usage.output_tokens > 0


def test_a_chat_stream_whose_first_token_ends_inside_a_character_has_its_role(served):
    """The same b11434 gap in a chat stream: no ``role: assistant`` in the first chunk, so the
    openai SDK's stream helper gives ``role=None``; through squad serve the role is there."""
    url, pid = served
    messages = [{"role": "user", "content": "Reply with only this emoji: \U0001F389"}]
    body = {"model": "any", "max_tokens": 8, "temperature": 0, "messages": messages, "stream": True}
    engine, engine_key = engine_of(url, pid)
    with httpx.stream("POST", engine + "/v1/chat/completions", headers={"Authorization": f"Bearer {engine_key}"},
                      json=body, timeout=600) as r:
        direct = sse(list(r.iter_lines()))
    if "role" in direct[0]["choices"][0]["delta"]:
        pytest.skip(f"the engine sent the role itself: {direct[0]}")
    with httpx.stream("POST", url + "/v1/chat/completions", headers=H, json=body, timeout=600) as r:
        through = sse(list(r.iter_lines()))
    assert through[0]["choices"][0]["delta"]["role"] == "assistant", through[0]
    client = openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0)
    with client.chat.completions.stream(model="any", messages=messages, max_tokens=8, temperature=0) as stream:
        for _ in stream:
            pass
        snapshot = stream.current_completion_snapshot
    assert snapshot.choices[0].message.role == "assistant" and snapshot.choices[0].message.content


@pytest.mark.parametrize("max_output_tokens", [2, 8])
def test_a_responses_stream_whose_first_token_ends_inside_a_character_is_created_once(served, max_output_tokens):
    """b11434 repeats ``response.created`` after every token, or (1-2 tokens) sends only
    ``response.completed``, when the first token ends inside a character; the openai SDK then
    raises. Through squad serve: one created, one in_progress, first."""
    url, pid = served
    body = {"model": "any", "input": "Reply with only this emoji: \U0001F389", "temperature": 0,
            "max_output_tokens": max_output_tokens}
    engine, engine_key = engine_of(url, pid)
    with httpx.stream("POST", engine + "/v1/responses", headers={"Authorization": f"Bearer {engine_key}"},
                      json={**body, "stream": True}, timeout=600) as r:
        direct = [e["type"] for e in sse(list(r.iter_lines()))]
    if direct[0] == "response.created" and direct.count("response.created") == 1:
        pytest.skip(f"the engine started this answer once itself: {direct[:3]}")
    client = openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0)
    kinds = [e.type for e in client.responses.create(**body, stream=True)]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] in ENDS, kinds
    assert kinds.count("response.created") == 1 and kinds.count("response.in_progress") == 1, kinds


def test_responses_plain_and_streamed(served):
    url, _ = served
    client = openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0)
    done = client.responses.create(model="any", input="Say hello.", max_output_tokens=24)
    assert done.output_text and done.usage.input_tokens > 0  # Responses: cached tokens included
    events = list(client.responses.create(model="any", input="Count to five.", max_output_tokens=24, stream=True))
    kinds = [e.type for e in events]
    assert kinds[0] == "response.created" and kinds[-1] in ENDS
    assert sum(1 for k in kinds if k == "response.output_text.delta") >= 4
    counted = httpx.post(url + "/v1/responses/input_tokens", headers=H, json={"input": "Say hello."}).json()
    assert counted["input_tokens"] == done.usage.input_tokens
    assert settled(url)["admission"]["reserved"] == 0


def test_messages_plain_and_streamed(served):
    url, _ = served
    body = {"model": "any", "max_tokens": 24, "messages": [{"role": "user", "content": "Say hello."}]}
    headers = {**H, "anthropic-version": "2023-06-01"}
    done = httpx.post(url + "/v1/messages", headers=headers, json=body, timeout=600).json()
    assert done["type"] == "message" and done["content"][0]["type"] == "text" and done["content"][0]["text"]
    assert done["usage"]["input_tokens"] > 0
    with httpx.stream("POST", url + "/v1/messages", headers=headers, json={**body, "stream": True}, timeout=600) as r:
        assert r.status_code == 200
        events = sse(list(r.iter_lines()))
    kinds = [e["type"] for e in events]
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert any(e["type"] == "content_block_delta" for e in events)
    counted = httpx.post(url + "/v1/messages/count_tokens", headers=headers, json=body).json()
    usage = done["usage"]  # b11434 counts cached prompt tokens apart
    assert counted["input_tokens"] == usage["input_tokens"] + usage.get("cache_read_input_tokens", 0)
    assert settled(url)["admission"]["reserved"] == 0


def _forced_chat(url: str, choice, stream: bool) -> list[dict]:
    body = {"model": "any", "messages": [{"role": "user", "content": ASK}], "tools": CHAT_TOOLS,
            "tool_choice": choice, "max_tokens": 96, "stream": stream}
    if not stream:
        got = httpx.post(url + "/v1/chat/completions", headers=H, json=body, timeout=600).json()
        return got["choices"][0]["message"].get("tool_calls") or []
    with httpx.stream("POST", url + "/v1/chat/completions", headers=H, json=body, timeout=600) as r:
        chunks = sse(list(r.iter_lines()))
    calls: dict[int, dict] = {}
    for c in chunks:
        for d in (c["choices"][0]["delta"].get("tool_calls") or []) if c.get("choices") else []:
            call = calls.setdefault(d["index"], {"function": {"name": "", "arguments": ""}})
            call["function"]["name"] += d.get("function", {}).get("name") or ""
            call["function"]["arguments"] += d.get("function", {}).get("arguments") or ""
    return list(calls.values())


@pytest.mark.parametrize("stream", [False, True])
def test_chat_tool_calls_for_required_and_a_named_tool(served, stream):
    url, _ = served
    calls = _forced_chat(url, "required", stream)
    assert calls and calls[0]["function"]["name"] in ("get_weather", "get_time")
    json.loads(calls[0]["function"]["arguments"])
    named = _forced_chat(url, {"type": "function", "function": {"name": "get_time"}}, stream)
    assert named and named[0]["function"]["name"] == "get_time"


def test_a_call_cut_by_max_tokens_sent_back_in_the_history_is_served(served):
    """A reply cut mid-call (what b11434 returns with finish_reason length: ``'{"city": "Par'``),
    sent back as LangChain and LiteLLM send it: the engine alone refuses the request (HTTP 500,
    "Failed to parse tool call arguments"); through squad serve it is answered, for chat and
    Responses."""
    url, pid = served
    cut = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
        {"id": "c2", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Par'}}]}
    body = {"model": "any", "max_tokens": 16, "tools": CHAT_TOOLS, "messages": [
        {"role": "user", "content": ASK}, cut, {"role": "tool", "tool_call_id": "c1", "content": "Sunny."},
        {"role": "tool", "tool_call_id": "c2", "content": "error: bad arguments"}]}
    engine, engine_key = engine_of(url, pid)
    direct = httpx.post(engine + "/v1/chat/completions", json=body, timeout=120,
                        headers={"Authorization": f"Bearer {engine_key}"})
    assert direct.status_code == 500 and "Failed to parse tool call arguments" in direct.text
    through = httpx.post(url + "/v1/chat/completions", json=body, headers=H, timeout=300)
    assert through.status_code == 200, through.text
    items = [{"role": "user", "content": ASK},
             {"type": "function_call", "call_id": "c2", "name": "get_weather", "arguments": '{"city": "Par'},
             {"type": "function_call_output", "call_id": "c2", "output": "error: bad arguments"}]
    responses = httpx.post(url + "/v1/responses", headers=H, timeout=300,
                           json={"model": "any", "max_output_tokens": 16, "tools": RESP_TOOLS, "input": items})
    assert responses.status_code == 200, responses.text


@pytest.mark.parametrize("stream", [False, True])
def test_responses_function_calls_for_required_and_a_named_tool(served, stream):
    url, _ = served
    client = openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0)
    for choice, names in (("required", ("get_weather", "get_time")), ({"type": "function", "name": "get_time"},
                                                                      ("get_time",))):
        kwargs = dict(model="any", input=ASK, tools=RESP_TOOLS, tool_choice=choice, max_output_tokens=96)
        if stream:
            events = list(client.responses.create(stream=True, **kwargs))
            assert any(e.type == "response.function_call_arguments.delta" for e in events)
            output = events[-1].response.output
        else:
            output = client.responses.create(**kwargs).output
        calls = [o for o in output if o.type == "function_call"]
        assert calls and calls[0].name in names, output
        json.loads(calls[0].arguments)


@pytest.mark.parametrize("stream", [False, True])
def test_messages_tool_use_for_any_and_a_named_tool(served, stream):
    url, _ = served
    headers = {**H, "anthropic-version": "2023-06-01"}
    for choice, names in (({"type": "any"}, ("get_weather", "get_time")), ({"type": "tool", "name": "get_time"},
                                                                          ("get_time",))):
        body = {"model": "any", "max_tokens": 96, "messages": [{"role": "user", "content": ASK}], "tools": MSG_TOOLS,
                "tool_choice": choice, "stream": stream}
        if stream:
            with httpx.stream("POST", url + "/v1/messages", headers=headers, json=body, timeout=600) as r:
                events = sse(list(r.iter_lines()))
            starts = [e["content_block"] for e in events if e["type"] == "content_block_start"]
            uses = [b for b in starts if b["type"] == "tool_use"]
            assert any(e["type"] == "content_block_delta" and e["delta"]["type"] == "input_json_delta" for e in events)
        else:
            done = httpx.post(url + "/v1/messages", headers=headers, json=body, timeout=600).json()
            uses = [b for b in done["content"] if b["type"] == "tool_use"]
            assert done["stop_reason"] in ("tool_use", "max_tokens")  # b11434: "length" after the call is max_tokens
            assert isinstance(uses[0]["input"], dict)
        assert uses and uses[0]["name"] in names


@pytest.mark.parametrize("path", ["/v1/responses", "/v1/messages"])
def test_an_answer_not_streamed_is_the_engines_own_shape(served, path):
    """squad serve streams a Responses or Messages request the client did not stream (so the engine
    stops it when the client leaves) and puts the answer together: at temperature 0 it has the
    keys, the output and the usage the engine answers directly, for text and for a forced tool."""
    url, pid = served
    engine, engine_key = engine_of(url, pid)
    if path == "/v1/responses":
        cases = [{"input": "Write the Korean word \uc548\ub155 twice.", "max_output_tokens": 16},
                 {"input": ASK, "tools": RESP_TOOLS, "tool_choice": {"type": "function", "name": "get_weather"},
                  "max_output_tokens": 64}]
    else:
        cases = [{"messages": [{"role": "user", "content": "Write the Korean word \uc548\ub155 twice."}],
                  "max_tokens": 16},
                 {"messages": [{"role": "user", "content": ASK}], "tools": MSG_TOOLS,
                  "tool_choice": {"type": "tool", "name": "get_weather"}, "max_tokens": 64}]
    for case in cases:
        body = {**case, "model": "any", "temperature": 0}
        direct = httpx.post(engine + path, headers={"Authorization": f"Bearer {engine_key}"}, json=body,
                            timeout=600)
        through = httpx.post(url + path, headers={**H, "anthropic-version": "2023-06-01"}, json=body, timeout=600)
        assert through.status_code == 200, through.text
        d, t = direct.json(), through.json()
        assert set(d) <= set(t), (sorted(t), sorted(d))  # and the fields the SDK requires (squad.serve.shapes)
        if path == "/v1/responses":
            cut = t["usage"]["output_tokens"] >= case["max_output_tokens"]  # incomplete, as OpenAI says
            assert t["status"] == ("incomplete" if cut else d["status"]) and set(d["usage"]) <= set(t["usage"])
            if "tools" in case:  # forced through serve, as the engine does not force it (squad.serve.forcing)
                call = next(o for o in t["output"] if o["type"] == "function_call")
                assert call["name"] == "get_weather" and isinstance(json.loads(call["arguments"]), dict)
            else:
                text = lambda r: "".join(c["text"] for o in r["output"] if o["type"] == "message"  # noqa: E731
                                         for c in o["content"])
                assert text(t) == text(d) and text(t)
                assert [o["type"] for o in t["output"]] == [o["type"] for o in d["output"]]
                assert t["usage"]["output_tokens"] == d["usage"]["output_tokens"]
        else:
            assert t["type"] == "message" and t["stop_reason"] == d["stop_reason"] or "tools" in case
            assert t["usage"]["output_tokens"] == d["usage"]["output_tokens"] or "tools" in case
            assert set(t["usage"]) == set(d["usage"])
            if "tools" in case:
                use = next(c for c in t["content"] if c["type"] == "tool_use")
                assert use["name"] == "get_weather" and isinstance(use["input"], dict) and use["id"]
            else:
                assert t["content"] == d["content"] and t["content"][0]["text"]


def test_structured_output_for_chat_and_responses(served):
    url, _ = served
    schema = {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
              "required": ["city", "days"], "additionalProperties": False}
    client = openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0)
    chat = client.chat.completions.create(
        model="any", messages=[{"role": "user", "content": "A trip: Paris, 3 days. As JSON."}], max_tokens=64,
        response_format={"type": "json_schema", "json_schema": {"name": "trip", "schema": schema}})
    assert set(json.loads(chat.choices[0].message.content)) == {"city", "days"}
    resp = client.responses.create(model="any", input="A trip: Paris, 3 days. As JSON.", max_output_tokens=64,
                                   text={"format": {"type": "json_schema", "name": "trip", "schema": schema}})
    assert set(json.loads(resp.output_text)) == {"city", "days"}


@pytest.mark.timeout(900)
def test_a_burst_of_responses_and_messages_overflows_directly_and_completes_through_serve(served):
    """Eight streams (four Responses, four Messages), each ~650 prompt tokens + 48 generated
    (ignore_eos; a Messages answer that ends its turn before is whole too): four at once need more than the 2,048-token
    pool."""
    url, pid = served
    engine, engine_key = engine_of(url, pid)

    async def burst(base: str, key: str) -> list:
        got: list = [None] * 8
        headers = {"Authorization": f"Bearer {key}", "anthropic-version": "2023-06-01"}

        async def one(client: httpx.AsyncClient, i: int) -> None:
            words = " ".join(f"w{i}x{k}" for k in range(120))
            if i % 2:
                path, body = "/v1/responses", {"input": f"Repeat: {words}", "max_output_tokens": 48}
            else:
                path, body = "/v1/messages", {"messages": [{"role": "user", "content": f"Repeat: {words}"}],
                                              "max_tokens": 48}
            body |= {"model": "any", "stream": True, "ignore_eos": True}
            try:
                async with client.stream("POST", path, json=body, headers=headers) as r:
                    if r.status_code != 200:
                        got[i] = r.status_code
                        return
                    lines = [line async for line in r.aiter_lines()]
                events = sse(lines)
                if any("error" in e for e in events):
                    got[i] = "error frame"
                elif i % 2:
                    done = [e for e in events if e.get("type") in ENDS]
                    got[i] = done[0]["response"]["usage"]["output_tokens"] if done else "truncated"
                else:  # b11434 drops ignore_eos from a Messages body (server_chat_convert_anthropic_to_oai),
                    # so a whole answer may end at the model's own end of turn before 48 tokens
                    ends = [e for e in events if e.get("type") == "message_delta"]
                    whole = bool(ends) and ends[-1]["delta"].get("stop_reason") == "end_turn" and events[-1].get(
                        "type") == "message_stop"
                    got[i] = 48 if whole else ends[-1]["usage"]["output_tokens"] if ends else "truncated"
            except httpx.HTTPError as exc:
                got[i] = type(exc).__name__

        async with httpx.AsyncClient(base_url=base, timeout=300) as client:
            async with anyio.create_task_group() as tg:
                for i in range(8):
                    tg.start_soon(one, client, i)
        return got

    direct = anyio.run(burst, engine, engine_key)
    assert any(got != 48 for got in direct), direct
    through = anyio.run(burst, url, KEY)
    assert through == [48] * 8, through
    assert status(url)["peaks"]["requests"] >= 4


@pytest.mark.parametrize("path", ["/v1/responses", "/v1/messages"])
def test_a_disconnect_mid_stream_frees_the_reservation_and_the_slot(served, path):
    url, _ = served
    body = ({"input": "Write a long story.", "max_output_tokens": 1500} if path == "/v1/responses" else
            {"messages": [{"role": "user", "content": "Write a long story."}], "max_tokens": 1500})
    body |= {"model": "any", "stream": True, "ignore_eos": True, "metadata": {"user_id": "leaver"}}
    if path == "/v1/responses":
        body.pop("metadata")
        body["user"] = "leaver"
    with httpx.stream("POST", url + path, headers={**H, "anthropic-version": "2023-06-01"}, json=body,
                      timeout=60) as r:
        for line in r.iter_lines():
            if line.startswith("data: ") and "delta" in line:
                assert status(url)["admission"]["reserved"] > 1500
                break
    now = settled(url)
    assert now["clients"]["leaver"]["disconnected"] >= 1


def test_embeddings_are_admitted_and_passed_on(served):
    """The engine squad serve starts has no --embeddings: the engine's own 501 comes back, and
    the reservation is released."""
    url, _ = served
    r = httpx.post(url + "/v1/embeddings", headers=H, json={"model": "any", "input": ["one text", "another"]})
    assert r.status_code == 501 and "--embeddings" in r.json()["error"]["message"]
    assert settled(url)["admission"]["reserved"] == 0
    for path in ("/tokenize", "/apply-template"):
        body = {"content": "hi"} if path == "/tokenize" else {"messages": [{"role": "user", "content": "hi"}]}
        assert httpx.post(url + path, headers=H, json=body).status_code == 200
    assert httpx.post(url + "/detokenize", headers=H, json={"tokens": [1, 2]}).status_code == 200

"""``squad serve``'s rewrites for other clients, without an engine: tool choice forced the way
squad's own client forces it, Responses ``text.format`` as ``response_format``, client names
from each API's fields, CORS preflights. The real engine: tests/serve/test_serve_apis_real.py."""

from __future__ import annotations

import anyio
import httpx
import pytest

from squad.engine.session import EngineSpec
from squad.serve import serving
from squad.serve.apis import client_field, prepare
from squad.serve.demand import Refused, read_max_tokens
from squad.serve.forcing import force_chat, force_messages, force_responses, repair_history
from squad.testing import FakeEngine

PREFIX = "<tool_call>\n"
CHAT_TOOLS = [{"type": "function", "function": {"name": n, "parameters": {"type": "object"}}} for n in ("a", "b")]
RESP_TOOLS = [{"type": "function", "name": n, "parameters": {"type": "object"}} for n in ("a", "b")]
MSG_TOOLS = [{"name": n, "input_schema": {"type": "object"}} for n in ("a", "b")]
USER = [{"role": "user", "content": "hi"}]


def test_chat_required_is_prefilled_and_a_named_tool_is_required_alone():
    body = {"messages": USER, "tools": CHAT_TOOLS, "tool_choice": "required",
            "response_format": {"type": "json_object"}}
    sent = force_chat(body, PREFIX)
    assert sent["messages"][-1] == {"role": "assistant", "content": PREFIX}
    assert "response_format" not in sent  # its grammar would win over the call
    assert body["messages"] == USER  # the client's body is not changed in place
    named = force_chat({"messages": USER, "tools": CHAT_TOOLS,
                        "tool_choice": {"type": "function", "function": {"name": "b"}}}, PREFIX)
    assert named["tool_choice"] == "required" and [t["function"]["name"] for t in named["tools"]] == ["b"]
    assert named["messages"][-1]["content"] == PREFIX
    for unchanged in ({"messages": USER, "tools": CHAT_TOOLS},
                      {"messages": USER, "tools": CHAT_TOOLS, "tool_choice": "auto"},
                      {"messages": USER, "tool_choice": "required"}):
        assert force_chat(unchanged, PREFIX) == unchanged
    no_template = force_chat({"messages": USER, "tools": CHAT_TOOLS, "tool_choice": "required"}, None)
    assert no_template["messages"] == USER  # the engine's own template: no prefix known, none added


def test_a_named_tool_not_offered_is_a_400_naming_the_offered_ones():
    with pytest.raises(Refused) as got:
        force_chat({"messages": USER, "tools": CHAT_TOOLS,
                    "tool_choice": {"type": "function", "function": {"name": "z"}}},
                   PREFIX)
    assert got.value.status == 400 and "'z'" in got.value.body["error"]["message"]
    assert "a, b" in got.value.body["error"]["message"]


def test_responses_forcing_and_text_format():
    sent = force_responses({"input": "hi", "tools": RESP_TOOLS, "tool_choice": {"type": "function", "name": "a"}},
                           PREFIX)
    assert sent["tool_choice"] == "required" and [t["name"] for t in sent["tools"]] == ["a"]
    assert sent["input"] == [{"role": "user", "content": "hi"},
                             {"type": "message", "role": "assistant",
                              "content": [{"type": "output_text", "text": PREFIX}]}]
    after_call = [{"role": "user", "content": "hi"},
                  {"type": "function_call", "call_id": "c1", "name": "a", "arguments": "{}"}]
    assert force_responses({"input": after_call, "tools": RESP_TOOLS, "tool_choice": "required"},
                           PREFIX)["input"] == after_call
    schema = {"type": "object", "properties": {"x": {"type": "integer"}}}
    fmt = force_responses({"input": "hi", "text": {"format": {"type": "json_schema", "name": "X", "schema": schema}}},
                          None)
    assert fmt["response_format"] == {"type": "json_schema",
                                      "json_schema": {"name": "X", "schema": schema, "strict": True}}
    assert force_responses({"input": "hi", "text": {"format": {"type": "json_object"}}}, None)["response_format"] == \
        {"type": "json_object"}
    plain = {"input": "hi", "text": {"format": {"type": "text"}}}
    assert prepare(plain, "responses", PREFIX) is plain


CUT_CALLS = [{"id": "a", "type": "function",
              "function": {"name": "get_weather", "arguments": '{\n  "city": "Paris"\n}'}},
             {"id": "b", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Par'}},
             {"id": "c", "type": "function", "function": {"name": "get_weather", "arguments": '["Paris"]'}},
             {"id": "d", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}]


def test_unfinished_call_arguments_in_the_history_go_back_as_an_empty_object():
    """What b11434 returned with finish_reason length (the second of two calls cut mid-way), as a
    client sends it back: every call but the JSON objects gets ``{}``; nothing else changes."""
    history = [*USER, {"role": "assistant", "content": None, "tool_calls": CUT_CALLS},
               {"role": "tool", "tool_call_id": "a", "content": "sunny"}]
    body = {"messages": history, "tools": CHAT_TOOLS}
    sent = prepare(body, "chat", PREFIX)
    args = [c["function"]["arguments"] for c in sent["messages"][1]["tool_calls"]]
    assert args == ['{\n  "city": "Paris"\n}', "{}", "{}", {"city": "Oslo"}]
    assert sent["messages"][0] is history[0] and sent["messages"][2] is history[2]
    assert body["messages"][1]["tool_calls"][1]["function"]["arguments"] == '{"city": "Par'  # the client's body is kept
    whole = {"messages": [*USER, {"role": "assistant", "tool_calls": CUT_CALLS[:1]}]}
    assert repair_history(whole, "chat") is whole
    items = [{"role": "user", "content": "hi"},
             {"type": "function_call", "call_id": "x", "name": "get_weather", "arguments": '{"city": '},
             {"type": "function_call", "call_id": "y", "name": "get_weather", "arguments": '{"city": "Oslo"}'}]
    fixed = prepare({"input": items}, "responses", PREFIX)["input"]
    assert [i.get("arguments") for i in fixed] == [None, "{}", '{"city": "Oslo"}'] and fixed[2] is items[2]


def test_messages_forcing():
    sent = force_messages({"messages": USER, "tools": MSG_TOOLS, "tool_choice": {"type": "tool", "name": "b"}}, PREFIX)
    assert sent["tool_choice"] == {"type": "any"} and [t["name"] for t in sent["tools"]] == ["b"]
    assert sent["messages"][-1] == {"role": "assistant", "content": PREFIX}
    none = force_messages({"messages": USER, "tools": MSG_TOOLS, "tool_choice": {"type": "none"}}, PREFIX)
    assert "tools" not in none and "tool_choice" not in none
    auto = {"messages": USER, "tools": MSG_TOOLS, "tool_choice": {"type": "auto"}}
    assert prepare(auto, "messages", PREFIX) is auto


def test_client_names_and_max_output_tokens():
    assert client_field({"user": "u1"}) == "u1"
    assert client_field({"metadata": {"user_id": "claude-1"}}) == "claude-1"
    assert client_field({"safety_identifier": "s"}) == "s"
    assert client_field({"metadata": "x"}) is None
    assert client_field({"metadata": {"user_id": '{"device_id": "5f28"}'}}) is None
    assert read_max_tokens({"max_output_tokens": 77}) == 77



@pytest.mark.anyio
async def test_cors_preflight_and_allowed_origins():
    async with FakeEngine(slots=1) as fe:
        spec = EngineSpec(url=fe.base_url, api_key=fe.api_key)
        async with serving(spec, port=0, cors_origins=("http://app.local:3000",)) as served:
            async with httpx.AsyncClient(base_url=served.url, timeout=10) as client:
                ask = {"Access-Control-Request-Method": "POST",
                       "Access-Control-Request-Headers": "authorization, content-type"}
                ok = await client.options("/v1/messages", headers={"Origin": "http://app.local:3000", **ask})
                assert ok.status_code == 204
                assert ok.headers["access-control-allow-origin"] == "http://app.local:3000"
                assert "POST" in ok.headers["access-control-allow-methods"]
                assert ok.headers["access-control-allow-headers"] == "authorization, content-type"
                other = await client.options("/v1/chat/completions", headers={"Origin": "http://evil.test", **ask})
                assert other.status_code == 403 and "--cors-origin" in other.json()["error"]["message"]
                assert "access-control-allow-origin" not in other.headers
                own = await client.options("/v1/models", headers={"Origin": served.url, **ask})
                assert own.status_code == 204 and own.headers["access-control-allow-origin"] == served.url
                plain = await client.options("/v1/models")
                assert plain.status_code == 204 and "GET" in plain.headers["allow"]
                got = await client.get("/v1/models", headers={"Origin": "http://app.local:3000",
                                                               "Authorization": f"Bearer {served.api_key}"})
                assert got.status_code == 200 and got.headers["access-control-allow-origin"] == "http://app.local:3000"
                denied = await client.get("/v1/models", headers={"Origin": "http://evil.test",
                                                                 "Authorization": f"Bearer {served.api_key}"})
                assert "access-control-allow-origin" not in denied.headers


@pytest.mark.anyio
async def test_a_queued_stream_starts_early_and_keeps_its_connection_alive(monkeypatch):
    """Queued behind a running request, a stream gets its status line and keep-alive comments
    (which the openai SDK skips) before it is admitted; a read timeout shorter than its wait
    does not trip; /squad/status and the watch view say what it waits for."""
    import openai

    from squad.serve import early
    from squad.serve.watch import ServeWatch

    monkeypatch.setattr(early, "EARLY_AFTER", 0.2)
    monkeypatch.setattr(early, "KEEPALIVE_EVERY", 0.3)
    async with FakeEngine(slots=1, token_delay=0.02) as fe:
        spec = EngineSpec(url=fe.base_url, api_key=fe.api_key)
        async with serving(spec, port=0) as served:
            headers = {"Authorization": f"Bearer {served.api_key}"}
            async with httpx.AsyncClient(base_url=served.url, headers=headers, timeout=30) as client:
                body = {"messages": USER, "max_tokens": 2000, "stream": True}
                async with client.stream("POST", "/v1/chat/completions", json=body) as first:
                    lines = first.aiter_lines()
                    while not (await lines.__anext__()).startswith("data: "):
                        pass
                    sdk = openai.AsyncOpenAI(base_url=served.base_url, api_key=served.api_key, max_retries=0,
                                             timeout=openai.Timeout(30, read=0.8))  # httpx2 in newer SDKs
                    async with anyio.create_task_group() as tg:
                        got: list[str] = []

                        async def second() -> None:
                            stream = await sdk.chat.completions.create(model="x", messages=USER, max_tokens=5,
                                                                       stream=True,
                                                                       extra_headers={"X-Squad-Client": "late"})
                            got.extend([c.choices[0].delta.content or "" async for c in stream if c.choices])

                        tg.start_soon(second)
                        await anyio.sleep(1.5)  # queued for longer than its read timeout
                        (queued,) = served.gateway.status()["queued"]
                        assert queued["client"] == "late" and queued["waits_for"] == "a slot (all 1 busy)"
                        view = ServeWatch(served.gateway, ["squad serve on URL  key KEY"], live=False)
                        from rich.console import Console

                        console = Console(record=True, width=200)
                        console.print(view.render())
                        text = console.export_text()
                        assert "key KEY" in text and "a slot (all 1 busy)" in text and "late" in text
                        await first.aclose()  # the first leaves: the second is admitted
                await sdk.close()
            assert "".join(got).strip()
            assert served.gateway.status()["clients"]["late"]["completed"] == 1


@pytest.mark.anyio
async def test_a_labelled_key_names_its_client_and_body_fields_name_others():
    async with FakeEngine(slots=2) as fe:
        spec = EngineSpec(url=fe.base_url, api_key=fe.api_key)
        async with serving(spec, port=0, client_keys={"editor": "editor-key-123"}) as served:
            async with httpx.AsyncClient(base_url=served.url, timeout=30) as client:
                body = {"messages": USER, "max_tokens": 3}
                r = await client.post("/v1/chat/completions", json=body, headers={"X-Api-Key": "editor-key-123"})
                assert r.status_code == 200
                r = await client.post("/v1/chat/completions", json={**body, "user": "alice"},
                                      headers={"Authorization": f"Bearer {served.api_key}"})
                assert r.status_code == 200
                assert (await client.get("/v1/models", headers={"X-Api-Key": "wrong-key-123"})).status_code == 401
            clients = served.gateway.status()["clients"]
    assert clients["editor"]["completed"] == 1 and clients["alice"]["completed"] == 1


def _events(raw: bytes) -> list[str]:
    import json

    return [json.loads(line[6:])["type"] if b'"error"' not in line else "error"
            for line in raw.split(b"\n") if line.startswith(b"data: ")]


@pytest.mark.parametrize("cut", [1, 7, 40, 10_000])
def test_a_messages_stream_without_message_start_gets_one_and_is_otherwise_untouched(cut):
    """Shapes b11434 sent here: a stream whose first token ended inside a character starts at
    ``content_block_start``; one that did not starts at ``message_start``. Fed in pieces of
    ``cut`` bytes."""
    from squad.serve.stream_start import MessagesStart

    block = (b'event: content_block_start\ndata: {"type": "content_block_start", "index": 0, '
             b'"content_block": {"type": "text", "text": ""}}\n\n'
             b'event: content_block_delta\ndata: {"type": "content_block_delta", "index": 0, '
             b'"delta": {"type": "text_delta", "text": "\xec\x95\x88"}}\n\n'
             b'event: message_stop\ndata: {"type": "message_stop"}\n\n')
    started = b'event: message_start\ndata: {"type": "message_start", "message": {"id": "m"}}\n\n' + block

    def relay(raw: bytes, start: MessagesStart) -> bytes:
        return b"".join(start.feed(raw[i:i + cut]) for i in range(0, len(raw), cut)) + start.end()

    fixer = MessagesStart(model="any", input_tokens=12)
    out = relay(block, fixer)
    assert fixer.mended and out.endswith(block)
    assert _events(out) == ["message_start", "content_block_start", "content_block_delta", "message_stop"]
    assert b'"input_tokens": 12' in out and b'"model": "any"' in out
    kept = MessagesStart(model="any", input_tokens=12)
    assert relay(started, kept) == started and not kept.mended
    comment = b": queued in squad serve for 1 s\n\n" + block  # a keep-alive comment is not the first event
    assert _events(relay(comment, MessagesStart(model="any", input_tokens=1)))[0] == "message_start"
    error = b'data: {"error": {"code": 500, "message": "x"}}\n\n'
    assert relay(error, MessagesStart(model="any", input_tokens=1)) == error
    partial = b'event: content_block_start\ndata: {"type"'  # the engine broke off mid-event
    assert relay(partial, MessagesStart(model="any", input_tokens=1)) == partial


@pytest.mark.parametrize("cut", [1, 9, 10_000])
def test_a_chat_stream_whose_first_chunk_has_no_role_gets_one(cut):
    """b11434's first chat chunk when the first token ended inside a character: no ``role``."""
    import json

    from squad.serve.stream_start import ChatRole

    first = {"choices": [{"finish_reason": None, "index": 0, "delta": {"content": "\U0001F389"}}],
             "object": "chat.completion.chunk", "id": "chatcmpl-1"}
    rest = b'data: {"choices": [{"index": 0, "delta": {"content": "x"}}]}\n\ndata: [DONE]\n\n'
    raw = b": queued in squad serve for 1 s\n\n" + b"data: " + json.dumps(first).encode() + b"\n\n" + rest

    def relay(raw: bytes) -> bytes:
        mender = ChatRole()
        return b"".join(mender.feed(raw[i:i + cut]) for i in range(0, len(raw), cut)) + mender.end()

    out = relay(raw)
    assert out.startswith(b": queued") and out.endswith(rest)
    chunks = [json.loads(line[6:]) for line in out.split(b"\n") if line.startswith(b"data: {")]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": "\U0001F389"}
    assert chunks[0]["id"] == "chatcmpl-1" and "role" not in chunks[1]["choices"][0]["delta"]
    whole = b'data: {"choices": [{"index": 0, "delta": {"role": "assistant", "content": null}}]}\n\n' + rest
    assert relay(whole) == whole


@pytest.mark.parametrize("cut", [1, 13, 10_000])
def test_a_responses_stream_gets_one_created_and_one_in_progress_first(cut):
    """b11434's shapes when the first token ended inside a character: the pair repeated after
    every token, or (one or two tokens) only ``response.completed``."""
    import json

    from squad.serve.stream_start import ResponsesStart

    def ev(kind: str, **data) -> bytes:
        return f"event: {kind}\ndata: {json.dumps({'type': kind, **data})}\n\n".encode()

    created, progress = ev("response.created", response={"id": "r1"}), ev("response.in_progress", response={"id": "r1"})
    delta, completed = ev("response.output_text.delta", delta="\U0001F389"), ev("response.completed",
                                                                               response={"id": "r1"})

    def relay(raw: bytes) -> list[str]:
        mender = ResponsesStart(model="any")
        out = b"".join(mender.feed(raw[i:i + cut]) for i in range(0, len(raw), cut)) + mender.end()
        return [json.loads(line[6:])["type"] for line in out.split(b"\n") if line.startswith(b"data: ")]

    repeated = created + progress + delta + created + progress + delta + created + progress + completed
    assert relay(repeated) == ["response.created", "response.in_progress", "response.output_text.delta",
                               "response.output_text.delta", "response.completed"]
    assert relay(completed) == ["response.created", "response.in_progress", "response.completed"]
    whole = created + progress + delta + completed
    mender = ResponsesStart(model="any")
    assert mender.feed(whole) == whole and not mender.mended

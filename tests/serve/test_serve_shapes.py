"""Answers in their API's own shape (squad.serve.shapes), without an engine: streams shaped as
llama-server b11434 writes them (``tools/server/server-task.cpp``), cut at any byte, go through
squad serve's menders and are checked with the openai and anthropic SDKs' own models and stream
accumulators; whole answers likewise; the text the model wrote comes out unchanged. The real
engine: tests/serve/test_serve_shapes_real.py."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import httpx
import httpx2
import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from api_shapes_support import check_answer, check_events, sse
from squad.engine.session import EngineSpec
from squad.serve import serving
from squad.serve.assemble import Assembly
from squad.serve.forcing import force_messages
from squad.serve.shapes import OUTPUT_TOOL, asked_of, mend_answer, stream_mender
from squad.testing import FakeEngine
from squad.testing.generation import Reply

ENGINE_MODEL = "/root/.cache/squad/models/SmolLM2-135M-Instruct.Q4_1.gguf"
FAST = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])

words = st.lists(st.sampled_from(["Hi", " there", "!", "\n", " 안녕", "🎉", ' "q"', "\\", "{}"]), max_size=6)


@st.composite
def _call(draw: Any) -> tuple[str, list[str]]:
    """A tool call as the engine streams it: a name, and its JSON arguments in pieces."""
    args = json.dumps(draw(st.dictionaries(st.sampled_from(["city", "n"]), st.sampled_from(["Paris", "é", 3]),
                                           max_size=2)), ensure_ascii=False)
    cuts = sorted(draw(st.lists(st.integers(1, max(1, len(args) - 1)), max_size=4)))
    return draw(st.sampled_from(["get_weather", "get_time"])), [args[a:b] for a, b in zip([0, *cuts], [*cuts, None])
                                                                if args[a:b]]


calls = st.lists(_call(), max_size=3)


def frames(events: list[dict[str, Any]], *, named: bool) -> bytes:
    """SSE bytes as b11434 writes them (``event:`` lines for Responses and Messages)."""
    out = b""
    for e in events:
        head = f"event: {e['type']}\n".encode() if named else b""
        out += head + b"data: " + json.dumps(e, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"
    return out


def cut(raw: bytes, points: list[int]) -> list[bytes]:
    """``raw`` in pieces at ``points`` (as TCP may deliver it)."""
    edges = sorted({min(p, len(raw)) for p in points} | {0, len(raw)})
    return [raw[a:b] for a, b in zip(edges, edges[1:])]


def replayed(raw: bytes, http: Any = httpx) -> Any:
    """An HTTP client (of ``http``: httpx for openai, httpx2 for anthropic) whose every request is
    answered with the SSE body ``raw``: the SDKs' own stream helpers read it as from a server."""
    return http.Client(transport=http.MockTransport(
        lambda request: http.Response(200, content=raw, headers={"content-type": "text/event-stream"})))


def mended(asked, raw: bytes, points: list[int]) -> bytes:
    mender = stream_mender(asked)
    assert mender is not None
    return b"".join(mender.feed(piece) for piece in cut(raw, points)) + mender.end()


# -- Responses --------------------------------------------------------------------------------------------


def b11434_responses(text: list[str], tool_calls: list[tuple[str, list[str]]], output_tokens: int) -> list[dict]:
    """A Responses stream as b11434 writes it: ``to_json_oaicompat_resp`` (partials) and
    ``to_json_oaicompat_resp_stream`` (the final events): no sequence_number, output_index,
    content_index; a response object of id/object/status only until the end."""
    rid, mid = "resp_abc", "msg_def"
    start = {"id": rid, "object": "response", "status": "in_progress"}
    ev: list[dict] = [{"type": "response.created", "response": start},
                      {"type": "response.in_progress", "response": start}]
    if text:
        ev += [{"type": "response.output_item.added", "item": {"content": [], "id": mid, "role": "assistant",
                                                               "status": "in_progress", "type": "message"}},
               {"type": "response.content_part.added", "item_id": mid, "part": {"type": "output_text", "text": ""}}]
        ev += [{"type": "response.output_text.delta", "item_id": mid, "delta": d} for d in text]
    for i, (name, args) in enumerate(tool_calls):
        ev.append({"type": "response.output_item.added", "item": {
            "id": f"fc_{i}", "arguments": "", "call_id": f"call_{i}", "name": name, "type": "function_call",
            "status": "in_progress"}})
        ev += [{"type": "response.function_call_arguments.delta", "delta": a, "item_id": f"fc_{i}"} for a in args]
    output = []
    if text:
        part = {"type": "output_text", "annotations": [], "logprobs": [], "text": "".join(text)}
        item = {"type": "message", "status": "completed", "id": mid, "content": [part], "role": "assistant"}
        ev += [{"type": "response.output_text.done", "item_id": mid, "text": "".join(text)},
               {"type": "response.content_part.done", "item_id": mid, "part": part},
               {"type": "response.output_item.done", "item": item}]
        output.append(item)
    for i, (name, args) in enumerate(tool_calls):
        item = {"id": f"fc_{i}", "type": "function_call", "status": "completed", "arguments": "".join(args),
                "call_id": f"call_{i}", "name": name}
        ev.append({"type": "response.output_item.done", "item": item})
        output.append(item)
    ev.append({"type": "response.completed", "response": {
        "id": rid, "object": "response", "created_at": 1, "status": "completed", "model": ENGINE_MODEL,
        "output": output, "usage": {"input_tokens": 9, "output_tokens": output_tokens,
                                    "total_tokens": 9 + output_tokens, "input_tokens_details": {"cached_tokens": 2}}}})
    return ev


@FAST
@given(text=words, tool_calls=calls, limit=st.integers(1, 12), used=st.integers(1, 12), parallel=st.booleans(),
       points=st.lists(st.integers(0, 4000), max_size=8))
def test_a_responses_stream_is_the_sdks_shape_whatever_the_engine_wrote(text, tool_calls, limit, used, parallel,
                                                                           points):
    used = min(used, limit)
    client = {"model": "gpt-x", "input": "hi", "max_output_tokens": limit, "stream": True,
              **({} if parallel else {"parallel_tool_calls": False})}
    raw = frames(b11434_responses(text, tool_calls, used), named=True)
    events = sse(mended(asked_of(client, "responses", limit=limit), raw, points))
    check_events("responses", events)  # every event the SDK's model of its type, strictly
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    client_sdk = openai.OpenAI(api_key="k", base_url="http://serve/v1", http_client=replayed(
        b"".join(b"event: " + e["type"].encode() + b"\ndata: " + json.dumps(e).encode() + b"\n\n" for e in events)))
    with client_sdk.responses.stream(model="gpt-x", input="hi") as stream:  # the SDK's own stream helper
        seen = [e.type for e in stream]
        final = stream.get_final_response() if seen[-1] == "response.completed" else None
    last = events[-1]
    assert last["response"]["model"] == "gpt-x" and last["response"]["id"] == events[0]["response"]["id"]
    if used >= limit:
        assert last["type"] == "response.incomplete" and last["response"]["status"] == "incomplete"
        assert last["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
        return
    assert last["type"] == "response.completed" and final is not None and final.status == "completed"
    assert final.output_text == "".join(text)  # the model's text, unchanged
    got_calls = [(o.name, o.arguments) for o in final.output if o.type == "function_call"]
    want = [(n, "".join(a)) for n, a in tool_calls]
    assert got_calls == (want if parallel else want[:1])
    assert all(e["item_id"] not in {f"fc_{i}" for i in range(1, len(tool_calls))}
               for e in events if "item_id" in e and not parallel)


def test_a_whole_responses_answer_echoes_the_request_and_says_incomplete():
    client = {"model": "gpt-x", "input": "hi", "max_output_tokens": 5, "parallel_tool_calls": False,
              "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}], "tool_choice": "auto"}
    engine = b11434_responses(["a"], [("f", ["{}"]), ("f", ["{}"])], 5)[-1]["response"]
    body = mend_answer(asked_of(client, "responses", limit=5), engine)
    check_answer("responses", body)
    assert body["model"] == "gpt-x" and body["status"] == "incomplete" and body["tools"] == client["tools"]
    assert body["parallel_tool_calls"] is False and [o["type"] for o in body["output"]] == ["message", "function_call"]
    done = mend_answer(asked_of({**client, "max_output_tokens": 6}, "responses", limit=6), engine)
    assert done["status"] == "completed" and done["incomplete_details"] is None


# -- Messages ----------------------------------------------------------------------------------------------


def b11434_messages(text: list[str], tool_calls: list[tuple[str, list[str]]], stop: str | None) -> list[dict]:
    """A Messages stream as b11434 writes it (``to_json_anthropic`` partials and final): a
    ``chatcmpl-`` id, the model file as model, ``end_turn`` for a stop word, tool_use blocks
    without ``input``."""
    ev: list[dict] = [{"type": "message_start", "message": {
        "id": "chatcmpl-xyz", "type": "message", "role": "assistant", "content": [], "model": ENGINE_MODEL,
        "stop_reason": None, "stop_sequence": None,
        "usage": {"cache_read_input_tokens": 0, "input_tokens": 7, "output_tokens": 0}}}]
    index = 0
    if text:
        ev.append({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}})
        ev += [{"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": t}} for t in text]
        index = 1
    for i, (name, args) in enumerate(tool_calls):
        ev.append({"type": "content_block_start", "index": index + i,
                   "content_block": {"type": "tool_use", "id": f"t{i}", "name": name}})
        ev += [{"type": "content_block_delta", "index": index + i,
                "delta": {"type": "input_json_delta", "partial_json": a}} for a in args]
    ev += [{"type": "content_block_stop", "index": i} for i in range(index + len(tool_calls))]
    reason = "tool_use" if tool_calls else "end_turn"
    ev += [{"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": stop},
            "usage": {"output_tokens": 9}}, {"type": "message_stop"}]
    return ev


def _final(raw: bytes) -> anthropic.types.Message:
    check_events("messages", sse(raw))
    client = anthropic.Anthropic(api_key="k", base_url="http://serve", http_client=replayed(raw, httpx2))
    with client.messages.stream(model="claude-x", max_tokens=9, messages=[]) as stream:  # the SDK's stream helper
        return stream.get_final_message()


@FAST
@given(text=words, tool_calls=calls, stop=st.sampled_from([None, ".", " "]), parallel=st.booleans(),
       points=st.lists(st.integers(0, 4000), max_size=8))
def test_a_messages_stream_is_the_sdks_shape_whatever_the_engine_wrote(text, tool_calls, stop, parallel, points):
    choice = {"type": "auto", **({} if parallel else {"disable_parallel_tool_use": True})}
    client = {"model": "claude-x", "max_tokens": 9, "messages": [], "tool_choice": choice}
    raw = frames(b11434_messages(text, tool_calls if not stop else [], stop), named=True)
    final = _final(mended(asked_of(client, "messages", limit=9), raw, points))
    assert final.id.startswith("msg_") and final.model == "claude-x"
    assert (final.stop_reason == "stop_sequence") == (stop is not None) and final.stop_sequence == stop
    assert "".join(b.text for b in final.content if b.type == "text") == "".join(text)  # unchanged
    uses = [(b.name, b.input) for b in final.content if b.type == "tool_use"]
    want = [(n, json.loads("".join(a)) if _is_json("".join(a)) else {}) for n, a in (tool_calls if not stop else [])]
    assert uses == (want if parallel else want[:1])


def _is_json(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except ValueError:
        return False


def test_messages_output_format_goes_as_a_forced_tool_and_comes_back_as_text():
    schema = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
    client = {"model": "claude-x", "max_tokens": 50, "messages": [{"role": "user", "content": "Rex"}],
              "output_config": {"format": {"type": "json_schema", "schema": schema}, "effort": "low"}}
    sent = force_messages(client, "<tool_call>\n")
    assert sent["tools"] == [{"name": OUTPUT_TOOL, "description": "Give your answer as this tool's input.",
                              "input_schema": schema}]
    assert sent["tool_choice"] == {"type": "any"} and sent["output_config"] == {"effort": "low"}
    assert sent["messages"][-1] == {"role": "assistant", "content": "<tool_call>\n"}  # forced as any tool choice
    assert client["messages"] == [{"role": "user", "content": "Rex"}]  # the client's body is not changed in place
    named = {**client, "tools": [{"name": "f", "input_schema": {}}], "tool_choice": {"type": "tool", "name": "f"}}
    assert [t["name"] for t in force_messages(named, None)["tools"]] == ["f"]  # a named tool is the shape already
    with_tools = force_messages({**client, "tools": [{"name": "f", "input_schema": {}}]}, None)
    assert [t["name"] for t in with_tools["tools"]] == ["f", OUTPUT_TOOL]
    asked = asked_of(client, "messages", limit=50, sent=sent)
    # the engine wrote the forced call, and then again (SmolLM2 does): one text block, the first
    raw = frames(b11434_messages([], [(OUTPUT_TOOL, ['{"name":', ' "Rex"}']), (OUTPUT_TOOL, ["{}"])], None),
                 named=True)
    final = _final(mended(asked, raw, []))
    assert [b.type for b in final.content] == ["text"] and json.loads(final.content[0].text) == {"name": "Rex"}
    assert final.stop_reason == "end_turn"
    whole = mend_answer(asked, {"id": "chatcmpl-1", "type": "message", "role": "assistant", "model": ENGINE_MODEL,
                                "content": [{"type": "tool_use", "id": "t", "name": OUTPUT_TOOL,
                                             "input": {"name": "Rex"}}],
                                "stop_reason": "tool_use", "stop_sequence": None,
                                "usage": {"input_tokens": 1, "output_tokens": 2}})
    check_answer("messages", whole)
    assert whole["content"] == [{"type": "text", "text": '{"name": "Rex"}'}] and whole["stop_reason"] == "end_turn"
    assert whole["id"] == "msg_1" and whole["model"] == "claude-x"
    parsed = anthropic.lib._parse._response.parse_text(whole["content"][0]["text"], dict)  # messages.parse's step
    assert parsed == {"name": "Rex"}


# -- chat -----------------------------------------------------------------------------------------------------


@FAST
@given(text=words, tool_calls=calls, parallel=st.booleans(), model=st.sampled_from(["m", "gpt-4o", "é/\"x\""]),
       points=st.lists(st.integers(0, 4000), max_size=8))
def test_a_chat_stream_echoes_the_model_and_keeps_one_call_when_asked(text, tool_calls, parallel, model, points):
    head = {"id": "chatcmpl-1", "created": 1, "model": ENGINE_MODEL, "system_fingerprint": "b0",
            "object": "chat.completion.chunk"}
    start = {"role": "assistant", "content": None}
    chunks = [{**head, "choices": [{"index": 0, "finish_reason": None, "delta": start}]}]
    chunks += [{**head, "choices": [{"index": 0, "finish_reason": None, "delta": {"content": t}}]} for t in text]
    for i, (name, args) in enumerate(tool_calls):
        chunks.append({**head, "choices": [{"index": 0, "finish_reason": None, "delta": {"tool_calls": [
            {"index": i, "id": f"c{i}", "type": "function", "function": {"name": name, "arguments": ""}}]}}]})
        chunks += [{**head, "choices": [{"index": 0, "finish_reason": None, "delta": {"tool_calls": [
            {"index": i, "function": {"arguments": a}}]}}]} for a in args]
    chunks.append({**head, "choices": [{"index": 0, "finish_reason": "stop", "delta": {}}]})
    raw = frames(chunks, named=False) + b"data: [DONE]\n\n"
    client = {"model": model, "messages": [], **({} if parallel else {"parallel_tool_calls": False})}
    asked = asked_of(client, "chat")
    out = mended(asked, raw, points)
    events = sse(out)
    check_events("chat", events)
    assert all(e["model"] == model for e in events) and out.endswith(b"data: [DONE]\n\n")
    got = Assembly()
    for line in out.decode().splitlines():
        got.line(line)
    message = got.answer()[1]["choices"][0]["message"]
    assert (message["content"] or "") == "".join(text)
    want = [(n, "".join(a)) for n, a in tool_calls]
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in message.get("tool_calls", [])] == (
        want if parallel else want[:1])
    assert asked.dropped == (0 if parallel else max(0, len(tool_calls) - 1))


# -- whole answers: every field the engine sends survives --------------------------------------------------------

extra = st.dictionaries(st.sampled_from(["prompt_progress", "x_extra", "refusal", "service_tier"]),
                        st.one_of(st.none(), st.integers(), st.text(max_size=3)), max_size=3)


@FAST
@given(extras=st.lists(extra, min_size=1, max_size=5), choice_extras=st.lists(extra, min_size=1, max_size=5),
       logprobs_from=st.integers(0, 4))
def test_assembly_keeps_every_field_the_engine_streams(extras, choice_extras, logprobs_from):
    """A chunk's fields the assembly does not know (and logprobs that start after the first chunk,
    which was a 500) reach the answer not streamed."""
    head = {"id": "chatcmpl-1", "created": 1, "model": "m", "object": "chat.completion.chunk"}
    got = Assembly()
    tokens = []
    for i, (top, inner) in enumerate(zip(extras * 5, choice_extras * 5)):
        if i == 5:
            break
        choice: dict[str, Any] = {"index": 0, "finish_reason": None, "delta": {"content": f"t{i}"}, **inner}
        if i >= logprobs_from:
            entry = {"token": f"t{i}", "logprob": -0.1, "bytes": None, "top_logprobs": []}
            choice["logprobs"] = {"content": [entry]}
            tokens.append(entry)
        got.chunk({**head, **top, "choices": [choice]})
    got.line("data: [DONE]")
    status, body = got.answer()
    assert status == 200
    for key in {k for e in extras for k in e}:
        assert key in body
    for key in {k for e in choice_extras for k in e}:
        assert key in body["choices"][0]
    assert body["choices"][0]["message"]["content"] == "t0t1t2t3t4"
    assert body["choices"][0]["logprobs"] == ({"content": tokens} if tokens else None)


# -- through squad serve ---------------------------------------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize("stream", [False, True])
async def test_chat_through_serve_echoes_the_model_and_honours_parallel_tool_calls_false(stream):
    two = [{"name": "a", "arguments": '{"x": 1}'}, {"name": "b", "arguments": "{}"}]
    tools = [{"type": "function", "function": {"name": n, "parameters": {"type": "object"}}} for n in "ab"]
    async with FakeEngine(slots=1, n_ctx=1024) as fe:
        fe.script(Reply(tool_calls=two), Reply(tool_calls=two))
        async with serving(EngineSpec(url=fe.base_url, api_key=fe.api_key), port=0) as served, \
                openai.AsyncOpenAI(base_url=served.base_url, api_key=served.api_key, max_retries=0) as client:
            messages = [{"role": "user", "content": "hi"}]
            if stream:
                async with client.chat.completions.stream(model="my-model", messages=messages, tools=tools,
                                                          parallel_tool_calls=False, max_tokens=50) as s:
                    final = await s.get_final_completion()
                    assert final.model == "my-model"
                    calls = final.choices[0].message.tool_calls
            else:
                raw = await client.chat.completions.with_raw_response.create(
                    model="my-model", messages=messages, tools=tools, parallel_tool_calls=False, max_tokens=50)
                done = raw.parse()
                check_answer("chat", done.model_dump(exclude_unset=True))
                assert done.model == "my-model" and raw.headers["x-squad-dropped-tool-calls"] == "1"
                calls = done.choices[0].message.tool_calls
            assert [c.function.name for c in calls] == ["a"]
            again = await client.chat.completions.create(model="other", messages=messages, tools=tools,
                                                         max_tokens=50)
            assert again.model == "other" and len(again.choices[0].message.tool_calls) == 2  # parallel on: both

"""Reading a stream (squad.stream): tool-call deltas in every shape engines send (F17),
usage-only chunks (F06), truncation (F05)."""

from __future__ import annotations

import pytest
from openai.types.chat import ChatCompletionChunk

from squad.errors import TruncatedStream
from squad.stream import StreamAssembly


def chunk(*tool_deltas: dict, finish: str | None = None, content: str | None = None) -> ChatCompletionChunk:
    delta: dict = {"role": "assistant"}
    if content is not None:
        delta["content"] = content
    if tool_deltas:
        delta["tool_calls"] = list(tool_deltas)
    return ChatCompletionChunk.model_validate({
        "id": "x", "object": "chat.completion.chunk", "created": 0, "model": "m",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})


def tc(index: int, *, id: str | None = None, name: str | None = None, args: str | None = None) -> dict:
    fn = {k: v for k, v in (("name", name), ("arguments", args)) if v is not None}
    d: dict = {"index": index, "function": fn}
    if id is not None:
        d |= {"id": id, "type": "function"}
    return d


def assemble(*chunks: ChatCompletionChunk):
    got = StreamAssembly()
    for c in chunks:
        got.add(c)
    return got.result("a", 0.0)


def test_f17_name_repeated_on_every_delta_is_taken_once():
    r = assemble(chunk(tc(0, id="call_1", name="lookup", args='{"q":')),
                 chunk(tc(0, name="lookup", args='"x"}')), chunk(finish="tool_calls"))
    assert [(c.id, c.name, c.arguments) for c in r.tool_calls] == [("call_1", "lookup", '{"q":"x"}')]


def test_f17_id_repeated_name_split_and_calls_interleaved_by_index():
    r = assemble(chunk(tc(0, id="call_a", name="get_"), tc(1, id="call_b", name="add", args="{")),
                 chunk(tc(0, id="call_a", name="weather", args='{"city":')),
                 chunk(tc(1, id="call_b", args='"a":1}'), tc(0, args='"Oslo"}')),
                 chunk(finish="tool_calls"))
    assert [(c.id, c.name, c.arguments) for c in r.tool_calls] == [
        ("call_a", "get_weather", '{"city":"Oslo"}'), ("call_b", "add", '{"a":1}')]


def test_f06_usage_only_chunk_and_f05_no_finish_reason():
    usage = ChatCompletionChunk.model_validate({
        "id": "x", "object": "chat.completion.chunk", "created": 0, "model": "m", "choices": [],
        "usage": {"prompt_tokens": 7, "completion_tokens": 2, "total_tokens": 9}})
    r = assemble(chunk(content="hi "), chunk(content="there", finish="stop"), usage)
    assert r.content == "hi there" and (r.usage.prompt_tokens, r.usage.completion_tokens) == (7, 2)
    with pytest.raises(TruncatedStream) as info:
        assemble(chunk(content="partial"))
    assert info.value.partial == "partial"

"""Reading a stream (squad.chat.stream): tool-call deltas in every shape engines send (F17),
usage-only chunks (F06), truncation (F05)."""

from __future__ import annotations

import pytest
from openai._models import construct_type
from openai.types.chat import ChatCompletionChunk

from squad.chat.stream import StreamAssembly
from squad.errors import TruncatedStream


def chunk(*tool_deltas: dict, finish: str | None = None, content: str | None = None) -> ChatCompletionChunk:
    delta: dict = {"role": "assistant"}
    if content is not None:
        delta["content"] = content
    if tool_deltas:
        delta["tool_calls"] = list(tool_deltas)
    # built as the SDK builds stream chunks: construct_type, no validation (a split "type" such as
    # "func" or a delta without "index" reaches squad as sent)
    return construct_type(type_=ChatCompletionChunk, value={
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


# --- F17, the whole kind: every header field in every shape, calls interleaved -------------------

HEADER = {"id": "call_7f3", "type": "function", "name": "get_weather"}
ARGS = ['{"city": ', '"Oslo", ', '"days": 2}']


def shaped(value: str, shape: str) -> list[str | None]:
    """The value of one header field as it appears on deltas 1..3 in each shape engines send."""
    return {
        "once": [value, None, None],
        "repeated": [value, value, value],
        "split": [value[:3], value[3:6], value[6:]],
        "growing": [value[:3], value[:6], value],
        "split_then_repeated": [value[:4], value[4:], value],
    }[shape]


def raw(index: int | None, **fields: str | None) -> dict:
    """A tool-call delta with exactly the given fields (None: absent)."""
    d: dict = {} if index is None else {"index": index}
    for key in ("id", "type"):
        if fields.get(key) is not None:
            d[key] = fields[key]
    fn = {k: fields[k] for k in ("name", "arguments") if fields.get(k) is not None}
    if fn:
        d["function"] = fn
    return d


SHAPES = ["once", "repeated", "split", "growing", "split_then_repeated"]


@pytest.mark.parametrize("field", ["id", "type", "name"])
@pytest.mark.parametrize("shape", SHAPES)
def test_f17_a_header_field_in_any_shape_assembles_to_its_value(field: str, shape: str) -> None:
    """The field's pieces come on the first three deltas (the other header fields once, on the
    first); then the arguments in three pieces, each carrying the whole field again when the
    engine repeats it."""
    pieces = shaped(HEADER[field], shape)
    deltas = []
    for i in range(3):
        fields = {k: (v if i == 0 else None) for k, v in HEADER.items()}
        fields[field] = pieces[i]
        deltas.append(raw(0, **fields))
    repeat = HEADER[field] if shape in ("repeated", "split_then_repeated") else None
    deltas += [raw(0, **{field: repeat}, arguments=part) for part in ARGS]
    got = StreamAssembly()
    for d in deltas:
        got.add(chunk(d))
    got.add(chunk(finish="tool_calls"))
    assert got.calls[0]["type"] == "function"
    result = got.result("a", 0.0)
    assert [(c.id, c.name, c.arguments) for c in result.tool_calls] == [
        ("call_7f3", "get_weather", '{"city": "Oslo", "days": 2}')]


@pytest.mark.parametrize("shape", SHAPES)
def test_f17_three_calls_interleaved_by_index_each_assemble(shape: str) -> None:
    """Three calls whose deltas arrive interleaved (2, 0, 1, ...) each keep their own header and
    arguments, in index order, whatever shape their names come in."""
    names = {0: "lookup", 1: "add_numbers", 2: "ask_weather"}
    args = {0: ['{"q":', ' "x"}'], 1: ['{"a": 1,', ' "b": 2}'], 2: ['{"task":', ' "rain?"}']}
    deltas = []
    for step in range(3):  # header pieces, interleaved
        for i in (2, 0, 1):
            piece = shaped(names[i], shape)[step]
            deltas.append(raw(i, id=f"call_{i}" if step == 0 else None, type="function" if step == 0 else None,
                              name=piece))
    for part in range(2):  # then arguments, interleaved, names repeated in the repeated shapes
        for i in (1, 2, 0):
            repeat = names[i] if shape in ("repeated", "split_then_repeated") else None
            deltas.append(raw(i, name=repeat, arguments=args[i][part]))
    got = StreamAssembly()
    for d in deltas:
        got.add(chunk(d))
    got.add(chunk(finish="tool_calls"))
    result = got.result("a", 0.0)
    assert [(c.id, c.name, c.arguments) for c in result.tool_calls] == [
        ("call_0", "lookup", '{"q": "x"}'), ("call_1", "add_numbers", '{"a": 1, "b": 2}'),
        ("call_2", "ask_weather", '{"task": "rain?"}')]


def test_f17_several_calls_in_one_delta_and_a_delta_without_index() -> None:
    """Two calls in one chunk; a later delta without ``index`` continues the last call."""
    first = chunk(raw(0, id="c0", type="function", name="a", arguments="{}"),
                  raw(1, id="c1", type="function", name="b", arguments='{"x":'))
    got = StreamAssembly()
    got.add(first)
    got.add(chunk(raw(None, arguments=" 1}")))
    got.add(chunk(finish="tool_calls"))
    result = got.result("a", 0.0)
    assert [(c.id, c.name, c.arguments) for c in result.tool_calls] == [("c0", "a", "{}"), ("c1", "b", '{"x": 1}')]


def test_f17_llama_server_shape_as_recorded_on_b11434() -> None:
    """What llama-server b11434 sent for two parallel calls with squad's template (recorded):
    id, type and name once on the first delta of each index, then argument pieces only."""
    deltas = [raw(0, id="Me79kXmiw3", type="function", name="get_weather", arguments="{"),
              raw(0, arguments='"'), raw(0, arguments="city"), raw(0, arguments='":'), raw(0, arguments=' "'),
              raw(0, arguments="Paris"), raw(0, arguments='"}'),
              raw(1, id="QX8nLjTMfr", type="function", name="get_weather", arguments="{"),
              raw(1, arguments='"city": "Lyon"}')]
    got = StreamAssembly()
    for d in deltas:
        got.add(chunk(d))
    got.add(chunk(finish="tool_calls"))
    result = got.result("a", 0.0)
    assert [(c.id, c.name, c.arguments) for c in result.tool_calls] == [
        ("Me79kXmiw3", "get_weather", '{"city": "Paris"}'), ("QX8nLjTMfr", "get_weather", '{"city": "Lyon"}')]


def test_f06_usage_only_chunk_and_f05_no_finish_reason():
    usage = ChatCompletionChunk.model_validate({
        "id": "x", "object": "chat.completion.chunk", "created": 0, "model": "m", "choices": [],
        "usage": {"prompt_tokens": 7, "completion_tokens": 2, "total_tokens": 9}})
    r = assemble(chunk(content="hi "), chunk(content="there", finish="stop"), usage)
    assert r.content == "hi there" and (r.usage.prompt_tokens, r.usage.completion_tokens) == (7, 2)
    with pytest.raises(TruncatedStream) as info:
        assemble(chunk(content="partial"))
    assert info.value.partial == "partial"

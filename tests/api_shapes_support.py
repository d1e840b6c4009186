"""Check an answer against the SDKs' own pydantic models (openai, anthropic), strictly: every field
a model declares as required must be there with its type (the SDKs themselves build their
objects leniently, so a missing field surfaces later as a TypeError or an AttributeError)."""

from __future__ import annotations

import functools
import json
from typing import Any

from pydantic import TypeAdapter


def sse(raw: bytes | str) -> list[dict[str, Any]]:
    """The JSON ``data:`` of each event of an SSE body (``[DONE]`` and comments left out)."""
    text = raw.decode() if isinstance(raw, bytes) else raw
    out = []
    for line in text.splitlines():
        if line.startswith("data:") and line[5:].strip() != "[DONE]":
            out.append(json.loads(line[5:]))
    return out


def _adapters() -> dict[str, tuple[TypeAdapter[Any], TypeAdapter[Any]]]:
    from anthropic.types import Message, RawMessageStreamEvent
    from openai.types import Completion
    from openai.types.chat import ChatCompletion, ChatCompletionChunk
    from openai.types.responses import Response, ResponseStreamEvent

    return {"chat": (TypeAdapter(ChatCompletion), TypeAdapter(ChatCompletionChunk)),
            "completion": (TypeAdapter(Completion), TypeAdapter(Completion)),
            "responses": (TypeAdapter(Response), TypeAdapter(ResponseStreamEvent)),
            "messages": (TypeAdapter(Message), TypeAdapter(RawMessageStreamEvent))}


_ADAPTERS: dict[str, tuple[TypeAdapter[Any], TypeAdapter[Any]]] = {}


def check_answer(kind: str, body: dict[str, Any]) -> Any:
    """``body`` (an answer not streamed) validated by its API's SDK model; raises pydantic's
    ValidationError naming each missing or wrong field."""
    _ADAPTERS.update(_ADAPTERS or _adapters())
    return _ADAPTERS[kind][0].validate_python(body)


def check_events(kind: str, events: list[dict[str, Any]]) -> list[Any]:
    """Each event of a stream validated by its API's SDK event model."""
    _ADAPTERS.update(_ADAPTERS or _adapters())
    adapter = _ADAPTERS[kind][1]
    if kind == "completion":  # the SDK reads each chunk as a Completion, whose finish_reason OpenAI's own chunks
        # leave null until the last one
        events = [{**e, "choices": [{**c, "finish_reason": c.get("finish_reason") or "length"}
                                    for c in e.get("choices", [])]} for e in events]
    by_type = _by_type(kind)
    return [(by_type[e["type"]] if e.get("type") in by_type else adapter).validate_python(e) for e in events]


@functools.cache
def _by_type(kind: str) -> dict[str, TypeAdapter[Any]]:
    """The event model for each ``type`` of a union of events (so that an error names the one field, not every
    member of the union)."""
    if kind not in ("responses", "messages"):
        return {}
    from typing import Annotated, Literal, Union, get_args, get_origin

    from anthropic.types import RawMessageStreamEvent
    from openai.types.responses import ResponseStreamEvent

    union = ResponseStreamEvent if kind == "responses" else RawMessageStreamEvent
    while get_origin(union) is Annotated:
        union = get_args(union)[0]
    out = {}
    for member in get_args(union) if get_origin(union) is Union else ():
        annotation = member.model_fields["type"].annotation
        if get_origin(annotation) is Literal:
            out[get_args(annotation)[0]] = TypeAdapter(member)
    return out

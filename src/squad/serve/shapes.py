"""An answer in its API's own shape: the fields clients (the openai and anthropic SDKs) check,
mended where llama-server b11434 leaves them out or gets them wrong (docs/llama-facts.md, "The
other APIs' shapes"). The text the model wrote is never changed (I2); only these fields are:

- ``model``: the request's own (b11434 answers with its model file's path), in every API;
- Messages: ``id`` ``msg_...`` (b11434: ``chatcmpl-...``); ``stop_reason: stop_sequence`` when
  ``stop_sequence`` names the one that ended the answer (b11434: ``end_turn``); a streamed
  ``tool_use`` block starts with ``input: {}``;
- Responses: every stream event gets ``sequence_number``, ``output_index``, ``content_index``
  (the openai SDK's ``responses.stream()`` raises without them), text events ``logprobs: []``,
  text parts ``annotations: []``, a call ``function_call_arguments.done``; the ``response`` the
  fields the SDK's ``Response`` requires (``created_at``, ``model``, ``output``, and the request's
  ``parallel_tool_calls``, ``tool_choice``, ``tools``), ``usage.output_tokens_details`` (0
  reasoning tokens, only when no reasoning item came) and ``input_tokens_details.cache_write_tokens``
  (``input_tokens - cached_tokens``: what the engine processed); an answer that used its whole
  generation limit is ``status: incomplete``, ``incomplete_details.reason: max_output_tokens``,
  last event ``response.incomplete`` (OpenAI's shape);
- parallel calls off (chat and Responses ``parallel_tool_calls: false``, Messages
  ``tool_choice.disable_parallel_tool_use``): the engine is asked where its API reads the field,
  and an answer that still holds several calls keeps the first; squad serve logs that (logger
  ``squad.serve``) and, not streamed, sends ``x-squad-dropped-tool-calls: N``;
- Messages ``output_config.format``: sent as the forced tool :data:`OUTPUT_TOOL`
  (:func:`squad.serve.forcing.force_messages`), whose first call comes back as the text block
  ``messages.parse`` reads (its JSON input as the text).

:func:`mend_answer` mends a whole answer; :func:`stream_mender` gives the mender of a streamed
one (bytes in, bytes out, whole SSE events).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Asked", "asked_of", "mend_answer", "stream_mender", "OUTPUT_TOOL", "Mender"]

log = logging.getLogger("squad.serve")

OUTPUT_TOOL = "squad_structured_output"
"""The tool a Messages request's ``output_config.format`` is sent as (its schema as the tool's input)."""


@dataclass
class Asked:
    """What a client's request says about its answer's shape.

    ``kind``: the API (:data:`squad.serve.demand.Kind`); ``model``: the request's ``model`` (None:
    the engine's stays); ``parallel``: whether several tool calls may come back; ``limit``: the most
    tokens the engine may generate for it (what squad reserved); ``body``: the client's own body
    (Responses echoes its ``tools``, ``tool_choice``); ``output_tool``: the Messages output format
    went as :data:`OUTPUT_TOOL`. ``dropped`` counts the tool calls left out (set by mending)."""

    kind: str
    model: str | None = None
    parallel: bool = True
    limit: int | None = None
    body: dict[str, Any] = field(default_factory=dict)
    output_tool: bool = False
    dropped: int = 0


def asked_of(body: dict[str, Any], kind: str, *, limit: int | None = None, sent: dict[str, Any] | None = None) -> Asked:
    """The :class:`Asked` of the client's ``body`` (``sent``: the body as forwarded, which says
    whether the output tool was added)."""
    model = body.get("model")
    choice = body.get("tool_choice")
    if kind == "messages":
        parallel = not (isinstance(choice, dict) and choice.get("disable_parallel_tool_use") is True)
    else:
        parallel = body.get("parallel_tool_calls") is not False
    tools = (sent or {}).get("tools")
    output_tool = kind == "messages" and isinstance(tools, list) and any(
        isinstance(t, dict) and t.get("name") == OUTPUT_TOOL for t in tools)
    return Asked(kind, model if isinstance(model, str) and model else None, parallel, limit, body, output_tool)


def _drop(asked: Asked) -> None:
    """One more tool call left out (logged once per answer)."""
    asked.dropped += 1
    if asked.dropped == 1:
        log.warning("squad serve kept the first tool call of a %s answer and left out the others: the request "
                    "turned parallel tool calls off", asked.kind)


# -- whole answers ------------------------------------------------------------------------------------


def mend_answer(asked: Asked, body: Any) -> Any:
    """A whole answer (a 200's JSON body) in its API's shape (module docstring); anything that is
    not a JSON object comes back as it is."""
    if not isinstance(body, dict):
        return body
    if asked.kind == "responses":
        return mend_response(asked, body)
    if asked.kind == "messages":
        return mend_message(asked, body)
    out = dict(body)
    if asked.model is not None and "model" in out:
        out["model"] = asked.model
    if asked.kind == "chat" and not asked.parallel and isinstance(out.get("choices"), list):
        out["choices"] = [_one_call_choice(asked, c) for c in out["choices"]]
    return out


def _one_call_choice(asked: Asked, choice: Any) -> Any:
    message = choice.get("message") if isinstance(choice, dict) else None
    if not isinstance(message, dict):
        return choice
    calls = message.get("tool_calls")
    if not isinstance(calls, list) or len(calls) < 2:
        return choice
    for _ in calls[1:]:
        _drop(asked)
    return {**choice, "message": {**message, "tool_calls": calls[:1]}}


def mend_response(asked: Asked, response: dict[str, Any], *, output: list[Any] | None = None) -> dict[str, Any]:
    """A Responses ``response`` object with the fields the openai SDK's ``Response`` requires
    (module docstring); ``output``: the items to give when the engine's has none yet."""
    body = asked.body
    out = {**response}
    out.setdefault("object", "response")
    out.setdefault("created_at", int(time.time()))
    if asked.model is not None or "model" not in out:
        out["model"] = asked.model or ""
    given = out.get("output")
    items: list[Any] = given if isinstance(given, list) else (output or [])
    if not asked.parallel:
        calls = [i for i in items if isinstance(i, dict) and i.get("type") == "function_call"]
        for _ in calls[1:]:
            _drop(asked)
        if len(calls) > 1:
            items = [i for i in items if not (isinstance(i, dict) and i.get("type") == "function_call")
                     or i is calls[0]]
    out["output"] = items
    out["parallel_tool_calls"] = asked.parallel
    out["tool_choice"] = body.get("tool_choice") if body.get("tool_choice") is not None else "auto"
    out["tools"] = body.get("tools") if isinstance(body.get("tools"), list) else []
    for key in ("instructions", "max_output_tokens", "temperature", "top_p", "previous_response_id", "metadata"):
        if key in body:
            out.setdefault(key, body[key])
    usage = out.get("usage")
    if isinstance(usage, dict):
        usage = {**usage}
        given_details = usage.get("input_tokens_details")
        details: dict[str, Any] = given_details if isinstance(given_details, dict) else {}
        cached, prompt = details.get("cached_tokens", 0), usage.get("input_tokens", 0)
        if isinstance(cached, int) and isinstance(prompt, int):
            # the prompt tokens the engine processed, which stay in its slot's cache for the next request
            details = {"cached_tokens": cached, "cache_write_tokens": max(0, prompt - cached), **details}
        usage["input_tokens_details"] = details
        if "output_tokens_details" not in usage and not any(
                isinstance(i, dict) and i.get("type") == "reasoning" for i in items):
            usage["output_tokens_details"] = {"reasoning_tokens": 0}  # no reasoning item: none was written
        out["usage"] = usage
        cut = (asked.limit is not None and isinstance(usage.get("output_tokens"), int)
               and usage["output_tokens"] >= asked.limit)
        if cut and out.get("status") == "completed":
            out["status"] = "incomplete"
            out["incomplete_details"] = {"reason": "max_output_tokens"}
    out.setdefault("incomplete_details", None)
    out.setdefault("error", None)
    return out


def mend_message(asked: Asked, message: dict[str, Any]) -> dict[str, Any]:
    """A Messages ``message`` with its id, model, stop reason, tool calls and output format as
    Anthropic answers them (module docstring)."""
    out = _message_head(asked, message)
    content = out.get("content")
    blocks: list[Any] = content if isinstance(content, list) else []
    kept, calls, answered = [], 0, False
    for block in blocks:
        if isinstance(block, dict) and block.get("type") == "tool_use":
            if asked.output_tool and block.get("name") == OUTPUT_TOOL:
                if not answered:  # one answer: the engine may write the forced call again after it
                    kept.append({"type": "text", "text": json.dumps(block.get("input", {}), ensure_ascii=False)})
                answered = True
                continue
            calls += 1
            if calls > 1 and not asked.parallel:
                _drop(asked)
                continue
        kept.append(block)
    out["content"] = kept
    if out.get("stop_reason") == "tool_use" and not any(
            isinstance(b, dict) and b.get("type") == "tool_use" for b in kept):
        out["stop_reason"] = "end_turn"  # the output tool's call was the answer
    return out


def _message_head(asked: Asked, message: dict[str, Any]) -> dict[str, Any]:
    out = {**message}
    if asked.model is not None and "model" in out:
        out["model"] = asked.model
    if isinstance(out.get("id"), str) and not out["id"].startswith("msg_"):
        out["id"] = "msg_" + out["id"].removeprefix("chatcmpl-")
    if out.get("stop_sequence") and out.get("stop_reason") == "end_turn":
        out["stop_reason"] = "stop_sequence"
    return out


# -- streams --------------------------------------------------------------------------------------------


class Mender:
    """Bytes of a streamed answer in (:meth:`feed`, then :meth:`end`), the same stream out with each
    whole SSE event given to :meth:`event` (which returns the bytes to send for it)."""

    def __init__(self) -> None:
        self._held = b""

    def feed(self, chunk: bytes) -> bytes:
        self._held += chunk
        out: list[bytes] = []
        while True:
            end = self._held.find(b"\n\n")
            if end < 0:
                return b"".join(out)
            block, self._held = self._held[:end + 2], self._held[end + 2:]
            out.append(self.event(block))

    def end(self) -> bytes:
        """What is still held when the answer ends (an incomplete event), mended if it is one."""
        held, self._held = self._held, b""
        return self.event(held) if held.strip() else held

    def event(self, block: bytes) -> bytes:
        return block


def _data(block: bytes) -> tuple[dict[str, Any] | None, bytes]:
    """An SSE block's JSON ``data`` (None when it has none or is an error frame) and its lines
    before the ``data:`` line (``event: ...``)."""
    head, _, rest = block.partition(b"data:")
    if not rest:
        return None, block
    try:
        data = json.loads(rest.strip())
    except ValueError:
        return None, block
    if not isinstance(data, dict) or "error" in data:
        return None, block
    return data, head


def _block(head: bytes, data: dict[str, Any]) -> bytes:
    return head + b"data: " + json.dumps(data, ensure_ascii=False).encode() + b"\n\n"


class ChatStream(Mender):
    """A chat or text completion stream: the request's ``model`` in every chunk (a byte
    replacement of the engine's ``"model":"..."``, learnt from the first chunk: no JSON parsed per
    token), and with parallel calls off only the first tool call's deltas."""

    def __init__(self, asked: Asked) -> None:
        super().__init__()
        self.asked = asked
        self._from: bytes | None = None
        self._to = b""
        self._calls = 0

    def event(self, block: bytes) -> bytes:
        if self._from is None and self.asked.model is not None and b'"model"' in block:
            data, _ = _data(block)
            if data is not None and isinstance(data.get("model"), str):
                for encoded in (json.dumps(data["model"], ensure_ascii=False), json.dumps(data["model"])):
                    for sep in (b'"model":', b'"model": '):
                        if sep + encoded.encode() in block:
                            self._from = sep + encoded.encode()
                            self._to = sep + json.dumps(self.asked.model, ensure_ascii=False).encode()
        if self._from is not None:
            block = block.replace(self._from, self._to)
        if not self.asked.parallel and b'"tool_calls"' in block:
            block = self._first_call(block)
        return block

    def _first_call(self, block: bytes) -> bytes:
        data, head = _data(block)
        if data is None:
            return block
        changed = False
        for choice in data.get("choices") or []:
            delta = choice.get("delta") if isinstance(choice, dict) else None
            if not isinstance(delta, dict) or not isinstance(delta.get("tool_calls"), list):
                continue
            calls = delta["tool_calls"]
            for call in calls:
                index = call.get("index", 0) if isinstance(call, dict) else 0
                if isinstance(index, int) and index + 1 > self._calls:
                    for _ in range(max(1, self._calls), index + 1):
                        _drop(self.asked)
                    self._calls = index + 1
            kept = [c for c in calls if not (isinstance(c, dict) and c.get("index", 0) != 0)]
            if len(kept) != len(calls):
                changed = True
                delta["tool_calls"] = kept
                if not kept:
                    del delta["tool_calls"]
        return _block(head, data) if changed else block


class ResponsesStream(Mender):
    """A Responses stream with the fields the openai SDK's events require (module docstring).
    Every event is parsed: ``sequence_number`` counts from 0; an item's ``output_index`` is the order
    its ``output_item.added`` came in; a text's ``content_index`` is 0 (b11434 writes one part per
    message)."""

    def __init__(self, asked: Asked) -> None:
        super().__init__()
        self.asked = asked
        self.sequence = 0
        self.index: dict[str, int] = {}
        """Item id -> output index."""
        self.items: dict[int, dict[str, Any]] = {}
        """Output index -> the item as added, then as done."""
        self.dropped: set[str] = set()
        """Ids of the function calls left out (parallel calls off)."""
        self.arguments: dict[str, str] = {}
        self.id: str | None = None
        """The response's id, as its first event gave it."""

    def event(self, block: bytes) -> bytes:
        data, head = _data(block)
        if data is None:
            return block
        out = self._mend(data)
        if not out:
            return b""
        return b"".join(_block(b"event: " + str(e.get("type")).encode() + b"\n", {**e, "sequence_number": self._next()})
                        for e in out)

    def _next(self) -> int:
        self.sequence += 1
        return self.sequence - 1

    LIFECYCLE = ("response.created", "response.in_progress", "response.completed", "response.incomplete",
                 "response.failed")

    def _lifecycle(self, data: dict[str, Any]) -> dict[str, Any]:
        kind = data.get("type")
        response_given = data.get("response")
        given: dict[str, Any] = response_given if isinstance(response_given, dict) else {}
        self.id = self.id or given.get("id")  # one id from start to end (a start squad serve sent has its own)
        given = {**given, "id": self.id} if self.id else given
        if kind in ("response.created", "response.in_progress"):
            return {**data, "response": mend_response(self.asked, given, output=[])}
        response = mend_response(self.asked, given, output=[self.items[i] for i in sorted(self.items)])
        if kind == "response.completed" and response.get("status") == "incomplete":
            kind = "response.incomplete"
        return {**data, "type": kind, "response": response}

    def _mend(self, data: dict[str, Any]) -> list[dict[str, Any]]:
        kind = data.get("type")
        item = data.get("item") if isinstance(data.get("item"), dict) else None
        item_id = str((item or {}).get("id") or data.get("item_id") or "")
        if item_id in self.dropped:
            return []
        if kind in self.LIFECYCLE:
            return [self._lifecycle(data)]
        if kind == "response.output_item.added" and item is not None:
            if item.get("type") == "function_call" and not self.asked.parallel and any(
                    i.get("type") == "function_call" for i in self.items.values()):
                self.dropped.add(item_id)
                _drop(self.asked)
                return []
            index = self.index.setdefault(item_id, len(self.index))
            self.items[index] = item
            return [{**data, "output_index": index}]
        known = self.index.get(item_id)
        if known is None:  # an item the engine did not announce: it gets the next index
            index = self.index.setdefault(item_id, len(self.index))
            if item is not None:
                self.items[index] = item
        else:
            index = known
        out = {**data, "output_index": index}
        if kind == "response.function_call_arguments.delta":
            self.arguments[item_id] = self.arguments.get(item_id, "") + str(data.get("delta") or "")
        if kind in ("response.content_part.added", "response.content_part.done", "response.output_text.delta",
                    "response.output_text.done", "response.reasoning_text.delta", "response.reasoning_text.done"):
            out.setdefault("content_index", 0)
        if kind in ("response.output_text.delta", "response.output_text.done"):
            out.setdefault("logprobs", [])
        part = out.get("part")
        if isinstance(part, dict) and part.get("type") == "output_text" and "annotations" not in part:
            out["part"] = {**part, "annotations": []}
        if kind == "response.output_item.done" and item is not None:
            self.items[index] = item
            if item.get("type") == "function_call":
                done = {"type": "response.function_call_arguments.done", "item_id": item_id, "output_index": index,
                        "arguments": item.get("arguments", self.arguments.get(item_id, ""))}
                return [done, out]
        return [out]


class MessagesStream(Mender):
    """A Messages stream: ``message_start``'s id and model, ``message_delta``'s stop reason, one
    tool call when parallel calls are off, and the output tool's call as a text block (module
    docstring)."""

    def __init__(self, asked: Asked) -> None:
        super().__init__()
        self.asked = asked
        self.dropped: set[int] = set()
        self.as_text: set[int] = set()
        self.calls = 0

    def event(self, block: bytes) -> bytes:
        if b"message_start" not in block and b"message_delta" not in block and b"content_block" not in block:
            return block
        data, head = _data(block)
        if data is None:
            return block
        kind = data.get("type")
        index = data.get("index")
        if kind == "message_start" and isinstance(data.get("message"), dict):
            return _block(head, {**data, "message": _message_head(self.asked, data["message"])})
        if kind == "message_delta" and isinstance(data.get("delta"), dict):
            delta = _message_head(self.asked, data["delta"])
            if delta.get("stop_reason") == "tool_use" and self.as_text and self.calls == 0:
                delta["stop_reason"] = "end_turn"  # the output tool's call was the answer
            return _block(head, {**data, "delta": delta})
        if index in self.dropped:
            return b""
        if kind == "content_block_start" and isinstance(data.get("content_block"), dict):
            content = data["content_block"]
            if content.get("type") == "tool_use":
                if self.asked.output_tool and content.get("name") == OUTPUT_TOOL:
                    if self.as_text:  # one answer: the engine may write the forced call again after it
                        self.dropped.add(index)  # type: ignore[arg-type]
                        return b""
                    self.as_text.add(index)  # type: ignore[arg-type]
                    return _block(head, {**data, "content_block": {"type": "text", "text": ""}})
                self.calls += 1
                if self.calls > 1 and not self.asked.parallel:
                    self.dropped.add(index)  # type: ignore[arg-type]
                    _drop(self.asked)
                    return b""
                if "input" not in content:  # Anthropic starts a tool_use block with its input empty
                    return _block(head, {**data, "content_block": {**content, "input": {}}})
            return block
        if kind == "content_block_delta" and index in self.as_text and isinstance(data.get("delta"), dict):
            text = str(data["delta"].get("partial_json") or "")
            return _block(head, {**data, "delta": {"type": "text_delta", "text": text}}) if text else b""
        return block


_STREAMS: dict[str, Callable[[Asked], Mender]] = {"chat": ChatStream, "completion": ChatStream,
                                                  "responses": ResponsesStream, "messages": MessagesStream}


def stream_mender(asked: Asked) -> Mender | None:
    """The mender of a streamed answer of ``asked.kind``, None for an API squad serve relays as it is."""
    make = _STREAMS.get(asked.kind)
    return make(asked) if make is not None else None

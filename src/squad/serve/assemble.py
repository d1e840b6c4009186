"""A request the client did not stream is streamed from llama-server, and its answer put together
here, so that the engine stops it as soon as the client leaves.

Why (llama.cpp b11434, ``tools/server/server-queue.cpp``): the HTTP thread of a request that is
not streamed looks at its connection only when it has waited a whole second
(``HTTP_POLLING_SECONDS``) in ``server_response::recv_with_timeout`` without any result. That wait
is one condition variable for every task: each token of any other streamed request, and each
``/slots`` read, wakes it and starts the second again. So while other requests run, llama-server
never notices that such a client left, and generates to ``max_tokens``. A streamed request
writes every token, and stops at the first write that fails.

:class:`Assembly` reads the chunks (``data: {...}`` lines of OpenAI's ``chat.completion.chunk``
or ``text_completion``) and gives the body llama-server would have answered without streaming:
``choices`` with the joined ``message`` (``content``, ``reasoning_content``, ``tool_calls``) or
``text``, ``finish_reason``, ``usage`` and ``timings``; or the error a stream ended with, as the
HTTP status and body a request not streamed gets. The Responses and Messages APIs have the same
gap in b11434, so :class:`ResponsesAssembly` (the ``response`` of ``response.completed``) and
:class:`MessagesAssembly` (``message_start``'s message, the content blocks joined, then
``message_delta``'s stop reason and usage: the shape of ``to_json_anthropic()`` in
``tools/server/server-task.cpp``) do the same for them; :func:`assembly_for` picks one.
"""

from __future__ import annotations

import json
from typing import Any

from squad.serve.stream_start import new_message

__all__ = ["Assembly", "ResponsesAssembly", "MessagesAssembly", "assembly_for", "streamed_upstream",
           "STREAMABLE_PATHS"]

STREAMABLE_PATHS = ("/v1/chat/completions", "/chat/completions", "/v1/completions")
"""OpenAI-shaped generation paths whose answer is the same streamed or not (llama-server's own
``/completion`` and ``/completions`` answer in a shape of their own and are sent as they are)."""


def streamed_upstream(body: dict[str, Any], kind: str = "chat") -> dict[str, Any]:
    """``body`` (not streamed) as the streamed request sent to the engine, usage included
    (``stream_options`` only for the chat and completion APIs: Responses and Messages streams
    carry their usage in their last events)."""
    if kind in ("responses", "messages"):
        return {**body, "stream": True}
    return {**body, "stream": True, "stream_options": {**(body.get("stream_options") or {}), "include_usage": True}}


def data_of(line: str) -> dict[str, Any] | None:
    """One SSE line's ``data:`` as a JSON object; None for any other line, ``[DONE]`` or non-JSON."""
    if not line.startswith("data: "):
        return None
    try:
        data = json.loads(line[6:])
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def error_answer(frame: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """The HTTP status and body for an error frame a stream ended with: its ``code``, 500 when it
    gives none in 400-599."""
    error = frame.get("error")
    code = error.get("code") if isinstance(error, dict) else None
    return (code if isinstance(code, int) and 400 <= code < 600 else 500), frame


class Assembly:
    """Chunks in, one answer out: :meth:`line` for each line of the stream, then :meth:`answer`."""

    def __init__(self) -> None:
        self.started = False
        """A ``data:`` line was read (the first token's time)."""
        self.envelope: dict[str, Any] = {}
        self.choices: dict[int, dict[str, Any]] = {}
        self.usage: dict[str, Any] | None = None
        self.timings: dict[str, Any] | None = None
        self.error: dict[str, Any] | None = None
        self.done = False
        """``[DONE]`` was read: the engine ended the answer."""

    def line(self, line: str) -> None:
        if not line.startswith("data: "):
            return
        self.started = True
        if line[6:].strip() == "[DONE]":
            self.done = True
            return
        chunk = data_of(line)
        if chunk is not None:
            self.chunk(chunk)

    def chunk(self, chunk: dict[str, Any]) -> None:
        if "error" in chunk:
            self.error = chunk
            return
        for key, value in chunk.items():  # every field the engine sends survives (the last one given wins)
            if key == "choices":
                continue
            if key in ("usage", "timings"):
                if isinstance(value, dict):
                    setattr(self, key, value)
            elif key in ("id", "created", "model", "system_fingerprint", "object"):
                self.envelope.setdefault(key, value)
            elif value is not None or key not in self.envelope:
                self.envelope[key] = value
        for choice in chunk.get("choices") or []:
            if isinstance(choice, dict):
                self._choice(choice)

    def _choice(self, choice: dict[str, Any]) -> None:
        index = choice.get("index")
        index = index if isinstance(index, int) and not isinstance(index, bool) else 0
        got = self.choices.setdefault(index, {"index": index, "finish_reason": None})
        for key, value in choice.items():
            if key in ("index", "delta"):
                continue
            if key == "text":  # text_completion
                got["text"] = got.get("text", "") + (value if isinstance(value, str) else "")
            elif key == "logprobs":
                got["logprobs"] = _joined(got.get("logprobs"), value)
            elif value is not None or key not in got:
                got[key] = value
        delta = choice.get("delta")
        if isinstance(delta, dict):
            message = got.setdefault("message", {"role": "assistant", "content": None})
            for key, value in delta.items():
                if key == "tool_calls":
                    for call in value if isinstance(value, list) else []:
                        if isinstance(call, dict):
                            _add_call(message.setdefault("tool_calls", []), call)
                elif key == "role":
                    message["role"] = value or message["role"]
                elif isinstance(value, str):  # content, reasoning_content, refusal: joined
                    message[key] = (message.get(key) or "") + value
                elif value is not None or key not in message:
                    message[key] = value
        got.setdefault("logprobs", None)

    def answer(self) -> tuple[int, dict[str, Any]]:
        """``(HTTP status, body)``: 200 and the whole answer, or the error the stream ended with
        (its ``code``, 500 when it gives none)."""
        if self.error is not None:
            return error_answer(self.error)
        kind = self.envelope.get("object", "")
        body: dict[str, Any] = {
            **self.envelope,
            "object": "chat.completion" if kind == "chat.completion.chunk" else kind or "text_completion",
            "choices": [self.choices[i] for i in sorted(self.choices)],
        }
        if self.usage is not None:
            body["usage"] = self.usage
        if self.timings is not None:
            body["timings"] = self.timings
        return 200, body


def _joined(got: Any, more: Any) -> Any:
    """Streamed ``logprobs`` joined: the lists of each chunk's object (``content``, ``refusal``,
    text completions' ``tokens``...) one after another; None until one comes."""
    if not isinstance(more, dict):
        return got if got is not None else more
    if not isinstance(got, dict):
        return {k: list(v) if isinstance(v, list) else v for k, v in more.items()}
    for key, value in more.items():
        if isinstance(value, list) and isinstance(got.get(key), list):
            got[key].extend(value)
        elif value is not None or key not in got:
            got[key] = value
    return got


def _add_call(calls: list[dict[str, Any]], delta: dict[str, Any]) -> None:
    """Merge one streamed tool-call delta (``index``, then ``id``/``type``/``function.name`` once
    and ``function.arguments`` in pieces) into ``calls``."""
    index = int(delta.get("index") or 0)
    while len(calls) <= index:
        calls.append({"type": "function", "function": {"name": "", "arguments": ""}})
    call = calls[index]
    if delta.get("id"):
        call["id"] = delta["id"]
    if delta.get("type"):
        call["type"] = delta["type"]
    function = delta.get("function") or {}
    if function.get("name"):
        call["function"]["name"] += function["name"]
    if function.get("arguments"):
        call["function"]["arguments"] += function["arguments"]


class _EventAssembly:
    """The common part of the Responses and Messages assemblies: ``data:`` lines parsed, an
    ``error`` frame kept, :meth:`event` for the rest."""

    def __init__(self) -> None:
        self.started = False
        self.error: dict[str, Any] | None = None
        self.done = False
        """The API's last event was read: the engine ended the answer."""

    def line(self, line: str) -> None:
        if not line.startswith("data: "):
            return
        self.started = True
        data = data_of(line)
        if data is None:
            return
        if "error" in data:
            self.error = data
            return
        self.event(data)

    def event(self, data: dict[str, Any]) -> None:
        raise NotImplementedError

    def _error_answer(self) -> tuple[int, dict[str, Any]] | None:
        return None if self.error is None else error_answer(self.error)


class ResponsesAssembly(_EventAssembly):
    """A Responses stream in, its ``response.completed`` response out (with ``completed_at``, as
    b11434's answer not streamed has it)."""

    def __init__(self) -> None:
        super().__init__()
        self.response: dict[str, Any] | None = None

    def event(self, data: dict[str, Any]) -> None:
        if data.get("type") in ("response.completed", "response.incomplete", "response.failed") and isinstance(
                data.get("response"), dict):
            self.response = data["response"]
            self.done = True

    def answer(self) -> tuple[int, dict[str, Any]]:
        failed = self._error_answer()
        if failed is not None:
            return failed
        body = dict(self.response or {})
        if "created_at" in body:
            body.setdefault("completed_at", body["created_at"])
        return 200, body


class MessagesAssembly(_EventAssembly):
    """A Messages stream in, the message out: text and thinking deltas joined per block,
    ``input_json_delta`` pieces parsed into a ``tool_use`` block's ``input`` (``{}`` when they are
    not JSON, as b11434 does), usage from ``message_start`` and ``message_delta``. ``model`` and
    ``input_tokens`` stand in when the engine left ``message_start`` out (squad.serve.stream_start)."""

    def __init__(self, *, model: str = "", input_tokens: int = 0) -> None:
        super().__init__()
        self.message = new_message(model, input_tokens)
        self.blocks: dict[int, dict[str, Any]] = {}
        self.partial_json: dict[int, str] = {}

    def event(self, data: dict[str, Any]) -> None:
        kind = data.get("type")
        if kind == "message_start" and isinstance(data.get("message"), dict):
            start = {k: v for k, v in data["message"].items() if k != "content"}
            self.message.update(start)
        elif kind == "content_block_start" and isinstance(data.get("content_block"), dict):
            self.blocks[int(data.get("index") or 0)] = dict(data["content_block"])
        elif kind == "content_block_delta" and isinstance(data.get("delta"), dict):
            index, delta = int(data.get("index") or 0), data["delta"]
            block = self.blocks.setdefault(index, {"type": "text", "text": ""})
            if delta.get("type") == "text_delta":
                block["text"] = block.get("text", "") + str(delta.get("text") or "")
            elif delta.get("type") == "thinking_delta":
                block["thinking"] = block.get("thinking", "") + str(delta.get("thinking") or "")
            elif delta.get("type") == "signature_delta":
                block["signature"] = block.get("signature", "") + str(delta.get("signature") or "")
            elif delta.get("type") == "input_json_delta":
                self.partial_json[index] = self.partial_json.get(index, "") + str(delta.get("partial_json") or "")
        elif kind == "message_delta":
            delta = data["delta"] if isinstance(data.get("delta"), dict) else {}
            for key in ("stop_reason", "stop_sequence"):
                if key in delta:
                    self.message[key] = delta[key]
            if isinstance(data.get("usage"), dict):
                self.message["usage"] = {**(self.message.get("usage") or {}), **data["usage"]}
        elif kind == "message_stop":
            self.done = True

    def answer(self) -> tuple[int, dict[str, Any]]:
        failed = self._error_answer()
        if failed is not None:
            return failed
        content = []
        for index in sorted(self.blocks):
            block = dict(self.blocks[index])
            if block.get("type") == "tool_use":
                try:
                    parsed = json.loads(self.partial_json.get(index) or "{}")
                except ValueError:
                    parsed = {}
                block["input"] = parsed if isinstance(parsed, dict) else {}
            content.append(block)
        return 200, {**self.message, "content": content}


def assembly_for(kind: str, *, model: str = "",
                 input_tokens: int = 0) -> Assembly | ResponsesAssembly | MessagesAssembly:
    """The assembly for one API's stream (``kind`` as in :data:`squad.serve.demand.Kind`;
    ``model`` and ``input_tokens``: see :class:`MessagesAssembly`)."""
    if kind == "responses":
        return ResponsesAssembly()
    if kind == "messages":
        return MessagesAssembly(model=model, input_tokens=input_tokens)
    return Assembly()

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
HTTP status and body a request not streamed gets.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["Assembly", "streamed_upstream", "STREAMABLE_PATHS"]

STREAMABLE_PATHS = ("/v1/chat/completions", "/chat/completions", "/v1/completions")
"""OpenAI-shaped generation paths whose answer is the same streamed or not (llama-server's own
``/completion`` and ``/completions`` answer in a shape of their own and are sent as they are)."""


def streamed_upstream(body: dict[str, Any]) -> dict[str, Any]:
    """``body`` (not streamed) as the streamed request sent to the engine, usage included."""
    return {**body, "stream": True, "stream_options": {**(body.get("stream_options") or {}), "include_usage": True}}


class Assembly:
    """Chunks in, one answer out: :meth:`line` for each line of the stream, then :meth:`answer`."""

    def __init__(self) -> None:
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
        data = line[6:].strip()
        if data == "[DONE]":
            self.done = True
            return
        try:
            chunk = json.loads(data)
        except ValueError:
            return
        if isinstance(chunk, dict):
            self.chunk(chunk)

    def chunk(self, chunk: dict[str, Any]) -> None:
        if "error" in chunk:
            self.error = chunk
            return
        for key in ("id", "created", "model", "system_fingerprint", "object"):
            if key in chunk:
                self.envelope.setdefault(key, chunk[key])
        if isinstance(chunk.get("usage"), dict):
            self.usage = chunk["usage"]
        if isinstance(chunk.get("timings"), dict):
            self.timings = chunk["timings"]
        for choice in chunk.get("choices") or []:
            self._choice(choice)

    def _choice(self, choice: dict[str, Any]) -> None:
        index = int(choice.get("index") or 0)
        got = self.choices.setdefault(index, {"index": index, "finish_reason": None})
        if choice.get("finish_reason") is not None:
            got["finish_reason"] = choice["finish_reason"]
        if "text" in choice:  # text_completion
            got["text"] = got.get("text", "") + (choice.get("text") or "")
        delta = choice.get("delta")
        if isinstance(delta, dict):
            message = got.setdefault("message", {"role": "assistant", "content": None})
            for key in ("content", "reasoning_content"):
                if delta.get(key):
                    message[key] = (message.get(key) or "") + delta[key]
            for call in delta.get("tool_calls") or []:
                _add_call(message.setdefault("tool_calls", []), call)
        logprobs = choice.get("logprobs")
        if isinstance(logprobs, dict) and isinstance(logprobs.get("content"), list):
            got.setdefault("logprobs", {"content": []})["content"].extend(logprobs["content"])
        else:
            got.setdefault("logprobs", None)

    def answer(self) -> tuple[int, dict[str, Any]]:
        """``(HTTP status, body)``: 200 and the whole answer, or the error the stream ended with
        (its ``code``, 500 when it gives none)."""
        if self.error is not None:
            error = self.error.get("error")
            code = error.get("code") if isinstance(error, dict) else None
            return (code if isinstance(code, int) and 400 <= code < 600 else 500), self.error
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

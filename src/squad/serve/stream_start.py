"""A streamed Anthropic Messages answer always starts with ``message_start``.

llama.cpp b11434 writes ``message_start`` only into the partial result of the first generated
token (``server_task_result_cmpl_partial::to_json_anthropic``, ``first = n_decoded == 1`` in
``tools/server/server-task.cpp``). When that token ends inside a UTF-8 character (an emoji, a
CJK character split over two tokens), ``process_token`` in ``server-context.cpp`` holds it back
and sends no partial result for it, so the stream begins with ``content_block_start`` and has
no ``message_start`` at all. Clients that follow the Messages stream's event order refuse it:
the anthropic SDK raises ``Unexpected event order, got content_block_start before
"message_start"``, and Claude Code ends the task with an error. Measured here: 1 stream in 30
for SmolLM2 answering "Say hello N." (it likes to start with an emoji).

:class:`MessagesStart` sits in squad serve's relay of a streamed ``/v1/messages`` answer. It
holds the bytes until the first SSE event is whole; when that event is neither
``message_start`` nor an error, it sends a ``message_start`` of its own first (a new
``msg_...`` id, the request's model, ``input_tokens`` as squad counted the prompt), then
everything as it came. From the second event on it passes bytes through untouched.
"""

from __future__ import annotations

import json
import secrets
from typing import Any

__all__ = ["MessagesStart"]


class MessagesStart:
    """Bytes of one streamed Messages answer in (:meth:`feed`, then :meth:`end`), the same bytes
    out, preceded by a ``message_start`` event when the engine left it out.

    ``model``: the request's ``model`` (echoed as Anthropic does); ``input_tokens``: the prompt's
    tokens as squad counted them."""

    def __init__(self, *, model: str, input_tokens: int) -> None:
        self.model = model
        self.input_tokens = input_tokens
        self._held = b""
        self._checked = False
        self.added = False
        """A ``message_start`` of squad serve's own was sent."""

    def feed(self, chunk: bytes) -> bytes:
        """The bytes to send now for ``chunk`` (possibly none while the first event is incomplete)."""
        if self._checked:
            return chunk
        self._held += chunk
        out = b""
        while not self._checked:
            end = self._held.find(b"\n\n")
            if end < 0:
                return out
            kind = _event_type(self._held[:end])
            if kind is None:  # a comment or an empty event: look at the next one
                out, self._held = out + self._held[:end + 2], self._held[end + 2:]
                continue
            self._checked = True
            if kind not in ("message_start", "error"):
                self.added = True
                out += self._start()
        held, self._held = self._held, b""
        return out + held

    def end(self) -> bytes:
        """What is still held when the engine's answer ends (an incomplete first event, as it came)."""
        held, self._held = self._held, b""
        self._checked = True
        return held

    def _start(self) -> bytes:
        event: dict[str, Any] = {
            "type": "message_start",
            "message": {"id": f"msg_{secrets.token_hex(12)}", "type": "message", "role": "assistant",
                        "content": [], "model": self.model, "stop_reason": None, "stop_sequence": None,
                        "usage": {"input_tokens": self.input_tokens, "output_tokens": 0,
                                  "cache_read_input_tokens": 0}},
        }
        return b"event: message_start\ndata: " + json.dumps(event).encode() + b"\n\n"


def _event_type(block: bytes) -> str | None:
    """The ``type`` of one SSE event block's ``data:`` (``error`` for an error frame), None when it
    has no JSON data (a comment, a keep-alive)."""
    for line in block.split(b"\n"):
        if line.startswith(b"data:"):
            try:
                data = json.loads(line[5:].strip())
            except ValueError:
                return None
            if not isinstance(data, dict):
                return None
            if "error" in data:
                return "error"
            kind = data.get("type")
            return kind if isinstance(kind, str) else None
    return None

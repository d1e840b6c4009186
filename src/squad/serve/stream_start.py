"""A streamed answer starts the way its API says: Messages with ``message_start``, chat with a
first chunk whose ``delta`` carries ``role: assistant``.

llama.cpp b11434 writes both only into the partial result of the first generated token
(``first = n_decoded == 1`` in ``server_task_result_cmpl_partial::to_json_anthropic`` and
``::to_json_oaicompat_chat``, ``tools/server/server-task.cpp``). When that token ends inside a
UTF-8 character (an emoji; Hangul or kana split over two tokens), ``process_token`` in
``server-context.cpp`` holds it back and sends no partial result for it, so:

- a Messages stream begins with ``content_block_start`` and has no ``message_start`` at all; the
  anthropic SDK raises ``Unexpected event order, got content_block_start before
  "message_start"``, and Claude Code ends the task with an error;
- a chat stream has no ``role``; the openai SDK's stream helper then gives a message with
  ``role=None``, which a client that sends it back in the history has refused.

Measured here: SmolLM2 at temperature 0 answering "Reply with only this emoji: 🎉" or asked for a
Korean or Japanese word, every time; "Say hello N." at temperature 0.8, 1 stream in 30.
The Responses stream has the same fault in another form: b11434 marks ``response.created`` as
sent only in the first token's partial result (``state.oai_resp_created`` set when ``n_decoded ==
1``, ``server_task_result_cmpl_partial::update``), so when that token is held back every later
partial sends ``response.created`` and ``response.in_progress`` again, and an answer of one or two
tokens has only ``response.completed`` (the openai SDK raises ``Expected to have received
response.created before response.completed``). :class:`ResponsesStart` sends one of each first and
drops the repeats.

:class:`MessagesStart` and :class:`ChatRole` sit in squad serve's relay of a streamed answer.
They hold the bytes until the first SSE event with JSON data is whole (comments, such as squad
serve's keep-alive lines, pass), mend that event if the engine left its start out, and pass
everything after it through untouched. An error frame is never mended.
"""

from __future__ import annotations

import json
import secrets
import time
from typing import Any

__all__ = ["FirstEvent", "MessagesStart", "ChatRole", "ResponsesStart", "add_role"]


class FirstEvent:
    """Bytes of one streamed answer in (:meth:`feed`, then :meth:`end`), the same bytes out, with
    the first event that has JSON data given to :meth:`mend`."""

    def __init__(self) -> None:
        self._held = b""
        self._checked = False
        self.mended = False
        """The first event was changed (or one was added before it)."""

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
            block, self._held = self._held[:end + 2], self._held[end + 2:]
            data = _event_data(block)
            if data is None:  # a comment or an event without JSON: look at the next one
                out += block
                continue
            self._checked = True
            mended = block if "error" in data else self.mend(block, data)
            self.mended = mended != block
            out += mended
        held, self._held = self._held, b""
        return out + held

    def end(self) -> bytes:
        """What is still held when the engine's answer ends (an incomplete first event, as it came)."""
        held, self._held = self._held, b""
        self._checked = True
        return held

    def mend(self, block: bytes, data: dict[str, Any]) -> bytes:
        """The bytes to send for the first event (``block``, its ``data`` parsed)."""
        return block


class MessagesStart(FirstEvent):
    """A Messages stream: a ``message_start`` of squad serve's own before a first event that is not
    one (a new ``msg_...`` id; ``model``: the request's, echoed as Anthropic does; ``input_tokens``:
    the prompt's tokens as squad counted them)."""

    def __init__(self, *, model: str, input_tokens: int) -> None:
        super().__init__()
        self.model = model
        self.input_tokens = input_tokens

    def mend(self, block: bytes, data: dict[str, Any]) -> bytes:
        if data.get("type") == "message_start":
            return block
        event = {"type": "message_start", "message": new_message(self.model, self.input_tokens)}
        return b"event: message_start\ndata: " + json.dumps(event).encode() + b"\n\n" + block


class ChatRole(FirstEvent):
    """A chat stream: ``role: assistant`` put into the first chunk's deltas that have none."""

    def mend(self, block: bytes, data: dict[str, Any]) -> bytes:
        if not add_role(data):
            return block
        return b"data: " + json.dumps(data, ensure_ascii=False).encode() + b"\n\n"


class ResponsesStart:
    """A Responses stream (same :meth:`feed` / :meth:`end` as :class:`FirstEvent`): exactly one
    ``response.created`` and one ``response.in_progress``, first; the engine's repeats dropped,
    and a pair of squad serve's own sent when the engine sent none (a new ``resp_...`` id,
    ``model``: the request's)."""

    STARTS = (b"response.created", b"response.in_progress")

    def __init__(self, *, model: str) -> None:
        self.model = model
        self._held = b""
        self._started = False
        self._seen_progress = False
        self.mended = False
        """A repeat was dropped, or a pair of squad serve's own sent."""

    def feed(self, chunk: bytes) -> bytes:
        """The bytes to send now for ``chunk`` (whole events only; the rest is held)."""
        self._held += chunk
        out = b""
        while True:
            end = self._held.find(b"\n\n")
            if end < 0:
                return out
            block, self._held = self._held[:end + 2], self._held[end + 2:]
            out += self._block(block)

    def end(self) -> bytes:
        """What is still held when the engine's answer ends (an incomplete event, as it came)."""
        held, self._held = self._held, b""
        return held

    def _block(self, block: bytes) -> bytes:
        if self._started and not any(kind in block for kind in self.STARTS):
            return block  # the common case: no JSON parsed
        data = _event_data(block)
        if data is None:
            return block
        kind = data.get("type")
        if "error" in data and not self._started:
            self._started = True
            return block
        if kind in ("response.created", "response.in_progress"):
            repeat = self._seen_progress if kind == "response.in_progress" else self._started
            if repeat:
                self.mended = True
                return b""  # b11434's repeat
            self._started = True
            self._seen_progress = self._seen_progress or kind == "response.in_progress"
            return block
        if self._started:
            return block
        self._started = self._seen_progress = self.mended = True
        response = {"id": f"resp_{secrets.token_hex(12)}", "object": "response", "created_at": int(time.time()),
                    "status": "in_progress", "model": self.model, "output": []}
        return b"".join(b"event: " + name.encode() + b"\ndata: " + json.dumps(
            {"type": name, "response": response}).encode() + b"\n\n"
            for name in ("response.created", "response.in_progress")) + block


def new_message(model: str, input_tokens: int) -> dict[str, Any]:
    """An empty Messages ``message`` of squad serve's own (a new ``msg_...`` id), for a start the
    engine left out."""
    return {"id": f"msg_{secrets.token_hex(12)}", "type": "message", "role": "assistant", "content": [],
            "model": model, "stop_reason": None, "stop_sequence": None,
            "usage": {"input_tokens": input_tokens, "output_tokens": 0, "cache_read_input_tokens": 0}}


def add_role(chunk: dict[str, Any]) -> bool:
    """Put ``role: assistant`` first into each delta of a chat chunk's ``choices`` that has no role
    (in place); True when one was added."""
    choices = chunk.get("choices")
    missing = [c for c in choices if isinstance(c, dict) and isinstance(c.get("delta"), dict)
               and "role" not in c["delta"]] if isinstance(choices, list) else []
    for choice in missing:
        choice["delta"] = {"role": "assistant", **choice["delta"]}
    return bool(missing)


def _event_data(block: bytes) -> dict[str, Any] | None:
    """One SSE event block's ``data:`` as a JSON object, None when it has none (a comment, a
    keep-alive, ``[DONE]``)."""
    for line in block.split(b"\n"):
        if line.startswith(b"data:"):
            try:
                data = json.loads(line[5:].strip())
            except ValueError:
                return None
            return data if isinstance(data, dict) else None
    return None

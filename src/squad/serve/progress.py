"""llama-server's prompt progress, relayed as SSE comments.

A streamed chat or completions request that squad serve sends to llama-server asks for ``return_progress``: the
engine then sends a ``prompt_progress`` chunk (``total``, ``cache``, ``processed``, ``time_ms``) when its slot
starts and after each batch it reads (:data:`squad.engine.llama.N_BATCH` tokens). Those chunks are not part of the
OpenAI API, so :class:`Progress` turns each into a comment line the client's SSE reader skips
(``: prefill 2048/9000 tokens``) and passes every other byte on as it is; after the first event that is not
progress it only passes bytes on. The Messages API gets no progress from the engine (its conversion drops the
field) and Responses carries it inside its own events: neither asks for it.
"""

from __future__ import annotations

import json

__all__ = ["Progress", "PROGRESS_KINDS", "PROGRESS_FIELD"]

PROGRESS_KINDS = ("chat", "completion")
"""The APIs whose streamed requests ask llama-server for ``return_progress``."""
PROGRESS_FIELD = b'"prompt_progress"'
_MAX_EVENT = 1 << 20
"""Bytes of one unfinished event kept while looking for its end (a longer one is passed on as it is)."""


class Progress:
    """Feed the engine's stream in (:meth:`feed`); out come its progress-only events as comments and the other
    bytes as they are. :attr:`answering` turns True at the first other event (the first token, or an error)."""

    def __init__(self) -> None:
        self.answering = False
        self.seen = 0
        """Progress events turned into comments."""
        self.last: dict[str, int] | None = None
        """The last progress the engine sent."""
        self._buffer = b""

    def feed(self, chunk: bytes) -> tuple[bytes, bytes]:
        """``(comments, rest)``: the progress events of ``chunk`` as comments, and the bytes to pass on."""
        if self.answering:
            return b"", chunk
        self._buffer += chunk.replace(b"\r\n", b"\n")
        out: list[bytes] = []
        rest = b""
        while not self.answering:
            end = self._buffer.find(b"\n\n")
            if end < 0:
                if len(self._buffer) > _MAX_EVENT:
                    self.answering = True
                break
            block, self._buffer = self._buffer[:end + 2], self._buffer[end + 2:]
            comment = self._comment(block)
            if comment is None:
                self.answering = True
                rest = block
            else:
                out.append(comment)
        if self.answering:
            rest += self._buffer
            self._buffer = b""
        return b"".join(out), rest

    def end(self) -> bytes:
        """What is left unfinished (passed on as it is)."""
        rest, self._buffer = self._buffer, b""
        return rest

    def _comment(self, block: bytes) -> bytes | None:
        if PROGRESS_FIELD not in block:
            return None
        data = b"".join(line[5:].strip() for line in block.split(b"\n") if line.startswith(b"data:"))
        try:
            event = json.loads(data)
        except ValueError:
            return None
        if not isinstance(event, dict) or not isinstance(event.get("prompt_progress"), dict):
            return None
        for choice in event.get("choices") or ():  # a chunk that also carries a token is an answer
            delta = choice.get("delta") if isinstance(choice, dict) else None
            if isinstance(delta, dict) and (delta.get("content") or delta.get("reasoning_content")
                                            or delta.get("tool_calls")):
                return None
            if isinstance(choice, dict) and choice.get("text"):
                return None
        if event.get("content"):  # /completion's own shape
            return None
        progress = event["prompt_progress"]
        self.seen += 1
        self.last = {k: int(v) for k, v in progress.items() if isinstance(v, (int, float))}
        processed, total = self.last.get("processed", 0), self.last.get("total", 0)
        cache = self.last.get("cache", 0)
        return f": prefill {processed}/{total} tokens (cached {cache})\n\n".encode()

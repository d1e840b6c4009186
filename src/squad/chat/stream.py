"""Reading one llama-server stream and its errors: chunks in, a :class:`~squad.chat.ChatResult`
or a typed error out. No I/O here; :class:`squad.chat.client.EngineClient` feeds it.

Stream rules (field cases: ``docs/field-cases.md``):

- the usage-only final chunk (``choices: []``) is read for usage, never indexed (F06);
- ``reasoning_content`` deltas (a llama-server extra field) are kept apart from content;
- tool-call deltas are assembled by ``index`` (a delta without one continues the last call):
  ``id``, ``type`` and ``name`` sent once, repeated on every delta, split over the first deltas
  or growing all assemble to the one value (F17, :func:`_header`); ``arguments`` are
  concatenated;
- a stream that ends without a ``finish_reason`` is :class:`TruncatedStream`, the partial text
  only on the exception (F05); ``finish_reason == "length"`` with reasoning but no answer is a
  result cut while thinking (:attr:`~squad.chat.ChatResult.cut_while_thinking`, F07), not an error.

:func:`classify` turns an openai SDK error into squad's error tree: an error frame becomes
:class:`ContextExceeded` (``Context size has been exceeded.``) or :class:`TruncatedStream`
keeping the server's message; HTTP 400 ``exceed_context_size_error`` is
:class:`PromptTooLong`; 503 is :class:`Loading` (retried by the client); a connection lost
before the first token is :class:`EngineGone` (safe to resend), after it a truncated stream.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import openai

from squad.chat import CallTimings, ChatResult, ToolCall, Usage
from squad.engine.llama import CONTEXT_EXCEEDED, round_ctx
from squad.errors import (
    AgentRunError,
    CallTimeout,
    ContextExceeded,
    EngineError,
    EngineGone,
    PromptTooLong,
    TruncatedStream,
)

__all__ = ["StreamAssembly", "classify", "Loading", "InnocentOverflow", "error_message"]


class Loading(EngineError):
    """503 from the engine (loading or restarting); the client waits it out until its deadline."""


class InnocentOverflow(ContextExceeded):
    """The pool overflowed although squad's reservations fit it: another client did it.
    ``reserved``: tokens this process's admission held when it happened (this call's
    reservation and its siblings'), for the message: never the pool's size (F20); ``need``: the
    call's own reservation (prompt + max_tokens), set by the admitted layer (0: not known)."""

    def __init__(self, message: str, *, agent: str, reserved: int, need: int = 0) -> None:
        self.reserved, self.need = reserved, need
        super().__init__(message, agent=agent)


def error_message(body: Any, default: str) -> str:
    """``body["error"]["message"]`` of a llama-server error body, else ``default``."""
    err = body.get("error") if isinstance(body, dict) else None
    return str(err.get("message", default)) if isinstance(err, dict) else default


def classify(exc: openai.APIError, agent: str, *, base_url: str, engine_pool: int, squad_pool: int,
             squad_reserved: int, request_timeout: float, started: bool, partial: str = "") -> Exception:
    """The squad error for an SDK error of one call of ``agent``.

    ``engine_pool``/``squad_pool``/``squad_reserved`` (tokens) tell an overflow caused by
    another client (squad's reservations fit) from a misconfigured admission; ``started``:
    whether a token had arrived; ``partial``: the text so far (kept only on the error).
    """
    body = exc.body if isinstance(exc.body, dict) else {}
    body = body.get("error", body) if isinstance(body.get("error"), dict) else body
    message = str(body.get("message") or exc.message)
    if isinstance(exc, openai.APITimeoutError):
        return CallTimeout(f"agent '{agent}': no answer from the engine within {request_timeout:.0f} s; "
                           "not resent unchanged: raise request_timeout (--request-timeout on the command line) "
                           "or shorten the prompt", agent=agent)
    if isinstance(exc, openai.APIConnectionError):
        if not started:
            return EngineGone(f"engine at {base_url} is not answering ({message})")
        return TruncatedStream(f"agent '{agent}': connection to the engine dropped mid-answer ({message})",
                               agent=agent, partial=partial)
    status = getattr(exc, "status_code", None)
    if status == 503:
        return Loading(message)
    if body.get("type") == "exceed_context_size_error" or status == 400 and "exceeds the available context" in message:
        n_prompt, n_ctx = body.get("n_prompt_tokens"), body.get("n_ctx")
        fix = f"raise the context to {round_ctx(int(n_prompt) + 1)}" if n_prompt else "raise the context"
        return PromptTooLong(f"agent '{agent}': the engine refused the prompt ({message}; n_prompt_tokens="
                             f"{n_prompt}, n_ctx={n_ctx}): {fix} or shorten the prompt", agent=agent)
    if CONTEXT_EXCEEDED in message:
        if squad_pool <= engine_pool:
            return InnocentOverflow(f"agent '{agent}': {message} while this process held {squad_reserved} of the "
                                    f"engine's {engine_pool} tokens reserved: another client filled the pool",
                                    agent=agent, reserved=squad_reserved)
        return ContextExceeded(f"agent '{agent}': {message} squad's admission pool ({squad_pool}) is larger "
                               f"than the engine's ({engine_pool}): build Admission from the engine's "
                               "read-back pool", agent=agent)
    if status is None:  # an error frame inside the stream
        return TruncatedStream(f"agent '{agent}': the engine ended the stream with an error: {message}",
                               agent=agent, partial=partial)
    return AgentRunError(f"agent '{agent}': the engine answered HTTP {status}: {message}", agent=agent)


def _header(slot: dict[str, str], key: str, piece: str | None) -> None:
    """Fold one delta's ``id``/``type``/``name`` into a call being assembled (field case F17).

    Engines send these header fields in four shapes: once (llama.cpp), repeated whole on every
    delta, split into pieces over the first deltas, or growing (each delta the text so far). A
    piece equal to what is held, or arriving after the call's arguments have begun (split
    headers come before the arguments), is a repeat; a piece that extends what is held replaces
    it; any other piece continues a split field.
    """
    if not piece:
        return
    held = slot[key]
    if not held:
        slot[key] = piece
    elif piece == held or slot["arguments"]:
        return
    elif piece.startswith(held):
        slot[key] = piece
    else:
        slot[key] = held + piece


class StreamAssembly:
    """Accumulates one stream's chunks: content, reasoning, tool calls by index, usage."""

    def __init__(self) -> None:
        self.content = self.reasoning = ""
        self.calls: dict[int, dict[str, str]] = {}
        self.finish_reason: str | None = None
        self.usage: Usage | None = None
        self.timings: dict[str, Any] | None = None
        self.first_at: float | None = None
        self._last_index = 0

    def add(self, chunk: Any, on_delta: Callable[[str], None] | None = None) -> bool:
        """Take one chunk (an openai ``ChatCompletionChunk``); True when it carried generated
        text or a tool call."""
        extra = chunk.model_extra or {}
        if isinstance(extra.get("timings"), dict):
            self.timings = extra["timings"]
        if chunk.usage is not None:
            self.usage = Usage(chunk.usage.prompt_tokens, chunk.usage.completion_tokens)
        produced = False
        for choice in chunk.choices:  # empty for the usage-only chunk
            delta = choice.delta
            reasoning = (delta.model_extra or {}).get("reasoning_content")
            if reasoning:
                self.reasoning += reasoning
                produced = True
            if delta.content:
                self.content += delta.content
                produced = True
                if on_delta is not None:
                    on_delta(delta.content)
            for tc in delta.tool_calls or []:
                self._tool_delta(tc)
                produced = True
            if choice.finish_reason:
                self.finish_reason = choice.finish_reason
        return produced

    def _tool_delta(self, tc: Any) -> None:
        # the SDK builds stream chunks without validation: any field may be absent
        index = getattr(tc, "index", None)
        index = self._last_index if index is None else index
        self._last_index = index
        slot = self.calls.setdefault(index, {"id": "", "type": "", "name": "", "arguments": ""})
        fn = getattr(tc, "function", None)
        _header(slot, "id", getattr(tc, "id", None))
        _header(slot, "type", getattr(tc, "type", None))
        _header(slot, "name", getattr(fn, "name", None))
        arguments = getattr(fn, "arguments", None)
        if arguments:
            slot["arguments"] += arguments

    def result(self, agent: str, sent: float) -> ChatResult:
        """The finished call (``sent``: ``time.monotonic()`` when the request was sent).

        Raises :class:`TruncatedStream` without a finish_reason. A call that spent ``max_tokens``
        thinking (no answer) is a result like any cut one (:attr:`ChatResult.cut_while_thinking`):
        its outcome is ``truncated`` and the recipe's ``non_answers`` decides (field case F07)."""
        if self.finish_reason is None:
            raise TruncatedStream(
                f"agent '{agent}': the stream ended without a finish_reason after {len(self.content)} characters; "
                "the partial answer was discarded", agent=agent, partial=self.content)
        tool_calls = [ToolCall(c["id"] or f"call_{i}", c["name"], c["arguments"] or "{}")
                      for i, c in sorted(self.calls.items())]
        end = time.monotonic()
        ttft = self.first_at - sent if self.first_at is not None else None
        rate = None
        if self.usage and self.first_at is not None and end > self.first_at:
            rate = self.usage.completion_tokens / (end - self.first_at)
        timings = CallTimings(ttft_s=ttft, tokens_per_s=rate, engine=self.timings)
        return ChatResult(content=self.content, reasoning=self.reasoning, tool_calls=tool_calls,
                          finish_reason=self.finish_reason, usage=self.usage, timings=timings)

"""How the fake llama-server generates: scripted replies, slots, one request's token stream.

:class:`Reply` scripts one request; :class:`_Run` turns it into ``chat.completion.chunk``
dicts one token at a time, charging the fake's shared pool as it goes (see
:mod:`squad.testing.fake_engine` for the server and the pool rules).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Protocol

import anyio

from squad.engine.llama import CONTEXT_EXCEEDED, THINKING_BUDGET_FIELD
from squad.testing.counting import _words

__all__ = ["Reply", "Books"]


class Books(Protocol):
    """What a run reads of the fake engine (:class:`squad.testing.fake_engine.FakeEngine` is one): its sizes and
    delays, and the pool it charges. A protocol, so that this module does not import the engine, which imports it."""

    n_ctx: int
    n_batch: int
    prompt_delay: float
    token_delay: float

    def charge(self, slot: _Slot, tokens: int) -> None:
        """Add ``tokens`` cells to ``slot``; raises when the pool overflowed and the slot failed."""
        ...


@dataclass
class Reply:
    """One scripted behaviour for one chat request (all fields optional).

    - ``content`` / ``reasoning``: text streamed one word (= one token) per chunk;
      reasoning first, as ``reasoning_content`` deltas, cut at the request's
      ``thinking_budget_tokens`` as llama-server cuts it (then the content follows). Default content: the last user
      message's words repeated to ``max_tokens`` tokens (16 when unset).
    - ``tool_calls``: ``[{"name": ..., "arguments": "<json>"}]`` streamed after content.
    - ``finish_reason``: default ``"tool_calls"`` with tool calls, ``"length"`` when
      ``max_tokens`` (or the slot context) cut the text, else ``"stop"``.
    - ``truncate_after=K``: close the stream after K token chunks, no finish_reason, no [DONE].
    - ``error_after=K``: after K token chunks send ``data: {"error": ...}`` with
      ``error_message`` and close without [DONE].
    - ``status``: answer with this HTTP status and a llama-server error body, nothing else
      (503 → ``Loading model``, 500 → ``error_message``, 400, ...).
    - ``token_delay``: seconds before each token (overrides the engine's default).
    - ``prompt_delay``: seconds per prompt token of prefill (overrides the engine's default).
    - ``stall_after=K``: after K token chunks send nothing more and keep the slot until the
      client closes the stream (a hung engine); 0: right after the prompt is processed.
    """

    content: str | None = None
    reasoning: str | None = None
    tool_calls: list[dict] | None = None
    finish_reason: str | None = None
    truncate_after: int | None = None
    error_after: int | None = None
    error_message: str = CONTEXT_EXCEEDED
    status: int | None = None
    token_delay: float | None = None
    prompt_delay: float | None = None
    stall_after: int | None = None


class _Failed(Exception):
    def __init__(self, message: str, code: int = 500, type_: str = "server_error") -> None:
        self.body = {"error": {"code": code, "message": message, "type": type_}}
        self.code = code
        super().__init__(message)


class _Truncated(Exception):
    pass


@dataclass
class _Slot:
    id: int
    task: int = -1
    held: int = 0
    n_prompt: int = 0
    n_decoded: int = 0
    n_remain: int = 0
    failed: str | None = None
    busy: bool = False


class _Run:
    """One request's generation: yields chat.completion.chunk dicts, one token each."""

    def __init__(self, fe: Books, slot: _Slot, body: dict, reply: Reply, n_prompt: int) -> None:
        self.fe, self.slot, self.body, self.reply, self.n_prompt = fe, slot, body, reply, n_prompt
        self.id = f"chatcmpl-fake{slot.task}"
        self.content = self.reasoning = ""
        self.tool_calls: list[dict] = []
        self.finish_reason = "stop"
        self.n_decoded = 0
        self.t0 = time.monotonic()
        self.t_first: float | None = None

    def envelope(self, choices: list, **extra: Any) -> dict:
        return {"id": self.id, "object": "chat.completion.chunk", "created": int(time.time()),
                "model": "fake", "system_fingerprint": "b0-fake", "choices": choices, **extra}

    def _choice(self, delta: dict, finish: str | None = None) -> dict:
        return self.envelope([{"index": 0, "delta": delta, "finish_reason": finish}])

    def usage(self) -> dict:
        return {"prompt_tokens": self.n_prompt, "completion_tokens": self.n_decoded,
                "total_tokens": self.n_prompt + self.n_decoded}

    def timings(self) -> dict:
        end = time.monotonic()
        first = self.t_first or end
        gen_ms = max((end - first) * 1000, 1e-3)
        return {"cache_n": 0, "prompt_n": self.n_prompt, "prompt_ms": (first - self.t0) * 1000,
                "predicted_n": self.n_decoded, "predicted_ms": gen_ms,
                "predicted_per_second": self.n_decoded / gen_ms * 1000}

    def _plan(self) -> tuple[list[tuple[str, str]], list[dict], str | None]:
        """(kind, word) tokens to emit, tool calls, forced finish reason."""
        r = self.reply
        max_tokens = self.body.get("max_tokens") or self.body.get("n_predict") or 16
        content = r.content
        if content is None and r.reasoning is None and r.tool_calls is None:
            users = [m for m in self.body.get("messages", []) if m.get("role") == "user"]
            words = str(users[-1].get("content") if users else "ok").split() or ["ok"]
            content = " ".join(itertools.islice(itertools.cycle(words), max_tokens))
        thinking = (r.reasoning or "").split()
        budget = self.body.get(THINKING_BUDGET_FIELD)
        if isinstance(budget, int) and budget >= 0:  # as llama-server: thinking ends at the budget
            thinking = thinking[:budget]
        tokens = [("reasoning_content", w) for w in thinking]
        tokens += [("content", w) for w in (content or "").split()]
        room = min(max_tokens, self.fe.n_ctx - self.n_prompt)
        if len(tokens) >= room and not r.tool_calls:
            return tokens[:room], [], "length"
        return tokens, r.tool_calls or [], None

    def _progress(self, processed: int) -> dict:
        """llama-server's prompt-progress chunk (``return_progress``): a role delta with
        ``prompt_progress`` {total, cache, processed, time_ms}."""
        ms = int((time.monotonic() - self.t0) * 1000)
        return self._choice({"role": "assistant", "content": None}) | {
            "prompt_progress": {"total": self.n_prompt, "cache": 0, "processed": processed, "time_ms": ms}}

    async def _prefill(self) -> AsyncIterator[dict]:
        """Process the prompt one batch (``fe.n_batch`` tokens) at a time, ``prompt_delay`` s per
        token; with ``return_progress`` in a streaming body, a progress chunk at the start and
        after each batch, as llama-server sends them."""
        fe, r = self.fe, self.reply
        per_token = fe.prompt_delay if r.prompt_delay is None else r.prompt_delay
        progress = bool(self.body.get("stream") and self.body.get("return_progress"))
        if progress:
            yield self._progress(0)
        done = 0
        while per_token and done < self.n_prompt:
            step = min(fe.n_batch, self.n_prompt - done)
            await anyio.sleep(step * per_token)
            done += step
            if progress:
                yield self._progress(done)

    async def chunks(self) -> AsyncIterator[dict]:
        fe, slot, r = self.fe, self.slot, self.reply
        delay = fe.token_delay if r.token_delay is None else r.token_delay
        tokens, tool_calls, forced = self._plan()
        slot.n_remain = len(tokens)
        fe.charge(slot, self.n_prompt)  # prefill
        async for progress in self._prefill():
            yield progress
        started = False
        for i, (kind, word) in enumerate(tokens):
            if r.stall_after is not None and i >= r.stall_after:
                await anyio.sleep_forever()
            if r.truncate_after is not None and i >= r.truncate_after:
                raise _Truncated
            if r.error_after is not None and i >= r.error_after:
                raise _Failed(r.error_message)
            await anyio.sleep(delay)
            fe.charge(slot, 1)
            self.n_decoded += 1
            slot.n_decoded, slot.n_remain = self.n_decoded, slot.n_remain - 1
            text = word if (self.content if kind == "content" else self.reasoning) == "" else " " + word
            if kind == "content":
                self.content += text
            else:
                self.reasoning += text
            if not started:
                self.t_first, started = time.monotonic(), True
                yield self._choice({"role": "assistant", "content": None})
            yield self._choice({kind: text})
        if r.truncate_after is not None:
            raise _Truncated
        if r.error_after is not None:
            raise _Failed(r.error_message)
        for index, call in enumerate(tool_calls):
            await anyio.sleep(delay)
            args = call.get("arguments", "{}")
            fe.charge(slot, 1 + _words(args))
            self.n_decoded += 1 + _words(args)
            call_id = call.get("id") or f"call_{slot.task}_{index}"
            self.tool_calls.append({"id": call_id, "type": "function",
                                    "function": {"name": call["name"], "arguments": args}})
            if not started:
                self.t_first, started = time.monotonic(), True
                yield self._choice({"role": "assistant", "content": None})
            yield self._choice({"tool_calls": [{"index": index, "id": call_id, "type": "function",
                                                "function": {"name": call["name"], "arguments": ""}}]})
            yield self._choice({"tool_calls": [{"index": index, "function": {"arguments": args}}]})
        if not started:
            self.t_first = time.monotonic()
            yield self._choice({"role": "assistant", "content": None})
        self.finish_reason = r.finish_reason or forced or ("tool_calls" if tool_calls else "stop")
        yield self._choice({}, self.finish_reason) | {"timings": self.timings()}

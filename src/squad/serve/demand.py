"""What one generation request asks of the engine: its prompt tokens and its ``max_tokens``.

``squad serve`` reserves ``prompt + max_tokens`` KV cells for each request in squad's
:class:`~squad.sched.admission.Admission` before it is sent on. The prompt is counted by the
project's one counter (:class:`~squad.chat.counting.PromptCounter`: the model's own tokenizer and
chat template, else the engine's ``/v1/chat/completions/input_tokens``; for a plain-text prompt
``/tokenize``; each API's own: :mod:`squad.serve.apis`). ``max_tokens`` is the largest of the
generation-limit fields the API reads (:data:`MAX_TOKEN_FIELDS`: ``n_predict``, ``max_completion_tokens``,
``max_tokens``, Responses ``max_output_tokens``); a request without any gets the server's stated
default. Either way the reserved limit is written into every one of those fields of the body sent
(:meth:`squad.serve.apis.base.Api.write_limit`): the engine never generates more than was reserved.

A request that cannot be admitted is a :class:`Refused`: an HTTP status and an OpenAI-shaped
error body with the numbers (``{"error": {"message", "type", "param", "code", ...}}``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal

from squad.engine.llama import COMPLETIONS_FIELDS, LIMIT_FIELDS, round_ctx

__all__ = ["Demand", "Refused", "Kind", "MAX_TOKEN_FIELDS", "read_max_tokens", "completions", "demand_for",
           "error_body"]

Kind = Literal["chat", "completion", "responses", "messages", "embeddings", "infill", "rerank"]
"""The name of an API squad serve admits (:data:`squad.serve.apis.APIS`: one module each)."""

MAX_TOKEN_FIELDS = (*LIMIT_FIELDS, "max_output_tokens")
"""Request fields llama-server reads as the most tokens to generate (Responses' ``max_output_tokens``
becomes ``max_tokens``)."""


class Refused(Exception):
    """A request squad serve answers itself: ``status`` (HTTP) and ``body`` (OpenAI error shape)."""

    def __init__(self, status: int, message: str, type_: str = "invalid_request_error", **extra: Any) -> None:
        super().__init__(message)
        self.status, self.body = status, error_body(status, message, type_, **extra)


def error_body(status: int, message: str, type_: str, **extra: Any) -> dict[str, Any]:
    """``{"error": {"message", "type", "param": None, "code": status, **extra}}`` (what the openai
    SDK reads, and the shape llama-server itself answers errors with)."""
    return {"error": {"message": message, "type": type_, "param": None, "code": status, **extra}}


@dataclass(frozen=True)
class Demand:
    """One request's reservation: ``prompt`` tokens + ``max_tokens`` = ``tokens``. ``defaulted``:
    the request gave no max_tokens and got the server's default (or less, to fit)."""

    prompt: int
    max_tokens: int
    defaulted: bool = False

    @property
    def tokens(self) -> int:
        return self.prompt + self.max_tokens


def read_max_tokens(body: dict[str, Any], fields: tuple[str, ...] = MAX_TOKEN_FIELDS) -> int | None:
    """The most tokens ``body`` asks the engine to generate: the largest of ``fields`` given, None
    when none is (``n_predict: -1`` means none: squad's default is reserved, and written). Raises
    :class:`Refused` for a value that is not a whole number >= 1."""
    found: list[int] = []
    for name in fields:
        value = body.get(name)
        if value is None or (name == "n_predict" and value == -1 and not isinstance(value, bool)):
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise Refused(400, f"{name} must be a whole number of at least 1, got {value!r}", param=name)
        found.append(value)
    return max(found) if found else None


def completions(body: dict[str, Any]) -> Any:
    """The number of completions ``body`` asks for, as llama-server reads it: the first of
    :data:`~squad.engine.llama.COMPLETIONS_FIELDS` given and not null (1 when none is); not checked."""
    for name in COMPLETIONS_FIELDS:
        if body.get(name) is not None:
            return body[name]
    return 1


Count = Callable[[dict[str, Any], Kind], Awaitable[int]]


async def demand_for(body: dict[str, Any], kind: Kind, count: Count, *, limit: int, default_max_tokens: int,
                     fields: tuple[str, ...] = MAX_TOKEN_FIELDS) -> Demand:
    """The :class:`Demand` of ``body`` on an engine where one request may hold at most ``limit``
    tokens (:attr:`squad.sched.admission.Admission.limit`). A request without max_tokens gets
    ``default_max_tokens``, lowered to what fits beside its prompt. ``count(body, kind)`` returns
    the prompt tokens.

    Raises :class:`Refused` (400) for a request that can never fit, with the numbers and the fix.
    """
    n = completions(body)
    if isinstance(n, bool) or not isinstance(n, int) or n != 1:
        raise Refused(400, f"squad serve admits one completion per request here, got n={n!r}: "
                           "send n requests instead", param="n")
    asked = read_max_tokens(body, fields)
    prompt = await count(body, kind)
    if asked is None:
        room = limit - prompt
        if room < 1:
            raise _never_fits(prompt, None, limit)
        return Demand(prompt, min(default_max_tokens, room), defaulted=True)
    if prompt + asked > limit:
        raise _never_fits(prompt, asked, limit)
    return Demand(prompt, asked)


def _never_fits(prompt: int, max_tokens: int | None, limit: int) -> Refused:
    need = prompt + (max_tokens or 1)
    restart = (f"restart squad serve with --ctx {round_ctx(need):,} (a request too big for the engine is refused, "
               "never re-planned for: re-planning follows requests that wait)")
    if max_tokens is None:
        message = (f"this request's prompt is {prompt:,} tokens, but one request may hold at most {limit:,} tokens "
                   f"(prompt + max_tokens) on this engine: shorten the prompt by {prompt - limit + 1:,} tokens, "
                   f"or {restart}")
    else:
        fixes = [f"lower max_tokens to {limit - prompt:,}"] if prompt < limit else []
        fixes += [f"shorten the prompt by {need - limit:,} tokens", restart]
        message = (f"this request needs {need:,} tokens (prompt {prompt:,} + max_tokens {max_tokens:,}), but one "
                   f"request may hold at most {limit:,} tokens on this engine: " + ", or ".join(fixes))
    return Refused(400, message, "exceed_context_size_error", n_prompt_tokens=prompt, max_tokens=max_tokens,
                   n_ctx=limit)

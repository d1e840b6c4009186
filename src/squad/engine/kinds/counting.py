"""How an engine kind's prompts are counted when the model file is not on this machine: a
:class:`PromptCounting` object on each :class:`~squad.engine.kinds.base.EngineKind`.

The callers (the client's transport, ``squad serve``'s gateway) hand it a :data:`Post`: their own
way to send a JSON body to the engine (their connection, retries and error types); the counter
says where to send what and reads the answer. A kind with no tokenize endpoint estimates
(:class:`Estimate`) and never posts. Adding a kind that counts another way is one class here.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

__all__ = ["PromptCounting", "Post", "InputTokens", "Tokenize", "Estimate", "INPUT_TOKENS", "TOKENIZE", "ESTIMATE",
           "ESTIMATE_OVERHEAD", "estimate_tokens", "estimate_chat_tokens"]

Post = Callable[[str, dict[str, Any]], Awaitable[Any]]
"""``await post(path, body)``: POST ``body`` as JSON to ``path`` on the engine and return the JSON of
its 200 answer; the caller raises its own errors for anything else."""

ESTIMATE_OVERHEAD = 8
"""Tokens :func:`estimate_chat_tokens` adds per message and once per prompt (role markers and the
assistant opener of a chat template; real templates spend 3-6)."""


def estimate_tokens(text: str) -> int:
    """Tokens of ``text`` estimated without a tokenizer: UTF-8 bytes / 2, rounded up (a lone
    surrogate counts as its 3 bytes instead of failing)."""
    return (len(text.encode("utf-8", "surrogatepass")) + 1) // 2


def estimate_chat_tokens(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> int:
    """Prompt tokens of a chat request estimated without a tokenizer, for a server that has no
    tokenize endpoint for chat (Ollama, LM Studio, SGLang, an unknown server): the messages' and
    tools' UTF-8 bytes / 2 (:func:`estimate_tokens`; tokenizers spend 3-4
    bytes per token of ordinary text, so this counts high) plus :data:`ESTIMATE_OVERHEAD` per
    message and per prompt. High on purpose: admission must not reserve less than the server
    uses. It is not a bound for unusual text (a tokenizer may spend one token per byte)."""
    n = ESTIMATE_OVERHEAD
    for message in messages:
        n += ESTIMATE_OVERHEAD + estimate_tokens(json.dumps(message.get("content") or "", ensure_ascii=False))
        for key in ("tool_calls", "reasoning_content"):
            if message.get(key):
                n += estimate_tokens(json.dumps(message[key], ensure_ascii=False))
    if tools:
        n += estimate_tokens(json.dumps(tools, ensure_ascii=False))
    return n


class PromptCounting(Protocol):
    """How one kind counts a prompt.

    - ``name``: ``"input_tokens"``, ``"tokenize"``, ``"estimate"`` (what ``squad engine info --json`` shows);
    - ``describe``: the same in words; ``exact``: the count is the engine's own (not an estimate);
    - :meth:`chat`: tokens of a chat prompt (``messages`` + ``tools``) for ``model``;
    - :meth:`text`: tokens of a text prompt, special tokens included (``squad serve``'s completions).
    """

    @property
    def name(self) -> str: ...

    @property
    def describe(self) -> str: ...

    @property
    def exact(self) -> bool: ...

    async def chat(self, post: Post, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                   model: str) -> int: ...

    async def text(self, post: Post, prompt: str, model: str) -> int: ...


class InputTokens:
    """llama-server (and squad serve in front of one): ``POST /v1/chat/completions/input_tokens``
    (``{"input_tokens"}``) for chat, ``POST /tokenize`` ``{"content", "add_special"}`` (``{"tokens"}``) for text."""

    name = "input_tokens"
    describe = "POST /v1/chat/completions/input_tokens (exact)"
    exact = True

    async def chat(self, post: Post, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                   model: str) -> int:
        body: dict[str, Any] = {"messages": messages, **({"tools": tools} if tools else {})}
        return int((await post("/v1/chat/completions/input_tokens", body))["input_tokens"])

    async def text(self, post: Post, prompt: str, model: str) -> int:
        return len((await post("/tokenize", {"content": prompt, "add_special": True}))["tokens"])


class Tokenize:
    """vLLM: ``POST /tokenize`` with the chat messages (``{"count", "max_model_len", "tokens"}``), or
    with a text prompt (``TokenizeCompletionRequest``: ``{"model", "prompt", "add_special_tokens"}``)."""

    name = "tokenize"
    describe = "POST /tokenize with the chat messages (exact)"
    exact = True

    async def chat(self, post: Post, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                   model: str) -> int:
        body: dict[str, Any] = {"messages": messages, **({"tools": tools} if tools else {}), "model": model}
        return int((await post("/tokenize", body))["count"])

    async def text(self, post: Post, prompt: str, model: str) -> int:
        return len((await post("/tokenize", {"model": model, "prompt": prompt, "add_special_tokens": True}))["tokens"])


class Estimate:
    """No tokenize endpoint (Ollama, LM Studio, SGLang's takes no chat, an unknown server): squad's
    estimate, high on purpose (:func:`estimate_chat_tokens`); never posts."""

    name = "estimate"
    describe = ("squad's estimate: UTF-8 bytes / 2 + 8 per message (the server has no chat "
                "tokenize endpoint)")
    exact = False

    async def chat(self, post: Post, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                   model: str) -> int:
        return estimate_chat_tokens(messages, tools)

    async def text(self, post: Post, prompt: str, model: str) -> int:
        return estimate_tokens(prompt) + ESTIMATE_OVERHEAD


INPUT_TOKENS, TOKENIZE, ESTIMATE = InputTokens(), Tokenize(), Estimate()
"""The counters the shipped kinds use."""

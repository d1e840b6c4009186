"""The fakes' token count: words plus fixed overheads, so tests can compute it by hand."""

from __future__ import annotations

import json
from typing import Any

__all__ = ["count_tokens", "MESSAGE_OVERHEAD", "PROMPT_OVERHEAD"]

MESSAGE_OVERHEAD = 4
"""Tokens each chat message costs beyond its words (role markers)."""

PROMPT_OVERHEAD = 3
"""Tokens every prompt costs beyond its messages (the assistant turn opener)."""

"""llama-server's message when the unified pool is exhausted by the running requests."""


def _words(text: Any) -> int:
    if text is None:
        return 0
    if isinstance(text, list):  # content parts
        return sum(_words(part.get("text")) for part in text if isinstance(part, dict))
    return len(str(text).split())


def count_tokens(messages: list[dict], tools: list[dict] | None = None) -> int:
    """Prompt tokens the fake charges for ``messages`` (+ ``tools``): words + overheads."""
    n = PROMPT_OVERHEAD
    for m in messages:
        n += MESSAGE_OVERHEAD + _words(m.get("content")) + _words(m.get("reasoning_content"))
        if m.get("tool_calls"):
            n += _words(json.dumps(m["tool_calls"]))
    if tools:
        n += _words(json.dumps(tools))
    return n

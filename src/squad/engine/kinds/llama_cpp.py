"""llama.cpp's ``llama-server``: read by :func:`squad.engine.control.attach` from ``/props``
(not probed here); admitted by its KV pool, counted by ``/v1/chat/completions/input_tokens``."""

from __future__ import annotations

from squad.engine.kinds.base import EngineKind
from squad.engine.kinds.counting import INPUT_TOKENS
from squad.engine.llama import THINKING_BUDGET_FIELD

__all__ = ["KIND"]

KIND = EngineKind(
    name="llama.cpp",
    policy="reserve by pool: llama-server fails every running request when its KV pool overflows",
    counting=INPUT_TOKENS,
    progress=True,
    llama_server=True,
    thinking="a hard cap per request: thinking_budget_tokens (the end tag is forced at the budget)",
    thinking_request=lambda budget: {THINKING_BUDGET_FIELD: budget},
)

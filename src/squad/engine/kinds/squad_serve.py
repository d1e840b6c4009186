"""A ``squad serve`` endpoint (it answers ``/squad/status``; read by :func:`squad.engine.control.attach`):
it admits every request itself, so a client sends without reserving (field case F20)."""

from __future__ import annotations

from squad.engine.kinds.base import EngineKind
from squad.engine.kinds.counting import INPUT_TOKENS
from squad.engine.llama import THINKING_BUDGET_FIELD

__all__ = ["KIND"]

KIND = EngineKind(
    name="squad-serve",
    policy="the squad serve endpoint admits every request itself; squad sends without reserving",
    counting=INPUT_TOKENS,
    progress=True,
    llama_server=True,
    thinking="passed on to its llama-server: thinking_budget_tokens",
    thinking_request=lambda budget: {THINKING_BUDGET_FIELD: budget},
)

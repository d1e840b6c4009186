"""Any other OpenAI-compatible server (the catch-all, probed last): it must answer ``GET /v1/models``
with a model list; its context from that list when it says, concurrency from the pins or the
conservative defaults; counted by estimate."""

from __future__ import annotations

import httpx

from squad.engine.kinds.base import (
    DEFAULT_CTX,
    DEFAULT_SLOTS,
    Capacity,
    EngineKind,
    Pins,
    first_model,
    openai_models,
    positive,
)
from squad.engine.kinds.counting import ESTIMATE

__all__ = ["KIND"]


async def probe(client: httpx.AsyncClient, pins: Pins) -> Capacity:
    """Raises :class:`~squad.errors.UserError` when ``/v1/models`` answers no model list (not an
    engine, or the key refused)."""
    card = first_model(await openai_models(client))
    context, where = None, ""
    for key in ("max_model_len", "context_length", "context_window"):
        if card and positive(card.get(key)) is not None:
            context, where = positive(card.get(key)), f"/v1/models data[0].{key}"
            break
    n_ctx = pins.take("ctx", context, where, default=DEFAULT_CTX, default_why="the server reports no context")
    n_slots = pins.take("slots", None, "", default=DEFAULT_SLOTS, default_why="the server reports no concurrency")
    pins.sources["pool"] = "slots × context: nothing reported, each request is kept under its own context"
    return pins.capacity("openai-compatible", n_slots, n_ctx, n_slots * n_ctx,
                         model=str(card.get("id", "")) if card else "")


KIND = EngineKind(
    name="openai-compatible",
    policy="nothing reported: squad keeps to the pins or its conservative defaults",
    counting=ESTIMATE,
    probe=probe,
    probe_order=1000,
)

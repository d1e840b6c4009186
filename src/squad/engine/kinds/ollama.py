"""Ollama: detected by ``/api/version``; context from ``/api/ps`` (the loaded model); one request
at a time unless pinned (``OLLAMA_NUM_PARALLEL`` is not reported). It silently truncates a prompt
longer than its context, so squad refuses one itself; counted by estimate."""

from __future__ import annotations

import httpx

from squad.engine.kinds.base import DEFAULT_CTX, Capacity, EngineKind, Pins, get_json, positive
from squad.engine.kinds.counting import ESTIMATE

__all__ = ["KIND"]


async def probe(client: httpx.AsyncClient, pins: Pins) -> Capacity | None:
    version = await get_json(client, "/api/version")
    if not (isinstance(version, dict) and "version" in version):
        return None
    ps = await get_json(client, "/api/ps")
    loaded = [m for m in (ps.get("models") or []) if isinstance(m, dict)] if isinstance(ps, dict) else []
    context = positive(loaded[0].get("context_length")) if loaded else None
    n_ctx = pins.take("ctx", context, f"/api/ps models[0].context_length ({loaded[0].get('name')})" if loaded else "",
                      default=DEFAULT_CTX, default_why="no model is loaded, so /api/ps reports no context_length")
    n_slots = pins.take("slots", None, "", default=1,
                        default_why="Ollama does not report OLLAMA_NUM_PARALLEL; its own default is 1",
                        warn=False)  # 1 is Ollama's own default, not a guess
    pins.sources["pool"] = f"slots × context ({n_slots} × {n_ctx}): Ollama gives each parallel request its own num_ctx"
    return pins.capacity("ollama", n_slots, n_ctx, n_slots * n_ctx,
                         model=str(loaded[0].get("name", "")) if loaded else "", version=str(version["version"]))


KIND = EngineKind(
    name="ollama",
    policy="keep every request under the loaded context: Ollama silently truncates a longer prompt, so squad "
           "refuses it",
    counting=ESTIMATE,
    probe=probe,
    probe_order=30,
    truncates=True,
    thinking="on or off only: reasoning_effort none turns thinking off; no budget of N tokens",
    # Ollama's OpenAI endpoint turns thinking off for reasoning_effort "none" (ollama/ollama#14820)
    thinking_request=lambda budget: {"reasoning_effort": "none"} if budget == 0 else None,
)

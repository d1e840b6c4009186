"""LM Studio: detected by ``/api/v1/models`` (``loaded_instances[].config``) or ``/api/v0/models``
(``state``); context and parallel predictions from the loaded model. Its overflow policy cuts a
too-long prompt, so squad refuses one itself; counted by estimate; no thinking budget."""

from __future__ import annotations

import httpx

from squad.engine.kinds.base import DEFAULT_CTX, Capacity, EngineKind, Pins, get_json, positive
from squad.engine.kinds.counting import ESTIMATE

__all__ = ["KIND"]


async def probe(client: httpx.AsyncClient, pins: Pins) -> Capacity | None:
    v1 = await get_json(client, "/api/v1/models")
    if isinstance(v1, dict) and isinstance(v1.get("models"), list):
        for model in v1["models"]:
            instances = model.get("loaded_instances") if isinstance(model, dict) else None
            if instances and model.get("type") == "llm":
                config = instances[0].get("config") or {}
                key = model.get("key", "")
                n_ctx = pins.take("ctx", positive(config.get("context_length")),
                                  f"/api/v1/models {key} loaded_instances[0].config.context_length",
                                  default=DEFAULT_CTX, default_why="not reported")
                n_slots = pins.take("slots", positive(config.get("parallel")),
                                    f"/api/v1/models {key} loaded_instances[0].config.parallel",
                                    default=1, default_why="LM Studio reports no parallel for this model")
                return _capacity(pins, n_slots, n_ctx, str(key))
        return _capacity(pins, pins.take("slots", None, "", default=1, default_why="no model is loaded"),
                         pins.take("ctx", None, "", default=DEFAULT_CTX, default_why="no model is loaded"), "")
    v0 = await get_json(client, "/api/v0/models")
    data = v0.get("data") if isinstance(v0, dict) else None
    if not (isinstance(data, list) and any(isinstance(m, dict) and "state" in m for m in data)):
        return None
    loaded = [m for m in data if isinstance(m, dict) and m.get("state") == "loaded" and m.get("type") in ("llm", "vlm")]
    model = loaded[0] if loaded else {}
    context = positive(model.get("loaded_context_length")) or positive(model.get("max_context_length"))
    n_ctx = pins.take("ctx", context, f"/api/v0/models {model.get('id')} max_context_length" if loaded else "",
                      default=DEFAULT_CTX, default_why="no model is loaded")
    n_slots = pins.take("slots", None, "", default=1, default_why="/api/v0 does not report parallel predictions")
    return _capacity(pins, n_slots, n_ctx, str(model.get("id", "")))


def _capacity(pins: Pins, n_slots: int, n_ctx: int, model: str) -> Capacity:
    pins.sources["pool"] = "one context (LM Studio does not say whether parallel predictions share it)"
    return pins.capacity("lmstudio", n_slots, n_ctx, n_ctx, model=model)


KIND = EngineKind(
    name="lmstudio",
    policy="keep every request under the loaded context: LM Studio's overflow policy cuts a longer prompt, "
           "so squad refuses it",
    counting=ESTIMATE,
    probe=probe,
    probe_order=40,
    truncates=True,
)

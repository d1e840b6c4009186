"""SGLang: detected by ``/server_info`` (or ``/get_server_info``) with ``max_total_num_tokens``;
capacity from it, the running-request cap and the context length; no chat tokenize endpoint, so
estimated. Past its KV capacity it retracts and recomputes (thrash), so squad keeps within it.
It takes no thinking budget squad sends (its per-request cap needs ``--enable-strict-thinking``)."""

from __future__ import annotations

import httpx

from squad.engine.kinds.base import DEFAULT_CTX, Capacity, EngineKind, Pins, derived_slots, get_json, positive
from squad.engine.kinds.counting import ESTIMATE

__all__ = ["KIND"]


async def probe(client: httpx.AsyncClient, pins: Pins) -> Capacity | None:
    info, path = await get_json(client, "/server_info"), "/server_info"
    if not (isinstance(info, dict) and "max_total_num_tokens" in info):
        info, path = await get_json(client, "/get_server_info"), "/get_server_info"
    if not (isinstance(info, dict) and "max_total_num_tokens" in info):
        return None
    states = info.get("internal_states") or [{}]
    state = states[0] if isinstance(states, list) and states and isinstance(states[0], dict) else {}
    running = positive(state.get("effective_max_running_requests_per_dp"))
    running_where = f"{path} internal_states[0].effective_max_running_requests_per_dp"
    if running is None:
        running, running_where = positive(info.get("max_running_requests")), f"{path} max_running_requests"
    context, context_where = positive(info.get("context_length")), f"{path} context_length"
    if context is None and positive(info.get("max_req_input_len")) is not None:
        context, context_where = int(info["max_req_input_len"]) + 1, f"{path} max_req_input_len + 1"
    capacity = positive(info.get("max_total_num_tokens"))
    n_ctx = pins.take("ctx", context, context_where, default=DEFAULT_CTX,
                      default_why="SGLang reported no context length")
    pool = capacity or n_ctx
    pins.sources["pool"] = f"{path} max_total_num_tokens" if capacity else "one context (no KV capacity reported)"
    n_slots = derived_slots(pins, running, running_where, pool, n_ctx, "SGLang reported no max_running_requests")
    return pins.capacity("sglang", n_slots, min(n_ctx, pool), pool, model=str(info.get("model_path") or ""),
                         version=str(info.get("version") or ""))


KIND = EngineKind(
    name="sglang",
    policy="keep running requests within the reported KV capacity and running-request cap: SGLang retracts "
           "and recomputes past them (thrash)",
    counting=ESTIMATE,
    probe=probe,
    probe_order=10,
)

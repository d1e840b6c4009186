"""vLLM: detected by ``/metrics`` (``vllm:cache_config_info``) or ``/version`` + ``owned_by: vllm``;
capacity from ``num_gpu_blocks`` × ``block_size`` and ``max_model_len``; counted by ``POST /tokenize``.
Past its KV capacity it preempts and recomputes (thrash), so squad keeps within it."""

from __future__ import annotations

import re

import httpx

from squad.engine.kinds.base import (
    DEFAULT_CTX,
    Capacity,
    EngineKind,
    Pins,
    derived_slots,
    first_model,
    get_json,
    get_text,
    positive,
)
from squad.engine.kinds.counting import TOKENIZE

__all__ = ["KIND", "parse_cache_config"]

_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def parse_cache_config(metrics: str) -> dict[str, str] | None:
    """The labels of vLLM's ``vllm:cache_config_info`` line in Prometheus text, or None."""
    for line in metrics.splitlines():
        if line.startswith("vllm:cache_config_info{"):
            return dict(_LABEL.findall(line[line.index("{") + 1:line.rindex("}")]))
    return None


async def probe(client: httpx.AsyncClient, pins: Pins) -> Capacity | None:
    metrics = await get_text(client, "/metrics")
    cache = parse_cache_config(metrics) if metrics else None
    version = await get_json(client, "/version")
    card = first_model(await get_json(client, "/v1/models"))
    owned = str(card.get("owned_by", "")) if card else ""
    if cache is None and not (isinstance(version, dict) and "version" in version and owned == "vllm"):
        return None
    context = positive(card.get("max_model_len")) if card else None
    n_ctx = pins.take("ctx", context, "/v1/models data[0].max_model_len", default=DEFAULT_CTX,
                      default_why="vLLM reported no max_model_len")
    blocks, size = (positive(cache.get("num_gpu_blocks")), positive(cache.get("block_size"))) if cache else (None, None)
    if blocks and size:
        pool = blocks * size
        pins.sources["pool"] = f"/metrics vllm:cache_config_info num_gpu_blocks {blocks} × block_size {size}"
    else:
        pool = n_ctx
        pins.sources["pool"] = "one context: /metrics has no vllm:cache_config_info (started without metrics?)"
    n_slots = derived_slots(pins, None, "", pool, n_ctx, "vLLM does not report --max-num-seqs")
    return pins.capacity("vllm", n_slots, min(n_ctx, pool), pool, model=str(card.get("id", "")) if card else "",
                         version=str(version.get("version", "")) if isinstance(version, dict) else "")


KIND = EngineKind(
    name="vllm",
    policy="keep running requests within the reported KV capacity and running-request cap: vLLM preempts "
           "and recomputes past them (thrash)",
    counting=TOKENIZE,
    probe=probe,
    probe_order=20,
    thinking="a hard cap per request: thinking_token_budget (needs the server's --reasoning-config)",
    # vLLM's vllm/v1/sample/thinking_budget_state.py: the end token is forced at the budget
    thinking_request=lambda budget: {"thinking_token_budget": budget},
)

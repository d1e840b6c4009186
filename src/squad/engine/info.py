"""What a running engine reports about itself, read back after load."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["EngineInfo"]


@dataclass(frozen=True)
class EngineInfo:
    """The engine as it really is, read back from ``/props``, ``/slots`` and ``/v1/models``.

    These values, never the requested ones, are what squad uses and shows.

    - ``base_url``: ``http://127.0.0.1:PORT`` (no ``/v1``).
    - ``api_key``: bearer key or None.
    - ``slots``: ``/props`` ``total_slots``.
    - ``n_ctx``: ``/props`` ``default_generation_settings.n_ctx``: the context one request
      may use, in tokens. With unified KV this is the whole shared pool.
    - ``kv_unified``: True/False when known (squad launched it, or it could be inferred),
      None when an attached engine does not say.
    - ``pool``: KV cells the slots share, in tokens. Unified: ``n_ctx``. Not unified: each slot
      has its own ``n_ctx`` cells, so admission must keep each request under ``n_ctx``.
    - ``n_ctx_train``: the model's training context (``/v1/models`` ``data[0].meta``), or None.
    - ``template_has_tools``: whether ``/props`` ``chat_template`` refers to ``tools`` at all
      (None when unknown). llama-server renders ``tools`` into the prompt only through the
      model's chat template, so a template without them silently drops the tool definitions
      (measured on b11434 with SmolLM2: the same prompt token count with and without tools).
    """

    base_url: str
    api_key: str | None = field(repr=False)
    slots: int
    n_ctx: int
    kv_unified: bool | None
    pool: int
    n_ctx_train: int | None = None
    model_path: str = ""
    model_alias: str = ""
    build_info: str = ""
    launched: bool = True
    template_has_tools: bool | None = None

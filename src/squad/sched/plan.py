"""The engine plan: what one llama-server is to be started with.

An :class:`EnginePlan` is made by the planner (:func:`squad.sched.planner.plan`, through
:func:`squad.engine.session.plan_engine`), realised by the launcher (:meth:`EnginePlan.server_args`
gives the argv, from :mod:`squad.engine.llama`) and compared after load with what the engine
reported.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from squad.engine.llama import DEFAULT_SLOTS, round_ctx, server_args

if TYPE_CHECKING:
    from squad.sched.workload import Stage

__all__ = ["EnginePlan", "Backend"]

Backend = Literal["llama-server", "mlx", "attached"]
"""What serves the plan: llama-server squad launches, mlxcel-server (one slot), or an engine
squad attaches to (planned only to check it)."""


@dataclass(frozen=True)
class EnginePlan:
    """An immutable engine configuration.

    Two plans compare equal exactly when they would start the same engine (model, slots,
    context, unified KV, KV cache types, backend); reasons, warnings and estimates do not
    take part in the comparison, so the launcher reloads only on a real difference.

    - ``n_ctx``: total context in tokens, already rounded up to a multiple of 256.
    - ``slots``: parallel request slots (``-np``), 1..8.
    - ``kv_unified``: pass ``--kv-unified`` (always True when ``slots >= 2`` on llama-server).
    - ``kv_bytes``: estimated KV cache size in bytes for ``n_ctx`` cells, or None if unknown.
    - ``per_slot_ctx``: tokens one request may use (the whole pool when unified, capped at
      the training context; an MLX batch's per-sequence share).
    - ``timeline``: the workload's concurrency stages (:func:`squad.sched.workload.stages`), for display.
    - ``requested_ctx``: the context before rounding up to 256 (what was pinned or summed).
    - ``memory_for_kv``: bytes the machine had for the KV cache when planned, or None;
      ``memory_source``: which memory that was ("system RAM", "GPU 0 (name)"), or None.
    - ``kv_bytes_full``: what the KV cache would take if every layer held all ``n_ctx`` cells;
      above ``kv_bytes`` for a sliding-window model (the window's saving), else equal.
    - ``n_ctx_train``: the model's training context in tokens, or None.
    - ``peak``: agents the workload runs at once (None: nothing planned; -1: unbounded).
    - ``budgets``: each agent's budget in tokens as planned (auto ones resolved); the runtime
      checks every call against it.
    - ``chat_template``: a chat template file squad ships, passed to the engine in place of the
      model's own (:func:`squad.engine.chat_templates.tool_template_for`), or None for the
      model's own; ``template_name`` names it for display.
    - ``gpu_layers``: ``-ngl`` (a count or ``"all"``), or None to pass none (CPU);
      :func:`squad.sched.memory.kv_memory` chose it with the memory KV is planned against.
    """

    model: Path
    slots: int
    n_ctx: int
    kv_unified: bool
    cache_type_k: str = "f16"
    cache_type_v: str = "f16"
    backend: Backend = "llama-server"
    chat_template: Path | None = None
    gpu_layers: int | str | None = None
    kv_bytes: int | None = field(default=None, compare=False)
    per_slot_ctx: int | None = field(default=None, compare=False)
    reasons: tuple[str, ...] = field(default=(), compare=False)
    warnings: tuple[str, ...] = field(default=(), compare=False)
    timeline: tuple[Stage, ...] = field(default=(), compare=False)
    requested_ctx: int | None = field(default=None, compare=False)
    memory_for_kv: int | None = field(default=None, compare=False)
    n_ctx_train: int | None = field(default=None, compare=False)
    peak: int | None = field(default=None, compare=False)
    budgets: dict[str, int] = field(default_factory=dict, compare=False)
    template_name: str = field(default="the model's own", compare=False)
    kv_bytes_full: int | None = field(default=None, compare=False)
    memory_source: str | None = field(default=None, compare=False)
    cache_ram_mib: int | None = field(default=None, compare=False)
    """Host RAM for llama-server's prompt cache (``--cache-ram``, MiB; :func:`squad.engine.llama.cache_ram_mib`);
    None: not set (the engine's default)."""

    def server_args(self) -> list[str]:
        """The llama-server arguments that realise this plan (model, context, slots, KV).

        The launcher adds host, port, API key, metrics, timeout and threads.
        """
        return server_args(self.model, n_ctx=self.n_ctx, slots=self.slots, kv_unified=self.kv_unified,
                           cache_type_k=self.cache_type_k, cache_type_v=self.cache_type_v,
                           chat_template=self.chat_template, gpu_layers=self.gpu_layers,
                           cache_ram=self.cache_ram_mib if self.backend == "llama-server" else None)

    @classmethod
    def simple(cls, model: Path | str, *, slots: int = DEFAULT_SLOTS, n_ctx: int = 4096) -> EnginePlan:
        """A plan with the given slots and context and the unified-KV rule applied."""
        return cls(model=Path(model), slots=slots, n_ctx=round_ctx(n_ctx), kv_unified=slots >= 2)

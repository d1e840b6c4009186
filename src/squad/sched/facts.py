"""What the planner reads: one frozen :class:`PlanFacts` (the workload, the model's KV facts,
the machine's memory for KV, the user's pins). The planner (:func:`squad.sched.planner.plan`)
turns it into an :class:`~squad.sched.plan.EnginePlan` without I/O; whoever builds the facts
(:func:`squad.engine.session.plan_engine`) reads the GGUF file and the machine.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from squad.engine.llama import MAX_SLOTS, check_cache_type
from squad.errors import PlanError
from squad.sched.plan import Backend
from squad.sched.workload import Node

__all__ = ["KvBytesAt", "PlanFacts"]

KvBytesAt = Callable[[int, int], int]
"""``kv_bytes_at(n_ctx, slots)`` → KV cache bytes of a unified pool of ``n_ctx`` cells shared by
``slots`` (:meth:`squad.engine.facts.ModelFacts.kv_bytes` at the plan's cache types). Must grow
(weakly) with ``n_ctx``."""


@dataclass(frozen=True)
class PlanFacts:
    """Everything one plan depends on.

    The workload:

    - ``workload``: a :mod:`squad.sched.workload` tree, or None when there is nothing to plan.

    The model (``model``: its GGUF path, carried into the plan):

    - ``n_ctx_train``: the model's training context in tokens (GGUF ``{arch}.context_length``).
    - ``kv_bytes_per_token``: KV bytes per context cell at ``cache_type_k``/``cache_type_v``
      (``ModelFacts.kv_bytes_per_token``); None = unknown, no memory check. ``n_ctx ×
      kv_bytes_per_token`` is exact for full-attention models (checked against the engine's
      ``llama_kv_cache: size`` log line), an upper bound for sliding-window models.
    - ``kv_bytes_per_token_q8_0``: KV bytes per cell at ``q8_0``/``q8_0``, to quote the exact
      saving of a quantized cache; estimated from element sizes when None.
    - ``kv_bytes_at``: the KV size of a pool for a model whose layers do not all hold every
      cell (sliding-window attention, :data:`KvBytesAt`); None = ``n_ctx × kv_bytes_per_token``.

    The machine:

    - ``memory_for_kv``: bytes the machine can give the KV cache (:mod:`squad.sched.memory`);
      None = unknown, no memory check. ``memory_source``: which memory that is ("system RAM",
      "GPU 0 ..."), shown with the plan.

    The engine and the user's settings:

    - ``backend``: what serves the plan (:data:`~squad.sched.plan.Backend`).
    - ``pin_slots``/``pin_ctx``: values the user set; kept as given (context rounded up to 256).
    - ``cache_type_k``/``cache_type_v``: KV cache types (``f16``, ``q8_0``, ...).
    - ``mlx_max_batch``: MLX only: the max batch size the user set for mlxcel-server.
    """

    workload: Node | None
    model: Path
    n_ctx_train: int | None = None
    kv_bytes_per_token: int | None = None
    memory_for_kv: int | None = None
    backend: Backend = "llama-server"
    pin_slots: int | None = None
    pin_ctx: int | None = None
    cache_type_k: str = "f16"
    cache_type_v: str = "f16"
    mlx_max_batch: int | None = None
    kv_bytes_per_token_q8_0: int | None = None
    kv_bytes_at: KvBytesAt | None = None
    memory_source: str | None = None

    def __post_init__(self) -> None:
        """Raises :class:`~squad.errors.PlanError` for an unknown KV cache type or a pin out of
        range (slots 1..8, context >= 1, MLX max batch >= 1)."""
        check_cache_type(self.cache_type_k)
        check_cache_type(self.cache_type_v)
        if self.pin_slots is not None and not 1 <= self.pin_slots <= MAX_SLOTS:
            raise PlanError(f"slots {self.pin_slots} is out of range: use 1 to {MAX_SLOTS} "
                            f"(the cap is fixed; more agents than slots are queued by the runtime)")
        if self.pin_ctx is not None and self.pin_ctx < 1:
            raise PlanError(f"context {self.pin_ctx} is out of range: use a positive number of tokens, e.g. 8192")
        if self.mlx_max_batch is not None and self.mlx_max_batch < 1:
            raise PlanError(f"MLX max batch {self.mlx_max_batch} is out of range: use 1 or more")

    def kv_at(self, n_ctx: int, slots: int) -> int:
        """KV bytes of a pool of ``n_ctx`` cells shared by ``slots`` (0 when the size per cell is unknown)."""
        if self.kv_bytes_at is not None:
            return self.kv_bytes_at(n_ctx, slots)
        return n_ctx * (self.kv_bytes_per_token or 0)

    @property
    def mlx_single(self) -> bool:
        """MLX without a max batch: one request at a time gets the whole context."""
        return self.backend == "mlx" and not self.mlx_max_batch

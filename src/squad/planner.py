"""The planner: pure, facts in, plan out, no I/O.

Turns a workload (which agents run at the same time, with which budgets) plus the model's
facts and the memory available for KV into an :class:`EnginePlan`: slot count, context,
unified KV, estimated KV memory, and reasons/warnings a user can read.

Rules come from the product page (``docs/mission.md`` facts 3-10).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

__all__ = ["EnginePlan", "MAX_SLOTS", "DEFAULT_SLOTS", "CTX_ROUND", "round_ctx"]

MAX_SLOTS = 8
"""Upper limit on slots: a fixed constant, independent of the model (product page fact 5)."""

DEFAULT_SLOTS = 2
"""Slots when nothing is planned: main agent + one sub-agent (product page fact 4)."""

CTX_ROUND = 256
"""llama.cpp rounds ``-c`` up to a multiple of 256 (llama-server.md, checked on b11434)."""

Backend = Literal["llama-server", "mlx", "attached"]


def round_ctx(n_ctx: int) -> int:
    """Round a context length in tokens up to the next multiple of 256, as llama.cpp does."""
    return -(-n_ctx // CTX_ROUND) * CTX_ROUND


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
    - ``per_slot_ctx``: tokens one request may use (the whole pool when unified).
    """

    model: Path
    slots: int
    n_ctx: int
    kv_unified: bool
    cache_type_k: str = "f16"
    cache_type_v: str = "f16"
    backend: Backend = "llama-server"
    kv_bytes: int | None = field(default=None, compare=False)
    per_slot_ctx: int | None = field(default=None, compare=False)
    reasons: tuple[str, ...] = field(default=(), compare=False)
    warnings: tuple[str, ...] = field(default=(), compare=False)

    def server_args(self) -> list[str]:
        """The llama-server arguments that realise this plan (model, context, slots, KV).

        The launcher adds host, port, API key, metrics, timeout and threads.
        """
        args = ["-m", str(self.model), "-c", str(self.n_ctx), "-np", str(self.slots)]
        args.append("--kv-unified" if self.kv_unified else "--no-kv-unified")
        if self.cache_type_k != "f16":
            args += ["-ctk", self.cache_type_k]
        if self.cache_type_v != "f16":
            args += ["-ctv", self.cache_type_v]
        return args

    @classmethod
    def simple(cls, model: Path | str, *, slots: int = DEFAULT_SLOTS, n_ctx: int = 4096) -> "EnginePlan":
        """A plan with the given slots and context and the unified-KV rule applied."""
        return cls(model=Path(model), slots=slots, n_ctx=round_ctx(n_ctx), kv_unified=slots >= 2)

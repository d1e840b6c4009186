"""The KV cache against the memory that holds it: what fits, and what to cut when it does not.

A plan whose KV cache (``PlanFacts.kv_at(n_ctx, slots)`` bytes) is above the memory for KV
gets the largest context that fits (a multiple of 256 tokens), and the slots that context really
holds at once; the advice quotes what a ``q8_0`` cache would save. Pure; used by
:mod:`squad.sched.planner`.
"""

from __future__ import annotations

from dataclasses import dataclass

from squad.engine.llama import CTX_ROUND, KV_TYPE_BYTES
from squad.errors import PlanError
from squad.sched.facts import KvBytesAt
from squad.sched.sizing import Notes, agents_that_fit, budget, mib
from squad.sched.workload import Stage

__all__ = ["KvMemory", "fit_memory", "q8_bytes", "tokens_that_fit"]


@dataclass(frozen=True)
class KvMemory:
    """The memory for KV (``available`` bytes, ``where`` it is, e.g. ``" (system RAM)"``) and the
    model's KV size per cell at the plan's cache types (``per_token``) and at ``q8_0``."""

    available: int
    per_token: int
    q8_per_token: int
    ctk: str
    ctv: str
    kv_at: KvBytesAt
    where: str = ""

    def fit(self, slots: int, most: int) -> int:
        """The largest multiple of 256 tokens (at most ``most``) whose KV fits."""
        return tokens_that_fit(self.available, self.kv_at, slots, most)

    def advice(self, n_ctx: int, slots: int) -> str:
        """What the user can do when ``n_ctx`` tokens of KV do not fit."""
        tips = ["give the agents smaller budgets", "run fewer agents at once"]
        if self.ctk != "q8_0" and self.q8_per_token < self.per_token:
            now = self.kv_at(n_ctx, slots)
            q8 = now * self.q8_per_token // self.per_token
            tips.insert(1, f"use -ctk q8_0 -ctv q8_0 (KV for {n_ctx:,} tokens {mib(now)} → {mib(q8)}, "
                           f"saves {mib(now - q8)})")
        return "; ".join(tips)


def fit_memory(timeline: tuple[Stage, ...], n_ctx: int, slots: int, memory: KvMemory,
               keep_slots: bool, notes: Notes) -> tuple[int, int]:
    """``(n_ctx, slots)``: the largest context whose KV fits, then the slots that context really
    holds at once (``slots`` unchanged with ``keep_slots``).

    Raises :class:`PlanError` when it cannot hold the largest single budget (or 256 tokens).
    """
    fit = memory.fit(slots, n_ctx)
    biggest = max((budget(c) for s in timeline for c in s.calls + s.unbounded), default=0)
    if fit < max(CTX_ROUND, biggest):
        raise PlanError(
            f"not enough memory for the KV cache: {mib(memory.available)}{memory.where} available holds {fit:,} "
            f"tokens at {memory.ctk}/{memory.ctv}, but "
            + (f"the largest agent budget is {biggest:,} tokens; " if biggest else f"at least {CTX_ROUND} are needed; ")
            + memory.advice(n_ctx, slots) + ", or free memory (override with SQUAD_KV_MEMORY)")
    new_slots = slots
    if not keep_slots and timeline:
        new_slots = max(1, min(slots, max(agents_that_fit(s, fit) for s in timeline)))
    cut = f"context {n_ctx:,} → {fit:,}"
    if new_slots != slots:
        cut += f", slots {slots} → {new_slots} (what that context holds at once; the runtime queues the rest)"
    notes.warn(f"KV cache for {n_ctx:,} tokens would need {mib(memory.kv_at(n_ctx, slots))} but only "
               f"{mib(memory.available)}{memory.where} is available for it: cut {cut}. To keep the full plan: "
               + memory.advice(n_ctx, slots))
    notes.reason(f"context {fit:,} = the largest multiple of 256 whose KV cache fits {mib(memory.available)}")
    if new_slots != slots:
        notes.reason(f"slots {new_slots} = the most agents running together whose budgets fit {fit:,} tokens")
    return fit, new_slots


def tokens_that_fit(available: int, kv_at: KvBytesAt, slots: int, most: int) -> int:
    """The largest multiple of 256 tokens, at most ``most``, whose KV (``kv_at(tokens, slots)``)
    fits in ``available`` bytes; 0 when not even 256 do. A bisection: ``kv_at`` grows with tokens."""
    lo, hi = 0, max(0, most) // CTX_ROUND  # in units of 256 tokens
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if kv_at(mid * CTX_ROUND, slots) <= available:
            lo = mid
        else:
            hi = mid - 1
    return lo * CTX_ROUND


def q8_bytes(per_token: int, ctk: str, ctv: str, q8: int | None) -> int:
    """KV bytes per cell at ``q8_0``/``q8_0``: ``q8`` when the model's facts give it, else
    estimated from ``per_token`` at ``ctk``/``ctv`` (K and V halves of equal size, each scaled by
    its element size, :data:`~squad.engine.llama.KV_TYPE_BYTES`)."""
    if q8 is not None:
        return q8
    half = per_token / (KV_TYPE_BYTES[ctk] + KV_TYPE_BYTES[ctv])
    return round(half * 2 * KV_TYPE_BYTES["q8_0"])

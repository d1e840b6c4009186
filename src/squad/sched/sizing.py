"""Slots and context from a workload's timeline: the planner's rules for a plan's shape.

Each rule returns a number and writes why into :class:`Notes` (the plan's reasons and warnings):
slots = the peak number of agents running at once (floor 1, cap
:data:`~squad.engine.llama.MAX_SLOTS`; MLX: 1 unless a max batch is set), context = the largest
sum of budgets of agents running at once; nothing to plan: :data:`DEFAULT_CTX`.
Pure; used by :mod:`squad.sched.planner` and :mod:`squad.sched.kv_fit`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from squad.engine.llama import DEFAULT_SLOTS, MAX_SLOTS, round_ctx
from squad.errors import PlanError
from squad.sched.workload import Call, Stage

__all__ = ["DEFAULT_CTX", "MLX_MIN_SHARE", "Notes", "agents_that_fit", "budget", "check_budgets", "context",
           "context_need", "mib", "mlx_slots", "names", "per_slot", "slots"]

DEFAULT_CTX = 8192
"""Context in tokens when nothing is planned: 4,096 per default slot. 4K holds a typical
agent turn (instructions, a short history and an answer), 2 × 4K is the product page's
verification size (``docs/product.md`` fact 11) and the default model's training context, and
its KV cache is small (180 MiB for SmolLM2-135M at f16, ~1 GiB for an 8B model)."""

MLX_MIN_SHARE = 1024
"""Below this per-sequence share of the context (tokens) an MLX batch warns (``docs/product.md`` fact 9)."""


@dataclass
class Notes:
    """What a plan says to people: ``reasons`` (how each number came about) and ``warnings``."""

    reasons: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def reason(self, text: str) -> None:
        self.reasons.append(text)

    def warn(self, text: str) -> None:
        self.warnings.append(text)


def budget(call: Call) -> int:
    """A call's budget in tokens once auto budgets are resolved (0 before)."""
    return call.budget or 0


def check_budgets(timeline: tuple[Stage, ...], n_ctx_train: int | None) -> None:
    """Raises :class:`PlanError` for a budget below 1 token or above the training context."""
    for stage in timeline:
        for c in stage.calls + stage.unbounded:
            if budget(c) < 1:
                raise PlanError(f"agent {c.agent!r} has budget {budget(c)}: give it a positive "
                                f"number of tokens, e.g. 4096")
            if n_ctx_train and budget(c) > n_ctx_train:
                raise PlanError(
                    f"agent {c.agent!r} has budget {budget(c):,} tokens, above the model's training "
                    f"context of {n_ctx_train:,}: lower its budget to {n_ctx_train:,} or less, or "
                    f"use a model trained for longer contexts")


def slots(peak_stage: Stage | None, pin_slots: int | None, notes: Notes) -> int:
    """llama-server/attached: slots = peak concurrency, the pin, the default or the cap."""
    if pin_slots is not None:
        notes.reason(f"slots {pin_slots}: pinned by you")
        if peak_stage is not None and peak_stage.size > pin_slots:
            notes.warn(_serialize_warning(pin_slots, peak_stage))
        return pin_slots
    if peak_stage is None:
        notes.reason(f"slots {DEFAULT_SLOTS}: nothing to plan, the default (a main agent + one sub-agent)")
        return DEFAULT_SLOTS
    if peak_stage.size > MAX_SLOTS:
        many = "an unbounded number of" if peak_stage.unbounded else str(len(peak_stage.calls))
        notes.reason(f"slots {MAX_SLOTS} = the cap: {many} agents can run at once at {_where(peak_stage)}; "
                     f"the runtime queues the rest until a slot frees")
        return MAX_SLOTS
    count = max(1, len(peak_stage.calls))
    notes.reason(f"slots {count} = peak concurrency at {_where(peak_stage)}: {names(peak_stage)}")
    return count


def mlx_slots(peak_stage: Stage | None, pin_slots: int | None, batch: int | None, notes: Notes) -> int:
    """MLX (mlxcel-server divides the context by slots): the max batch if set, else 1."""
    if batch:
        notes.reason(f"slots {batch}: the MLX max batch you set (the sequences split the context)")
        return batch
    notes.reason("slots 1: MLX (mlxcel-server divides the context by slots, so one request "
                 "at a time gets the whole context)")
    if pin_slots not in (None, 1):
        notes.warn(f"MLX runs 1 slot whatever the slot setting ({pin_slots} ignored); "
                   f"set an MLX max batch to decode several sequences at once")
    if peak_stage is not None and peak_stage.size > 1:
        notes.warn(_serialize_warning(1, peak_stage))
    return 1


def context(timeline: tuple[Stage, ...], at_once: int, pin_ctx: int | None, notes: Notes) -> int:
    """The context to ask for in tokens (before rounding): the pin, the default, or the
    largest sum of the ``at_once`` largest budgets held together."""
    ctx_stage, needed = context_need(timeline, at_once)
    if pin_ctx is not None:
        notes.reason(f"context {pin_ctx:,}: pinned by you")
        _warn_pinned_context(timeline, ctx_stage, needed, pin_ctx, notes)
        return pin_ctx
    if ctx_stage is None:
        notes.reason(f"context {DEFAULT_CTX:,}: nothing to plan, 4,096 tokens per default slot")
        return DEFAULT_CTX
    notes.reason(f"context {needed:,} = largest sum of budgets held at once, at "
                 f"{_where(ctx_stage)}: {_budget_sum(ctx_stage, at_once)}")
    return needed


def _warn_pinned_context(timeline: tuple[Stage, ...], ctx_stage: Stage | None, needed: int, pin_ctx: int,
                         notes: Notes) -> None:
    """Warn when a pinned context cannot hold one agent's budget, or the budgets held together."""
    biggest = max((c for st in timeline for c in st.calls + st.unbounded), key=budget, default=None)
    if biggest is not None and budget(biggest) > round_ctx(pin_ctx):
        need = budget(biggest)
        notes.warn(f"agent {biggest.agent!r} may need up to its budget of {need:,} tokens in one call, more than "
                   f"the whole context {round_ctx(pin_ctx):,}: such a call can never fit, however long it waits "
                   f"(squad refuses it); use --ctx {round_ctx(need)} (or engine: ctx: in the recipe), or lower "
                   f"the budget or max_tokens of agent {biggest.agent!r} to fit {round_ctx(pin_ctx):,}")
    elif needed > round_ctx(pin_ctx):
        notes.warn(f"context {round_ctx(pin_ctx):,} is below the {needed:,} tokens that the agents "
                   f"at {_where(ctx_stage)} may hold together: the pool can overflow; squad admits "
                   f"requests only while they fit, so some wait; use --ctx {round_ctx(needed)} or "
                   f"lower their budgets")


def per_slot(backend: str, slots: int, n_ctx: int, kv_unified: bool, n_ctx_train: int | None,
             mlx_max_batch: int | None, notes: Notes) -> int:
    """Tokens one request may use; notes on the unified pool and the training context."""
    if backend == "mlx":
        share = n_ctx // slots
        if mlx_max_batch and share < MLX_MIN_SHARE:
            notes.warn(f"MLX max batch {slots} splits the context: configured {n_ctx:,} tokens, reduced "
                       f"to {share:,} per sequence (below {MLX_MIN_SHARE:,}); raise the context or lower the batch")
    else:
        share = n_ctx
        if kv_unified:
            notes.reason(f"--kv-unified: the {slots} slots share one pool of {n_ctx:,} tokens; "
                         f"one request may use all of it")
    if n_ctx_train and share > n_ctx_train:
        share = n_ctx_train
        if kv_unified:
            notes.reason(f"context {n_ctx:,} is above the model's training context {n_ctx_train:,}: fine with "
                         f"unified KV (one request is capped at {n_ctx_train:,}, the pool is shared)")
        else:
            notes.warn(f"context {n_ctx:,} is above the model's training context {n_ctx_train:,}: with 1 slot "
                       f"one request is capped at {n_ctx_train:,}; the rest of the KV cache is unused")
    return share


def context_need(timeline: tuple[Stage, ...], at_once: int) -> tuple[Stage | None, int]:
    """The stage whose ``at_once`` largest budgets sum highest, and that sum (tokens)."""
    best, need = None, 0
    for stage in timeline:
        total = sum(budget(c) for c in stage.largest(at_once))
        if best is None or total > need:
            best, need = stage, total
    return best, need


def agents_that_fit(stage: Stage, n_ctx: int) -> int:
    """How many of the stage's agents fit in ``n_ctx`` tokens at once (smallest budgets first)."""
    count, used = 0, 0
    pool = sorted(stage.calls + stage.unbounded * MAX_SLOTS, key=budget)
    for c in pool:
        if used + budget(c) > n_ctx:
            break
        count, used = count + 1, used + budget(c)
    return count


def _serialize_warning(slots: int, stage: Stage) -> str:
    many = "an unbounded number of" if stage.unbounded else str(len(stage.calls))
    return (f"{slots} slot(s) but {many} agents run at once at {_where(stage)} ({names(stage)}): "
            f"the work is serialized, the runtime queues all but {slots} at a time")


def _where(stage: Stage | None) -> str:
    return (stage.label or "one stage") if stage is not None else "—"


def names(stage: Stage) -> str:
    """The stage's agents, comma-separated."""
    return ", ".join(stage.agents)


def _budget_sum(stage: Stage, at_once: int) -> str:
    top = stage.largest(at_once)
    parts = [f"{c.agent} {budget(c):,}" for c in top]
    return " + ".join(parts) if len(parts) > 1 else parts[0] if parts else "0"


def mib(n: int) -> str:
    """``n`` bytes in MiB, for people: ``"180.0 MiB"``."""
    return f"{n / 2**20:,.1f} MiB"

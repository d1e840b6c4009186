"""The planner: pure, facts in, plan out, no I/O.

Turns one :class:`~squad.sched.facts.PlanFacts` (which agents run at the same time with which
budgets, the model's KV facts, the memory for KV, the user's pins) into an :class:`EnginePlan`:
slot count, context, unified KV, estimated KV memory, and reasons/warnings a user can read.

Rules come from the product page (``docs/product.md`` facts 3-10):

- slots and context: :mod:`squad.sched.sizing` (peak concurrency; the largest sum of budgets held
  at once, rounded up to 256; nothing to plan: :data:`DEFAULT_SLOTS` slots, :data:`DEFAULT_CTX`
  tokens; more than 8 at once: 8 slots and the 8 largest budgets, the runtime queues the rest).
- A pinned value (slots or context) is always kept; the planner only warns.
- A budget above the model's training context is a :class:`~squad.errors.PlanError`.
- An auto budget (``Call.budget`` None, no prompt known when planning): :func:`auto_budget`.
- KV memory = ``PlanFacts.kv_at(n_ctx, slots)``; when it does not fit, the largest context that
  fits is planned and slots follow what that context really holds (:mod:`squad.sched.kv_fit`).
- MLX (mlxcel-server) divides the context by slots: 1 slot, unless a max batch is set.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any, overload

from squad.engine.llama import CTX_ROUND, DEFAULT_SLOTS, MAX_SLOTS, cache_ram_mib, round_ctx, slot_ctx
from squad.sched import sizing
from squad.sched.facts import KvBytesAt, PlanFacts
from squad.sched.kv_fit import KvMemory, fit_memory, q8_bytes, tokens_that_fit
from squad.sched.plan import EnginePlan
from squad.sched.sizing import DEFAULT_CTX, MLX_MIN_SHARE, Notes, budget, mib, names
from squad.sched.workload import Call, Node, Stage, stages, with_budgets

__all__ = [
    "EnginePlan",
    "PlanFacts",
    "MAX_SLOTS",
    "DEFAULT_SLOTS",
    "DEFAULT_CTX",
    "CTX_ROUND",
    "MLX_MIN_SHARE",
    "round_ctx",
    "plan",
    "check_attached",
    "plan_for_replan",
    "auto_budget",
    "KvBytesAt",
]


@overload
def plan(facts: PlanFacts, /) -> EnginePlan: ...


@overload
def plan(workload: Node | None, /, **keywords: Any) -> EnginePlan: ...


def plan(facts: PlanFacts | Node | None = None, /, **keywords: Any) -> EnginePlan:
    """Size the engine for ``facts`` (:class:`~squad.sched.facts.PlanFacts`, whose docstring
    says what each fact is).

    The older form ``plan(workload, model=..., n_ctx_train=..., ...)`` still works: the keywords
    are :class:`PlanFacts`' fields (``TypeError`` for another keyword).

    Raises :class:`~squad.errors.PlanError` when an agent's budget is above the training context,
    a pin is out of range (slots 1..8, context >= 1), a KV cache type is unknown, or the memory
    cannot hold one agent's budget.
    """
    if isinstance(facts, PlanFacts):
        if keywords:
            raise TypeError(f"plan(PlanFacts) takes no keywords, got {', '.join(keywords)}")
        return _plan(facts)
    workload: Node | None = facts
    if "workload" in keywords:
        if facts is not None:
            raise TypeError("plan() got the workload twice")
        workload = keywords.pop("workload")
    return _plan(PlanFacts(workload, **keywords))


def _plan(f: PlanFacts) -> EnginePlan:
    notes = Notes()
    timeline = _timeline(f, notes)
    sizing.check_budgets(timeline, f.n_ctx_train)
    budgets: dict[str, int] = {}
    for s in timeline:
        for c in s.calls + s.unbounded:
            budgets[c.agent] = max(budgets.get(c.agent, 0), c.budget or 0)
    peak_stage = max(timeline, key=lambda s: (s.size, s.budget), default=None)

    if f.backend == "mlx":
        slots = sizing.mlx_slots(peak_stage, f.pin_slots, f.mlx_max_batch, notes)
    else:
        slots = sizing.slots(peak_stage, f.pin_slots, notes)
    at_once = 1 if f.mlx_single else slots
    requested = sizing.context(timeline, at_once, f.pin_ctx, notes)
    n_ctx = round_ctx(requested)
    if n_ctx != requested:
        notes.reason(f"context {requested:,} → {n_ctx:,} applied (llama.cpp rounds up to a multiple of 256)")
    n_ctx, slots, kv_bytes = _memory(f, timeline, n_ctx, slots, notes)
    kv_full = n_ctx * f.kv_bytes_per_token if f.kv_bytes_per_token else None
    if kv_bytes and kv_full and kv_bytes < kv_full:
        notes.reason(f"KV cache {mib(kv_bytes)}, not {mib(kv_full)}: the model's sliding-window layers hold only "
                     f"their window of cells per slot, not all {n_ctx:,} (saves {mib(kv_full - kv_bytes)})")
    if f.memory_source and f.memory_for_kv is not None:
        notes.reason(f"KV memory planned against {f.memory_source}: {mib(f.memory_for_kv)} for the KV cache")

    kv_unified = f.backend != "mlx" and slots >= 2
    cache_ram = cache_ram_mib(kv_bytes, f.memory_for_kv) if f.backend == "llama-server" else None
    if cache_ram is not None:
        notes.reason(f"host prompt cache (--cache-ram) {cache_ram:,} MiB: a conversation's prompt parked there when "
                     "its slot goes to another, restored when it comes back")
    per_slot = sizing.per_slot(f.backend, slots, n_ctx, kv_unified, f.n_ctx_train, f.mlx_max_batch, notes)
    return EnginePlan(
        model=Path(f.model), slots=slots, n_ctx=n_ctx, kv_unified=kv_unified,
        cache_type_k=f.cache_type_k, cache_type_v=f.cache_type_v, backend=f.backend,
        kv_bytes=kv_bytes, per_slot_ctx=per_slot, reasons=tuple(notes.reasons),
        warnings=tuple(notes.warnings), timeline=timeline, requested_ctx=requested,
        memory_for_kv=f.memory_for_kv, n_ctx_train=f.n_ctx_train, kv_bytes_full=kv_full,
        memory_source=f.memory_source, cache_ram_mib=cache_ram,
        peak=None if peak_stage is None else (-1 if peak_stage.unbounded else len(peak_stage.calls)),
        budgets=budgets,
    )


def _timeline(f: PlanFacts, notes: Notes) -> tuple[Stage, ...]:
    """The workload's stages that run calls, auto budgets resolved (:func:`auto_budget`, with a
    reason saying where the number came from)."""
    if f.workload is None:
        return ()
    timeline = tuple(s for s in stages(f.workload) if s.calls or s.unbounded)
    if not any(c.budget is None for s in timeline for c in s.calls + s.unbounded):
        return timeline
    peak = max((s.size for s in timeline), default=1)
    at_once = int(1 if f.mlx_single else min(peak, f.pin_slots or MAX_SLOTS))
    fit = None
    if f.kv_bytes_per_token and f.memory_for_kv is not None:
        fit = tokens_that_fit(f.memory_for_kv, f.kv_at, at_once, (f.n_ctx_train or DEFAULT_CTX) * at_once + CTX_ROUND)
    auto = auto_budget(f.n_ctx_train, at_once, pin_ctx=f.pin_ctx, memory_fit=fit)
    agents = sorted({c.agent for s in timeline for c in s.calls + s.unbounded if c.budget is None})
    notes.reason(f"budget auto = {auto:,} tokens for {', '.join(agents)}: "
                 f"{_auto_source(f.n_ctx_train, f.pin_ctx, fit, at_once)}, rounded down to {CTX_ROUND}")
    return tuple(s for s in stages(with_budgets(f.workload, auto)) if s.calls or s.unbounded)


def _memory(f: PlanFacts, timeline: tuple[Stage, ...], n_ctx: int, slots: int,
            notes: Notes) -> tuple[int, int, int | None]:
    """``(n_ctx, slots, kv_bytes)`` once the KV cache is checked against the memory for it: a pinned
    context that does not fit is kept with a warning; otherwise cut to what fits
    (:func:`~squad.sched.kv_fit.fit_memory`, which raises :class:`~squad.errors.PlanError` when not
    even one budget fits). ``kv_bytes`` None when the KV size per cell is unknown."""
    per_token = f.kv_bytes_per_token
    if not per_token:
        return n_ctx, slots, None
    kv_bytes = f.kv_at(n_ctx, slots)
    if not kv_bytes or f.memory_for_kv is None or kv_bytes <= f.memory_for_kv or f.backend == "attached":
        return n_ctx, slots, kv_bytes
    where = f" ({f.memory_source})" if f.memory_source else ""
    q8 = q8_bytes(per_token, f.cache_type_k, f.cache_type_v, f.kv_bytes_per_token_q8_0)
    memory = KvMemory(f.memory_for_kv, per_token, q8, f.cache_type_k, f.cache_type_v, f.kv_at, where)
    if f.pin_ctx is not None:
        notes.warn(f"KV cache for the pinned {n_ctx:,} tokens needs {mib(kv_bytes)} but "
                   f"only {mib(f.memory_for_kv)}{where} is available: the engine may fail to load or swap; "
                   + memory.advice(n_ctx, slots))
    else:
        keep_slots = f.pin_slots is not None or f.mlx_single
        n_ctx, slots = fit_memory(timeline, n_ctx, slots, memory, keep_slots, notes)
    return n_ctx, slots, f.kv_at(n_ctx, slots)


def auto_budget(n_ctx_train: int | None, at_once: int, *, pin_ctx: int | None = None,
                memory_fit: int | None = None) -> int:
    """An auto budget in tokens when no prompt is known: the model's training context
    (:data:`DEFAULT_CTX` when unknown) divided by ``at_once`` agents; with ``pin_ctx`` the
    pinned pool divided by them instead, but never above the training context (one request's
    cap); at most ``memory_fit`` (tokens of KV the memory holds) divided by them; rounded down
    to 256, at least 256."""
    trained, at_once = n_ctx_train or DEFAULT_CTX, max(1, at_once)
    share = trained // at_once if pin_ctx is None else min(trained, pin_ctx // at_once)
    if memory_fit is not None:
        share = min(share, memory_fit // at_once)
    return max(CTX_ROUND, share // CTX_ROUND * CTX_ROUND)


def _auto_source(n_ctx_train: int | None, pin_ctx: int | None, fit: int | None, at_once: int) -> str:
    """Where :func:`auto_budget`'s number came from, for the plan's reasons."""
    total = n_ctx_train or DEFAULT_CTX
    trained = f"training context {total:,}" if n_ctx_train else f"default context {total:,}"
    base = trained if pin_ctx is None or pin_ctx >= total * at_once else f"the pinned context {pin_ctx:,}"
    base_tokens = total if base == trained else pin_ctx or total
    if fit is not None and fit < base_tokens:
        return f"the {fit:,} tokens of KV memory holds / {at_once} agent(s) at once"
    if pin_ctx is not None and base == trained:
        return f"{trained} (one request's cap; the pinned {pin_ctx:,} is shared by {at_once})"
    return f"{base} / {at_once} agent(s) at once"


def check_attached(plan_needed: EnginePlan, slots: int, n_ctx: int, *, kv_unified: bool | None = None) -> list[str]:
    """Warnings for an attached engine smaller than what the workload needs.

    ``slots`` and ``n_ctx`` are what the engine reports (``/props`` ``total_slots`` and
    ``default_generation_settings.n_ctx``: per slot, the whole pool when unified). Returns
    an empty list when the engine holds the plan.
    """
    out: list[str] = []
    if slots < plan_needed.slots:
        out.append(f"the attached engine has {slots} slot(s) but the workload runs up to "
                   f"{plan_needed.slots} agents at once: the runtime queues the rest "
                   f"(restart it with -np {plan_needed.slots} --kv-unified)")
    if kv_unified is False and slots > 1:
        biggest = max((budget(c) for s in plan_needed.timeline for c in s.calls + s.unbounded), default=0)
        if biggest > n_ctx:
            out.append(f"the attached engine has no unified KV: each slot holds {n_ctx:,} tokens, "
                       f"below the largest budget {biggest:,}; restart it with --kv-unified")
    elif n_ctx < plan_needed.n_ctx:
        out.append(f"the attached engine's context is {n_ctx:,} tokens but the agents running "
                   f"together may hold {plan_needed.n_ctx:,}: some requests wait for room "
                   f"(restart it with -c {plan_needed.n_ctx})")
    return out


def plan_for_replan(current: EnginePlan, concurrent: Iterable[Call], *,
                    memory_for_kv: int | None = None) -> EnginePlan | None:
    """A bigger plan for a chat turn that runs ``concurrent`` agents at once, or None.

    None when ``current`` already holds them (enough slots and context), or when the engine
    cannot be reloaded for it (an attached engine, or MLX which runs one slot). Slots grow
    to the number of agents (capped at 8), context to the sum of the largest budgets that
    run at once; neither ever shrinks. When ``memory_for_kv`` is given and the bigger
    context's KV cache (scaled from ``current.kv_bytes``) would not fit, returns None.
    """
    group = tuple(concurrent)
    if current.backend != "llama-server" or not group:
        return None
    stage = Stage(group, "this turn")
    slots = min(MAX_SLOTS, max(current.slots, len(group)))
    need = round_ctx(sum(budget(c) for c in stage.largest(slots)))
    if len(group) <= current.slots and need <= current.n_ctx:
        return None
    n_ctx = max(current.n_ctx, need)
    per_token = current.kv_bytes // current.n_ctx if current.kv_bytes else None
    kv_bytes = n_ctx * per_token if per_token else None
    if kv_bytes and memory_for_kv is not None and kv_bytes > memory_for_kv:
        return None
    if (slots, n_ctx) == (current.slots, current.n_ctx):
        return None
    reason = f"re-plan: {len(group)} agents at once this turn ({names(stage)})"
    per_slot = slot_ctx(n_ctx, slots, True, current.n_ctx_train)
    cache_ram = cache_ram_mib(kv_bytes, current.memory_for_kv) if current.cache_ram_mib is not None else None
    return replace(current, slots=slots, n_ctx=n_ctx, kv_unified=slots >= 2, kv_bytes=kv_bytes,
                   per_slot_ctx=per_slot, reasons=current.reasons + (reason,), cache_ram_mib=cache_ram,
                   requested_ctx=need, peak=len(group))

"""The planner: pure, facts in, plan out, no I/O.

Turns a workload (which agents run at the same time, with which budgets) plus the model's
facts and the memory available for KV into an :class:`EnginePlan`: slot count, context,
unified KV, estimated KV memory, and reasons/warnings a user can read.

Rules come from the product page (``docs/product.md`` facts 3-10):

- slots = the peak number of agents running at once (floor 1, cap :data:`MAX_SLOTS`);
  context = the largest sum of budgets of agents running at once, rounded up to 256.
- Nothing to plan: :data:`DEFAULT_SLOTS` slots and :data:`DEFAULT_CTX` tokens.
- A pinned value (slots or context) is always kept; the planner only warns.
- More than 8 at once: 8 slots, context = the 8 largest concurrent budgets; the runtime
  queues the rest.
- A budget above the model's training context is a :class:`~squad.errors.PlanError`.
- An auto budget (``Call.budget`` None, no prompt known when planning) = the model's training
  context (:data:`DEFAULT_CTX` when unknown) divided by the peak number of agents at once
  (capped by the slots); a pinned context is shared the same way instead (never above the
  training context per agent), and what memory holds caps it; rounded down to 256, at least
  256 (:func:`auto_budget`).
- KV memory = context × bytes per token, or for a sliding-window model what
  ``kv_bytes_at(context, slots)`` says (its window layers hold only about ``window × slots +
  ubatch`` cells); when it does not fit, the largest context that fits is planned and slots
  follow the concurrency that context can really hold.
- MLX (mlxcel-server) divides the context by slots: 1 slot, unless a max batch is set.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Iterable

from squad.engine.llama import (
    CTX_ROUND,
    DEFAULT_SLOTS,
    KV_TYPE_BYTES,
    MAX_SLOTS,
    check_cache_type,
    round_ctx,
    slot_ctx,
)
from squad.sched.plan import Backend, EnginePlan
from squad.errors import PlanError
from squad.sched.workload import Call, Node, Stage, stages, with_budgets

__all__ = [
    "EnginePlan",
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

KvBytesAt = Callable[[int, int], int]
"""``kv_bytes_at(n_ctx, slots)`` → KV cache bytes of a unified pool of ``n_ctx`` cells shared by
``slots`` (:meth:`squad.engine.facts.ModelFacts.kv_bytes` at the plan's cache types). Must grow
(weakly) with ``n_ctx``."""

DEFAULT_CTX = 8192
"""Context in tokens when nothing is planned: 4,096 per default slot. 4K holds a typical
agent turn (instructions, a short history and an answer), 2 × 4K is the product page's
verification size (fact 11) and the default model's training context, and its KV cache is
small (180 MiB for SmolLM2-135M at f16, ~1 GiB for an 8B model)."""

MLX_MIN_SHARE = 1024
"""Below this per-sequence share of the context (tokens) an MLX batch warns (fact 9)."""


def plan(
    workload: Node | None,
    *,
    model: Path,
    n_ctx_train: int | None = None,
    kv_bytes_per_token: int | None = None,
    memory_for_kv: int | None = None,
    backend: Backend = "llama-server",
    pin_slots: int | None = None,
    pin_ctx: int | None = None,
    cache_type_k: str = "f16",
    cache_type_v: str = "f16",
    mlx_max_batch: int | None = None,
    kv_bytes_per_token_q8_0: int | None = None,
    kv_bytes_at: KvBytesAt | None = None,
    memory_source: str | None = None,
) -> EnginePlan:
    """Size the engine for ``workload``.

    - ``workload``: a :mod:`squad.sched.workload` tree, or None when there is nothing to plan.
    - ``n_ctx_train``: the model's training context in tokens (GGUF ``{arch}.context_length``).
    - ``kv_bytes_per_token``: KV bytes per context cell at ``cache_type_k``/``cache_type_v``
      (``ModelFacts.kv_bytes_per_token``); None = unknown, no memory check. ``kv_bytes`` is
      ``n_ctx × kv_bytes_per_token``: exact for full-attention models (checked against the
      engine's ``llama_kv_cache: size`` log line), an upper bound for sliding-window models.
    - ``memory_for_kv``: bytes the machine can give the KV cache (``squad.sched.memory``); None =
      unknown, no memory check.
    - ``pin_slots``/``pin_ctx``: values the user set; kept as given (context rounded up to 256).
    - ``mlx_max_batch``: MLX only: the max batch size the user set for mlxcel-server.
    - ``kv_bytes_per_token_q8_0``: KV bytes per cell at ``q8_0``/``q8_0``, to quote the exact
      saving of a quantized cache; estimated from element sizes when None.
    - ``kv_bytes_at``: the KV size of a pool for a model whose layers do not all hold every
      cell (sliding-window attention, :data:`KvBytesAt`); None = ``n_ctx × kv_bytes_per_token``.
      The plan then sizes, checks and cuts memory by it and says what the window saves.
    - ``memory_source``: which memory ``memory_for_kv`` is ("system RAM", "GPU 0 ..."), shown
      with the plan (:func:`squad.sched.memory.kv_memory`).

    Raises :class:`PlanError` when an agent's budget is above the training context, a pin
    is out of range (slots 1..8, context >= 1), or the memory cannot hold one agent's budget.
    """
    check_cache_type(cache_type_k), check_cache_type(cache_type_v)  # validate early
    _check_pins(pin_slots, pin_ctx, mlx_max_batch)

    def kv_at(n_ctx: int, slots: int) -> int:
        if kv_bytes_at is not None:
            return kv_bytes_at(n_ctx, slots)
        return n_ctx * (kv_bytes_per_token or 0)

    notes = _Notes()
    timeline = stages(workload) if workload is not None else ()
    timeline = tuple(s for s in timeline if s.calls or s.unbounded)
    if workload is not None and any(c.budget is None for s in timeline for c in s.calls + s.unbounded):
        peak = max((s.size for s in timeline), default=1)
        at_once = 1 if backend == "mlx" and not mlx_max_batch else min(peak, pin_slots or MAX_SLOTS)
        fit = None
        if kv_bytes_per_token and memory_for_kv is not None:
            fit = _tokens_that_fit(memory_for_kv, kv_at, int(at_once),
                                   (n_ctx_train or DEFAULT_CTX) * int(at_once) + CTX_ROUND)
        auto = auto_budget(n_ctx_train, int(at_once), pin_ctx=pin_ctx, memory_fit=fit)
        names = sorted({c.agent for s in timeline for c in s.calls + s.unbounded if c.budget is None})
        notes.reason(f"budget auto = {auto:,} tokens for {', '.join(names)}: "
                     f"{_auto_source(n_ctx_train, pin_ctx, fit, int(at_once))}, rounded down to {CTX_ROUND}")
        timeline = tuple(s for s in stages(with_budgets(workload, auto)) if s.calls or s.unbounded)
    _check_budgets(timeline, n_ctx_train)
    budgets: dict[str, int] = {}
    for s in timeline:
        for c in s.calls + s.unbounded:
            budgets[c.agent] = max(budgets.get(c.agent, 0), c.budget or 0)
    peak_stage = max(timeline, key=lambda s: (s.size, s.budget), default=None)

    if backend == "mlx":
        slots = _mlx_slots(peak_stage, pin_slots, mlx_max_batch, notes)
    else:
        slots = _slots(peak_stage, pin_slots, notes)
    at_once = 1 if backend == "mlx" and not mlx_max_batch else slots
    requested = _context(timeline, at_once, pin_ctx, notes)
    n_ctx = round_ctx(requested)
    if n_ctx != requested:
        notes.reason(f"context {requested:,} → {n_ctx:,} applied (llama.cpp rounds up to a multiple of 256)")

    kv_bytes = kv_at(n_ctx, slots) if kv_bytes_per_token else None
    where = f" ({memory_source})" if memory_source else ""
    if (kv_bytes and memory_for_kv is not None and kv_bytes > memory_for_kv
            and backend != "attached"):
        q8 = _q8_bytes(kv_bytes_per_token, cache_type_k, cache_type_v, kv_bytes_per_token_q8_0)
        memory = _Memory(memory_for_kv, kv_bytes_per_token, q8, cache_type_k, cache_type_v, kv_at, where)
        if pin_ctx is not None:
            notes.warn(f"KV cache for the pinned {n_ctx:,} tokens needs {_mib(kv_bytes)} but "
                       f"only {_mib(memory_for_kv)}{where} is available: the engine may fail to load or swap; "
                       + memory.advice(n_ctx, slots))
        else:
            keep_slots = pin_slots is not None or (backend == "mlx" and not mlx_max_batch)
            n_ctx, slots = _fit_memory(timeline, n_ctx, slots, memory, keep_slots, notes)
        kv_bytes = kv_at(n_ctx, slots)
    kv_full = n_ctx * kv_bytes_per_token if kv_bytes_per_token else None
    if kv_bytes and kv_full and kv_bytes < kv_full:
        notes.reason(f"KV cache {_mib(kv_bytes)}, not {_mib(kv_full)}: the model's sliding-window layers hold only "
                     f"their window of cells per slot, not all {n_ctx:,} (saves {_mib(kv_full - kv_bytes)})")
    if memory_source and memory_for_kv is not None:
        notes.reason(f"KV memory planned against {memory_source}: {_mib(memory_for_kv)} for the KV cache")

    kv_unified = backend != "mlx" and slots >= 2
    per_slot = _per_slot(backend, slots, n_ctx, kv_unified, n_ctx_train, mlx_max_batch, notes)
    return EnginePlan(
        model=Path(model), slots=slots, n_ctx=n_ctx, kv_unified=kv_unified,
        cache_type_k=cache_type_k, cache_type_v=cache_type_v, backend=backend,
        kv_bytes=kv_bytes, per_slot_ctx=per_slot, reasons=tuple(notes.reasons),
        warnings=tuple(notes.warnings), timeline=timeline, requested_ctx=requested,
        memory_for_kv=memory_for_kv, n_ctx_train=n_ctx_train, kv_bytes_full=kv_full,
        memory_source=memory_source,
        peak=None if peak_stage is None else (-1 if peak_stage.unbounded else len(peak_stage.calls)),
        budgets=budgets,
    )


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
        biggest = max((_budget(c) for s in plan_needed.timeline for c in s.calls + s.unbounded), default=0)
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
    need = round_ctx(sum(_budget(c) for c in stage.largest(slots)))
    if len(group) <= current.slots and need <= current.n_ctx:
        return None
    n_ctx = max(current.n_ctx, need)
    per_token = current.kv_bytes // current.n_ctx if current.kv_bytes else None
    kv_bytes = n_ctx * per_token if per_token else None
    if kv_bytes and memory_for_kv is not None and kv_bytes > memory_for_kv:
        return None
    if (slots, n_ctx) == (current.slots, current.n_ctx):
        return None
    reason = f"re-plan: {len(group)} agents at once this turn ({_names(stage)})"
    per_slot = slot_ctx(n_ctx, slots, True, current.n_ctx_train)
    return replace(current, slots=slots, n_ctx=n_ctx, kv_unified=slots >= 2, kv_bytes=kv_bytes,
                   per_slot_ctx=per_slot, reasons=current.reasons + (reason,),
                   requested_ctx=need, peak=len(group))


# -- helpers -------------------------------------------------------------------------------


def _budget(call: Call) -> int:
    """A call's budget in tokens once auto budgets are resolved (0 before)."""
    return call.budget or 0


def _check_pins(pin_slots: int | None, pin_ctx: int | None, mlx_max_batch: int | None) -> None:
    if pin_slots is not None and not 1 <= pin_slots <= MAX_SLOTS:
        raise PlanError(f"slots {pin_slots} is out of range: use 1 to {MAX_SLOTS} "
                        f"(the cap is fixed; more agents than slots are queued by the runtime)")
    if pin_ctx is not None and pin_ctx < 1:
        raise PlanError(f"context {pin_ctx} is out of range: use a positive number of tokens, e.g. 8192")
    if mlx_max_batch is not None and mlx_max_batch < 1:
        raise PlanError(f"MLX max batch {mlx_max_batch} is out of range: use 1 or more")


def _check_budgets(timeline: tuple[Stage, ...], n_ctx_train: int | None) -> None:
    for stage in timeline:
        for c in stage.calls + stage.unbounded:
            if _budget(c) < 1:
                raise PlanError(f"agent {c.agent!r} has budget {_budget(c)}: give it a positive "
                                f"number of tokens, e.g. 4096")
            if n_ctx_train and _budget(c) > n_ctx_train:
                raise PlanError(
                    f"agent {c.agent!r} has budget {_budget(c):,} tokens, above the model's training "
                    f"context of {n_ctx_train:,}: lower its budget to {n_ctx_train:,} or less, or "
                    f"use a model trained for longer contexts")


@dataclass
class _Notes:
    reasons: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def reason(self, text: str) -> None:
        self.reasons.append(text)

    def warn(self, text: str) -> None:
        self.warnings.append(text)


@dataclass(frozen=True)
class _Memory:
    available: int
    per_token: int
    q8_per_token: int
    ctk: str
    ctv: str
    kv_at: KvBytesAt
    where: str = ""

    def fit(self, slots: int, most: int) -> int:
        """The largest multiple of 256 tokens (at most ``most``) whose KV fits."""
        return _tokens_that_fit(self.available, self.kv_at, slots, most)

    def advice(self, n_ctx: int, slots: int) -> str:
        """What the user can do when ``n_ctx`` tokens of KV do not fit."""
        tips = ["give the agents smaller budgets", "run fewer agents at once"]
        if self.ctk != "q8_0" and self.q8_per_token < self.per_token:
            now = self.kv_at(n_ctx, slots)
            q8 = now * self.q8_per_token // self.per_token
            tips.insert(1, f"use -ctk q8_0 -ctv q8_0 (KV for {n_ctx:,} tokens {_mib(now)} → {_mib(q8)}, "
                           f"saves {_mib(now - q8)})")
        return "; ".join(tips)


def _slots(peak_stage: Stage | None, pin_slots: int | None, notes: _Notes) -> int:
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
    slots = max(1, len(peak_stage.calls))
    notes.reason(f"slots {slots} = peak concurrency at {_where(peak_stage)}: {_names(peak_stage)}")
    return slots


def _mlx_slots(peak_stage: Stage | None, pin_slots: int | None, batch: int | None, notes: _Notes) -> int:
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


def _context(timeline: tuple[Stage, ...], at_once: int, pin_ctx: int | None, notes: _Notes) -> int:
    """The context to ask for in tokens (before rounding): the pin, the default, or the
    largest sum of the ``at_once`` largest budgets held together."""
    ctx_stage, needed = _context_need(timeline, at_once)
    if pin_ctx is not None:
        notes.reason(f"context {pin_ctx:,}: pinned by you")
        biggest = max((c for st in timeline for c in st.calls + st.unbounded), key=_budget, default=None)
        if biggest is not None and _budget(biggest) > round_ctx(pin_ctx):
            need = _budget(biggest)
            notes.warn(f"agent {biggest.agent!r} may need up to its budget of {need:,} tokens in one call, more than "
                       f"the whole context {round_ctx(pin_ctx):,}: such a call can never fit, however long it waits "
                       f"(squad refuses it); use --ctx {round_ctx(need)} (or engine: ctx: in the recipe), or lower "
                       f"the budget or max_tokens of agent {biggest.agent!r} to fit {round_ctx(pin_ctx):,}")
        elif needed > round_ctx(pin_ctx):
            notes.warn(f"context {round_ctx(pin_ctx):,} is below the {needed:,} tokens that the agents "
                       f"at {_where(ctx_stage)} may hold together: the pool can overflow; squad admits "
                       f"requests only while they fit, so some wait; use --ctx {round_ctx(needed)} or "
                       f"lower their budgets")
        return pin_ctx
    if ctx_stage is None:
        notes.reason(f"context {DEFAULT_CTX:,}: nothing to plan, 4,096 tokens per default slot")
        return DEFAULT_CTX
    notes.reason(f"context {needed:,} = largest sum of budgets held at once, at "
                 f"{_where(ctx_stage)}: {_budget_sum(ctx_stage, at_once)}")
    return needed


def _fit_memory(timeline: tuple[Stage, ...], n_ctx: int, slots: int, memory: _Memory,
                keep_slots: bool, notes: _Notes) -> tuple[int, int]:
    """The largest context whose KV fits, then the slots that context really holds at once.

    Raises :class:`PlanError` when it cannot hold the largest single budget (or 256 tokens).
    """
    fit = memory.fit(slots, n_ctx)
    biggest = max((_budget(c) for s in timeline for c in s.calls + s.unbounded), default=0)
    if fit < max(CTX_ROUND, biggest):
        raise PlanError(
            f"not enough memory for the KV cache: {_mib(memory.available)}{memory.where} available holds {fit:,} "
            f"tokens at {memory.ctk}/{memory.ctv}, but "
            + (f"the largest agent budget is {biggest:,} tokens; " if biggest else f"at least {CTX_ROUND} are needed; ")
            + memory.advice(n_ctx, slots) + ", or free memory (override with SQUAD_KV_MEMORY)")
    new_slots = slots
    if not keep_slots and timeline:
        new_slots = max(1, min(slots, max(_fits(s, fit) for s in timeline)))
    cut = f"context {n_ctx:,} → {fit:,}"
    if new_slots != slots:
        cut += f", slots {slots} → {new_slots} (what that context holds at once; the runtime queues the rest)"
    notes.warn(f"KV cache for {n_ctx:,} tokens would need {_mib(memory.kv_at(n_ctx, slots))} but only "
               f"{_mib(memory.available)}{memory.where} is available for it: cut {cut}. To keep the full plan: "
               + memory.advice(n_ctx, slots))
    notes.reason(f"context {fit:,} = the largest multiple of 256 whose KV cache fits {_mib(memory.available)}")
    if new_slots != slots:
        notes.reason(f"slots {new_slots} = the most agents running together whose budgets fit {fit:,} tokens")
    return fit, new_slots


def _per_slot(backend: str, slots: int, n_ctx: int, kv_unified: bool, n_ctx_train: int | None,
              mlx_max_batch: int | None, notes: _Notes) -> int:
    """Tokens one request may use; notes on the unified pool and the training context."""
    if backend == "mlx":
        per_slot = n_ctx // slots
        if mlx_max_batch and per_slot < MLX_MIN_SHARE:
            notes.warn(f"MLX max batch {slots} splits the context: configured {n_ctx:,} tokens, reduced "
                       f"to {per_slot:,} per sequence (below {MLX_MIN_SHARE:,}); raise the context or lower the batch")
    else:
        per_slot = n_ctx
        if kv_unified:
            notes.reason(f"--kv-unified: the {slots} slots share one pool of {n_ctx:,} tokens; "
                         f"one request may use all of it")
    if n_ctx_train and per_slot > n_ctx_train:
        per_slot = n_ctx_train
        if kv_unified:
            notes.reason(f"context {n_ctx:,} is above the model's training context {n_ctx_train:,}: fine with "
                         f"unified KV (one request is capped at {n_ctx_train:,}, the pool is shared)")
        else:
            notes.warn(f"context {n_ctx:,} is above the model's training context {n_ctx_train:,}: with 1 slot "
                       f"one request is capped at {n_ctx_train:,}; the rest of the KV cache is unused")
    return per_slot


def _context_need(timeline: tuple[Stage, ...], at_once: int) -> tuple[Stage | None, int]:
    """The stage whose ``at_once`` largest budgets sum highest, and that sum (tokens)."""
    best, need = None, 0
    for stage in timeline:
        total = sum(_budget(c) for c in stage.largest(at_once))
        if best is None or total > need:
            best, need = stage, total
    return best, need


def _tokens_that_fit(available: int, kv_at: KvBytesAt, slots: int, most: int) -> int:
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


def _fits(stage: Stage, n_ctx: int) -> int:
    """How many of the stage's agents fit in ``n_ctx`` tokens at once (smallest budgets first)."""
    count, used = 0, 0
    pool = sorted(stage.calls + stage.unbounded * MAX_SLOTS, key=lambda c: _budget(c))
    for c in pool:
        if used + _budget(c) > n_ctx:
            break
        count, used = count + 1, used + _budget(c)
    return count


def _serialize_warning(slots: int, stage: Stage) -> str:
    many = "an unbounded number of" if stage.unbounded else str(len(stage.calls))
    return (f"{slots} slot(s) but {many} agents run at once at {_where(stage)} ({_names(stage)}): "
            f"the work is serialized, the runtime queues all but {slots} at a time")


def _q8_bytes(per_token: int, ctk: str, ctv: str, q8: int | None) -> int:
    if q8 is not None:
        return q8
    # Estimate: K and V halves of equal size, each scaled by its element size.
    half = per_token / (KV_TYPE_BYTES[ctk] + KV_TYPE_BYTES[ctv])
    return round(half * 2 * KV_TYPE_BYTES["q8_0"])


def _where(stage: Stage | None) -> str:
    return (stage.label or "one stage") if stage is not None else "—"


def _names(stage: Stage) -> str:
    return ", ".join(stage.agents)


def _budget_sum(stage: Stage, at_once: int) -> str:
    top = stage.largest(at_once)
    parts = [f"{c.agent} {_budget(c):,}" for c in top]
    return " + ".join(parts) if len(parts) > 1 else parts[0] if parts else "0"


def _mib(n: int) -> str:
    return f"{n / 2**20:,.1f} MiB"

"""The planner's rules (product page facts 3-10), one parametrized case each, plus the KV
size of a real llama-server for the default model."""

from __future__ import annotations

import re
import socket
import subprocess
import time
from pathlib import Path

import pytest

from launch_support import THREADS
from squad.engine.process import stop_pid
from squad.errors import PlanError
from squad.sched.planner import (
    DEFAULT_CTX,
    DEFAULT_SLOTS,
    MAX_SLOTS,
    EnginePlan,
    PlanFacts,
    check_attached,
    plan,
    plan_for_replan,
    round_ctx,
)
from squad.sched.workload import Call, Delegate, Map, Parallel, Sequence

MODEL = Path("/models/m.gguf")
SMOL_KV = 23_040  # SmolLM2-135M: 30 layers × 3 KV heads × 64 × (2 + 2) bytes at f16
GIB = 2**30
MIB = 2**20


def agents(n: int, budget: int = 4096, prefix: str = "a") -> tuple[Call, ...]:
    return tuple(Call(f"{prefix}{i}", budget) for i in range(1, n + 1))


FOUR = Parallel((Call("lead", 4096), Call("security", 4096), Call("style", 4096), Call("tests", 4096)))


def mk(workload, **kw) -> EnginePlan:
    kw.setdefault("n_ctx_train", 8192)
    kw.setdefault("kv_bytes_per_token", SMOL_KV)
    kw.setdefault("memory_for_kv", 16 * GIB)
    return plan(workload, model=MODEL, **kw)


# --- one facts object ----------------------------------------------------------------------


def test_plan_takes_one_facts_object_and_the_keyword_form_builds_the_same():
    """plan(PlanFacts) is the planner's form; plan(workload, model=..., ...) builds the same facts."""
    facts = PlanFacts(FOUR, model=MODEL, n_ctx_train=8192, kv_bytes_per_token=SMOL_KV, memory_for_kv=GIB // 4,
                      memory_source="system RAM")
    by_facts, by_keywords = plan(facts), mk(FOUR, memory_for_kv=GIB // 4, memory_source="system RAM")
    assert by_facts == by_keywords
    assert (by_facts.reasons, by_facts.warnings, by_facts.kv_bytes) == (
        by_keywords.reasons, by_keywords.warnings, by_keywords.kv_bytes)
    assert plan(workload=FOUR, model=MODEL) == plan(PlanFacts(FOUR, model=MODEL))
    with pytest.raises(TypeError):
        plan(facts, pin_slots=2)  # type: ignore[call-overload]
    with pytest.raises(TypeError):
        plan(FOUR, model=MODEL, pins=2)  # not a fact


def test_facts_are_checked_when_made():
    with pytest.raises(PlanError, match="slots 9 is out of range"):
        PlanFacts(None, model=MODEL, pin_slots=9)
    with pytest.raises(PlanError, match="unknown KV cache type"):
        PlanFacts(None, model=MODEL, cache_type_k="f8")


# --- the product page's examples ---------------------------------------------------------

@pytest.mark.parametrize(
    "workload, kw, slots, n_ctx",
    [
        (FOUR, {}, 4, 16384),  # 4 agents × 4K all at once
        (Delegate(Call("main", 4096), Call("sub", 4096)), {}, 2, 8192),  # main + one sub-agent
        (None, {}, DEFAULT_SLOTS, DEFAULT_CTX),  # nothing to plan → 2
        (FOUR, {"pin_slots": 1}, 1, 4096),  # pinned 1 → 1 (with a warning, below)
        (Parallel(agents(10, 1024)), {}, 8, 8192),  # 10 concurrent → 8 slots
        (FOUR, {"backend": "mlx"}, 1, 4096),  # MLX → 1 slot
        (None, {"pin_ctx": 1000}, DEFAULT_SLOTS, 1024),  # requested 1,000 → 1,024
    ],
)
def test_product_page_examples(workload, kw, slots, n_ctx):
    p = mk(workload, **kw)
    assert (p.slots, p.n_ctx) == (slots, n_ctx)
    assert p.kv_unified == (slots >= 2 and kw.get("backend", "llama-server") == "llama-server")


def test_four_agents_reason_names_the_stage():
    p = mk(Sequence((Call("lead", 4096), FOUR)))
    assert p.reasons[0] == "slots 4 = peak concurrency at step 2: lead, security, style, tests"
    assert p.warnings == ()
    assert p.per_slot_ctx == 8192  # unified pool of 16K, one request capped at n_ctx_train
    assert any("fine with unified KV" in r for r in p.reasons)


def test_pinned_one_slot_warns_serialized():
    p = mk(FOUR, pin_slots=1)
    assert p.slots == 1 and not p.kv_unified
    assert len(p.warnings) == 1 and "serialized" in p.warnings[0] and "4 agents" in p.warnings[0]


def test_ten_concurrent_sum_of_eight_largest_and_queue_reason():
    budgets = [1000, 2000, 500, 500, 3000, 1000, 1000, 1000, 1000, 4000]
    p = mk(Parallel(tuple(Call(f"a{i}", b) for i, b in enumerate(budgets))))
    assert p.slots == MAX_SLOTS
    assert p.requested_ctx == sum(sorted(budgets)[-8:]) == 14000
    assert p.n_ctx == 14080
    assert "queues the rest" in p.reasons[0]


def test_requested_1000_is_applied_as_1024_not_a_mismatch():
    p = mk(None, pin_ctx=1000)
    assert p.n_ctx == 1024 and p.requested_ctx == 1000
    assert p.warnings == ()
    assert any("1,000 → 1,024 applied" in r for r in p.reasons)
    assert p == EnginePlan.simple(MODEL, slots=2, n_ctx=1024)


def test_default_model_kv_bytes_per_token():
    p = mk(None)
    assert p.n_ctx == 8192 and p.kv_bytes == 180 * MIB


# --- the rules ---------------------------------------------------------------------------

@pytest.mark.parametrize(
    "workload, slots, requested",
    [
        (Call("solo", 3000), 1, 3000),
        (Sequence((Call("a", 2000), Call("b", 6000))), 1, 6000),
        (Delegate(Call("main", 4096), Parallel((Call("s1", 1024), Call("s2", 2048)))), 3, 7168),
        (Map(Call("item", 1000), count=20, limit=5), 5, 5000),
        (Map(Call("item", 1000), count=3, limit=5), 3, 3000),
        (Map(Call("item", 1000)), 8, 8000),  # unbounded → capped, the runtime queues the rest
        (Sequence(()), DEFAULT_SLOTS, DEFAULT_CTX),  # empty → nothing to plan
    ],
)
def test_slots_and_context_from_workload(workload, slots, requested):
    p = mk(workload)
    assert p.slots == slots
    assert p.requested_ctx == requested
    assert p.n_ctx == round_ctx(requested) and p.n_ctx % 256 == 0


def test_unbounded_map_says_runtime_queues():
    p = mk(Map(Call("item", 1000)))
    assert p.peak == -1 and "unbounded" in p.reasons[0] and "queues the rest" in p.reasons[0]


@pytest.mark.parametrize("pin_slots, pin_ctx, slots, n_ctx, warns", [
    (8, None, 8, 16384, 0),     # more slots than needed: kept, no warning
    (2, None, 2, 8192, 1),      # fewer: serialized warning; context for 2 at once
    (None, 4096, 4, 4096, 1),   # context below the concurrent need: overflow warning
    (None, 65536, 4, 65536, 0),  # bigger: kept
    (1, 8192, 1, 8192, 1),
])
def test_pins_are_kept_and_only_warn(pin_slots, pin_ctx, slots, n_ctx, warns):
    p = mk(FOUR, pin_slots=pin_slots, pin_ctx=pin_ctx)
    assert (p.slots, p.n_ctx, len(p.warnings)) == (slots, n_ctx, warns)


@pytest.mark.parametrize("kw, text", [
    ({"pin_slots": 0}, "slots 0 is out of range"),
    ({"pin_slots": 9}, "use 1 to 8"),
    ({"pin_ctx": 0}, "context 0 is out of range"),
    ({"cache_type_k": "q9"}, "unknown KV cache type 'q9'"),
    ({"backend": "mlx", "mlx_max_batch": 0}, "MLX max batch 0"),
])
def test_bad_pins_are_plan_errors(kw, text):
    with pytest.raises(PlanError, match=re.escape(text)):
        mk(FOUR, **kw)


@pytest.mark.parametrize("budget", [0, -5])
def test_non_positive_budget_is_an_error(budget):
    with pytest.raises(PlanError, match="positive"):
        mk(Call("x", budget))


def test_budget_above_training_context_names_agent_budget_and_limit():
    with pytest.raises(PlanError) as info:
        mk(Parallel((Call("lead", 4096), Call("reader", 32768))), n_ctx_train=8192)
    msg = str(info.value)
    assert "'reader'" in msg and "32,768" in msg and "8,192" in msg


def test_total_above_training_context_is_fine_with_unified_kv():
    p = mk(FOUR, n_ctx_train=8192)
    assert p.n_ctx == 16384 and p.kv_unified and p.warnings == ()


def test_unknown_facts_skip_checks():
    p = plan(FOUR, model=MODEL)
    assert (p.slots, p.n_ctx, p.kv_bytes, p.per_slot_ctx) == (4, 16384, None, 16384)


# --- memory ------------------------------------------------------------------------------

def test_memory_too_small_gives_smaller_plan_and_advice():
    p = mk(FOUR, memory_for_kv=200 * MIB)
    assert p.n_ctx == (200 * MIB // SMOL_KV) // 256 * 256 == 8960
    assert p.slots == 2  # 8,960 tokens hold two 4K budgets at once
    assert p.kv_bytes == 8960 * SMOL_KV <= 200 * MIB
    (w,) = p.warnings
    assert "16,384 → 8,960" in w and "slots 4 → 2" in w
    # exact q8_0 saving: 16,384 × (23,040 - 12,240) bytes
    assert "-ctk q8_0 -ctv q8_0" in w and "360.0 MiB → 191.2 MiB" in w and "saves 168.8 MiB" in w
    assert "smaller budgets" in w and "fewer agents" in w


def test_memory_q8_saving_uses_given_exact_value():
    p = mk(FOUR, memory_for_kv=200 * MIB, kv_bytes_per_token_q8_0=12_000)
    assert "→ 187.5 MiB" in p.warnings[0]


def test_memory_fits_no_cut():
    p = mk(FOUR, memory_for_kv=360 * MIB)
    assert (p.slots, p.n_ctx, p.warnings) == (4, 16384, ())


def test_memory_cannot_hold_one_budget_is_an_error():
    with pytest.raises(PlanError, match="not enough memory"):
        mk(FOUR, memory_for_kv=50 * MIB)


def test_memory_with_pinned_context_keeps_pin_and_warns():
    p = mk(FOUR, memory_for_kv=100 * MIB, pin_ctx=16384)
    assert p.n_ctx == 16384 and "may fail to load" in p.warnings[0]


def test_memory_with_pinned_slots_cuts_only_context():
    p = mk(FOUR, memory_for_kv=200 * MIB, pin_slots=4)
    assert (p.slots, p.n_ctx) == (4, 8960)


# --- backends ----------------------------------------------------------------------------

def test_mlx_one_slot_whole_context_and_serialized_warning():
    p = mk(FOUR, backend="mlx")
    assert (p.slots, p.per_slot_ctx, p.kv_unified) == (1, 4096, False)
    assert any("serialized" in w for w in p.warnings)


def test_mlx_ignores_slot_pin_with_warning():
    p = mk(Call("a", 4096), backend="mlx", pin_slots=4)
    assert p.slots == 1 and "ignored" in p.warnings[0]


@pytest.mark.parametrize("batch, ctx, share, warns", [(4, 16384, 4096, False), (4, 3072, 768, True)])
def test_mlx_max_batch_splits_context(batch, ctx, share, warns):
    p = mk(FOUR, backend="mlx", mlx_max_batch=batch, pin_ctx=ctx)
    assert (p.slots, p.n_ctx, p.per_slot_ctx) == (batch, ctx, share)
    warned = [w for w in p.warnings if "per sequence" in w]
    assert bool(warned) == warns
    if warns:
        assert "configured 3,072" in warned[0] and "768 per sequence" in warned[0]


def test_attached_plan_describes_need_and_skips_memory_cut():
    p = mk(FOUR, backend="attached", memory_for_kv=1 * MIB)
    assert (p.slots, p.n_ctx) == (4, 16384)


@pytest.mark.parametrize("slots, n_ctx, unified, expect", [
    (4, 16384, True, []),
    (8, 32768, True, []),
    (2, 16384, True, ["2 slot(s)"]),
    (4, 8192, True, ["context is 8,192"]),
    (1, 4096, None, ["1 slot(s)", "context is 4,096"]),
    (4, 2048, False, ["no unified KV"]),
])
def test_check_attached(slots, n_ctx, unified, expect):
    need = mk(FOUR, backend="attached")
    warnings = check_attached(need, slots, n_ctx, kv_unified=unified)
    assert len(warnings) == len(expect)
    for w, e in zip(warnings, expect):
        assert e in w


# --- equality and re-plan ----------------------------------------------------------------

def test_plans_equal_when_they_start_the_same_engine():
    a = mk(FOUR)
    b = mk(Parallel(agents(4)), memory_for_kv=None)  # other agents, other reasons, same engine
    assert a == b and a.reasons != b.reasons
    assert a != mk(FOUR, cache_type_k="q8_0")
    assert a != mk(Parallel(agents(3)))


def test_server_args():
    p = mk(FOUR, cache_type_k="q8_0", cache_type_v="q8_0", kv_bytes_per_token=12_240)
    assert p.server_args() == ["-m", str(MODEL), "-c", "16384", "-np", "4", "--kv-unified",
                               "-ctk", "q8_0", "-ctv", "q8_0", "--cache-ram", str(p.cache_ram_mib)]
    assert p.cache_ram_mib == 4 * -(-(p.kv_bytes or 0) // 2**20)  # four pools' worth of host RAM
    assert "--no-kv-unified" in mk(Call("a", 100)).server_args()


@pytest.mark.parametrize("turn, expect", [
    (agents(2), None),                       # fits the 2 × 4K engine
    (agents(1, 8192), None),                 # one big request fits the pool
    (agents(3), (3, 12288)),                 # more agents than slots
    (agents(2, 6000), (2, 12032)),           # same count, more context
    (agents(12, 1024), (8, 8192)),           # capped at 8; the pool already holds 8 × 1K
    ((), None),
])
def test_plan_for_replan(turn, expect):
    current = mk(Delegate(Call("main", 4096), Call("sub", 4096)))
    new = plan_for_replan(current, list(turn))
    if expect is None:
        assert new is None
    else:
        assert (new.slots, new.n_ctx, new.kv_unified) == (*expect, True)
        assert new.kv_bytes == new.n_ctx * SMOL_KV
        assert new != current


def test_replan_none_for_mlx_attached_or_no_memory():
    for backend in ("mlx", "attached"):
        assert plan_for_replan(mk(Call("a", 1024), backend=backend), list(agents(4))) is None
    assert plan_for_replan(mk(Call("a", 1024)), list(agents(4)), memory_for_kv=MIB) is None


# --- the real engine ---------------------------------------------------------------------

def test_default_model_facts_give_the_documented_kv_bytes(default_model_path):
    from squad.engine.facts import read_model_facts

    facts = read_model_facts(default_model_path)
    assert facts.kv_bytes_per_token("f16", "f16") == SMOL_KV
    assert facts.kv_bytes_per_token("q8_0", "q8_0") == SMOL_KV * 34 // 64 == 12_240


@pytest.mark.engine
@pytest.mark.parametrize("cache_type", ["f16", "q8_0"])
def test_kv_bytes_match_real_engine_log(llama_server_path, default_model_path, tmp_path, cache_type):
    binary, model = llama_server_path, default_model_path
    per_token = {"f16": SMOL_KV, "q8_0": 12_240}[cache_type]
    p = plan(Parallel(agents(3, 1000)), model=model, n_ctx_train=8192, kv_bytes_per_token=per_token,
             cache_type_k=cache_type, cache_type_v=cache_type)
    assert (p.slots, p.n_ctx) == (3, 3072)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log_path = tmp_path / "engine.log"
    cmd = [str(binary), *p.server_args(), "--host", "127.0.0.1", "--port", str(port), "-t", str(THREADS), "-lv", "4"]
    with log_path.open("w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        try:
            match = None
            deadline = time.monotonic() + 120
            while match is None and time.monotonic() < deadline and proc.poll() is None:
                time.sleep(0.2)
                match = re.search(r"llama_kv_cache: size =\s*([0-9.]+) MiB \(\s*(\d+) cells", log_path.read_text())
        finally:
            stop_pid(proc.pid, grace=20)
            proc.wait()
    assert match, f"no llama_kv_cache size line in the log:\n{log_path.read_text()[-2000:]}"
    mib, cells = float(match.group(1)), int(match.group(2))
    assert cells == p.n_ctx
    assert abs(p.kv_bytes - mib * MIB) <= 0.01 * MIB  # the log prints MiB with 2 decimals


def test_a_budget_above_the_pinned_context_can_never_fit_and_the_warning_says_what_to_change():
    """Issue 19: waiting never helps a call bigger than the whole context; 'some wait' is only
    for budgets that each fit but not together."""
    alone = mk(Sequence((Call("writer", 1024),)), pin_ctx=512)
    [warning] = alone.warnings
    assert "can never fit" in warning and "some wait" not in warning
    assert "agent 'writer'" in warning and "--ctx 1024" in warning and "lower the budget or max_tokens" in warning
    together = mk(Parallel((Call("a", 512), Call("b", 512))), pin_ctx=512)
    assert any("some wait" in w for w in together.warnings)
    assert not any("can never fit" in w for w in together.warnings)


def test_cache_ram_is_one_pool_within_the_memory_left_and_the_engine_default():
    from squad.engine.llama import CACHE_RAM_DEFAULT_MIB, cache_ram_mib

    assert cache_ram_mib(None, None) == CACHE_RAM_DEFAULT_MIB
    assert cache_ram_mib(100 * 2**20, None) == 400
    assert cache_ram_mib(100 * 2**20, 150 * 2**20) == 50  # only what the pool leaves
    assert cache_ram_mib(100 * 2**20, 90 * 2**20) == 0  # none left: the cache is off
    assert cache_ram_mib(10**12, None) == CACHE_RAM_DEFAULT_MIB

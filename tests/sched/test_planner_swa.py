"""The planner on a sliding-window model: KV sized by ``ModelFacts.kv_bytes`` (window layers hold
only ``pad256(window × slots + ubatch)`` cells), the saving said, memory cuts by the real size.

The facts are Gemma 3 270M's (``gemma3-270m``): 18 layers, 1 KV head of 256, a 512-token window
on 15 of them (llama.cpp's gemma3 pattern 6). tests/sched/test_kv_estimate_real.py checks the same
arithmetic against the engine's log."""

from __future__ import annotations

from pathlib import Path

import pytest

from squad.engine.facts import ModelFacts
from squad.errors import PlanError
from squad.sched.planner import plan
from squad.sched.workload import Call, Parallel

MIB = 2**20
GEMMA = ModelFacts(
    path=Path("/models/gemma.gguf"), name="Gemma 3 270m", architecture="gemma3", n_ctx_train=32768,
    n_layer=18, n_embd=640, n_head=4, n_head_kv=(1,) * 18, key_length=256, value_length=256,
    sliding_window=512, sliding_window_pattern=tuple(i % 6 < 5 for i in range(18)), file_size=253_113_024,
)
PER_TOKEN = GEMMA.kv_bytes_per_token()  # 18 layers × 1 × 256 × (2 + 2) = 18,432


def gemma_plan(workload, **kw):
    return plan(workload, model=GEMMA.path, n_ctx_train=GEMMA.n_ctx_train, kv_bytes_per_token=PER_TOKEN,
                kv_bytes_at=lambda n, s: GEMMA.kv_bytes(n, slots=s), **kw)


@pytest.mark.parametrize(("ctx", "slots", "mib"), [
    (4096, 2, 12 + 22.5),     # engine log: 4096 cells × 3 layers + 1536 cells × 15 layers
    (16384, 4, 48 + 37.5),    # 16384 × 3 + 2560 × 15
    (1000, 1, 3 + 15),        # 1024 × 3 + 1024 × 15 (window + ubatch = 1024 > the pool: capped)
])
def test_kv_bytes_are_the_engines_sliding_window_figure(ctx, slots, mib):
    p = gemma_plan(None, pin_slots=slots, pin_ctx=ctx)
    assert p.kv_bytes == mib * MIB
    assert p.kv_bytes_full == p.n_ctx * PER_TOKEN
    saved = any("sliding-window" in r for r in p.reasons)
    assert saved == (p.kv_bytes < p.kv_bytes_full) == (ctx != 1000)  # a 1,024-cell pool: nothing saved


def test_a_memory_cut_uses_the_sliding_window_size():
    """Three 4K agents: 66 MiB of KV with the window (12,288 × 3 full layers + 2,048 × 15 window
    layers, 1 KiB each), 216 MiB without it."""
    three = Parallel(tuple(Call(f"a{i}", 4096) for i in range(3)))
    p = gemma_plan(three, memory_for_kv=80 * MIB)
    assert (p.n_ctx, p.slots, p.kv_bytes, p.warnings) == (12288, 3, 66 * MIB, ())
    assert p.kv_bytes_full == 216 * MIB
    cut = gemma_plan(three, memory_for_kv=60 * MIB)  # (60 - 30) MiB / 3 KiB per full-layer cell
    assert (cut.n_ctx, cut.slots) == (10240, 2) and cut.kv_bytes <= 60 * MIB
    assert "cut context 12,288 → 10,240" in cut.warnings[0]
    with pytest.raises(PlanError):  # the flat per-token figure would not even hold one 4K agent
        plan(three, model=GEMMA.path, n_ctx_train=32768, kv_bytes_per_token=PER_TOKEN, memory_for_kv=60 * MIB)


def test_too_little_memory_even_with_the_window_is_a_plan_error():
    with pytest.raises(PlanError, match="not enough memory for the KV cache"):
        gemma_plan(Call("a", 16384), memory_for_kv=40 * MIB)


def test_full_attention_models_are_unchanged():
    p = plan(Call("a", 4096), model=GEMMA.path, n_ctx_train=8192, kv_bytes_per_token=23_040)
    assert p.kv_bytes == p.kv_bytes_full == 4096 * 23_040
    assert not any("sliding-window" in r for r in p.reasons)


def test_the_memory_planned_against_is_named():
    p = gemma_plan(Call("a", 4096), memory_for_kv=8 << 30, memory_source="GPU 0 (Fake GPU)")
    assert p.memory_source == "GPU 0 (Fake GPU)"
    assert any("planned against GPU 0 (Fake GPU)" in r for r in p.reasons)

"""A tiny smoke of bench/overhead.py against the fake engine only (no timing assertions)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import anyio
import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"


def load(name: str):
    sys.path.insert(0, str(BENCH))
    try:
        spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(BENCH))


def test_overhead_quick_runs_against_the_fake_engine():
    pytest.importorskip("starlette")
    overhead = load("overhead")
    text = anyio.run(overhead.main, ["--quick"])
    assert "| concurrent calls |" in text
    rows = [line for line in text.splitlines() if line.startswith("| 1 |") or line.startswith("| 5 |")]
    assert len(rows) == 2


def test_bench_common_helpers():
    common = load("_common")
    assert common.pct([1, 2, 3, 4], 0.5) == 2.5
    assert common.pct([], 0.5) is None
    assert common.md_table(["a", "b"], [[1, 2]]) == "| a | b |\n|---|---|\n| 1 | 2 |"
    assert {"cpu", "cores", "memory", "python", "llama.cpp"} <= set(common.machine_info())

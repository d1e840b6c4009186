"""Cost grows with the work, not faster (invariant I6, issue 31): squad's CPU per map item at 2,000 items is within
1.5x of that at 200, measured as process CPU time in one run against the zero-latency fake engine (in a process of
its own, so its CPU is not counted). A ratio of CPU times, not a wall-clock limit: load on the machine slows both
alike. bench/scale.py measures the same at 100 to 10,000 items side by side with the raw SDK."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from squad import Agent, EngineSpec, Squad

pytestmark = pytest.mark.anyio

_FAKE = """
import sys, anyio
from squad.testing import FakeEngine
async def main():
    fe = FakeEngine(slots=16, n_ctx=16 * 128)
    await fe.start()
    print(fe.base_url, flush=True)
    await anyio.to_thread.run_sync(sys.stdin.read)
    await fe.stop()
anyio.run(main)
"""


async def _cpu_per_item(sq: Squad, n: int, tag: str) -> float:
    cpu = time.process_time()
    results = await sq.map("echo", [f"{tag} {i}" for i in range(n)])
    cpu = time.process_time() - cpu
    assert len(results) == n and all(r.ok for r in results) and [r.item for r in results] == list(range(n))
    return cpu / n


async def test_cpu_per_item_at_2000_items_is_within_1_5x_of_200():
    fake = subprocess.Popen([sys.executable, "-c", _FAKE], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert fake.stdout is not None
        url = fake.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:"), url
        async with Squad([Agent(name="echo", budget=64, max_tokens=4)], engine=EngineSpec(url=url)) as sq:
            await sq.map("echo", [f"warm {i}" for i in range(50)])
            small = await _cpu_per_item(sq, 200, "small")
            large = await _cpu_per_item(sq, 2000, "large")
    finally:
        if fake.stdin is not None:
            fake.stdin.close()
        try:
            fake.wait(10)
        except subprocess.TimeoutExpired:
            fake.kill()
            fake.wait()
    assert large <= 1.5 * small, f"CPU per item {large * 1e3:.2f} ms at 2,000 vs {small * 1e3:.2f} ms at 200"

"""Overhead: what squad itself costs per call, against the zero-latency fake engine.

``squad.testing.FakeEngine`` (real HTTP on 127.0.0.1, no token delay) with as many slots as
calls and a pool large enough for all of them, so neither the fake nor squad's admission
ever makes a call wait. Then N = 1, 100, 1,000 concurrent calls (4 generated tokens each):

- raw: plain ``openai`` streaming calls in an anyio task group;
- squad: ``Squad.map`` (runtime + admission + engine client, including squad's token count
  request to ``/v1/chat/completions/input_tokens`` before each call).

Each timed run follows an untimed warm-up run of the same size on the same client, so both
sides have warm connection pools.

Per call: wall time / N in microseconds, for both, and the difference (squad's overhead).
Memory: peak ``tracemalloc`` bytes during the run / N (a separate run: tracing slows it
down). The fake engine lives in this process, so its CPU and memory count on both sides
alike; the difference is squad's.

    .venv/bin/python bench/overhead.py [--quick] [--ns 1,100,1000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
import tracemalloc
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import md_table, raw_client, raw_fanout  # noqa: E402

MAX_TOKENS = 4
BUDGET = 64
MEMORY_MAX_N = 100
"""Memory is traced up to this many calls (per-agent memory does not depend on N, and
tracemalloc makes a 1,000-call run take minutes)."""


async def raw_once(fe, prompts: list[str]) -> float:  # type: ignore[no-untyped-def]
    """A fresh openai client, warmed by one untimed fan-out (so its connection pool is as warm
    as squad's), then the timed fan-out. Fresh per run because the fake engine (uvicorn)
    closes idle keep-alive connections after 5 s and the SDK does not retry (max_retries=0)."""
    client = raw_client(fe.base_url, fe.api_key or "none")
    try:
        await raw_fanout(fe.base_url, "", prompts, MAX_TOKENS, client=client)
        wall, calls = await raw_fanout(fe.base_url, "", prompts, MAX_TOKENS, client=client)
    finally:
        await client.close()
    failed = [c.error for c in calls if c.error]
    if failed:
        raise RuntimeError(f"raw calls failed against the fake: {failed[0]}")
    return wall


async def squad_once(sq, prompts: list[str]) -> float:  # type: ignore[no-untyped-def]
    """One untimed warm-up ``map``, then the timed one."""
    await sq.map("echo", prompts)
    t0 = time.monotonic()
    results = await sq.map("echo", prompts)
    wall = time.monotonic() - t0
    failed = [r.error for r in results if not r.ok]
    if failed:
        raise RuntimeError(f"squad calls failed against the fake: {failed[0]}")
    return wall


async def traced(fn, *args) -> int:  # type: ignore[no-untyped-def]
    """Peak traced bytes above the starting point while ``fn(*args)`` runs."""
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        await fn(*args)
        return tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()


async def measure(n: int, repeats: int, memory: bool) -> dict[str, float]:
    from squad.agent import Agent
    from squad.runtime import Squad
    from squad.testing import FakeEngine

    prompts = [f"say hello number {i}" for i in range(n)]
    echo = Agent(name="echo", budget=BUDGET, max_tokens=MAX_TOKENS)
    out: dict[str, float] = {}
    async with FakeEngine(slots=max(n, 1), n_ctx=max(n, 1) * BUDGET * 2) as fe:
        async with Squad([echo], engine=fe.info) as sq:
            # squad first, back to back: the fake (uvicorn) closes keep-alive connections idle
            # for 5 s, and squad's client does not retry a stale pooled connection
            squad = [await squad_once(sq, prompts) for _ in range(repeats)]
            if memory:
                out["squad_mem"] = await traced(squad_once, sq, prompts) / n
        raw = [await raw_once(fe, prompts) for _ in range(repeats)]
        if memory:
            out["raw_mem"] = await traced(raw_once, fe, prompts) / n
        out["raw_us"] = statistics.median(raw) / n * 1e6
        out["squad_us"] = statistics.median(squad) / n * 1e6
    return out


async def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny smoke: N=1,5, one repeat")
    parser.add_argument("--ns", default="1,100,1000")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-memory", action="store_true")
    args = parser.parse_args(argv)
    ns = [1, 5] if args.quick else [int(n) for n in args.ns.split(",")]
    repeats = 1 if args.quick else args.repeats
    rows = []
    for n in ns:
        m = await measure(n, repeats, memory=not args.no_memory and n <= MEMORY_MAX_N)
        row = [n, f"{m['raw_us']:.0f}", f"{m['squad_us']:.0f}", f"{m['squad_us'] - m['raw_us']:+.0f}",
               f"{m['squad_us'] / m['raw_us']:.2f}"]
        if "raw_mem" in m:
            row += [f"{m['raw_mem'] / 1024:.1f}", f"{m['squad_mem'] / 1024:.1f}",
                    f"{(m['squad_mem'] - m['raw_mem']) / 1024:+.1f}"]
        elif not args.no_memory:
            row += ["-", "-", "-"]
        rows.append(row)
        print(f"N={n} done", file=sys.stderr)
    headers = ["concurrent calls", "raw µs/call", "squad µs/call", "squad overhead µs/call", "squad/raw"]
    if not args.no_memory:
        headers += ["raw KiB/call (peak)", "squad KiB/agent (peak)", "squad extra KiB/agent"]
    text = (
        f"### Overhead against the zero-latency fake engine ({MAX_TOKENS} tokens per call, "
        f"median of {repeats})\n\n{md_table(headers, rows)}\n\n"
        "µs/call = wall time of N concurrent calls / N (the fake engine runs in the same process and "
        "counts on both sides). Memory: tracemalloc peak during one run / N.\n"
    )
    print(text)
    return text


if __name__ == "__main__":
    anyio.run(main)

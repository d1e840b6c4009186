"""Overhead: what squad itself costs per call, against the zero-latency fake engine.

``squad.testing.FakeEngine`` (real HTTP on 127.0.0.1, no token delay) with as many slots as
calls and a pool large enough for all of them, so neither the fake nor squad's admission
ever makes a call wait. Then N = 1, 100, 1,000 concurrent calls (4 generated tokens each):

- raw: plain ``openai`` streaming calls in an anyio task group;
- squad: ``Squad.map`` (runtime + admission + engine client, including squad's token count
  request to ``/v1/chat/completions/input_tokens`` before each call).

Each repeat opens a fresh ``Squad`` attached to the fake and a fresh openai client, warms
each with one untimed run of the same size (so both have warm connection pools), then times
one run of each; the order alternates between repeats so drift hits both sides alike. Per
repeat: squad's overhead per call = (squad wall - raw wall) / N and the ratio squad/raw; the
table shows the median of the repeats with the spread (min–max), and a line per N says whether
the targets (overhead <= 0.3 ms per call, squad/raw <= 1.05, judged on the median) were met.

Memory: peak ``tracemalloc`` bytes during a run / N (a separate run: tracing slows it down).
The fake engine lives in this process, so its CPU and memory count on both sides alike; the
difference is squad's.

    .venv/bin/python bench/overhead.py [--quick] [--ns 1,100,1000] [--repeats 5]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
import tracemalloc
from dataclasses import dataclass, field
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import MODEL, against, md_table, ratios, raw_client, raw_fanout, spread  # noqa: E402

MAX_TOKENS = 4
BUDGET = 64
TARGET_OVERHEAD_MS = 0.3
"""squad's own cost per call it should stay under."""
TARGET_RATIO = 1.05
"""squad wall / raw wall it should stay under."""
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


async def squad_once(fe, prompts: list[str]) -> float:  # type: ignore[no-untyped-def]
    """A fresh ``Squad`` attached to the fake (fresh for the same reason as raw's client), one
    untimed warm-up ``map``, then the timed one."""
    from squad.agent import Agent
    from squad.runtime import Squad

    async with Squad([Agent(name="echo", budget=BUDGET, max_tokens=MAX_TOKENS)], engine=fe.info) as sq:
        await sq.map("echo", [f"warm up {p}" for p in prompts])  # other prompts: no count is remembered
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


@dataclass
class Measured:
    """Walls (s) of the repeats at N concurrent calls, paired by index; memory per call (bytes)."""

    n: int
    raw: list[float] = field(default_factory=list)
    squad: list[float] = field(default_factory=list)
    raw_mem: float | None = None
    squad_mem: float | None = None

    def per_call_ms(self, walls: list[float]) -> list[float]:
        return [w / self.n * 1e3 for w in walls]

    @property
    def overhead_ms(self) -> list[float]:
        return [(s - r) / self.n * 1e3 for s, r in zip(self.squad, self.raw)]


async def measure(n: int, repeats: int, memory: bool) -> Measured:
    from squad.testing import FakeEngine

    prompts = [f"say hello number {i}" for i in range(n)]
    m = Measured(n)
    # The fake reports the real model file, so squad counts prompts with the model's own
    # tokenizer as it does for an engine it launched (no count round trip).
    async with FakeEngine(slots=max(n, 1), n_ctx=max(n, 1) * BUDGET * 2, model_path=str(MODEL)) as fe:
        for r in range(repeats):
            if r % 2 == 0:
                m.squad.append(await squad_once(fe, prompts))
                m.raw.append(await raw_once(fe, prompts))
            else:
                m.raw.append(await raw_once(fe, prompts))
                m.squad.append(await squad_once(fe, prompts))
        if memory:
            m.squad_mem = await traced(squad_once, fe, prompts) / n
            m.raw_mem = await traced(raw_once, fe, prompts) / n
    return m


def target_line(m: Measured) -> str:
    over = statistics.median(m.overhead_ms)
    ratio = statistics.median(ratios(m.squad, m.raw))
    return (f"- {m.n} concurrent call{'s' if m.n != 1 else ''}: overhead {over:.3f} ms/call "
            f"(target <= {TARGET_OVERHEAD_MS} ms): {against(over, TARGET_OVERHEAD_MS)}; "
            f"squad/raw {ratio:.3f} (target <= {TARGET_RATIO}): {against(ratio, TARGET_RATIO)}")


async def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny smoke: N=1,5 (repeats as given)")
    parser.add_argument("--ns", default="1,100,1000")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--no-memory", action="store_true")
    args = parser.parse_args(argv)
    ns = [1, 5] if args.quick else [int(n) for n in args.ns.split(",")]
    rows, targets = [], []
    for n in ns:
        m = await measure(n, args.repeats, memory=not args.no_memory and n <= MEMORY_MAX_N)
        row = [n, len(m.raw), spread(m.per_call_ms(m.raw), 3), spread(m.per_call_ms(m.squad), 3),
               spread(m.overhead_ms, 3), spread(ratios(m.squad, m.raw), 3)]
        if m.raw_mem is not None and m.squad_mem is not None:
            row += [f"{m.raw_mem / 1024:.1f}", f"{m.squad_mem / 1024:.1f}", f"{(m.squad_mem - m.raw_mem) / 1024:+.1f}"]
        elif not args.no_memory:
            row += ["-", "-", "-"]
        rows.append(row)
        targets.append(target_line(m))
        print(f"N={n} done", file=sys.stderr)
    headers = ["concurrent calls", "repeats", "raw ms/call", "squad ms/call", "squad overhead ms/call", "squad/raw"]
    if not args.no_memory:
        headers += ["raw KiB/call (peak)", "squad KiB/agent (peak)", "squad extra KiB/agent"]
    text = (
        f"### Overhead against the zero-latency fake engine ({MAX_TOKENS} tokens per call, "
        f"{args.repeats} repeats, median (min–max))\n\n{md_table(headers, rows)}\n\n"
        "Targets, judged on the medians:\n\n" + "\n".join(targets) + "\n\n"
        "ms/call = wall time of N concurrent calls / N (the fake engine runs in the same process and "
        "counts on both sides). Each repeat times the second run of a fresh Squad and of a fresh openai "
        "client (the first, untimed, opens their connections). Overhead and squad/raw are computed per "
        "repeat from the paired squad and raw runs (their order alternating), then summarised. Memory: "
        "tracemalloc peak during one run / N.\n"
    )
    print(text)
    return text


if __name__ == "__main__":
    anyio.run(main)

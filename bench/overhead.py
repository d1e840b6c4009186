"""Overhead: what squad itself costs per call, against the zero-latency fake engine.

``squad.testing.FakeEngine`` (real HTTP on 127.0.0.1, no token delay) with as many slots as
calls and a pool large enough for all of them, so neither the fake nor squad's admission
ever makes a call wait. Then N = 1, 100, 1,000 concurrent calls (4 generated tokens each):

- raw: plain ``openai`` streaming calls in an anyio task group;
- squad: ``Squad.map`` attached to it (runtime + admission + engine client, including the exact
  token count of each prompt with the model's own tokenizer: the fake reports the real model file).

Each repeat opens a fresh ``Squad`` attached to the fake and a fresh openai client, warms
each with one untimed run of the same size (so both have warm connection pools), then times
one run of each; the order alternates between repeats so drift hits both sides alike. Per
repeat: squad's overhead per call = (squad wall - raw wall) / N and the ratio squad/raw; the
table shows the median of the repeats with the spread (min–max), and a line per N says whether
the targets (overhead <= 0.3 ms per call, squad/raw <= 1.05, judged on the median) were met.

Memory: peak ``tracemalloc`` bytes during a run / N (a separate run: tracing slows it down).
The fake engine runs in a process of its own, so this process's CPU time per call is the
client side alone: squad's CPU overhead = (squad CPU - raw CPU) / N, beside the wall figures.

    .venv/bin/python bench/overhead.py [--quick] [--ns 1,100,1000] [--repeats 5]
    .venv/bin/python bench/overhead.py --profile 1000   # where squad's CPU goes, by area

``--profile N``: the timed squad run of N calls under ``cProfile`` (after the untimed warm-up, as above); its
own time (tottime) summed per area (each ``squad`` sub-package, the openai SDK, httpx/httpcore, anyio/asyncio,
the tokenizer, pydantic, the rest), with the 15 squad functions of most own time; against one raw run of the same
N profiled alike, so the difference per area is what squad adds.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import statistics
import sys
import time
import tracemalloc
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (
    MODEL,
    against,
    fake_engine_process,
    md_table,
    ratios,
    raw_client,
    raw_fanout,
    spread,
)

MAX_TOKENS = 4
BUDGET = 64
TARGET_OVERHEAD_MS = 0.3
"""squad's own cost per call it should stay under."""
TARGET_RATIO = 1.05
"""squad wall / raw wall it should stay under."""
MEMORY_MAX_N = 100
"""Memory is traced up to this many calls (per-agent memory does not depend on N, and
tracemalloc makes a 1,000-call run take minutes)."""


@contextlib.contextmanager
def _profiling(profiler: Any) -> Iterator[None]:
    """``profiler`` (a ``cProfile.Profile``) enabled for the block; nothing when it is None."""
    if profiler is None:
        yield
        return
    profiler.enable()
    try:
        yield
    finally:
        profiler.disable()


async def raw_once(base_url: str, prompts: list[str], profiler: object = None) -> tuple[float, float]:
    """A fresh openai client, warmed by one untimed fan-out of other prompts (so its connection
    pool is as warm as squad's), then the timed fan-out: (wall s, this process's CPU s). Fresh
    per run because the fake engine (uvicorn) closes idle keep-alive connections after 5 s and
    the SDK does not retry (max_retries=0)."""
    client = raw_client(base_url, "none", retries=3)
    try:
        await raw_fanout(base_url, "", [f"warm up {p}" for p in prompts], MAX_TOKENS, client=client)
        cpu = time.process_time()
        with _profiling(profiler):
            wall, calls = await raw_fanout(base_url, "", prompts, MAX_TOKENS, client=client)
        cpu = time.process_time() - cpu
    finally:
        await client.close()
    failed = [c.error for c in calls if c.error]
    if failed:
        raise RuntimeError(f"raw calls failed against the fake: {failed[0]}")
    return wall, cpu


async def squad_once(base_url: str, prompts: list[str], profiler: object = None) -> tuple[float, float]:
    """A fresh ``Squad`` attached to the fake (fresh for the same reason as raw's client), one
    untimed warm-up ``map`` of other prompts (no count is remembered), then the timed one:
    (wall s, this process's CPU s). The fake reports the real model file, so squad counts
    prompts with the model's own tokenizer as it does for an engine it launched."""
    from squad import Agent, EngineSpec, Squad

    async with Squad([Agent(name="echo", budget=BUDGET, max_tokens=MAX_TOKENS)],
                     engine=EngineSpec(url=base_url)) as sq:
        await sq.map("echo", [f"warm up {p}" for p in prompts])
        cpu, t0 = time.process_time(), time.monotonic()
        with _profiling(profiler):
            results = await sq.map("echo", prompts)
        wall, cpu = time.monotonic() - t0, time.process_time() - cpu
    failed = [r.error for r in results if not r.ok]
    if failed:
        raise RuntimeError(f"squad calls failed against the fake: {failed[0]}")
    return wall, cpu


def _area(filename: str) -> str:
    """The area a profiled function belongs to, from its file name."""
    f = filename.replace("\\", "/")
    if "/squad/" in f and "site-packages" not in f or "/src/squad/" in f:
        rest = f.split("/squad/", 1)[1]
        return "squad/" + (rest.split("/", 1)[0] if "/" in rest else rest.removesuffix(".py"))
    for name, area in (("/openai/", "openai SDK"), ("/httpx", "httpx/httpcore"), ("/httpcore", "httpx/httpcore"),
                       ("/h11/", "httpx/httpcore"), ("/anyio/", "anyio/asyncio"), ("/asyncio/", "anyio/asyncio"),
                       ("/tokenizers/", "tokenizer"), ("/pydantic", "pydantic"), ("/json/", "json"),
                       ("selectors", "anyio/asyncio"), ("/ssl", "socket"), ("socket", "socket")):
        if name in f:
            return area
    return "builtins" if f.startswith("~") or f.startswith("<") else "other"


async def _profiled(fn: Callable[..., Awaitable[object]], base_url: str, prompts: list[str]) -> tuple[dict, list]:
    """``fn``'s timed run under cProfile (not its set-up or warm-up). Returns (own seconds per area, the functions
    of squad and the builtins with most own time as (seconds, calls, name))."""
    import cProfile
    import pstats

    prof = cProfile.Profile()
    await fn(base_url, prompts, prof)
    stats = pstats.Stats(prof).stats  # type: ignore[attr-defined]
    areas: dict[str, float] = {}
    top = []
    for (filename, line, name), (_cc, calls, tottime, _cum, _callers) in stats.items():
        area = _area(filename)
        areas[area] = areas.get(area, 0.0) + tottime
        if area.startswith("squad/"):
            top.append((tottime, calls, f"{filename.split('/squad/', 1)[-1]}:{line} {name}"))
        elif area == "builtins":
            top.append((tottime, calls, name))
    top.sort(reverse=True)
    return areas, top[:15]


async def profile(n: int) -> str:
    """Where the CPU of one squad run of ``n`` calls goes, against one raw run: a markdown report."""
    prompts = [f"say hello number {i}" for i in range(n)]
    async with fake_engine_process(max(n, 1), max(n, 1) * BUDGET * 2, str(MODEL)) as base_url:
        squad_areas, top = await _profiled(squad_once, base_url, prompts)
        raw_areas, _ = await _profiled(raw_once, base_url, prompts)
    calls = n
    names = sorted(set(squad_areas) | set(raw_areas), key=lambda a: -(squad_areas.get(a, 0) - raw_areas.get(a, 0)))
    rows = [[a, f"{raw_areas.get(a, 0) / calls * 1e3:.3f}", f"{squad_areas.get(a, 0) / calls * 1e3:.3f}",
             f"{(squad_areas.get(a, 0) - raw_areas.get(a, 0)) / calls * 1e3:+.3f}"] for a in names]
    total_raw, total_squad = sum(raw_areas.values()), sum(squad_areas.values())
    rows.append(["total", f"{total_raw / calls * 1e3:.3f}", f"{total_squad / calls * 1e3:.3f}",
                 f"{(total_squad - total_raw) / calls * 1e3:+.3f}"])
    fns = [[f"{t / calls * 1e3:.4f}", c, name] for t, c, name in top]
    return (f"### Where squad's CPU goes: {n} concurrent calls under cProfile (own time per call, ms; profiling "
            f"inflates every figure, so read the shares, not the totals)\n\n"
            + md_table(["area", "raw ms/call", "squad ms/call", "squad - raw"], rows)
            + "\n\nthe functions of squad (and builtins) with the most own time in squad's run:\n\n"
            + md_table(["ms/call", "calls", "function"], fns) + "\n")


async def traced(fn: Callable[..., Awaitable[object]], *args: object) -> int:
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
    raw_cpu: list[float] = field(default_factory=list)
    squad_cpu: list[float] = field(default_factory=list)
    raw_mem: float | None = None
    squad_mem: float | None = None

    def per_call_ms(self, walls: list[float]) -> list[float]:
        return [w / self.n * 1e3 for w in walls]

    @property
    def overhead_ms(self) -> list[float]:
        return [(s - r) / self.n * 1e3 for s, r in zip(self.squad, self.raw)]

    @property
    def cpu_overhead_ms(self) -> list[float]:
        """squad's extra CPU per call in this process (the fake runs in another one)."""
        return [(s - r) / self.n * 1e3 for s, r in zip(self.squad_cpu, self.raw_cpu)]

    def add(self, side: str, measured: tuple[float, float]) -> None:
        getattr(self, side).append(measured[0])
        getattr(self, f"{side}_cpu").append(measured[1])


async def measure(n: int, repeats: int, memory: bool) -> Measured:
    prompts = [f"say hello number {i}" for i in range(n)]
    m = Measured(n)
    async with fake_engine_process(max(n, 1), max(n, 1) * BUDGET * 2, str(MODEL)) as base_url:
        for r in range(repeats):
            if r % 2 == 0:
                m.add("squad", await squad_once(base_url, prompts))
                m.add("raw", await raw_once(base_url, prompts))
            else:
                m.add("raw", await raw_once(base_url, prompts))
                m.add("squad", await squad_once(base_url, prompts))
        if memory:
            m.squad_mem = await traced(squad_once, base_url, prompts) / n
            m.raw_mem = await traced(raw_once, base_url, prompts) / n
    return m


def target_line(m: Measured) -> str:
    over = statistics.median(m.overhead_ms)
    cpu = statistics.median(m.cpu_overhead_ms)
    ratio = statistics.median(ratios(m.squad, m.raw))
    return (f"- {m.n} concurrent call{'s' if m.n != 1 else ''}: overhead {over:.3f} ms/call "
            f"(target <= {TARGET_OVERHEAD_MS} ms): {against(over, TARGET_OVERHEAD_MS)}; "
            f"squad/raw {ratio:.3f} (target <= {TARGET_RATIO}): {against(ratio, TARGET_RATIO)}; "
            f"squad's own CPU {cpu:.3f} ms/call ({against(cpu, TARGET_OVERHEAD_MS)})")


async def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny smoke: N=1,5 (repeats as given)")
    parser.add_argument("--ns", default="1,100,1000")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--no-memory", action="store_true")
    parser.add_argument("--profile", type=int, metavar="N", help="profile one run of N calls instead (see above)")
    args = parser.parse_args(argv)
    if args.profile:
        text = await profile(args.profile)
        print(text)
        return text
    ns = [1, 5] if args.quick else [int(n) for n in args.ns.split(",")]
    rows, targets = [], []
    for n in ns:
        m = await measure(n, args.repeats, memory=not args.no_memory and n <= MEMORY_MAX_N)
        row = [n, len(m.raw), spread(m.per_call_ms(m.raw), 3), spread(m.per_call_ms(m.squad), 3),
               spread(m.overhead_ms, 3), spread(ratios(m.squad, m.raw), 3),
               spread(m.per_call_ms(m.raw_cpu), 3), spread(m.per_call_ms(m.squad_cpu), 3),
               spread(m.cpu_overhead_ms, 3)]
        if m.raw_mem is not None and m.squad_mem is not None:
            row += [f"{m.raw_mem / 1024:.1f}", f"{m.squad_mem / 1024:.1f}", f"{(m.squad_mem - m.raw_mem) / 1024:+.1f}"]
        elif not args.no_memory:
            row += ["-", "-", "-"]
        rows.append(row)
        targets.append(target_line(m))
        print(f"N={n} done", file=sys.stderr)
    headers = ["concurrent calls", "repeats", "raw ms/call", "squad ms/call", "squad overhead ms/call", "squad/raw",
               "raw CPU ms/call", "squad CPU ms/call", "squad CPU overhead ms/call"]
    if not args.no_memory:
        headers += ["raw KiB/call (peak)", "squad KiB/agent (peak)", "squad extra KiB/agent"]
    text = (
        f"### Overhead against the zero-latency fake engine ({MAX_TOKENS} tokens per call, "
        f"{args.repeats} repeats, median (min–max))\n\n{md_table(headers, rows)}\n\n"
        "Targets, judged on the medians:\n\n" + "\n".join(targets) + "\n\n"
        "ms/call = wall time of N concurrent calls / N; CPU ms/call = this process's CPU time / N (the fake "
        "engine runs in a process of its own, so the CPU columns are the client side alone). Each repeat times the "
        "second run of a fresh Squad and of a fresh openai "
        "client (the first, untimed, opens their connections). Overhead and squad/raw are computed per "
        "repeat from the paired squad and raw runs (their order alternating), then summarised. Memory: "
        "tracemalloc peak during one run / N.\n"
    )
    print(text)
    return text


if __name__ == "__main__":
    anyio.run(main)

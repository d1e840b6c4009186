"""Fan-out: K agents at once on one local model, three ways, side by side in one run.

(a) squad: ``Squad.map`` over K prompts with the engine its planner sized (slots = K,
    context = K x budget), launched by squad's launcher;
(b) 1 slot: plain ``openai`` + anyio against ``llama-server -c 4096 -np 1`` (what users get
    when nothing sizes the engine);
(c) raw: plain ``openai`` + anyio task group against (a)'s planned engine.

Per K and way: wall time (median of the repeats), time to first token p50/p95/max measured
from the fan-out start, aggregate generated tokens/s, failures; ratios squad/raw and
squad/1-slot. Prints a markdown table.

    .venv/bin/python bench/fanout.py [--quick] [--ks 1,2,4,8] [--max-tokens 64] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (  # noqa: E402
    MODEL, THREADS, CallResult, fmt, hand_engine, md_table, pct, raw_client, raw_fanout, story_prompt,
)

BUDGET = 512
"""Context tokens each agent may hold (prompt ~40 + max_tokens, with room)."""


@dataclass
class Way:
    """Repeated measurements of one way at one K."""

    walls: list[float] = field(default_factory=list)
    calls: list[CallResult] = field(default_factory=list)
    engine: str = ""

    def add(self, wall: float, calls: list[CallResult]) -> None:
        self.walls.append(wall)
        self.calls.extend(calls)

    @property
    def wall(self) -> float | None:
        return statistics.median(self.walls) if self.walls else None

    def ttfts(self) -> list[float]:
        return [c.ttft_s for c in self.calls if c.ttft_s is not None]

    @property
    def failures(self) -> int:
        return sum(1 for c in self.calls if c.error)

    @property
    def tokens_per_s(self) -> float | None:
        total_wall = sum(self.walls)
        return sum(c.tokens for c in self.calls) / total_wall if total_wall else None


class FirstTokens:
    """An event sink keeping the times of ``call.first_token`` events."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def __call__(self, event) -> None:  # type: ignore[no-untyped-def]
        if event.kind == "call.first_token":
            self.times.append(event.t)


async def squad_fanout(sq, firsts: FirstTokens, prompts: list[str]) -> tuple[float, list[CallResult]]:  # type: ignore[no-untyped-def]
    """``Squad.map`` over the prompts; first-token times come from squad's own events."""
    firsts.times.clear()
    t0 = time.monotonic()
    results = await sq.map("writer", prompts)
    wall = time.monotonic() - t0
    times = sorted(firsts.times)
    calls = []
    for i, r in enumerate(results):
        calls.append(CallResult(
            ttft_s=(times[i] - t0) if i < len(times) else None,
            end_s=None, tokens=r.usage.completion_tokens if r.ok else 0,
            error=None if r.ok else str(r.error),
        ))
    return wall, calls


async def run_k(k: int, max_tokens: int, repeats: int, one_slot) -> dict[str, Way]:  # type: ignore[no-untyped-def]
    from squad import flow
    from squad.agent import Agent, Sampling
    from squad.runtime import Squad

    prompts = [story_prompt(i) for i in range(k)]
    ways = {"squad": Way(), "raw": Way(), "1-slot": Way()}
    writer = Agent(name="writer", budget=BUDGET, max_tokens=max_tokens, sampling=Sampling(temperature=0))
    workload = flow.Map(flow.Call("writer", BUDGET), count=k, limit=k)
    firsts = FirstTokens()
    async with Squad([writer], workload=workload, model=MODEL, threads=THREADS, on_event=firsts) as sq:
        info = sq.info
        engine = f"-np {info.slots} -c {info.n_ctx}"
        ways["squad"].engine = ways["raw"].engine = engine
        ways["1-slot"].engine = "-np 1 -c 4096"
        client = raw_client(info.base_url, info.api_key or "none")  # kept, like squad keeps its own
        try:
            await raw_fanout("", "", prompts, 8, client=client)  # warm-up: connections and prompt cache
            await sq.map("writer", prompts)
            for _ in range(repeats):  # interleaved so drift hits all ways alike
                ways["raw"].add(*await raw_fanout("", "", prompts, max_tokens, client=client))
                ways["squad"].add(*await squad_fanout(sq, firsts, prompts))
                ways["1-slot"].add(*await raw_fanout("", "", prompts, max_tokens, client=one_slot))
        finally:
            await client.close()
    return ways


def report(k: int, ways: dict[str, Way]) -> list[list[object]]:
    rows = []
    squad_wall = ways["squad"].wall
    for name, way in ways.items():
        t = way.ttfts()
        ratio = "" if name == "squad" or not way.wall or squad_wall is None else f"{squad_wall / way.wall:.2f}"
        rows.append([
            k, name, way.engine, fmt(way.wall), fmt(pct(t, 0.5)), fmt(pct(t, 0.95)), fmt(max(t) if t else None),
            fmt(way.tokens_per_s, 1), way.failures, ratio,
        ])
    return rows


async def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny smoke: K=1,2, 16 tokens, 1 repeat")
    parser.add_argument("--ks", default="1,2,4,8")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    ks = [1, 2] if args.quick else [int(k) for k in args.ks.split(",")]
    max_tokens = 16 if args.quick else args.max_tokens
    repeats = 1 if args.quick else args.repeats
    rows: list[list[object]] = []
    async with hand_engine(["-m", str(MODEL), "-c", "4096", "-np", "1"]) as one:
        one_slot = raw_client(one.base_url, one.api_key)
        try:
            await raw_fanout("", "", [story_prompt(i) for i in range(max(ks))], 8, client=one_slot)  # warm-up
            for k in ks:
                ways = await run_k(k, max_tokens, repeats, one_slot)
                rows += report(k, ways)
                print(f"K={k} done", file=sys.stderr)
        finally:
            await one_slot.close()
    table = md_table(
        ["K", "way", "engine", "wall s (median)", "TTFT p50 s", "TTFT p95 s", "TTFT max s", "tokens/s", "failures",
         "squad wall / this"],
        rows,
    )
    text = (
        f"### Fan-out: K agents, max_tokens={max_tokens}, temperature 0, {repeats} repeat(s), "
        f"budget {BUDGET} tokens per agent\n\n{table}\n\n"
        "TTFT is measured from the fan-out start (all K calls issued at once). tokens/s = generated "
        "tokens of all repeats / their summed wall time. 'squad wall / this' < 1 means squad was faster. "
        "Each engine gets one untimed warm-up fan-out; raw and 1-slot reuse one openai client per engine "
        "(as squad reuses its own).\n"
    )
    print(text)
    return text


if __name__ == "__main__":
    anyio.run(main)

"""Fan-out: K agents at once on one local model, four ways, side by side in one run.

(a) squad: ``Squad.map`` over K prompts with the engine its planner sized (slots = K,
    context = K x budget), launched by squad's launcher;
(b) raw: plain ``openai`` + anyio task group against (a)'s planned engine;
(c) 1 slot: plain ``openai`` + anyio against ``llama-server -c 4096 -np 1``;
(d) llama-server defaults: plain ``openai`` + anyio against ``llama-server -m MODEL`` with no
    ``-np``/``-c`` (what users get when nothing sizes the engine: b11434 picks its own slots
    and context; the table shows what it read back from ``/props``).

Per K and way: wall time as the median of the repeats with the spread (min–max), time to first
token p50/p95/max measured from the fan-out start, aggregate generated tokens/s, failures; the
ratio squad wall / this way's wall per repeat (paired, median and spread), and a line per K with
squad/raw against its target (<= 1.02). Prints markdown.

    .venv/bin/python bench/fanout.py [--quick] [--ks 1,2,4,8] [--max-tokens 64] [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (
    DEFAULTS_ARGS,
    MODEL,
    THREADS,
    CallResult,
    against,
    defaults_label,
    fmt,
    hand_engine,
    md_table,
    pct,
    ratios,
    raw_client,
    raw_fanout,
    spread,
    story_prompt,
)

if TYPE_CHECKING:
    from squad.events import Event
    from squad.runtime.squad import Squad

BUDGET = 512
"""Context tokens each agent may hold (prompt ~40 + max_tokens, with room)."""
TARGET_RAW_RATIO = 1.02
"""squad wall / raw wall (same engine) it should stay under."""
ONE_SLOT_ARGS = ["-m", str(MODEL), "-c", "4096", "-np", "1"]


@dataclass
class Way:
    """Repeated measurements of one way at one K."""

    walls: list[float] = field(default_factory=list)
    calls: list[CallResult] = field(default_factory=list)
    engine: str = ""

    def add(self, wall: float, calls: list[CallResult]) -> None:
        self.walls.append(wall)
        self.calls.extend(calls)

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

    def __call__(self, event: Event) -> None:
        if event.kind == "call.first_token":
            self.times.append(event.t)


async def squad_fanout(sq: Squad, firsts: FirstTokens, prompts: list[str]) -> tuple[float, list[CallResult]]:
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


async def run_k(k: int, max_tokens: int, repeats: int, hand: dict[str, tuple[str, object]]) -> dict[str, Way]:  # type: ignore[no-untyped-def]
    """All ways at K; ``hand`` maps the hand-engine ways to (engine label, their kept openai client)."""
    from squad.runtime.agent import Agent, Sampling
    from squad.runtime.squad import Squad
    from squad.sched.workload import Call, Map

    prompts = [story_prompt(i) for i in range(k)]
    ways = {"squad": Way(), "raw": Way(), **{name: Way(engine=label) for name, (label, _) in hand.items()}}
    writer = Agent(name="writer", budget=BUDGET, max_tokens=max_tokens, sampling=Sampling(temperature=0))
    workload = Map(Call("writer", BUDGET), count=k, limit=k)
    firsts = FirstTokens()
    async with Squad([writer], workload=workload, model=MODEL, threads=THREADS, on_event=firsts) as sq:
        info = sq.info
        ways["squad"].engine = ways["raw"].engine = f"-np {info.slots} -c {info.n_ctx}"
        client = raw_client(info.base_url, info.api_key or "none")  # kept, like squad keeps its own
        try:
            await raw_fanout("", "", prompts, 8, client=client)  # warm-up: connections and prompt cache
            await sq.map("writer", prompts)

            async def raw() -> None:
                ways["raw"].add(*await raw_fanout("", "", prompts, max_tokens, client=client))

            async def squad() -> None:
                ways["squad"].add(*await squad_fanout(sq, firsts, prompts))

            for r in range(repeats):  # interleaved so drift hits all ways alike; raw/squad order alternates
                for run in (raw, squad) if r % 2 == 0 else (squad, raw):
                    await run()
                for name, (_, other) in hand.items():
                    ways[name].add(*await raw_fanout("", "", prompts, max_tokens, client=other))
        finally:
            await client.close()
    return ways


def report(k: int, ways: dict[str, Way]) -> tuple[list[list[object]], str]:
    """Table rows for K and the line on the squad/raw target."""
    rows = []
    squad_walls = ways["squad"].walls
    for name, way in ways.items():
        t = way.ttfts()
        ratio = "" if name == "squad" else spread(ratios(squad_walls, way.walls))
        rows.append([
            k, name, way.engine, spread(way.walls), fmt(pct(t, 0.5)), fmt(pct(t, 0.95)), fmt(max(t) if t else None),
            fmt(way.tokens_per_s, 1), way.failures, ratio,
        ])
    raw_ratios = ratios(squad_walls, ways["raw"].walls)
    median = statistics.median(raw_ratios) if raw_ratios else None
    line = (f"- K={k}: squad/raw wall {spread(raw_ratios)} over {len(raw_ratios)} paired repeat(s) "
            f"(target <= {TARGET_RAW_RATIO}): {against(median, TARGET_RAW_RATIO)}")
    return rows, line


async def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny smoke: K=1,2, 16 tokens, 2 repeats")
    parser.add_argument("--ks", default="1,2,4,8")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    ks = [1, 2] if args.quick else [int(k) for k in args.ks.split(",")]
    max_tokens = 16 if args.quick else args.max_tokens
    repeats = 2 if args.quick else args.repeats
    rows: list[list[object]] = []
    lines: list[str] = []
    warm_prompts = [story_prompt(i) for i in range(max(ks))]
    async with hand_engine(ONE_SLOT_ARGS) as one, hand_engine(DEFAULTS_ARGS) as defaults:
        hand = {
            "1-slot": ("-np 1 -c 4096", raw_client(one.base_url, one.api_key)),
            "defaults": (defaults_label(defaults), raw_client(defaults.base_url, defaults.api_key)),
        }
        try:
            for _, client in hand.values():
                await raw_fanout("", "", warm_prompts, 8, client=client)  # warm-up
            for k in ks:
                k_rows, line = report(k, await run_k(k, max_tokens, repeats, hand))
                rows += k_rows
                lines.append(line)
                print(f"K={k} done", file=sys.stderr)
        finally:
            for _, client in hand.values():
                await client.close()
    table = md_table(
        ["K", "way", "engine", "wall s median (min–max)", "TTFT p50 s", "TTFT p95 s", "TTFT max s", "tokens/s",
         "failures", "squad wall / this, median (min–max)"],
        rows,
    )
    text = (
        f"### Fan-out: K agents, max_tokens={max_tokens}, temperature 0, {repeats} repeats, "
        f"budget {BUDGET} tokens per agent\n\n{table}\n\n"
        "squad against raw on the same engine, judged on the median:\n\n" + "\n".join(lines) + "\n\n"
        "Wall times: median of the repeats (min–max). 'squad wall / this' is computed per repeat (squad's "
        "repeat i over this way's repeat i; the ways run interleaved) and summarised; < 1 means squad was "
        "faster. TTFT is measured from the fan-out start (all K calls issued at once), pooled over the "
        "repeats. tokens/s = generated tokens of all repeats / their summed wall time. Each engine gets "
        "one untimed warm-up fan-out; raw, 1-slot and defaults reuse one openai client per engine (as squad "
        f"reuses its own). The defaults engine was started as `llama-server {' '.join(defaults.argv[1:])}` "
        "(API key in `LLAMA_API_KEY`, port picked per run); its slots and n_ctx are read back from `/props`.\n"
    )
    print(text)
    return text


if __name__ == "__main__":
    anyio.run(main)

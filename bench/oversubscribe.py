"""Oversubscription: a pool too small for every request at once (field case F01).

One hand-started engine ``llama-server -c 2048 -np 4 --kv-unified``; N agents (default 8)
each asking for a long story with ``max_tokens`` 512 (~600 tokens of context each with the
prompt). Four slots x ~600 tokens > 2048 cells, so llama-server fails every running request
with ``Context size has been exceeded.`` once the pool is full.

- naive: plain ``openai`` + anyio task group, all N at once (what users write);
- squad: ``Squad.map`` attached to the same engine (``url=``): its admission reserves
  prompt + max_tokens per call and admits only what the pool the engine reported can hold;
- llama-server defaults: the same naive gather against a second engine started with only
  ``-m MODEL`` (no ``-np``/``-c``: b11434 picks its own slots and a bigger context). Its
  read-back slots and n_ctx are printed with how many agents completed or failed.

Prints completed / failed / wall time / generated tokens as a markdown table.

    .venv/bin/python bench/oversubscribe.py [--quick] [--agents 8] [--max-tokens 512]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import DEFAULTS_ARGS, MODEL, defaults_label, hand_engine, md_table, raw_fanout, story_prompt


async def squad_run(base_url: str, api_key: str, prompts: list[str], max_tokens: int, budget: int):  # type: ignore[no-untyped-def]
    from squad.runtime.agent import Agent, Sampling
    from squad.runtime.squad import Squad

    writer = Agent(name="writer", budget=budget, max_tokens=max_tokens, sampling=Sampling(temperature=0))
    async with Squad([writer], url=base_url, api_key=api_key) as sq:
        t0 = time.monotonic()
        results = await sq.map("writer", prompts)
        wall = time.monotonic() - t0
    errors = [str(r.error) for r in results if not r.ok]
    tokens = sum(r.usage.completion_tokens for r in results if r.ok)
    return wall, len(results) - len(errors), errors, tokens


async def naive_run(eng: Any, prompts: list[str], max_tokens: int) -> tuple[float, int, list[str], int]:
    """All prompts at once with plain openai + anyio: (wall s, completed, errors, generated tokens)."""
    wall, calls = await raw_fanout(eng.base_url, eng.api_key, prompts, max_tokens)
    errors = [c.error for c in calls if c.error]
    return wall, len(calls) - len(errors), errors, sum(c.tokens for c in calls)


def _kinds(errors: list[str]) -> str:
    counts = Counter("Context size has been exceeded" if "exceeded" in e else e[:60] for e in errors)
    return "; ".join(f"{n}x {e}" for e, n in counts.items()) or "-"


async def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny smoke: -c 512 -np 2, 3 agents, 160 tokens")
    parser.add_argument("--agents", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=512)
    parser.add_argument("--ctx", type=int, default=2048)
    parser.add_argument("--slots", type=int, default=4)
    args = parser.parse_args(argv)
    if args.quick:
        args.agents, args.max_tokens, args.ctx, args.slots = 3, 160, 512, 2
    prompts = [story_prompt(i) for i in range(args.agents)]
    flags = ["-m", str(MODEL), "-c", str(args.ctx), "-np", str(args.slots), "--kv-unified"]
    small = " ".join(flags[2:])
    rows = []

    def add(way: str, engine: str, wall: float, done: int, errors: list[str], tokens: int) -> None:
        rows.append([way, engine, done, len(errors), f"{wall:.2f}", tokens, _kinds(errors)])

    async with hand_engine(flags) as eng:
        add("naive gather (openai + anyio)", small, *await naive_run(eng, prompts, args.max_tokens))
        print("naive done", file=sys.stderr)
        squad = await squad_run(eng.base_url, eng.api_key, prompts, args.max_tokens, budget=args.max_tokens + 128)
        add("squad (admission)", small, *squad)
        print("squad done", file=sys.stderr)
    async with hand_engine(DEFAULTS_ARGS) as defaults:
        wall, done, errors, tokens = await naive_run(defaults, prompts, args.max_tokens)
        add("naive gather on llama-server defaults", defaults_label(defaults), wall, done, errors, tokens)
        print("defaults done", file=sys.stderr)
    table = md_table(["way", "engine", "completed", "failed", "wall s", "generated tokens", "errors"], rows)
    text = (
        f"### Oversubscription: `llama-server {small}`, {args.agents} agents, "
        f"max_tokens={args.max_tokens}, temperature 0\n\n{table}\n\n"
        "Each agent's request needs its prompt plus up to max_tokens cells; together the running requests "
        "exceed the pool. squad admits a call only while the reservations fit the pool the engine reported.\n\n"
        f"llama-server defaults (`llama-server {' '.join(defaults.argv[1:])}`, no `-np`/`-c`; port picked per "
        f"run) read back {defaults.slots} slots and n_ctx {defaults.n_ctx} from `/props` (the pool above has "
        f"{args.ctx} cells): {done} of {args.agents} agents completed, {len(errors)} failed. "
        f"squad wall (admission on the {args.ctx}-cell pool) / defaults wall: {squad[0] / wall:.2f}.\n"
    )
    print(text)
    return text


if __name__ == "__main__":
    anyio.run(main)

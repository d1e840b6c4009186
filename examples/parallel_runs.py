"""Parallel agent runs: one agent over many inputs on one local engine.

The engine is planned for a map of ``--limit`` conversations at once (slots = limit,
context = limit x budget); squad never has more requests in flight than that, and the
results come back in input order with their timings.

    .venv/bin/python examples/parallel_runs.py
    .venv/bin/python examples/parallel_runs.py --limit 2
"""

from __future__ import annotations

import argparse

import anyio

from squad import Agent, Call, Map, Squad

SUMMARIZER = Agent(
    name="summarizer",
    description="summarizes a sentence in a few words",
    instructions="Summarize the user's text in at most six words.",
    budget=256,
    max_tokens=16,
    sampling={"temperature": 0.0, "seed": 1},
)

INPUTS = [
    "The meeting moved to Thursday because the projector in room 4 is broken.",
    "Sales grew eight percent this quarter, mostly from the new subscription plan.",
    "The build fails on Windows since the path separator is hard-coded.",
    "Our cat learned to open the fridge and now eats all the cheese.",
    "Rain is expected all weekend, so the picnic is cancelled.",
]


async def main(model: str | None, limit: int, threads: int) -> None:
    workload = Map(Call(SUMMARIZER.name, SUMMARIZER.budget), count=len(INPUTS), limit=limit)
    async with Squad([SUMMARIZER], model=model, workload=workload, threads=threads) as sq:
        print(f"engine: slots={sq.info.slots} n_ctx={sq.info.n_ctx}")
        results = await sq.map("summarizer", INPUTS, max_concurrency=limit)
    for text, result in zip(INPUTS, results):
        print(f"\n{text}\n  -> {result.output.strip() or result.error}")
        print(f"     {result.summary()}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="model name or .gguf path (default: the default model)")
    parser.add_argument("--limit", type=int, default=3, help="conversations at once")
    parser.add_argument("--threads", type=int, default=2, help="llama-server threads (-t)")
    args = parser.parse_args()
    anyio.run(main, args.model, args.limit, args.threads)

"""Run a shipped recipe with a JSONL trace and draw its timeline (the README picture).

    .venv/bin/python bench/timeline.py [recipes/review.yaml] [-o bench/timeline-review.png]

Writes the trace next to the image (``.jsonl``) and prints ``squad trace show`` for it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import MODEL, THREADS


async def main(argv: list[str] | None = None) -> Path:
    from squad.cli.trace import plot_timeline
    from squad.events.jsonl import JsonlTrace, load_trace
    from squad.events.summary import summarize
    from squad.recipes import load_recipe, run_recipe

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("recipe", nargs="?", type=Path, default=Path("recipes/review.yaml"))
    parser.add_argument("-o", "--output", type=Path, default=Path("bench/timeline-review.png"))
    args = parser.parse_args(argv)
    trace_path = args.output.with_suffix(".jsonl")
    trace_path.unlink(missing_ok=True)
    recipe = load_recipe(args.recipe, {})
    with JsonlTrace(trace_path) as sink:
        await run_recipe(recipe, engine=recipe.engine_spec().but(model=str(MODEL), threads=THREADS), on_event=sink)
    summary = summarize(load_trace(trace_path))
    plot_timeline(summary, args.output, title=f"squad run {args.recipe}")
    print(f"trace: {trace_path}\nimage: {args.output}")
    return args.output


if __name__ == "__main__":
    anyio.run(main)

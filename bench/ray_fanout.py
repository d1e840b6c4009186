"""Ray fan-out: a recipe's map over Ray workers (``squad.cluster.ray``) against the same map on one
local engine, on this machine.

Both ways run the same N-item map (tiny prompts, ``max_tokens`` 8) with the same engine per
process (``--slots`` slots, 1 thread, ``--ctx`` context): (a) local, ``run_recipe`` on one
engine; (b) ray, ``run_recipe(..., ray=RayFanout(workers_per_node=W))`` on a local Ray cluster
on 127.0.0.1, W workers each with its own engine. On a 2-core machine this shows where the
items went and what Ray adds, not a speed-up (W engines share the same two cores).

Per way, median (min–max) over the repeats: start s (run start to engine(s) ready: for ray the
cluster, the actors and their engines), map s (engines ready to last item done) and per item, items per
worker, the item's own time in its squad (p50, ``AgentResult.timings.total_s``) and for ray
the dispatch overhead per item: the driver's round trip of one item minus that item's time in
the worker's squad (p50/p95, ms), i.e. Ray's call, serialisation and scheduling.

    .venv/bin/python bench/ray_fanout.py [--quick] [--items 32] [--workers 2] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import fmt, md_table, pct, spread

if TYPE_CHECKING:
    from squad.engine.session import EngineSpec
    from squad.events import Event
    from squad.recipes.model import Recipe


def recipe_text(n: int) -> str:
    words = [f"w{i:03d}" for i in range(n)]
    return f"""\
name: ray-bench
model: default
params:
  items:
    type: list
    default: {json.dumps(words)}
agents:
  echo:
    instructions: Repeat the word.
    max_tokens: 8
    sampling: {{temperature: 0}}
  boss:
    instructions: Be brief.
    max_tokens: 8
main: boss
flow:
  - id: words
    map: params.items
    agent: echo
    prompt: "Say {{{{ item }}}}"
"""


async def run_ray(recipe: Recipe, spec: EngineSpec, workers: int) -> dict:
    import squad.cluster.ray as sray
    from squad.recipes import run_recipe

    t0 = time.monotonic()
    marks: dict[str, float] = {}
    trips: dict[int, float] = {}
    real_start, real_run = sray._Pool.start, sray._Handle.run

    async def start(self: sray._Pool, *a: Any, **kw: Any) -> None:
        await real_start(self, *a, **kw)
        marks["ready"] = time.monotonic()

    async def run(self: sray._Handle, index: int, item: Any) -> Any:
        sent = time.monotonic()
        result = await real_run(self, index, item)
        trips[index] = time.monotonic() - sent
        return result

    done_at: list[float] = []
    sray._Pool.start, sray._Handle.run = start, run
    try:
        fanout = sray.RayFanout(workers_per_node=workers,
                                on_item=lambda r: done_at.append(time.monotonic()))
        run_ = await run_recipe(recipe, engine=spec, ray=fanout)
    finally:
        sray._Pool.start, sray._Handle.run = real_start, real_run
    items = [r for sid, r in run_.results if sid == "words"]
    per_worker = {w["id"]: w["items"] for w in run_.workers}
    overhead = [trips[r.item] - r.timings.total_s for r in items if r.item in trips]
    return {"start": marks["ready"] - t0, "map": max(done_at) - marks["ready"], "per_worker": per_worker,
            "item_s": [r.timings.total_s for r in items], "overhead": overhead,
            "retried": sum(1 for r in items if r.retried)}


async def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="8 items, 1 repeat")
    parser.add_argument("--items", type=int, default=32)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--slots", type=int, default=2)
    parser.add_argument("--ctx", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    if args.quick:
        args.items, args.repeats = 8, 1
    from squad.recipes import load_recipe

    path = Path(tempfile.mkdtemp(prefix="squad-bench-")) / "ray-bench.yaml"
    path.write_text(recipe_text(args.items))
    recipe = load_recipe(path, {})
    spec = recipe.engine_spec().but(threads=1, slots=args.slots, ctx=args.ctx)
    local: list[dict] = []
    ray: list[dict] = []
    for _ in range(args.repeats):  # interleaved, so drift on a shared machine hits both alike
        local.append(await run_local_timed(recipe, spec))
        ray.append(await run_ray(recipe, spec, args.workers))

    def row(name: str, runs: list[dict], engines: str) -> list[object]:
        counts = [sorted(r["per_worker"].values(), reverse=True) for r in runs]
        over = [x * 1000 for r in runs for x in r["overhead"]]
        return [name, engines, spread([r["start"] for r in runs]), spread([r["map"] for r in runs]),
                spread([r["map"] / max(1, args.items) * 1000 for r in runs], 0),
                " / ".join("+".join(str(c) for c in cs) for cs in counts),
                fmt(pct([x for r in runs for x in r["item_s"]], 0.5)),
                "-" if not over else f"{fmt(pct(over, 0.5), 1)} / {fmt(pct(over, 0.95), 1)}",
                sum(r.get("retried", 0) for r in runs),
                sum(r["restarts"] for r in runs) if "restarts" in runs[0] else "- (not seen from the driver)"]

    headers = ["way", "engines", "start s", "map s", "map ms per item", "items per worker (each repeat)", "item s p50",
               "dispatch overhead ms p50 / p95", "retried",
               "engine restarts"]
    per = f"{args.slots} slots, 1 thread, ctx {args.ctx}"
    table = md_table(headers, [row("local", local, f"1 × ({per})"),
                               row("ray", ray, f"{args.workers} workers × ({per}), one node")])
    return (f"### Ray fan-out: {args.items}-item map, max_tokens 8, {args.repeats} repeats, local Ray cluster on "
            f"127.0.0.1\n\n{table}\n\nitem s: the item's time in its squad; local items all start at once and "
            "wait in squad's admission for a slot, ray items wait in the driver until their worker has one. "
            "On this 2-core machine the workers' engines share the same cores: the table shows the distribution "
            "and Ray's cost, not a speed-up, which needs real nodes.\n")


async def run_local_timed(recipe: Recipe, spec: EngineSpec) -> dict:
    """The map on one local engine; each item's end time from its ``agent.finished`` event."""
    from squad.events import AgentFinished, EngineLoaded
    from squad.recipes import run_recipe

    t0 = time.monotonic()
    marks: dict[str, float] = {}
    done_at: list[float] = []

    restarts = 0

    def sink(event: Event) -> None:
        nonlocal restarts
        if isinstance(event, EngineLoaded):
            marks.setdefault("ready", time.monotonic())
            restarts += event.reason == "restarted"
        elif isinstance(event, AgentFinished):
            done_at.append(time.monotonic())

    run = await run_recipe(recipe, engine=spec, on_event=sink)
    items = [r for sid, r in run.results if sid == "words"]
    return {"start": marks["ready"] - t0, "map": max(done_at) - marks["ready"], "restarts": restarts,
            "per_worker": {"local": len(items)}, "item_s": [r.timings.total_s for r in items], "overhead": []}


if __name__ == "__main__":
    print(anyio.run(main))

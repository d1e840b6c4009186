"""Shared input, paid once (squad.sched.share): today's way against the shared way, side by side in one run.

K = 1, 3, 5 reviewers given the same generated Python file (300 and 600 lines) through
``Squad.parallel``; with ``--big``, the shipped review recipe (recipes/review.yaml: three
reviewers map over the file's chunks, then a lead) on a 2,000-line file. Each case runs twice on
the same engine: ``shared_input="off"`` (the prompts as written: instructions, then the file)
and ``"first"`` (since issue 29: the file declared ``shared=`` by the author, so it goes first in the
system message, prefilled once, restored into the other slots; squad no longer moves it on its own).
The ``--big`` recipe case runs the recipe as shipped, whose prompts begin differently: both ways
then send the same requests. Reported per case: prompt tokens the engine processed (``llamacpp:prompt_tokens_total``
from ``/metrics``, before and after), wall seconds, first token (seconds from the start to each
call's first token: median and last), and the ratios.

    .venv/bin/python bench/shared_input.py            # 300 and 600 lines, K = 1, 3, 5
    .venv/bin/python bench/shared_input.py --big      # and the 2,000-line review recipe
    .venv/bin/python bench/shared_input.py --quick    # 300 lines, K = 1, 3 (a smoke run)
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import anyio
import httpx

from _common import BINARY, MODEL, THREADS
from squad.engine.session import EngineSpec
from squad.events import CallFirstToken, Event
from squad.runtime.agent import Agent
from squad.runtime.squad import Squad

FOCUS = ["security", "style", "tests", "performance", "docs"]
WAYS = ("off", "first")


def python_source(lines: int, seed: int = 7) -> str:
    """Realistic, deterministic Python source of ``lines`` lines: a module of small classes and
    functions with docstrings, loops, conditions and error handling (no randomness beyond ``seed``)."""
    words = ["order", "user", "item", "price", "cache", "token", "route", "event", "batch", "limit", "queue",
             "record", "session", "retry", "payload"]
    out = ['"""Service helpers: orders, users and their caches."""', "", "import json", "import logging",
           "from dataclasses import dataclass", "", "log = logging.getLogger(__name__)", ""]
    i = seed
    while len(out) < lines:
        a, b, c = words[i % 15], words[(i * 7 + 3) % 15], words[(i * 11 + 5) % 15]
        if i % 4 == 0:
            out += ["@dataclass", f"class {a.title()}{b.title()}{i}:", f'    """A {a} with its {b}."""', "",
                    f"    {a}_id: int", f"    {b}: str = \"\"", f"    {c}_count: int = {i % 9}", "",
                    "    def to_json(self) -> str:",
                    f"        return json.dumps({{'{a}': self.{a}_id, '{b}': self.{b}}})",
                    ""]
        else:
            out += [f"def load_{a}_{b}_{i}(rows, {c}=None, limit={i % 50 + 10}):",
                    f'    """Load {a} rows into {b} objects, at most ``limit``."""',
                    "    found = []", "    for row in rows:", f"        if row.get('{c}') is None and {c} is not None:",
                    "            continue", "        try:", f"            value = int(row['{a}']) * {i % 7 + 1}",
                    "        except (KeyError, ValueError) as exc:",
                    f"            log.warning('bad {a} row %s: %s', row, exc)", "            continue",
                    "        found.append(value)", "        if len(found) >= limit:", "            break",
                    "    return found", ""]
        i += 1
    return "\n".join(out[:lines]) + "\n"


def processed(metrics: str) -> float:
    found = re.search(r"^llamacpp:prompt_tokens_total\s+(\S+)", metrics, re.MULTILINE)
    return float(found.group(1)) if found else float("nan")


async def measured(squad: Squad, http: httpx.AsyncClient, seen: list[tuple[float, Event]],
                   work: Callable[[], Awaitable[object]]) -> dict:
    await anyio.sleep(0.5)
    for slot in range(squad.info.slots):  # no prompt left over from the case before
        await http.post(f"/slots/{slot}", params={"action": "erase"})
    before = processed((await http.get("/metrics")).text)
    seen.clear()
    start = time.monotonic()
    await work()
    wall = time.monotonic() - start
    await anyio.sleep(0.2)
    after = processed((await http.get("/metrics")).text)
    firsts = sorted(t - start for t, e in seen if isinstance(e, CallFirstToken))
    return {"tokens": after - before, "wall": wall, "ttft_med": statistics.median(firsts) if firsts else float("nan"),
            "ttft_last": firsts[-1] if firsts else float("nan"), "calls": len(firsts)}


async def main(argv: list[str]) -> str:
    ap = argparse.ArgumentParser()
    ap.add_argument("--big", action="store_true", help="add the 2,000-line review recipe")
    ap.add_argument("--quick", action="store_true", help="300 lines, K = 1 and 3 only")
    ap.add_argument("--sizes", help="file sizes in lines, e.g. 600 (default 300,600)")
    ap.add_argument("--ks", help="agent counts, e.g. 1,3 (default 1,3,5)")
    ap.add_argument("--no-parallel", action="store_true",
                    help="skip the Squad.parallel cases (with --big: the recipe only)")
    args = ap.parse_args(argv)
    sizes, ks = ([300], [1, 3]) if args.quick else ([300, 600], [1, 3, 5])
    sizes = [int(x) for x in args.sizes.split(",")] if args.sizes else sizes
    ks = [int(x) for x in args.ks.split(",")] if args.ks else ks
    if args.no_parallel:
        sizes = []
    seen: list[tuple[float, Event]] = []
    agents = [Agent(name=n, instructions=f"You review Python code for {n}. List the two most important issues, "
                    "one short line each.", budget=8192, max_tokens=32, sampling={"temperature": 0.0, "seed": 1})
              for n in FOCUS]
    rows: list[tuple[str, dict[str, dict]]] = []
    if sizes:
        await parallel_cases(agents, sizes, ks, seen, rows)
    if args.big:
        rows.append(("review.yaml, 2,000 lines", await review_recipe(seen)))
    return table(rows, ks)


async def parallel_cases(agents: list[Agent], sizes: list[int], ks: list[int], seen: list[tuple[float, Event]],
                         rows: list[tuple[str, dict[str, dict]]]) -> None:
    """K reviewers on one file through ``Squad.parallel``, each way, on one engine."""
    spec = EngineSpec(model=MODEL, binary=BINARY, threads=THREADS, slots=max(ks), ctx=max(ks) * 8192,
                      request_timeout=3000)  # a loaded machine prefills K long prompts slowly
    async with Squad(agents, engine=spec, on_event=lambda e: seen.append((time.monotonic(), e))) as squad:
        info = squad.info
        headers = {"Authorization": f"Bearer {info.api_key}"} if info.api_key else {}
        async with httpx.AsyncClient(base_url=info.base_url, headers=headers, timeout=600) as http:
            for lines in sizes:
                prompt = "Review this file:\n\n" + python_source(lines)
                for k in ks:
                    pair: dict[str, dict] = {}
                    for way in WAYS:
                        if k == 1 and way == "first":  # one agent: nothing is shared, the same requests
                            pair[way] = pair["off"]
                            continue
                        squad.shared_input = way

                        async def work(prompt: str = prompt, k: int = k, way: str = way) -> None:
                            if way == "off":
                                await squad.parallel([(FOCUS[j], prompt) for j in range(k)], check=True)
                            else:  # the layout an author asks for: the file first (squad.sched.share)
                                file = prompt.removeprefix("Review this file:\n\n")
                                await squad.parallel([(FOCUS[j], "Review the file above.") for j in range(k)],
                                                     check=True, shared=file)

                        pair[way] = await measured(squad, http, seen, work)
                        print(f"{lines} lines K={k} {way}: {pair[way]}", file=sys.stderr, flush=True)
                    rows.append((f"{lines} lines, K={k}", pair))


async def review_recipe(seen: list[tuple[float, Event]]) -> dict[str, dict]:
    """The shipped review recipe on a 2,000-line file, once per way, each on its own engine."""
    from squad.recipes import load_recipe
    from squad.recipes.run import run_recipe

    code = python_source(2000)
    recipe_path = Path(__file__).resolve().parents[1] / "recipes" / "review.yaml"
    pair: dict[str, dict] = {}
    for way in WAYS:
        recipe = load_recipe(recipe_path, params={"code": code}, model=str(MODEL))
        recipe.shared_input = way
        box: dict = {}

        def sink(e: Event, box: dict = box) -> None:
            seen.append((time.monotonic(), e))
            url = getattr(e, "engine", None)
            if url and "url" not in box:
                box["url"] = url

        seen.clear()
        start = time.monotonic()
        run = await run_recipe(recipe, on_event=sink,
                               engine=recipe.engine_spec().but(binary=BINARY, threads=THREADS))
        wall = time.monotonic() - start
        firsts = sorted(t - start for t, e in seen if isinstance(e, CallFirstToken))
        tokens = sum(getattr(r, "usage", None).prompt_tokens for _, r in run.results if getattr(r, "usage", None))
        pair[way] = {"tokens": float("nan"), "wall": wall, "ttft_med": statistics.median(firsts),
                     "ttft_last": firsts[-1], "calls": len(firsts), "prompt_sum": tokens}
        print(f"review 2000 {way}: {pair[way]}", file=sys.stderr, flush=True)
    return pair


def table(rows: list[tuple[str, dict[str, dict]]], ks: list[int]) -> str:
    out = ["| case | way | prompt tokens processed | vs K=1 | wall s | first token s (median / last) |",
           "|---|---|---|---|---|---|"]
    ones: dict[tuple[str, str], float] = {}
    for name, pair in rows:
        size = name.split(",")[0]
        for way, m in pair.items():
            if name.endswith("K=1"):
                ones[(size, way)] = m["tokens"]
            base = ones.get((size, way))
            ratio = f"{m['tokens'] / base:.2f}" if base and m["tokens"] == m["tokens"] else "-"
            label = "today (off)" if way == "off" else "shared (first)"
            tokens = (f"{m['tokens']:.0f}" if m["tokens"] == m["tokens"]
                      else f"(engine per recipe) {m.get('prompt_sum', 0)} in prompts")
            out.append(f"| {name} | {label} | {tokens} | {ratio} | {m['wall']:.1f} | "
                       f"{m['ttft_med']:.1f} / {m['ttft_last']:.1f} |")
        off, first = pair.get("off"), pair.get("first")
        if off and first:
            out.append(f"| {name} | shared / today | "
                       f"{first['tokens'] / off['tokens']:.2f} | | {first['wall'] / off['wall']:.2f} | |"
                       if off["tokens"] == off["tokens"] else
                       f"| {name} | shared / today | | | {first['wall'] / off['wall']:.2f} | |")
    return "\n".join(out)


if __name__ == "__main__":
    print(anyio.run(main, sys.argv[1:]))

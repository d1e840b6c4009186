"""Scale: does squad's cost per map item stay flat as the map grows? Side by side with raw openai.

One zero-latency ``squad.testing.FakeEngine`` (16 slots, its own process) serves both sides. For each N
(default 100, 1,000, 10,000 items, 4 generated tokens each), in one run:

- raw: a fresh Python process with ``openai.AsyncOpenAI`` + ``asyncio.gather`` under a semaphore of 16;
- squad: a fresh Python process with ``Squad.map`` of one agent attached to the fake (admission, the
  queue policy, exact prompt counts with the model's own tokenizer, events, results).

Each side runs in its own subprocess so its memory and CPU are its own: after imports and a warm-up of 16
items (connections open, tokenizer loaded), the child times the map: CPU ms/item (``time.process_time``, this
process only; the fake is elsewhere), wall ms/item, RSS before the map and peak RSS (``ru_maxrss``). The sides
alternate per repeat so machine drift hits both. The machine is shared: judge ratios measured in one run.

Targets (issue 31): squad CPU/item within +-20 % from the smallest to the largest N; squad/raw CPU <= 1.3 at every
N; squad's peak RSS at the largest N <= raw's peak + squad's footprint (squad's RSS before the map minus raw's)
+ 30 MiB.

    .venv/bin/python bench/scale.py [--ns 100,1000,10000] [--repeats 2] [--profile 5000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

sys.path.insert(0, str(Path(__file__).resolve().parent))

T = TypeVar("T")
SLOTS = 16
MAX_TOKENS = 4
BUDGET = 64
WARM = 16
TARGET_FLAT = 0.20
TARGET_RATIO = 1.3
TARGET_RSS_MIB = 30.0


def _rss_mib() -> float:
    """This process's resident set now (MiB), from /proc."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


async def _raw(url: str, n: int) -> dict:
    import httpx
    from openai import AsyncOpenAI

    # Transport errors are retried (max_retries) and the pool holds the semaphore's 16 connections, so a loaded
    # machine (the fake answering late) slows the raw side down rather than failing it.
    client = AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=3, timeout=600,
                         http_client=httpx.AsyncClient(limits=httpx.Limits(max_connections=SLOTS)))
    sem = asyncio.Semaphore(SLOTS)

    async def one(prompt: str) -> str:
        async with sem:
            stream = await client.chat.completions.create(
                model="default", messages=[{"role": "user", "content": prompt}], max_tokens=MAX_TOKENS,
                temperature=0, stream=True, stream_options={"include_usage": True})
            parts = [c.choices[0].delta.content or "" async for c in stream if c.choices]
            return "".join(parts)

    await asyncio.gather(*(one(f"warm up {i}") for i in range(WARM)))
    before = _rss_mib()
    cpu, t0 = time.process_time(), time.monotonic()
    out = await asyncio.gather(*(one(f"say hello number {i}") for i in range(n)))
    wall, cpu = time.monotonic() - t0, time.process_time() - cpu
    await client.close()
    assert len(out) == n
    return {"cpu": cpu, "wall": wall, "before": before, "peak": _peak_mib()}


async def _squad(url: str, n: int, profile: str | None) -> dict:
    from squad import Agent, EngineSpec, Squad

    async with Squad([Agent(name="echo", budget=BUDGET, max_tokens=MAX_TOKENS)], engine=EngineSpec(url=url)) as sq:
        await sq.map("echo", [f"warm up {i}" for i in range(WARM)])
        before = _rss_mib()
        prof = None
        if profile:
            import cProfile

            prof = cProfile.Profile(time.process_time)
            prof.enable()
        cpu, t0 = time.process_time(), time.monotonic()
        results = await sq.map("echo", [f"say hello number {i}" for i in range(n)])
        wall, cpu = time.monotonic() - t0, time.process_time() - cpu
        if prof is not None:
            prof.disable()
            prof.dump_stats(profile)
    failed = [r.error for r in results if not r.ok]
    if failed:
        raise RuntimeError(f"squad items failed against the fake: {failed[0]}")
    return {"cpu": cpu, "wall": wall, "before": before, "peak": _peak_mib()}


def child(side: str, url: str, n: int, profile: str | None) -> None:
    out = asyncio.run(_raw(url, n) if side == "raw" else _squad(url, n, profile))
    print(json.dumps(out), flush=True)


def run_child(side: str, url: str, n: int, profile: str | None = None) -> dict:
    argv = [sys.executable, __file__, "--child", side, "--url", url, "--n", str(n)]
    if profile:
        argv += ["--profile-out", profile]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        raise RuntimeError(f"{side} child at N={n} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


async def _with_fake(fn: Callable[[str], T]) -> T:
    from _common import MODEL, fake_engine_process

    async with fake_engine_process(SLOTS, SLOTS * BUDGET * 2, str(MODEL)) as url:
        return await asyncio.to_thread(fn, url)


def measure(ns: list[int], repeats: int) -> dict[int, dict[str, list[dict]]]:
    def go(url: str) -> dict[int, dict[str, list[dict]]]:
        got: dict[int, dict[str, list[dict]]] = {}
        for n in ns:
            got[n] = {"raw": [], "squad": []}
            for r in range(repeats):
                order = ("squad", "raw") if r % 2 == 0 else ("raw", "squad")
                for side in order:
                    got[n][side].append(run_child(side, url, n))
                print(f"N={n} repeat {r + 1}/{repeats} done", file=sys.stderr)
        return got

    return asyncio.run(_with_fake(go))


def report(got: dict[int, dict[str, list[dict]]]) -> str:
    from _common import against, md_table, spread

    rows, cpu_med, ratio_med = [], {}, {}
    for n, sides in got.items():
        raw, sq = sides["raw"], sides["squad"]
        per = lambda runs, k, n=n: [r[k] / n * 1e3 for r in runs]  # noqa: E731 - a local shorthand
        ratios = [s["cpu"] / r["cpu"] for s, r in zip(sq, raw)]
        cpu_med[n], ratio_med[n] = statistics.median(per(sq, "cpu")), statistics.median(ratios)
        rows.append([f"{n:,}", spread(per(raw, "cpu"), 2), spread(per(sq, "cpu"), 2), spread(ratios, 2),
                     spread(per(raw, "wall"), 2), spread(per(sq, "wall"), 2),
                     spread([r["before"] for r in raw], 0), spread([r["peak"] for r in raw], 0),
                     spread([s["before"] for s in sq], 0), spread([s["peak"] for s in sq], 0)])
    ns = sorted(got)
    lo, hi = cpu_med[ns[0]], cpu_med[ns[-1]]
    drift = max(abs(cpu_med[n] / lo - 1) for n in ns)
    big = got[ns[-1]]
    raw_peak = statistics.median(r["peak"] for r in big["raw"])
    footprint = (statistics.median(s["before"] for s in big["squad"])
                 - statistics.median(r["before"] for r in big["raw"]))
    sq_peak = statistics.median(s["peak"] for s in big["squad"])
    limit = raw_peak + footprint + TARGET_RSS_MIB
    lines = [
        f"- flat: squad CPU/item {lo:.2f} ms at {ns[0]:,} to {hi:.2f} ms at {ns[-1]:,}; largest drift from "
        f"{ns[0]:,} {drift * 100:.0f} % (target <= {TARGET_FLAT * 100:.0f} %): {against(drift, TARGET_FLAT)}",
        *(f"- squad/raw CPU at {n:,}: {ratio_med[n]:.2f} (target <= {TARGET_RATIO}): "
          f"{against(ratio_med[n], TARGET_RATIO)}" for n in ns),
        f"- memory at {ns[-1]:,}: squad peak {sq_peak:.0f} MiB; raw peak {raw_peak:.0f} + squad's footprint "
        f"{footprint:.0f} + {TARGET_RSS_MIB:.0f} = {limit:.0f} MiB: {against(sq_peak, limit)}",
    ]
    reps = len(next(iter(got.values()))["raw"])
    return (f"### Scale: a map of N items against the zero-latency fake ({SLOTS} slots, {MAX_TOKENS} tokens per "
            f"item, {reps} repeats, median (min–max), each side in its own process)\n\n"
            + md_table(["items", "raw CPU ms/item", "squad CPU ms/item", "squad/raw CPU", "raw wall ms/item",
                        "squad wall ms/item", "raw RSS before MiB", "raw peak MiB", "squad RSS before MiB",
                        "squad peak MiB"], rows)
            + "\n\nTargets, judged on the medians:\n\n" + "\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ns", default="100,1000,10000")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--profile", type=int, metavar="N", help="cProfile one squad map of N items; print the top")
    parser.add_argument("--child", choices=["raw", "squad"], help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--n", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--profile-out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.url, args.n, args.profile_out)
        return
    if args.profile:
        import pstats
        import tempfile

        out = os.environ.get("SCALE_PROFILE_OUT") or tempfile.mktemp(suffix=".prof")
        print(json.dumps(asyncio.run(_with_fake(lambda url: run_child("squad", url, args.profile, out)))))
        pstats.Stats(out).sort_stats("tottime").print_stats(30)
        pstats.Stats(out).sort_stats("cumulative").print_stats(40)
        return
    print(report(measure([int(n) for n in args.ns.split(",")], args.repeats)))


if __name__ == "__main__":
    main()

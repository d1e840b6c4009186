"""Engines side by side on one machine: how many CPU threads each should get.

Two engines of the same model run at once, each decoding one stream (``ignore_eos``) after one
~1,000-token prompt: the situation of a test suite under pytest-xdist, or of two squad runs on
one laptop. Each engine gets ``-t T`` for T in ``--threads`` (default ``2,1``: both cores each,
then one core each). llama.cpp's worker threads wait for one another at every operation of the
graph, so when more threads than cores are busy, a step waits for the time slice of a thread
that is not running. Repeats alternate the order of the settings; medians (min–max).

    .venv/bin/python bench/threads.py [--repeats 3] [--tokens 200] [--engines 2] [--threads 2,1]

The engine: ``SQUAD_BENCH_BINARY`` if set, else the prebuilt engine of this Python
(``squad-llama-server``); the model: ``SQUAD_BENCH_MODEL`` or the default model.
"""

from __future__ import annotations

import argparse
import os
import secrets
import statistics
import subprocess
import sys
import time
from pathlib import Path

import anyio
import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import MODEL, _die_with_parent, free_port, md_table, spread, story_prompt
from squad.engine.binary import prebuilt_server_path


def _binary() -> Path:
    given = os.environ.get("SQUAD_BENCH_BINARY")
    return Path(given) if given else prebuilt_server_path()


async def _engine(threads: int, tokens: int, started: anyio.Event, results: list[dict[str, float]]) -> None:
    """Start one engine (-c 4096 -np 1 -t ``threads``), wait for ``started`` (all engines up), then time one prompt
    and one stream of ``tokens`` generated tokens; stop it."""
    port, key = free_port(), secrets.token_hex(8)
    argv = [str(_binary()), "-m", str(MODEL), "-c", "4096", "-np", "1", "--host", "127.0.0.1", "--port", str(port),
            "-t", str(threads)]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, "LLAMA_API_KEY": key}, preexec_fn=_die_with_parent())
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}",
                                     headers={"Authorization": f"Bearer {key}"}, timeout=900) as http:
            with anyio.fail_after(300):
                while True:
                    if proc.poll() is not None:
                        raise RuntimeError(f"the engine exited with {proc.returncode}")
                    try:
                        if (await http.get("/health", timeout=1.0)).status_code == 200:
                            break
                    except httpx.HTTPError:
                        pass
                    await anyio.sleep(0.05)
            mine: dict[str, float] = {}
            results.append(mine)  # one more engine up
            await started.wait()
            t0 = time.monotonic()
            long = " ".join(story_prompt(i) for i in range(60))
            body = {"messages": [{"role": "user", "content": long}], "max_tokens": tokens, "temperature": 0,
                    "ignore_eos": True, "cache_prompt": False}
            r = (await http.post("/v1/chat/completions", json=body)).raise_for_status().json()
            t = r["timings"]
            mine.update(wall_s=time.monotonic() - t0,
                               prompt_tps=t["prompt_n"] / (t["prompt_ms"] / 1000),
                               decode_tps=t["predicted_n"] / (t["predicted_ms"] / 1000))
    finally:
        proc.terminate()
        proc.wait(30)


async def once(engines: int, threads: int, tokens: int) -> dict[str, float]:
    """``engines`` engines at ``-t threads`` at once: the slowest wall time (s), the summed decode and prompt tok/s."""
    started = anyio.Event()
    results: list[dict[str, float]] = []
    async with anyio.create_task_group() as tg:
        for _ in range(engines):
            tg.start_soon(_engine, threads, tokens, started, results)
        while len(results) < engines:
            await anyio.sleep(0.05)
        started.set()
    return {"wall_s": max(r["wall_s"] for r in results), "decode_tps": sum(r["decode_tps"] for r in results),
            "prompt_tps": sum(r["prompt_tps"] for r in results)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=200, help="generated tokens per engine")
    ap.add_argument("--engines", type=int, default=2, help="engines running at once")
    ap.add_argument("--threads", default="2,1", help="comma-separated -t values to compare")
    args = ap.parse_args()
    settings = [int(t) for t in args.threads.split(",")]
    seen: dict[int, list[dict[str, float]]] = {t: [] for t in settings}
    for i in range(args.repeats):
        for t in (settings if i % 2 == 0 else settings[::-1]):
            seen[t].append(anyio.run(once, args.engines, t, args.tokens))
            print(f"repeat {i + 1}, -t {t}: {seen[t][-1]}", file=sys.stderr)
    rows = []
    base = statistics.median(r["wall_s"] for r in seen[settings[0]])
    for t in settings:
        walls = [r["wall_s"] for r in seen[t]]
        rows.append([f"{args.engines} engines x -t {t}", spread(walls),
                     spread([r["decode_tps"] for r in seen[t]], 1), spread([r["prompt_tps"] for r in seen[t]], 0),
                     f"{base / statistics.median(walls):.2f}"])
    print(f"{args.engines} engines at once on {len(os.sched_getaffinity(0))} usable cores; each: one ~1,000-token "
          f"prompt, then {args.tokens} generated tokens; {args.repeats} repeats, medians (min-max)\n")
    print(md_table(["setting", "slowest engine's wall s", "decode tok/s (sum)", "prompt tok/s (sum)",
                    f"speed-up vs -t {settings[0]}"], rows))


if __name__ == "__main__":
    main()

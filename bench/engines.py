"""The prebuilt engine (xllamacpp's wheel) against the source build (llama-server compiled here),
same model, same flags, alternating which goes first in each repeat; medians (min–max).

Per engine and repeat: load time (spawn → ``/health`` 200), peak memory (VmHWM of the engine
process), prompt tokens/s (one ~1,000-token prompt, ``cache_prompt`` off, the engine's own
``timings``), one stream's generated tokens/s (``ignore_eos``, the engine's ``timings``), and 8
streams at once on 8 slots (generated tokens of all 8 / wall time seen by the client).

    .venv/bin/python bench/engines.py [--repeats 5] [--tokens 128] [--quick]

The engines: ``SQUAD_BENCH_BINARY`` (default: squad's source build in ``~/.cache/squad``) and
the ``squad-llama-server`` command of this Python (``pip install -e '.[prebuilt]'``).
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
from _common import BINARY, MODEL, THREADS, _die_with_parent, free_port, md_table, spread, story_prompt
from squad.engine.binary import prebuilt_server_path

SLOTS = 8
CTX = 8192


def _peak_rss(pid: int) -> float:
    """Peak resident memory of ``pid`` in MiB (``VmHWM``)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def _one(http: httpx.AsyncClient, body: dict) -> dict:
    r = await http.post("/v1/chat/completions", json=body, timeout=600)
    r.raise_for_status()
    return r.json()


async def measure(path: Path, tokens: int, env: dict[str, str], prompt_items: int = 60) -> dict[str, float]:
    """Start the engine at ``path`` (extra environment ``env``) with -c CTX -np SLOTS --kv-unified;
    measure; stop it."""
    port, key = free_port(), secrets.token_hex(8)
    argv = [str(path), "-m", str(MODEL), "-c", str(CTX), "-np", str(SLOTS), "--kv-unified", "--host", "127.0.0.1",
            "--port", str(port), "-t", str(THREADS)]
    started = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, **env, "LLAMA_API_KEY": key}, preexec_fn=_die_with_parent())
    out: dict[str, float] = {}
    try:
        base = f"http://127.0.0.1:{port}"
        async with httpx.AsyncClient(base_url=base, headers={"Authorization": f"Bearer {key}"}) as http:
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"{path} exited with {proc.returncode}")
                try:
                    if (await http.get("/health", timeout=1.0)).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                await anyio.sleep(0.02)
            out["load_s"] = time.monotonic() - started
            gen = {"max_tokens": tokens, "temperature": 0, "ignore_eos": True}
            await _one(http, {"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4})  # warm-up
            long = " ".join(story_prompt(i) for i in range(prompt_items))  # ~17 tokens each
            r = await _one(http,
                           {"messages": [{"role": "user", "content": long}], "max_tokens": 1, "cache_prompt": False})
            out["prompt_n"] = r["timings"]["prompt_n"]
            out["prompt_tps"] = r["timings"]["prompt_n"] / (r["timings"]["prompt_ms"] / 1000)
            r = await _one(http, {"messages": [{"role": "user", "content": story_prompt(0)}], **gen})
            out["one_tps"] = r["timings"]["predicted_n"] / (r["timings"]["predicted_ms"] / 1000)
            done: list[int] = []
            t0 = time.monotonic()

            async def stream(i: int) -> None:
                got = await _one(http, {"messages": [{"role": "user", "content": story_prompt(i)}], **gen})
                done.append(got["usage"]["completion_tokens"])

            async with anyio.create_task_group() as tg:
                for i in range(SLOTS):
                    tg.start_soon(stream, i)
            out["eight_tps"] = sum(done) / (time.monotonic() - t0)
        out["peak_mib"] = _peak_rss(proc.pid)
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return out


ROWS = [("load_s", "load s (spawn → /health 200)", 2), ("peak_mib", "peak memory MiB (VmHWM)", 0),
        ("prompt_tps", "prompt tokens/s (one long prompt)", 0), ("one_tps", "tokens/s, one stream", 1),
        ("eight_tps", "tokens/s, 8 streams on 8 slots (all)", 1)]


async def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=128, help="generated tokens per stream (ignore_eos)")
    parser.add_argument("--quick", action="store_true", help="2 repeats, 32 tokens")
    parser.add_argument("--omp", action="store_true",
                        help="also the source build with OMP_WAIT_POLICY=passive (it spins by default; "
                             "squad-llama-server sleeps)")
    parser.add_argument("--prompt-items", type=int, default=60,
                        help="story prompts in the long prompt (~17 tokens each)")
    args = parser.parse_args(argv)
    if args.quick:
        args.repeats, args.tokens, args.prompt_items = 2, 16, 15
    prebuilt = prebuilt_server_path()
    if prebuilt is None or not BINARY.exists():
        print(f"needs both engines: source build {BINARY} ({'found' if BINARY.exists() else 'missing'}), prebuilt "
              f"{prebuilt or 'missing'}", file=sys.stderr)
        return 2
    engines = {"source build": (BINARY, {}), "prebuilt": (prebuilt, {})}
    if args.omp:
        engines["source build, OMP_WAIT_POLICY=passive"] = (BINARY, {"OMP_WAIT_POLICY": "passive"})
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in engines}
    for r in range(args.repeats):
        order = list(engines) if r % 2 == 0 else list(reversed(engines))
        for name in order:
            runs[name].append(await measure(engines[name][0], args.tokens, engines[name][1], args.prompt_items))
            print(f"repeat {r + 1} {name}: {runs[name][-1]}", file=sys.stderr, flush=True)
    print(f"### Prebuilt engine vs source build: -c {CTX} -np {SLOTS} --kv-unified -t {THREADS}, "
          f"{args.repeats} alternating repeats, {args.tokens} tokens per stream\n")
    names = list(engines)
    rows = [[label, *(spread([run[key] for run in runs[n]], digits) for n in names),
             spread([p[key] / s[key] for p, s in zip(runs["prebuilt"], runs["source build"]) if s[key]], 2)]
            for key, label, digits in ROWS]
    print(md_table(["measure", *names, "prebuilt / source build (paired)"], rows))
    print(f"\nsource build: `{BINARY}`; prebuilt: `{prebuilt}` (xllamacpp "
          f"{subprocess.run([str(prebuilt), '--version'], capture_output=True, text=True).stderr.split()[2]}); "
          f"prompt tokens per run: {statistics.median(r['prompt_n'] for r in runs['prebuilt']):.0f}. Values are "
          "median (min–max) over the repeats; the ratio is per repeat. tokens/s from the engine's own `timings` "
          "for one stream and the prompt, from the client's wall time for the 8 streams.")
    return 0


if __name__ == "__main__":
    sys.exit(anyio.run(main))

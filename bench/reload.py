"""Reload: time from plan to ready with squad's Launcher vs starting llama-server by hand.

- by hand: ``subprocess.Popen`` of the exact argv the launcher builds (same flags, same port
  choice), ready when ``/health`` answers 200;
- Launcher start: ``Launcher(plan)`` entered until ``engine.info`` is read back (health wait,
  ``/props`` + ``/v1/models`` read-back and the plan check);
- Launcher reload: ``reload(other_plan)`` on a running engine (stop + start + read-back);
- unchanged plan: ``reload(same_plan)`` must return False without touching the process.

    .venv/bin/python bench/reload.py [--quick] [--repeats 3]
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
from _common import BINARY, MODEL, THREADS, _die_with_parent, free_port, md_table


async def by_hand(argv: list[str], base_url: str) -> float:
    """Seconds from spawning ``argv`` to ``/health`` 200; the process is stopped afterwards."""
    started = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, "LLAMA_API_KEY": secrets.token_hex(8)}, preexec_fn=_die_with_parent())
    try:
        async with httpx.AsyncClient() as http:
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"llama-server exited: {' '.join(argv)}")
                try:
                    if (await http.get(base_url + "/health", timeout=1.0)).status_code == 200:
                        return time.monotonic() - started
                except httpx.HTTPError:
                    pass
                await anyio.sleep(0.01)
    finally:
        proc.terminate()
        proc.wait(10)


def stats(values: list[float]) -> list[str]:
    return [f"{1000 * statistics.median(values):.1f}", f"{1000 * min(values):.1f}", f"{1000 * max(values):.1f}"]


async def main(argv: list[str] | None = None) -> str:
    from squad.engine.launcher import Launcher, build_args
    from squad.sched.planner import EnginePlan

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one repeat")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    repeats = 1 if args.quick else args.repeats
    small = EnginePlan.simple(MODEL, slots=2, n_ctx=2048)
    big = EnginePlan.simple(MODEL, slots=4, n_ctx=4096)

    hand, start, reload_, same, same_pid = [], [], [], [], []
    commands = []
    for _ in range(repeats):
        port = free_port()
        argv_ = [str(BINARY), *build_args(small, port=port, threads=THREADS)]
        commands.append(" ".join(argv_))
        hand.append(await by_hand(argv_, f"http://127.0.0.1:{port}"))

        t0 = time.monotonic()
        async with Launcher(small, binary=BINARY, threads=THREADS) as engine:
            start.append(time.monotonic() - t0)
            t0 = time.monotonic()
            changed = await engine.reload(big)
            reload_.append(time.monotonic() - t0)
            assert changed and engine.info is not None and engine.info.slots == 4
            pid = engine.pid
            t0 = time.monotonic()
            changed = await engine.reload(EnginePlan.simple(MODEL, slots=4, n_ctx=4096))
            same.append(time.monotonic() - t0)
            same_pid.append(not changed and engine.pid == pid)
    rows = [
        ["llama-server by hand (same argv), to /health 200", *stats(hand)],
        ["Launcher start: plan → info read back", *stats(start)],
        ["Launcher reload to another plan (stop + start + read-back)", *stats(reload_)],
        ["Launcher reload with an unchanged plan", *stats(same)],
    ]
    table = md_table(["step", "median ms", "min ms", "max ms"], rows)
    text = (
        "### Reload: plan `-c 2048 -np 2 --kv-unified` (reload to `-c 4096 -np 4 --kv-unified`), "
        f"{repeats} repeat(s)\n\n"
        f"{table}\n\nUnchanged plan kept the same process (no reload) in {sum(same_pid)}/{len(same_pid)} runs.\n\n"
        f"Hand-started command: `{commands[0]}` (API key in `LLAMA_API_KEY`).\n"
    )
    print(text)
    return text


if __name__ == "__main__":
    anyio.run(main)

"""Mixed long and short calls on one small pool: how each queue policy orders them.

One hand-started ``llama-server -c 2048 -np 4 --kv-unified``. Two long calls (~700 prompt
tokens, 300 generated) ask first, then 12 short ones (~40 prompt tokens, 24 generated), all at
once, through squad's admission attached to that engine (``EngineSpec(url=..., queue=P)``) for
each policy P (fifo, backfill, program). ``ignore_eos`` makes every call generate exactly its
max_tokens, so the work is the same under every policy.

Reported per policy: makespan; the lower bound (the same 14 calls on the same 4 slots of a
second engine whose pool holds them all, ``-c 8192``: the pool is then no constraint, so no
admission order can beat it); short calls' p50/max slowdown against one short call alone;
the wait of a main-agent call (priority 0) asked while the queue is full.

    .venv/bin/python bench/mixed.py [--quick]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import MODEL, hand_engine, md_table  # noqa: E402

LONG_TEXT = " ".join(f"Line {i}: the committee reviewed the budget, the schedule and the open risks." for i in range(50))


async def _call(chat, name: str, prompt: str, max_tokens: int, priority: int = 1) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    """One call: (seconds from asking to done, seconds queued in squad)."""
    from squad.chat import ChatRequest
    from squad.events import Origin

    t0 = time.monotonic()
    result = await chat.complete(ChatRequest(origin=Origin(name, conversation=f"{name}#1"),
                                             messages=[{"role": "user", "content": prompt}], max_tokens=max_tokens,
                                             sampling={"temperature": 0, "ignore_eos": True}, priority=priority))
    del result
    return time.monotonic() - t0, 0.0


async def _workload(url: str, key: str, queue: str, n_short: int, long_tokens: int, short_tokens: int) -> dict:
    from squad.session import EngineSession, EngineSpec

    async with EngineSession(EngineSpec(url=url, api_key=key, queue=queue), None) as session:
        chat = session.chat
        short_alone = statistics.median([(await _call(chat, "probe", "Say hello to the team.", short_tokens))[0]
                                         for _ in range(3)])
        times: dict[str, float] = {}
        main_wait: list[float] = []

        async def one(name: str, prompt: str, max_tokens: int, priority: int = 1) -> None:
            times[name] = (await _call(chat, name, prompt, max_tokens, priority))[0]

        async def main_call() -> None:
            await anyio.sleep(1.0)  # asked while the queue is full
            t0 = time.monotonic()
            await _call(chat, "main", "Summarize: all good.", short_tokens, priority=0)
            main_wait.append(time.monotonic() - t0)

        t0 = time.monotonic()
        async with anyio.create_task_group() as tg:
            for i in range(2):
                tg.start_soon(one, f"long{i}", f"Summarize this report {i}:\n{LONG_TEXT}", long_tokens)
            for i in range(n_short):
                tg.start_soon(one, f"short{i}", f"Say hello to colleague number {i}.", short_tokens)
            tg.start_soon(main_call)
        makespan = time.monotonic() - t0
    shorts = [times[f"short{i}"] / short_alone for i in range(n_short)]
    return {"makespan": makespan, "short_alone": short_alone, "p50": statistics.median(shorts), "max": max(shorts),
            "main": main_wait[0] / short_alone}


async def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="6 short calls, shorter long calls")
    args = parser.parse_args(argv)
    n_short, long_tokens, short_tokens = (6, 120, 16) if args.quick else (12, 300, 24)
    rows = []
    async with hand_engine(["-m", str(MODEL), "-c", "8192", "-np", "4", "--kv-unified"]) as big:
        bound = await _workload(big.base_url, big.api_key, "fifo", n_short, long_tokens, short_tokens)
    async with hand_engine(["-m", str(MODEL), "-c", "2048", "-np", "4", "--kv-unified"]) as eng:
        for policy in ("fifo", "backfill", "program"):
            r = await _workload(eng.base_url, eng.api_key, policy, n_short, long_tokens, short_tokens)
            rows.append([policy, f"{r['makespan']:.1f}", f"{r['makespan'] / bound['makespan']:.2f}",
                         f"{r['p50']:.1f}x", f"{r['max']:.1f}x", f"{r['main']:.1f}x"])
    rows.append(["bound (-c 8192)", f"{bound['makespan']:.1f}", "1.00", f"{bound['p50']:.1f}x", f"{bound['max']:.1f}x",
                 f"{bound['main']:.1f}x"])
    table = md_table(["policy", "makespan s", "/ bound", "short p50 slowdown", "short max", "main call / alone"], rows)
    print(table)
    return table


if __name__ == "__main__":
    anyio.run(main)

"""Mixed long and short calls on one small pool: how each queue policy orders them.

One hand-started ``llama-server -c 2048 -np 4 --kv-unified``, used through squad's admission
(``EngineSpec(url=..., queue=P)``) for each policy P (fifo, backfill, program). ``ignore_eos``
makes every call generate exactly its max_tokens, so the work is the same under every policy;
each run puts a fresh nonce at the start of every prompt so no policy reuses another's KV cache.

Workloads:

- ``long+short``: 2 long calls (~700 prompt tokens, 300 generated) ask first, then 12 short ones
  (~40 prompt, 24 generated), all at once; a main-agent call (priority 0, short) is asked 1 s later.
- ``recipe``: a lead (priority 0) fans out 3 reviewers (~300 prompt, 60 generated, its
  sub-agents) and waits for them, then makes its own call (~270 prompt, 60 generated); at the same
  time another program maps 8 chunks (~450 prompt, 80 generated each).

Lower bound, derived from speeds measured on the same engine before the runs: P = prefill
tokens/s (the engine's ``timings`` of one long prompt alone), D = the best aggregate decode
tokens/s with 1..4 streams at once (4 = the slots). No order can beat the work done at those
rates, nor a chain of calls that must run one after another, each at least as long as alone:

    bound = max(sum(prompt tokens) / P + sum(generated tokens) / D, longest chain of calls alone)

(the pool limit is ignored, so the bound is optimistic: it may not be reachable).

    .venv/bin/python bench/mixed.py [--quick]
"""

from __future__ import annotations

import argparse
import os
import secrets
import statistics
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import anyio
import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import MODEL, hand_engine, md_table

if TYPE_CHECKING:
    from squad.chat import ChatEngine

LINE = "Line {i}: the committee reviewed the budget, the schedule and the open risks."
LONG_TEXT = " ".join(LINE.format(i=i) for i in range(50))  # ~700 tokens
MID_TEXT = " ".join(LINE.format(i=i) for i in range(20))  # ~300 tokens
CHUNK_TEXT = " ".join(LINE.format(i=i) for i in range(30))  # ~450 tokens
POLICIES = ("fifo", "backfill", "program")


class Run:
    """One workload under one policy: every call's (seconds from asking to done, prompt and
    generated tokens)."""

    def __init__(self, chat: ChatEngine, nonce: str) -> None:
        self.chat, self.nonce = chat, nonce
        self.times: dict[str, float] = {}
        self.prompt = self.generated = 0

    async def call(self, name: str, text: str, max_tokens: int, priority: int = 1, parent: str | None = None,
                   conversation: str | None = None) -> float:
        from squad.chat import ChatRequest
        from squad.events import Origin

        t0 = time.monotonic()
        result = await self.chat.complete(ChatRequest(
            origin=Origin(name, conversation=conversation or f"{name}#1", parent=parent),
            messages=[{"role": "user", "content": f"[{self.nonce} {name}] {text}"}], max_tokens=max_tokens,
            sampling={"temperature": 0, "ignore_eos": True}, priority=priority))
        elapsed = time.monotonic() - t0
        self.times[name] = elapsed
        if result.usage is not None:
            self.prompt += result.usage.prompt_tokens
            self.generated += result.usage.completion_tokens
        return elapsed


async def _speeds(url: str, key: str) -> dict[str, float]:
    """P (prefill tokens/s of one long prompt alone) and D (best aggregate decode tokens/s, 1..4
    streams), from the engine's own ``timings``."""
    headers = {"Authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=300) as http:
        async def one(text: str, n: int) -> dict:
            body = {"messages": [{"role": "user", "content": f"[{secrets.token_hex(4)}] {text}"}], "max_tokens": n,
                    "temperature": 0, "ignore_eos": True}
            r = await http.post("/v1/chat/completions", json=body)
            r.raise_for_status()
            return r.json()["timings"]

        prefill = [await one(f"Summarize this report:\n{LONG_TEXT}", 1) for _ in range(2)]
        p = max(t["prompt_n"] / t["prompt_ms"] * 1000 for t in prefill)
        decode: dict[int, float] = {}
        for streams in (1, 2, 3, 4):
            got: list[dict] = []

            async def stream(into: list[dict]) -> None:
                into.append(await one("Say hello to the team.", 96))

            async with anyio.create_task_group() as tg:
                for _ in range(streams):
                    tg.start_soon(stream, got)
            decode[streams] = sum(t["predicted_n"] for t in got) / (max(t["predicted_ms"] for t in got) / 1000)
    return {"P": p, **{f"D{b}": v for b, v in decode.items()}, "D": max(decode.values())}


def _bound(run: Run, speeds: dict[str, float], chain_s: float) -> float:
    return max(run.prompt / speeds["P"] + run.generated / speeds["D"], chain_s)


async def _long_short(url: str, key: str, queue: str, n_short: int, long_tokens: int, short_tokens: int,
                      with_long: bool = True) -> tuple[Run, float, dict]:
    from squad.engine.session import EngineSession, EngineSpec

    async with EngineSession(EngineSpec(url=url, api_key=key, queue=queue), None) as session:
        probe = Run(session.chat, secrets.token_hex(4))
        alone = {"short": statistics.median([await probe.call(f"probe{i}", "Say hello to the team.", short_tokens)
                                             for i in range(3)]),
                 "long": await probe.call("probe-long", f"Summarize this report:\n{LONG_TEXT}", long_tokens)}
        run = Run(session.chat, secrets.token_hex(4))

        async def main_call() -> None:
            await anyio.sleep(1.0)  # asked while the queue is full
            await run.call("main", "Summarize: all good.", short_tokens, priority=0)

        t0 = time.monotonic()
        async with anyio.create_task_group() as tg:
            if with_long:
                for i in range(2):
                    tg.start_soon(run.call, f"long{i}", f"Summarize this report {i}:\n{LONG_TEXT}", long_tokens)
            for i in range(n_short):
                tg.start_soon(run.call, f"short{i}", f"Say hello to colleague number {i}.", short_tokens)
            tg.start_soon(main_call)
        makespan = time.monotonic() - t0
    return run, makespan, alone


async def _recipe(url: str, key: str, queue: str, n_chunks: int, gen: int) -> tuple[Run, float, dict]:
    from squad.engine.session import EngineSession, EngineSpec

    async with EngineSession(EngineSpec(url=url, api_key=key, queue=queue), None) as session:
        probe = Run(session.chat, secrets.token_hex(4))
        alone = {"reviewer": await probe.call("p-rev", f"Review:\n{MID_TEXT}", gen),
                 "lead": await probe.call("p-lead", f"Decide:\n{MID_TEXT[:1400]}", gen, priority=0)}
        alone["lead_program"] = alone["reviewer"] + alone["lead"]
        run = Run(session.chat, secrets.token_hex(4))
        lead_done: list[float] = []

        async def lead(t0: float) -> None:
            async with anyio.create_task_group() as fan:
                for i in range(3):
                    fan.start_soon(lambda i=i: run.call(f"rev{i}", f"Review part {i}:\n{MID_TEXT}", gen,
                                                        parent="lead#1"))
            await run.call("lead", f"Decide:\n{MID_TEXT[:1400]}", gen, priority=0, conversation="lead#1")
            lead_done.append(time.monotonic() - t0)

        t0 = time.monotonic()
        async with anyio.create_task_group() as tg:
            tg.start_soon(lead, t0)
            for i in range(n_chunks):
                tg.start_soon(lambda i=i: run.call(f"chunk{i}", f"Summarize chunk {i}:\n{CHUNK_TEXT}", gen + 20,
                                                   parent="map#1"))
        makespan = time.monotonic() - t0
    alone["lead_wall"] = lead_done[0]
    return run, makespan, alone


def _load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f} / {five:.2f} / {fifteen:.2f}"


async def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="6 short calls, shorter long calls, 4 chunks")
    parser.add_argument("--batch", type=int, default=None, metavar="N",
                        help="the engine's -b and -ub (tokens per step; a prompt longer than N is prefilled in "
                             "pieces between other slots' decode steps); default: llama-server's own (2048 / 512)")
    parser.add_argument("--policies", default=",".join(POLICIES), help=f"comma-separated, of {', '.join(POLICIES)}")
    args = parser.parse_args(argv)
    policies = [p for p in args.policies.split(",") if p]
    if unknown := set(policies) - set(POLICIES):
        parser.error(f"unknown policies {sorted(unknown)}; choose from {', '.join(POLICIES)}")
    batch = ["-b", str(args.batch), "-ub", str(args.batch)] if args.batch else []
    n_short, long_tokens, short_tokens, n_chunks = (6, 120, 16, 4) if args.quick else (12, 300, 24, 8)
    out: list[str] = [f"load average (1/5/15 min) at start: {_load()}",
                      f"engine: -c 2048 -np 4 --kv-unified {' '.join(batch)}".rstrip()]
    async with hand_engine(["-m", str(MODEL), "-c", "2048", "-np", "4", "--kv-unified", *batch]) as eng:
        speeds = await _speeds(eng.base_url, eng.api_key)
        print(f"speeds {speeds}", file=sys.stderr, flush=True)
        out.append("speeds: P = {P:.0f} prefill tok/s; decode aggregate D1..D4 = {D1:.0f} / {D2:.0f} / {D3:.0f} / "
                   "{D4:.0f} tok/s".format(**speeds))
        rows = []
        for policy in policies:
            run, makespan, alone = await _long_short(eng.base_url, eng.api_key, policy, n_short, long_tokens,
                                                     short_tokens)
            bound = _bound(run, speeds, alone["long"])
            shorts = [run.times[f"short{i}"] / alone["short"] for i in range(n_short)]
            rows.append([policy, f"{makespan:.1f}", f"{bound:.1f}", f"{makespan / bound:.2f}",
                         f"{statistics.median(shorts):.1f}x", f"{max(shorts):.1f}x",
                         f"{run.times['main'] / alone['short']:.1f}x",
                         f"{alone['short']:.2f} / {alone['long']:.1f}"])
            print("long+short", rows[-1], f"load {_load()}", file=sys.stderr, flush=True)
        run, makespan, alone = await _long_short(eng.base_url, eng.api_key, "fifo", n_short, long_tokens,
                                                 short_tokens, with_long=False)
        shorts = [run.times[f"short{i}"] / alone["short"] for i in range(n_short)]
        rows.append(["(no long calls, fifo)", f"{makespan:.1f}", "", "", f"{statistics.median(shorts):.1f}x",
                     f"{max(shorts):.1f}x", f"{run.times['main'] / alone['short']:.1f}x", f"{alone['short']:.2f}"])
        out.append(md_table(["long+short", "makespan s", "bound s", "/ bound", "short p50 slowdown", "short max",
                             "main call / alone", "alone s (short / long)"], rows))
        rows = []
        for policy in policies:
            run, makespan, alone = await _recipe(eng.base_url, eng.api_key, policy, n_chunks, 60)
            bound = _bound(run, speeds, alone["lead_program"])
            rows.append([policy, f"{makespan:.1f}", f"{bound:.1f}", f"{makespan / bound:.2f}",
                         f"{alone['lead_wall']:.1f}", f"{alone['lead_wall'] / alone['lead_program']:.1f}x",
                         f"{run.times['lead'] / alone['lead']:.1f}x"])
            print("recipe", rows[-1], f"load {_load()}", file=sys.stderr, flush=True)
        out.append(md_table(["recipe", "makespan s", "bound s", "/ bound", "lead program s",
                             "lead program / alone", "lead's own call / alone"], rows))
    out.append(f"load average at end: {_load()}")
    text = "\n\n".join(out)
    print(text)
    return text


if __name__ == "__main__":
    anyio.run(main)

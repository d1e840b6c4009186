"""The engine's prompt cache across tool rounds, turns and fan-outs (issue 29), engine-counted.

Every number is the engine's own: prompt tokens it processed (``llamacpp:prompt_tokens_total`` from
``/metrics``, before and after), against the ideal (every token of each conversation's last prompt
processed once: each round or turn adds only its new tokens).

- **tool loops**: 4 agents at once, each a 5-round tool loop (rounds 0-4 ``tool_choice: required``
  then the answer), through squad's client (admission, pinning, deadlines) on 4 and on 2 slots; the
  answer round sent the way squad sends it now (the same tools, ``tool_choice: none``) and the way it
  did before issue 29 (tools dropped). Target: squad's way ≤ 1.15× the ideal.
- **fan-outs**: one reviewer given 3 prompts of which 2 begin with the same file (2 of 3), a common
  part under the sharing threshold, and 3 reviewers given the file as a declared ``shared`` context;
  ``shared_input`` prefix (default) vs off.
- **serve**: 4 conversations × 8 turns through ``squad serve`` on ``-np 2`` and a pool that cannot hold
  all 4 (the engine's ``--cache-ram`` parks the others). Target ≤ 1.3× the ideal.

    SQUAD_BENCH_BINARY=.venv/bin/squad-llama-server .venv/bin/python bench/cache.py [--parts loops4,loops2,fanout,serve]
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Any

import anyio
import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import BINARY, MODEL, THREADS, md_table
from shared_input import python_source
from squad.chat import ChatRequest
from squad.engine.session import EngineSpec
from squad.events import CallFinished, Event, Origin, ShareSkipped
from squad.runtime.agent import Agent
from squad.runtime.squad import Squad
from squad.runtime.tools import arguments_for_history, tool

SAMPLING = {"temperature": 0.0, "seed": 1}


def processed(metrics: str) -> float:
    found = re.search(r"^llamacpp:prompt_tokens_total\s+(\S+)", metrics, re.MULTILINE)
    return float(found.group(1)) if found else float("nan")


async def engine_total(squad: Squad) -> float:
    headers = {"Authorization": f"Bearer {squad.info.api_key}"} if squad.info.api_key else {}
    async with httpx.AsyncClient(base_url=squad.info.base_url, headers=headers, timeout=30) as http:
        return processed((await http.get("/metrics")).text)


@tool
def lookup(topic: str) -> str:
    """Look a topic up in the team's notes."""
    return f"Notes on {topic}: handled in module alpha, function beta_{len(topic)}, limit {len(topic) % 7 + 2}."


TOOLS = [lookup.spec()]
QUESTIONS = ["Where is rate limiting handled?", "Who owns the billing cache?", "How are retries bounded?",
             "Where are sessions stored?"]


async def loop(squad: Squad, i: int, *, rounds: int, keep_tools: bool) -> int:
    """One agent's tool loop through squad's client; returns its last prompt's tokens."""
    system = "You answer from the team's notes. Call lookup for every part of the question."
    convo: list[dict[str, Any]] = [{"role": "system", "content": system}, {"role": "user", "content": QUESTIONS[i]}]
    origin = Origin(f"agent{i}", f"agent{i}#1")
    last = 0
    for r in range(rounds + 1):
        answer = r == rounds
        tools = TOOLS if (keep_tools or not answer) else None
        choice = ("none" if answer else "required") if tools else None
        reply = await squad.chat.complete(ChatRequest(origin=origin, messages=list(convo), max_tokens=48,
                                                      tools=tools, tool_choice=choice, sampling=SAMPLING))
        last = reply.usage.prompt_tokens if reply.usage else 0
        if answer or not reply.tool_calls:
            break
        c = reply.tool_calls[0]
        convo += [{"role": "assistant", "content": None, "tool_calls": [
            {"id": c.id, "type": "function", "function": {"name": c.name,
                                                          "arguments": arguments_for_history(c.arguments)}}]},
            {"role": "tool", "tool_call_id": c.id, "content": lookup.fn(topic=QUESTIONS[i][:20])}]
    return last


async def tool_loops(slots: int) -> list[list[object]]:
    rows = []
    for keep in (True, False):
        spec = EngineSpec(model=MODEL, binary=BINARY, threads=THREADS, slots=slots, ctx=8192)
        async with Squad([Agent(name=f"agent{i}", max_tokens=32) for i in range(4)], engine=spec) as squad:
            before = await engine_total(squad)
            lasts: list[int] = [0] * 4

            async def one(i: int, lasts: list[int] = lasts, keep: bool = keep) -> None:
                lasts[i] = await loop(squad, i, rounds=5, keep_tools=keep)

            async with anyio.create_task_group() as tg:
                for i in range(4):
                    tg.start_soon(one, i)
            done = await engine_total(squad) - before
        ideal = sum(lasts)
        rows.append([f"{slots} slots", "same tools, tool_choice none (now)" if keep else "tools dropped (before)",
                     f"{done:,.0f}", f"{ideal:,}", f"{done / ideal:.2f}x"])
    return rows


async def fanouts(mode: str) -> list[list[object]]:
    """The fan-out cases with ``shared_input`` ``mode``, on a fresh engine (the cache warmed by one
    mode must not serve the other): per case the prompt tokens, the engine-processed ones and the
    engine-counted ``shared_tokens``."""
    rows: list[list[object]] = []
    file = python_source(200)
    other = python_source(60, seed=3)
    spec = EngineSpec(model=MODEL, binary=BINARY, threads=THREADS, slots=3, ctx=12288)
    agents = [Agent(name=n, instructions=f"You review Python code for {n}. One short sentence.", max_tokens=16,
                    sampling=SAMPLING) for n in ("security", "style", "tests")]
    cases: list[tuple[str, list[tuple[str, str]], str | None]] = [
        ("2 of 3 begin with the same file", [("security", "Review:\n" + file + "\nFocus on input checks."),
                                             ("security", "Summarize:\n" + other),
                                             ("security", "Review:\n" + file + "\nFocus on errors.")], None),
        ("a common part of 300 characters", [("security", file[:300] + "\nA"), ("security", file[:300] + "\nB"),
                                             ("security", file[:300] + "\nC")], None),
        ("3 reviewers, the file declared shared", [(n, "Review the code above.") for n in ("security", "style",
                                                                                           "tests")], file),
    ]
    seen: list[Event] = []
    async with Squad(agents, engine=spec, on_event=seen.append, shared_input=mode) as squad:
        for name, calls, shared in cases:
            seen.clear()
            before = await engine_total(squad)
            results = await squad.parallel(calls, check=True, shared=shared)
            done = await engine_total(squad) - before
            rows.append([name, mode, f"{sum(r.usage.prompt_tokens for r in results):,}", f"{done:,.0f}",
                         f"{sum(e.shared_tokens for e in seen if isinstance(e, CallFinished)):,}",
                         len([e for e in seen if isinstance(e, ShareSkipped)])])
    return rows


async def serve_turns(turns: int = 8) -> list[list[object]]:
    import openai

    from serve import KEY, ServeProcess

    serve = await anyio.to_thread.run_sync(lambda: ServeProcess("-c", "2048", "-np", "2", "-t", str(THREADS),
                                                                "--llama-server", str(BINARY), "-m", str(MODEL)))
    try:
        import psutil

        status = httpx.get(serve.url + "/squad/status", headers={"Authorization": f"Bearer {KEY}"}).json()
        url = status["engine"]["url"]
        # the prebuilt engine runs as python: find it by its command line
        (child,) = [c for c in psutil.Process(serve.pid).children(recursive=True)
                    if any("llama-server" in part for part in c.cmdline()) and "--port" in c.cmdline()]
        key = child.environ().get("LLAMA_API_KEY", "none")
        async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=30) as http:
            before = processed((await http.get("/metrics")).text)
            lasts = [0] * 4
            async with openai.AsyncOpenAI(base_url=serve.url + "/v1", api_key=KEY, max_retries=0,
                                          timeout=900) as client:
                async def conversation(i: int) -> None:
                    messages = [{"role": "system", "content": "You are a helpful assistant. Answer in two sentences."}]
                    for t in range(turns):
                        messages.append({"role": "user", "content": f"Tell me one more fact about {QUESTIONS[i]} "
                                                                    f"(turn {t + 1})."})
                        r = await client.chat.completions.create(model="default", messages=messages, max_tokens=24,
                                                                 temperature=0, seed=1)
                        lasts[i] = r.usage.prompt_tokens if r.usage else 0
                        messages.append({"role": "assistant", "content": r.choices[0].message.content or ""})

                async with anyio.create_task_group() as tg:
                    for i in range(4):
                        tg.start_soon(conversation, i)
            done = processed((await http.get("/metrics")).text) - before
        ideal = sum(lasts)
        return [[f"4 conversations x {turns} turns, -np 2 -c 2048", f"{done:,.0f}", f"{ideal:,}",
                 f"{done / ideal:.2f}x"]]
    finally:
        await anyio.to_thread.run_sync(serve.stop)


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--parts", default="loops4,loops2,fanout,serve",
                    help="any of loops4, loops2, fanout (or fanout-off, fanout-prefix), serve")
    parts = ap.parse_args().parts.split(",")
    for part in parts:  # each table printed as soon as its part ends
        if part.startswith("loops"):
            rows = await tool_loops(int(part[5:]))
            print(f"### Tool loops: 4 agents x 5 rounds, {part[5:]} slots (engine-processed prompt tokens vs ideal)\n\n"
                  + md_table(["engine", "answer round", "processed", "ideal", "ratio"], rows), flush=True)
        elif part.startswith("fanout"):
            modes = [part.split("-")[1]] if "-" in part else ["off", "prefix"]
            rows = [row for mode in modes for row in await fanouts(mode)]
            print("### Fan-outs: shared_input off vs prefix (default), each on a fresh engine\n\n"
                  + md_table(["case", "shared_input", "prompt tokens", "engine-processed", "shared (engine cache_n)",
                              "share.skipped"], rows), flush=True)
        elif part == "serve":
            print("### Multi-turn through squad serve\n\n"
                  + md_table(["case", "processed", "ideal", "ratio"], await serve_turns()), flush=True)


if __name__ == "__main__":
    anyio.run(main)

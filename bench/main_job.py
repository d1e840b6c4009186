"""The main job, side by side: ``squad run recipes/review.yaml -p code=@FILE`` on a real source file of hundreds of
lines, with prefix sharing on (``shared_input: prefix``, the default) and off, and (``--baseline``) the same job
written the way users write it today: the openai SDK with ``asyncio.gather`` against llama-server started with its
own defaults (only ``-m``, and ``--metrics`` to read its counts).

Each way runs on its own fresh engine (squad's: the recipe's own plan, launched as ``squad run`` launches it, so the
sharing way has its ``--slot-save-path``), the file from the packages installed on this machine (default: the
standard library's ``textwrap.py``, 491 lines), the recipe as shipped (its temperatures; no seed, so the answers are
not compared). Reported per way, from the engine's own counts: prompt tokens the engine processed
(``llamacpp:prompt_tokens_total`` from ``/metrics``, before and after; it includes a shared prefix's one-time prefill),
the prompt tokens of the calls (``usage``), wall seconds, calls and failures; and the invariant a speed-up keeps (I2):

- every chat request squad sent (captured at its transport, ``LlamaServerTransport._body``) carries exactly the
  messages the recipe asks: the agent's instructions as the system message and the step's prompt rendered from the
  recipe (``Recipe.render_prompt`` with that item, index and chunk count; the lead's from that run's outputs), byte
  for byte, no tool definitions; and
- the reviewers' requests with sharing on are byte-identical to those with sharing off (the lead's differ only
  through the reviewers' answers, which are sampled).

    .venv/bin/python bench/main_job.py                       # textwrap.py, sharing on and off
    .venv/bin/python bench/main_job.py --baseline            # and the openai SDK + asyncio.gather way
    .venv/bin/python bench/main_job.py --file PATH           # another real file
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import sysconfig
import time
from pathlib import Path
from typing import Any

import httpx

from _common import BINARY, DEFAULTS_ARGS, MODEL, THREADS, defaults_label, hand_engine, machine_info, md_table

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "recipes" / "review.yaml"
WAYS = ("off", "prefix")


def processed(metrics: str) -> float:
    found = re.search(r"^llamacpp:prompt_tokens_total\s+(\S+)", metrics, re.MULTILINE)
    return float(found.group(1)) if found else float("nan")


async def engine_processed(base_url: str, api_key: str | None) -> float:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    async with httpx.AsyncClient(base_url=base_url, headers=headers, timeout=60) as http:
        return processed((await http.get("/metrics")).text)


def load(code: str, way: str) -> Any:
    from squad.recipes import load_recipe

    recipe = load_recipe(RECIPE, params={"code": code}, model=str(MODEL))
    recipe.shared_input = way
    return recipe


def expected_messages(recipe: Any, steps: dict[str, Any]) -> list[tuple[str, str]]:
    """``(system, user)`` of every call the recipe asks for, rendered from the recipe itself: each reviewer's map
    items (its chunks), then the lead's merge from that run's step outputs."""
    variables = {"params": recipe.params}
    out: list[tuple[str, str]] = []
    for top in recipe.flow:
        for step in (top.steps if top.kind == "parallel" else [top]):
            system = recipe.agents[step.agent or recipe.main].system_prompt([], variables)
            if step.kind == "map":
                items = recipe.items(step, steps)
                extra = {"chunks": len(items)} if step.split == "chunks" else {}
                out += [(system, recipe.render_prompt(step, steps, item=item, index=i, capped=False, **extra))
                        for i, item in enumerate(items)]
            else:
                out.append((system, recipe.render_prompt(step, steps, capped=False)))
    return out


def as_pair(body: dict[str, Any]) -> tuple[str, str]:
    messages = body["messages"]
    assert [m["role"] for m in messages] == ["system", "user"], [m["role"] for m in messages]
    return messages[0]["content"], messages[1]["content"]


async def squad_way(code: str, way: str) -> dict[str, Any]:
    """The recipe run as ``squad run`` runs it (its own plan, a launched engine), with ``shared_input: way``."""
    from squad.chat.transport import LlamaServerTransport
    from squad.engine.launcher import Launcher
    from squad.engine.session import plan_engine
    from squad.recipes.run import run_recipe

    recipe = load(code, way)
    plan = plan_engine(recipe.engine_spec().but(binary=BINARY, threads=THREADS), recipe.workload())
    bodies: list[dict[str, Any]] = []
    build = LlamaServerTransport._body

    def spy(self: Any, call: Any) -> dict[str, Any]:
        body = build(self, call)
        bodies.append(body)
        return body

    LlamaServerTransport._body = spy  # type: ignore[method-assign]
    try:
        async with Launcher(plan, binary=BINARY, threads=THREADS) as launched:
            info = launched.info
            assert info is not None
            before = await engine_processed(info.base_url, info.api_key)
            start = time.monotonic()
            run = await run_recipe(recipe, engine=info)
            wall = time.monotonic() - start
            await asyncio.sleep(0.2)
            after = await engine_processed(info.base_url, info.api_key)
    finally:
        LlamaServerTransport._body = build  # type: ignore[method-assign]
    sent = [as_pair(b) for b in bodies]
    asked = expected_messages(recipe, run.steps)
    results = [r for _, r in run.results]
    return {
        "way": f"squad, shared_input: {way}" + (" (default)" if way == "prefix" else ""),
        "engine": f"squad's plan: {plan.slots} slots, ctx {plan.n_ctx}",
        "processed": after - before, "prompt_tokens": sum(r.usage.prompt_tokens for r in results if r.usage),
        "wall": wall, "calls": len(bodies), "failures": len(run.errors),
        "as_asked": sorted(sent) == sorted(asked) and not any("tools" in b for b in bodies),
        "sent": sent, "asked": asked, "reviewers": sorted(p for p in sent if not p[1].startswith("Security notes:")),
    }


async def baseline_way(code: str) -> dict[str, Any]:
    """The job as users write it today: the recipe's prompts sent with the openai SDK, the three reviewers at once
    (``asyncio.gather``), then the lead, against llama-server with its own defaults. No chunking, no admission: a
    file too long for the engine's per-slot context fails, as it does for them."""
    from openai import AsyncOpenAI

    recipe = load(code, "off")
    variables = {"params": recipe.params}
    review = recipe.flow[0]
    async with hand_engine([*DEFAULTS_ARGS, "--metrics"]) as eng:  # --metrics: only to read its counts
        client = AsyncOpenAI(base_url=eng.base_url + "/v1", api_key=eng.api_key, max_retries=0, timeout=3600)
        before = await engine_processed(eng.base_url, eng.api_key)
        start = time.monotonic()
        failures, prompt_tokens = 0, 0

        async def ask(agent_name: str, prompt: str) -> str:
            nonlocal failures, prompt_tokens
            agent = recipe.agents[agent_name]
            try:
                answer = await client.chat.completions.create(
                    model="default", max_tokens=agent.max_tokens,
                    messages=[{"role": "system", "content": agent.system_prompt([], variables)},
                              {"role": "user", "content": prompt}],
                    extra_body=agent.sampling.as_params() if agent.sampling else None)
            except Exception as exc:  # noqa: BLE001 - a failure is what is counted
                failures += 1
                print(f"baseline: {agent_name} failed: {str(exc)[:200]}", file=sys.stderr, flush=True)
                return ""
            prompt_tokens += answer.usage.prompt_tokens if answer.usage else 0
            return answer.choices[0].message.content or ""

        notes = await asyncio.gather(*(ask(step.agent, recipe.render_prompt(step, {}, item=code, index=0,
                                                                              capped=False, chunks=1))
                                       for step in review.steps))
        outputs = {step.id: {"output": text, "outputs": [text]} for step, text in zip(review.steps, notes)}
        await ask(recipe.main, recipe.render_prompt(recipe.flow[1], outputs, capped=False))
        wall = time.monotonic() - start
        await asyncio.sleep(0.2)
        after = await engine_processed(eng.base_url, eng.api_key)
        label = defaults_label(eng)
    return {"way": "openai SDK + asyncio.gather", "engine": label, "processed": after - before,
            "prompt_tokens": prompt_tokens, "wall": wall, "calls": 4, "failures": failures, "as_asked": None}


def default_file() -> Path:
    return Path(sysconfig.get_paths()["stdlib"]) / "textwrap.py"


async def main(argv: list[str]) -> str:
    ap = argparse.ArgumentParser()
    ap.add_argument("--file", type=Path, default=None, help="a real source file (default: the stdlib's textwrap.py)")
    ap.add_argument("--baseline", action="store_true", help="add the openai SDK + asyncio.gather way")
    args = ap.parse_args(argv)
    path = args.file or default_file()
    code = path.read_text(encoding="utf-8")
    rows: list[dict[str, Any]] = []
    for way in WAYS:
        rows.append(await squad_way(code, way))
        print(json.dumps({k: v for k, v in rows[-1].items() if k not in ("sent", "asked", "reviewers")}),
              file=sys.stderr, flush=True)
    if args.baseline:
        rows.append(await baseline_way(code))
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    off, on = rows[0], rows[1]
    table = md_table(
        ["way", "engine", "engine-processed prompt tokens", "prompt tokens of the calls", "wall s", "calls",
         "failures", "prompts as the recipe asks"],
        [[r["way"], r["engine"], f"{r['processed']:,.0f}", f"{r['prompt_tokens']:,}", f"{r['wall']:.1f}",
          r["calls"], r["failures"], {True: "yes, byte for byte", False: "NO", None: "(its own)"}[r["as_asked"]]]
         for r in rows])
    same = on["reviewers"] == off["reviewers"]
    lines = [f"file: {path} ({len(code.splitlines())} lines); model {MODEL.name}; engine {BINARY}", "", table, "",
             f"sharing on / off: engine-processed {on['processed'] / off['processed']:.2f}x, "
             f"wall {on['wall'] / off['wall']:.2f}x",
             f"reviewers' requests byte-identical with sharing on and off: {'yes' if same else 'NO'} "
             f"({len(on['reviewers'])} requests)"]
    if len(rows) > 2:
        base = rows[2]
        lines.append(f"squad default / openai SDK + gather: wall {on['wall'] / base['wall']:.2f}x, "
                     f"engine-processed {on['processed'] / base['processed']:.2f}x" if base["processed"] else "")
    for r in rows[:2]:
        if not r["as_asked"]:
            missing = [p for p in r["asked"] if p not in r["sent"]]
            extra = [p for p in r["sent"] if p not in r["asked"]]
            lines.append(f"{r['way']}: {len(missing)} asked not sent, {len(extra)} sent not asked: "
                         + json.dumps([p[1][:120] for p in (missing + extra)[:4]], ensure_ascii=False))
    lines.append("machine: " + json.dumps(machine_info()))
    return "\n".join(lines)


if __name__ == "__main__":
    print(asyncio.run(main(sys.argv[1:])))

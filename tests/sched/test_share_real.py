"""Shared input prefilled once (squad.sched.share) on the REAL engine: three reviewers given the same
file make llama-server process the file's tokens once (its own ``/metrics`` counter, not
squad's), and their greedy answers equal those of the same prompts sent one at a time with the
engine's prompt cache off."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest

from launch_support import THREADS
from squad.engine.session import EngineSpec
from squad.events import CallAdmitted, Event
from squad.runtime.agent import Agent
from squad.runtime.squad import Squad
from squad.sched.share import arrange

pytestmark = [pytest.mark.engine, pytest.mark.anyio]

SAMPLING = {"temperature": 0.0, "seed": 1}
REVIEWERS = ["security", "style", "tests"]


def source(lines: int) -> str:
    """Deterministic Python-looking source of ``lines`` lines."""
    out: list[str] = []
    i = 0
    while len(out) < lines:
        out += [f"def handler_{i}(request, limit={i % 7 + 1}):",
                f'    """Handle request kind {i} within a limit."""',
                f"    items = [x * {i % 5 + 2} for x in request.values if x > {i % 3}]",
                "    if len(items) > limit:",
                f"        raise ValueError('too many items for handler {i}')",
                "    return sum(items)", ""]
        i += 1
    return "\n".join(out[:lines])


def prompt_tokens_total(metrics: str) -> float:
    found = re.search(r"^llamacpp:prompt_tokens_total\s+(\S+)", metrics, re.MULTILINE)
    assert found, "no llamacpp:prompt_tokens_total in /metrics"
    return float(found.group(1))


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def test_shared_file_is_processed_once_and_answers_are_unchanged(
    llama_server_path: Path, default_model_path: Path
) -> None:
    """One engine for both checks (K = 3): processed prompt tokens, then answers one at a time."""
    agents = [Agent(name=n, instructions=f"You review Python code for {n}. Answer in one short sentence.",
                    budget=2048, max_tokens=8, sampling=SAMPLING) for n in REVIEWERS]
    seen: list[Event] = []
    async with Squad(agents, engine=EngineSpec(model=default_model_path, binary=llama_server_path, threads=THREADS,
                                               slots=3), on_event=seen.append) as squad:
        await processed_once(squad, seen)
        await answers_unchanged(squad)


async def processed_once(squad: Squad, seen: list[Event]) -> None:
    assert squad.info.slot_save_dir, "squad's launcher gives the engine a slot save directory"
    prompt = "Review this file:\n\n" + source(90)
    headers = {"Authorization": f"Bearer {squad.info.api_key}"} if squad.info.api_key else {}
    async with httpx.AsyncClient(base_url=squad.info.base_url, headers=headers, timeout=30) as http:
        before = prompt_tokens_total((await http.get("/metrics")).text)
        results = await squad.parallel([(n, prompt) for n in REVIEWERS], check=True)
        after = prompt_tokens_total((await http.get("/metrics")).text)
    one = max(r.usage.prompt_tokens for r in results)
    processed = after - before
    shared = [e.shared_tokens for e in seen if isinstance(e, CallAdmitted)]
    assert len(shared) == 3 and min(shared) > 500, shared
    # the file once, then each reviewer's own instructions (3 x ~20 tokens)
    assert processed <= 1.2 * one, (processed, one)
    assert not list(Path(squad.info.slot_save_dir).glob("squad-share-*.bin")), "the slot file is deleted"


async def answers_unchanged(squad: Squad) -> None:
    prompt = "Review this file:\n\n" + source(60)
    shared = await squad.parallel([(n, prompt) for n in REVIEWERS], check=True, max_concurrency=1)
    arrangement = arrange([prompt] * len(REVIEWERS))
    assert arrangement is not None
    headers = {"Authorization": f"Bearer {squad.info.api_key}"} if squad.info.api_key else {}
    plain = []
    async with httpx.AsyncClient(base_url=squad.info.base_url, headers=headers, timeout=120) as http:
        for name in REVIEWERS:  # one at a time: concurrent batches change greedy answers
            system = arrangement.system(squad.agents[name].system_prompt([], {}))
            r = await http.post("/v1/chat/completions", json={
                "messages": [{"role": "system", "content": system},
                             {"role": "user", "content": arrangement.prompt(prompt)}],
                "max_tokens": 8, "cache_prompt": False, **SAMPLING})
            r.raise_for_status()
            plain.append(r.json()["choices"][0]["message"]["content"])
    assert [r.output for r in shared] == plain


RECIPE = """\
name: chunked-review
params:
  code: {type: string}
agents:
  lead: {instructions: "Merge the notes.", max_tokens: 8, sampling: {temperature: 0.0, seed: 1}}
  security: {instructions: "You review code for security. One short line.", max_tokens: 8,
             sampling: {temperature: 0.0, seed: 1}}
  style: {instructions: "You review code for style. One short line.", max_tokens: 8,
          sampling: {temperature: 0.0, seed: 1}}
main: lead
flow:
  - id: reviews
    parallel:
      - {id: security, agent: security, map: params.code, split: chunks, chunk_tokens: 700, concurrency: 1,
         prompt: "Review this code (part {{ index + 1 }} of {{ chunks }}):\\n{{ item }}"}
      - {id: style, agent: style, map: params.code, split: chunks, chunk_tokens: 700, concurrency: 1,
         prompt: "Review this code (part {{ index + 1 }} of {{ chunks }}):\\n{{ item }}"}
"""


async def test_map_steps_of_a_parallel_block_share_each_chunk(
    tmp_path: Path, llama_server_path: Path, default_model_path: Path
) -> None:
    """The review recipe's shape: two reviewers map over the same chunks, one at a time each;
    each chunk is prefilled once for both (their call.admitted events say how much)."""
    from squad.recipes import load_recipe
    from squad.recipes.run import run_recipe

    (tmp_path / "r.yaml").write_text(RECIPE)
    recipe = load_recipe(tmp_path / "r.yaml", {"code": source(150)}, model=str(default_model_path))
    chunks = recipe.items(recipe.steps_by_id()["security"], {})
    assert len(chunks) >= 2
    seen: list[Event] = []
    run = await run_recipe(recipe, on_event=seen.append,
                           engine=recipe.engine_spec().but(binary=llama_server_path, threads=THREADS))
    assert not run.errors
    shared = [e.shared_tokens for e in seen if isinstance(e, CallAdmitted)]
    assert sum(1 for n in shared if n > 200) == 2 * len(chunks), shared

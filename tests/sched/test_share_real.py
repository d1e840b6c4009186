"""Shared input on the REAL engine (squad.sched.share, issue 29): the prompt the model gets is the
author's (sharing on or off, the same greedy answers as the author's messages sent by hand); a
declared ``shared`` context is processed once (the engine's own ``/metrics`` and ``timings.cache_n``);
a prefill past its deadline says ``share.skipped`` and reports no shared tokens; a tool loop's
rounds reuse their prefix (``cache_n``)."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest

from launch_support import THREADS
from squad.engine.session import EngineSpec
from squad.events import CallFinished, Event, ShareSkipped
from squad.runtime.agent import Agent
from squad.runtime.squad import Squad
from squad.runtime.tools import tool

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


def reviewers() -> list[Agent]:
    return [Agent(name=n, instructions=f"You review Python code for {n}. Answer in one short sentence.",
                  budget=2048, max_tokens=8, sampling=SAMPLING) for n in REVIEWERS]


def spec(llama_server_path: Path, default_model_path: Path) -> EngineSpec:
    return EngineSpec(model=default_model_path, binary=llama_server_path, threads=THREADS, slots=3)


async def counted(squad: Squad, system: str, prompt: str) -> int:
    """The engine's count of the author's own messages."""
    headers = {"Authorization": f"Bearer {squad.info.api_key}"} if squad.info.api_key else {}
    async with httpx.AsyncClient(base_url=squad.info.base_url, headers=headers, timeout=60) as http:
        r = await http.post("/v1/chat/completions/input_tokens", json={"messages": [
            {"role": "system", "content": system}, {"role": "user", "content": prompt}]})
        r.raise_for_status()
        return int(r.json()["input_tokens"])


@pytest.mark.timeout(900)  # two engines, one after the other, and 15 calls on 2 shared cores
async def test_answers_are_the_authors_and_a_declared_shared_context_is_processed_once(
    llama_server_path: Path, default_model_path: Path
) -> None:
    """K = 3, each mode on a fresh engine (the engine's host prompt cache outlives erased slots, and a
    prompt loaded from it gives other greedy answers than one computed whole, whatever squad does):
    (1) the issue's layout (own instructions, then the same file): the default sends exactly the
    author's messages (the engine counts their tokens) and answers as sharing off; (2) one reviewer
    given three prompts that begin with the same file: sharing uses that prefix (the engine's
    ``cache_n``) and still sends the author's messages; (3) the file declared as ``shared`` is
    processed once."""
    prompt = "Review this file:\n\n" + source(40)
    issue = [(n, prompt) for n in REVIEWERS]
    common = [("security", prompt + f"\n\nFocus on {what}.") for what in ("input checks", "errors", "limits")]
    answers: dict[str, list[str]] = {}
    for mode in ("prefix", "off"):
        seen: list[Event] = []
        async with Squad(reviewers(), engine=spec(llama_server_path, default_model_path), on_event=seen.append,
                         shared_input=mode) as squad:
            assert squad.info.slot_save_dir, "squad's launcher gives the engine a slot save directory"
            results = await squad.parallel(issue, check=True, max_concurrency=1)
            answers[mode] = [r.output for r in results]
            assert not [e for e in seen if isinstance(e, CallFinished) and e.shared_tokens]  # nothing in common
            seen.clear()
            grouped = await squad.parallel(common, check=True, max_concurrency=1)
            shared = [e.shared_tokens for e in seen if isinstance(e, CallFinished)]
            assert (max(shared) > 300) is (mode == "prefix"), shared  # only what the prompts begin with
            for (name, text), result in zip(issue + common, results + grouped):
                assert result.usage.prompt_tokens == await counted(squad, squad.agents[name].system_prompt([], {}),
                                                                   text)
            if mode == "prefix":
                await processed_once(squad, seen)
    assert answers["prefix"] == answers["off"]  # the very same requests: the same greedy answers


async def processed_once(squad: Squad, seen: list[Event]) -> None:
    file = source(60)
    headers = {"Authorization": f"Bearer {squad.info.api_key}"} if squad.info.api_key else {}
    seen.clear()
    async with httpx.AsyncClient(base_url=squad.info.base_url, headers=headers, timeout=30) as http:
        before = prompt_tokens_total((await http.get("/metrics")).text)
        results = await squad.parallel([(n, "Review the code above.") for n in REVIEWERS], check=True, shared=file)
        after = prompt_tokens_total((await http.get("/metrics")).text)
    one = max(r.usage.prompt_tokens for r in results)
    processed = after - before
    finished = [e for e in seen if isinstance(e, CallFinished)]
    assert len(finished) == 3 and all(e.cached_tokens is not None for e in finished)
    shared = sorted(e.shared_tokens for e in finished)
    assert shared[1] > 500, shared  # restored members: the engine reused the file (its timings.cache_n)
    assert all(e.shared_tokens <= (e.cached_tokens or 0) for e in finished)
    assert processed <= 1.2 * one, (processed, one)  # the file once, then each one's own words
    assert not list(Path(squad.info.slot_save_dir or ".").glob("squad-share-*.bin")), "the slot file is deleted"


async def test_a_prefill_past_its_deadline_says_so_and_reports_no_shared_tokens(
    llama_server_path: Path, default_model_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from squad.chat.deadline import EngineDeadlines

    monkeypatch.setattr(EngineDeadlines, "prefill_deadline", lambda self, tokens: 0.0005)
    seen: list[Event] = []
    async with Squad(reviewers(), engine=spec(llama_server_path, default_model_path), on_event=seen.append) as squad:
        await squad.parallel([(n, "Review the code above.") for n in REVIEWERS], check=True, shared=source(90))
    skipped = [e for e in seen if isinstance(e, ShareSkipped)]
    assert len(skipped) == 1 and "deadline" in skipped[0].reason and skipped[0].tokens > 500
    finished = [e for e in seen if isinstance(e, CallFinished)]
    assert len(finished) == 3 and all(e.shared_tokens == 0 for e in finished)


@tool
def lookup(topic: str) -> str:
    """Look a topic up in the notes."""
    return f"The notes say {topic} is handled in module alpha, function beta, with a limit of 3."


async def test_a_tool_loops_rounds_reuse_their_prefix(llama_server_path: Path, default_model_path: Path) -> None:
    """Round 0 (tool_choice required) then the answering round (tool_choice none, the same tool
    definitions): the engine reuses round 0's prompt in round 1 (its own ``timings.cache_n``)."""
    agent = Agent(name="reader", instructions="You answer with the notes. Call lookup first.", tools=["lookup"],
                  tool_choice="required", max_tool_rounds=1, max_tokens=24, budget=2048, sampling=SAMPLING)
    seen: list[Event] = []
    async with Squad([agent], engine=EngineSpec(model=default_model_path, binary=llama_server_path, threads=THREADS,
                                                slots=2), tools=[lookup], on_event=seen.append) as squad:
        result = await squad.run_agent("reader", "Where is rate limiting handled?")
    assert result.tool_calls, "round 0 was forced to call the tool"
    rounds = [e for e in seen if isinstance(e, CallFinished)]
    assert len(rounds) == 2, rounds
    first, answer = rounds
    assert first.prompt_tokens and answer.cached_tokens is not None
    assert answer.cached_tokens >= 0.9 * first.prompt_tokens, (answer.cached_tokens, first.prompt_tokens)

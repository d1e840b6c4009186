"""The runtime against the REAL llama-server and the default model (kept small: 2 shared cores).

- The issue's done-condition: a main agent @mentions three sub-agents through a planned
  engine (>= 4 slots), the three run at once, their answers come back to the lead.
- F08: a fan-out of more agents than slots never has more requests in flight than slots,
  checked on the engine itself (``/slots``) and through squad's admission events.
"""

from __future__ import annotations

from pathlib import Path

import anyio
import httpx
import pytest

from launch_support import THREADS
from squad.engine.session import EngineSpec
from squad.events import Event
from squad.runtime.agent import Agent
from squad.runtime.squad import Squad

pytestmark = [pytest.mark.engine, pytest.mark.anyio]

TINY = dict(budget=256, max_tokens=8, sampling={"temperature": 0.0, "seed": 1})


def squad_of(subs: list[str], **lead: object) -> list[Agent]:
    main = Agent(name="lead", instructions="You are a tech lead. One sentence.", agents=subs,
                 sub_agent_tools=False, **{**TINY, "budget": 512, "max_tokens": 12, **lead})
    return [main] + [Agent(name=n, instructions=f"You are {n}. Answer in five words.", **TINY) for n in subs]


async def watch_slots(info, seen: list[int], stop: anyio.Event) -> None:
    """Poll the engine's /slots and record how many are processing."""
    headers = {"Authorization": f"Bearer {info.api_key}"} if info.api_key else {}
    async with httpx.AsyncClient(base_url=info.base_url, headers=headers, timeout=5) as client:
        while not stop.is_set():
            slots = (await client.get("/slots")).json()
            seen.append(sum(bool(s.get("is_processing")) for s in slots))
            await anyio.sleep(0.05)


async def test_lead_mentions_three_sub_agents_on_a_planned_engine(
    llama_server_path: Path, default_model_path: Path
) -> None:
    events: list[Event] = []
    agents = squad_of(["security", "style", "tests"])
    async with Squad(agents, engine=EngineSpec(model=default_model_path, binary=llama_server_path, threads=THREADS),
                     on_event=events.append) as sq:
        assert sq.session.plan.slots >= 4 and sq.info.slots >= 4  # lead + 3 subs planned
        assert sq.info.n_ctx >= 512 + 3 * 256
        result = await sq.run("@security @style @tests Should we store passwords in plain text?")
    assert [s.agent for s in result.subs] == ["security", "style", "tests"]
    for sub in result.subs:
        assert sub.ok and sub.output.strip(), sub.summary()
        assert sub.usage.completion_tokens > 0 and sub.timings.ttft_s is not None
        assert sub.slot is not None
    assert result.main.ok and result.output.strip()
    assert len({s.slot for s in result.subs}) == 3  # three slots at once, not serialized
    admitted = [e for e in events if e.kind == "call.admitted"]
    assert max(e.data["in_flight"] for e in admitted) == 3
    assert not [e for e in events if e.kind in ("call.failed", "agent.failed")]


async def test_fan_out_beyond_slots_never_exceeds_slots_in_flight(
    llama_server_path: Path, default_model_path: Path
) -> None:
    events: list[Event] = []
    names = [f"s{i}" for i in range(5)]
    async with Squad(squad_of(names),
                     engine=EngineSpec(model=default_model_path, binary=llama_server_path, threads=THREADS, slots=2),
                     on_event=events.append) as sq:
        assert sq.info.slots == 2
        seen: list[int] = []
        stop = anyio.Event()
        async with anyio.create_task_group() as tg:
            tg.start_soon(watch_slots, sq.info, seen, stop)
            result = await sq.run(" ".join(f"@{n}" for n in names) + " name one colour.")
            stop.set()
    assert all(s.ok for s in result.subs) and len(result.subs) == 5
    assert seen and max(seen) <= 2
    in_flight = [e.data["in_flight"] for e in events if e.kind == "call.admitted"]
    assert max(in_flight) == 2
    queued = [e for e in events if e.kind == "mention.queued"]
    assert len(queued) == 1 and "slots=2" in queued[0].data["message"]
    assert [e for e in events if e.kind == "call.queued"]  # the extra ones waited in squad


async def test_engine_killed_between_calls_is_restarted_with_the_same_plan(
    llama_server_path: Path, default_model_path: Path
) -> None:
    """Engine gone (SIGKILL): the next call finds the connection refused, squad asks the
    launcher to restart with the same plan and retries; finished results are kept."""
    import os
    import signal

    events: list[Event] = []
    async with Squad(squad_of(["alpha"]),
                     engine=EngineSpec(model=default_model_path, binary=llama_server_path, threads=THREADS),
                     on_event=events.append) as sq:
        first = await sq.run_agent("alpha", "Say hello.")
        plan_before, old_pid = sq.session.plan, sq.session.launcher.pid
        os.kill(old_pid, signal.SIGKILL)
        with anyio.fail_after(60):
            while sq.session.launcher.running:
                await anyio.sleep(0.05)
        second = await sq.run_agent("alpha", "Say goodbye.")
        assert sq.session.launcher.pid != old_pid
        assert sq.session.plan == plan_before
    assert first.ok and first.output and second.ok and second.output
    retried = [e for e in events if e.kind == "call.retried"]
    assert any("connection failed before the first token" in str(e.data.get("reason")) for e in retried)


async def test_prompts_are_counted_locally_and_match_the_engines_usage(
    llama_server_path: Path, default_model_path: Path
) -> None:
    """On a launched engine every prompt is counted with the model's own tokenizer (no round
    trip), and what admission reserved is exactly the engine's prompt count + max_tokens."""
    text = ("Review this:\n" + Path(__file__).read_text()[:1500].replace("@", "(at)")
            + "\nnaïve café 한국어 🙂 {\"k\": 1} ops@example.org")
    agents = [a.model_copy(update={"budget": 2048}) for a in squad_of(["security", "style"])]
    seen: list[Event] = []
    async with Squad(agents, engine=EngineSpec(model=default_model_path, binary=llama_server_path, threads=THREADS),
                     on_event=seen.append) as sq:
        assert sq.chat.counter.local is not None
        result = await sq.run("@security @style " + text)
        assert sq.chat.counter.remote_counts == 0
    assert result.main.ok and all(s.ok for s in result.subs)
    max_tokens = {a.name: a.max_tokens for a in agents}
    admitted = {e.call: e.tokens for e in seen if e.kind == "call.admitted"}
    finished = [e for e in seen if e.kind == "call.finished"]
    assert len(finished) == 3 and all(e.prompt_tokens > 100 for e in finished)
    for e in finished:  # reserved == the engine's own prompt count + max_tokens, exactly
        assert admitted[e.call] == e.prompt_tokens + max_tokens[e.agent]

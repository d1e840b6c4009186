"""Two REAL llama-servers share one squad (squad.chat.routing), each launched by squad with one thread
(2 shared cores): a 16-agent fan-out never has more calls in flight on an engine than its slots
and loses nothing, also when one engine is SIGKILLed mid-run (the lost engine is reported, its
cut stream re-run elsewhere and stated), and no engine is left running at the end."""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from pathlib import Path

import anyio
import pytest

from squad.engine.session import EngineSpec
from squad.events import Event
from squad.runtime.agent import Agent
from squad.runtime.squad import Squad

pytestmark = [pytest.mark.engine, pytest.mark.anyio]

ITEMS = [f"Write a short story about the number {i}." for i in range(16)]


def two_engines(model: Path, binary: Path) -> list[EngineSpec]:
    return [EngineSpec(model=model, binary=binary, threads=1, slots=4, ctx=2048) for _ in range(2)]


def agent(max_tokens: int) -> Agent:
    return Agent(name="writer", instructions="You write.", budget=256, max_tokens=max_tokens,
                 sampling={"temperature": 0.0, "seed": 1})


def peaks(events: list[Event]) -> dict[str, int]:
    """Most calls in flight per engine, as each engine's admission reported it."""
    found: dict[str, int] = {}
    for e in events:
        if e.kind == "call.admitted" and e.engine:
            found[e.engine] = max(found.get(e.engine, 0), e.data["in_flight"])
    return found


async def test_two_real_engines_share_a_16_agent_fan_out(llama_server_path: Path, default_model_path: Path) -> None:
    events: list[Event] = []
    started = time.monotonic()
    async with Squad([agent(8)], engines=two_engines(default_model_path, llama_server_path),
                     on_event=events.append) as sq:
        urls = [s.info.base_url for s in sq.session.sessions]
        launchers = [s.launcher for s in sq.session.sessions]
        assert len(set(urls)) == 2 and all(p.slots == 4 for p in sq.session.plans)
        results = await sq.map("writer", ITEMS)
    took = time.monotonic() - started
    assert all(not launcher.running for launcher in launchers)  # both stopped at the end
    assert len(results) == 16 and all(r.ok and r.output.strip() for r in results), [r.summary() for r in results]
    assert sorted(r.item for r in results) == list(range(16))
    served = Counter(e.engine for e in events if e.kind == "call.finished")
    assert set(served) == set(urls) and sum(served.values()) == 16
    assert all(peak <= 4 for peak in peaks(events).values())
    print(f"\ncalls per engine {dict(served)}, in-flight peaks {peaks(events)}, {took:.1f} s with launch")


async def test_one_real_engine_killed_mid_run_loses_nothing(llama_server_path: Path, default_model_path: Path) -> None:
    events: list[Event] = []
    streaming = anyio.Event()
    victim: list[str] = []

    def sink(event: Event) -> None:
        events.append(event)
        if event.kind == "call.first_token" and victim and event.engine == victim[0]:
            streaming.set()

    async with Squad([agent(16)], engines=two_engines(default_model_path, llama_server_path), on_event=sink) as sq:
        first = sq.session.sessions[0]
        victim.append(first.info.base_url)
        launchers = [s.launcher for s in sq.session.sessions]

        async def kill_while_it_streams() -> None:
            await streaming.wait()
            os.kill(first.launcher.pid, signal.SIGKILL)

        async with anyio.create_task_group() as tg:
            tg.start_soon(kill_while_it_streams)
            started = time.monotonic()
            results = await sq.map("writer", ITEMS)
            took = time.monotonic() - started
    assert all(not launcher.running for launcher in launchers)
    assert len(results) == 16 and all(r.ok and r.output.strip() for r in results), [r.summary() for r in results]
    assert sorted(r.item for r in results) == list(range(16))  # every item answered once
    lost = [e for e in events if e.kind == "engine.lost"]
    assert [e.engine for e in lost] == [victim[0]] and "SIGKILL" in lost[0].data["reason"]
    moved = [e for e in events if e.kind == "call.moved"]
    reruns = [e for e in moved if e.data["rerun"]]
    assert reruns and all(e.engine == victim[0] for e in moved)
    notes = [n for r in results for n in r.notes]
    assert len(notes) == len(reruns) and all("re-run from its start" in n for n in notes)
    assert all(peak <= 4 for peak in peaks(events).values())
    served = Counter(e.engine for e in events if e.kind == "call.finished")
    print(f"\ncalls per engine {dict(served)}, moved {len(moved)} (re-run {len(reruns)}), "
          f"in-flight peaks {peaks(events)}, map took {took:.1f} s")

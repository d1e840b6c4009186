"""A real run writes a trace that summarizes, plots and drives the view (fake and real engine)."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console

from launch_support import THREADS
from squad.cli.trace import plot_timeline
from squad.engine.session import EngineSpec
from squad.events.jsonl import JsonlTrace, load_trace
from squad.events.summary import summarize
from squad.events.view import LiveView
from squad.runtime.agent import Agent
from squad.runtime.squad import Squad

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def writers() -> list[Agent]:
    return [Agent(name=n, budget=256, max_tokens=8) for n in ("ann", "bob", "cat")]


def check(path: Path, log: str, slots: int, results) -> None:
    s = summarize(load_trace(path))
    assert set(s.agents) == {"ann", "bob", "cat"}
    assert all(a.calls == 1 and a.completion_tokens > 0 for a in s.agents.values())
    # the trace says what each result says: done, or truncated at max_tokens 8 (never "done" for a cut answer)
    assert {a.name: a.status for a in s.agents.values()} == {
        r.agent: "done" if r.outcome == "ok" else r.outcome.value for r in results}
    assert s.max_in_flight == slots  # admission never exceeds the slots
    assert sum(1 for c in s.calls if c.wait_s > 0) >= 1  # the third call waited for a slot
    assert all(c.first_token is not None and c.error is None for c in s.calls)
    assert s.engine_loads and s.engine_loads[-1].slots == slots
    assert "waiting for a slot" in log
    for r in results:
        assert ("truncated at max_tokens 8 after" if r.truncated else "done in") in log
    png = path.with_suffix(".png")
    pytest.importorskip("matplotlib")
    plot_timeline(s, png)
    assert png.stat().st_size > 1000


async def test_trace_of_a_run_on_the_fake_engine(tmp_path):
    from squad.testing import FakeEngine

    out = io.StringIO()
    view = LiveView(console=Console(file=out, width=140))
    async with FakeEngine(slots=2, n_ctx=2048, token_delay=0.01) as fe:
        with JsonlTrace(tmp_path / "run.jsonl") as trace, view:
            async with Squad(writers(), engine=fe.info, on_event=[trace, view]) as sq:
                results = await sq.parallel([(n, f"say hi {n}") for n in ("ann", "bob", "cat")])
    assert all(r.ok for r in results)
    check(tmp_path / "run.jsonl", out.getvalue(), slots=2, results=results)


@pytest.mark.engine
async def test_trace_of_a_run_on_the_real_engine(tmp_path, llama_server_path, default_model_path):
    out = io.StringIO()
    view = LiveView(console=Console(file=out, width=140))
    with JsonlTrace(tmp_path / "run.jsonl") as trace, view:
        async with Squad(writers(),
                         engine=EngineSpec(model=default_model_path, binary=llama_server_path, threads=THREADS,
                                           slots=2),
                         on_event=[trace, view]) as sq:
            results = await sq.parallel([(n, f"Say hello to {n}.") for n in ("ann", "bob", "cat")])
    assert all(r.ok for r in results), [str(r.error) for r in results]
    check(tmp_path / "run.jsonl", out.getvalue(), slots=2, results=results)

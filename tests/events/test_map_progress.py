"""A map of thousands shows done/total, rate and ETA (issue 31): ``map.progress`` events, at most one a second,
and a live view that shows the map's progress instead of a row and a line per item, failures still named."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from squad import Agent, Squad
from squad.events import (
    AgentFailed,
    AgentFinished,
    AgentStarted,
    CallAdmitted,
    CallQueued,
    CallReleased,
    EngineLoaded,
    MapProgress,
)
from squad.events.view_state import ViewState
from squad.runtime.progress import MapProgressMeter
from squad.testing import ScriptedEngine

T0 = 1000.0


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@settings(max_examples=80, deadline=None)
@given(total=st.integers(1, 400), steps=st.lists(st.floats(0, 0.7), min_size=400, max_size=400),
       oks=st.lists(st.booleans(), min_size=400, max_size=400))
def test_the_meter_says_done_total_rate_and_eta_in_a_bounded_number_of_events(total, steps, oks):
    clock, got = _Clock(), []
    meter = MapProgressMeter("echo", total, got.append, clock=clock)
    meter.start()
    for i in range(total):
        clock.now += steps[i]
        meter.item_done(oks[i])
    assert got[0].done == 0 and got[0].eta_s is None
    last = got[-1]
    assert (last.done, last.total, last.failed) == (total, total, oks[:total].count(False))
    assert [e.done for e in got] == sorted(e.done for e in got)
    assert len(got) <= 2 + clock.now / meter.every_s  # at most one a second, plus the first and the last
    for e in got[1:-1]:
        assert e.rate > 0 and e.eta_s is not None
        assert e.eta_s == pytest.approx((e.total - e.done) / e.rate, rel=0.01, abs=0.2)


def _item_events(i: int, t: float, ok: bool) -> list:
    ids = dict(agent="echo", conversation=f"echo#{i}", t=T0 + t, wall=1.7e9 + t)
    call = dict(ids, call=f"c{i}", engine="http://127.0.0.1:1")
    end = AgentFinished(**ids) if ok else AgentFailed(**ids, error="EngineError: boom")
    return [AgentStarted(**ids, item=i), CallQueued(**call, tokens=10, position=i),
            CallAdmitted(**call, tokens=10, slot=0, in_flight=1, pool_used=10),
            CallReleased(**call, tokens=10, slot=0, held_s=0.01, in_flight=0, pool_used=0), end]


def test_the_view_of_a_thousand_items_is_their_progress_and_their_failures():
    s = ViewState()
    lines = []

    def apply(event) -> None:
        s.apply(event)
        if (line := s.line(event)) is not None:
            lines.append(line)

    apply(EngineLoaded(slots=16, n_ctx=1024, pool=1024, reason="attached", engine="http://127.0.0.1:1", t=T0,
                       wall=1.7e9))
    apply(MapProgress(agent="echo", done=0, total=1000, t=T0, wall=1.7e9))
    starts = [e for i in range(1000) for e in _item_events(i, i * 0.01, ok=i % 250 != 7)[:2]]
    for event in starts:
        apply(event)
    assert s.waiting == 1000 and s.agents == {}  # no row per item
    apply(MapProgress(agent="echo", done=400, total=1000, rate=40.0, eta_s=15.0, t=T0 + 10, wall=1.7e9 + 10))
    assert "echo: 400/1,000 items done, 40.0/s, about 15s left" in s.status_line()
    for i in range(1000):
        for event in _item_events(i, i * 0.01, ok=i % 250 != 7)[2:]:
            apply(event)
    apply(MapProgress(agent="echo", done=1000, total=1000, failed=4, rate=40.0, t=T0 + 25, wall=1.7e9 + 25))
    assert s.waiting == 0 and s.bulk.running == {}
    assert sorted(s.agents) == sorted(f"echo[{i}]" for i in (7, 257, 507, 757))  # the failed items, named
    assert all(row.state == "failed" for row in s.agents.values())
    assert len(lines) <= 3 + 4 + 1  # the engine, the progress lines, one per failure
    assert any("1,000/1,000 items done (4 failed)" in line for line in lines)


def test_a_small_map_keeps_a_row_per_item():
    s = ViewState()
    s.apply(MapProgress(agent="echo", done=0, total=3, t=T0, wall=1.7e9))
    for i in range(3):
        for event in _item_events(i, i * 0.01, ok=True):
            s.apply(event)
    assert sorted(s.agents) == ["echo[0]", "echo[1]", "echo[2]"]


@pytest.mark.anyio
async def test_a_map_emits_its_progress_from_zero_to_all():
    got: list = []
    engine = ScriptedEngine(responder=lambda req: "ok", slots=4)
    async with Squad([Agent(name="echo", max_tokens=8)], engine=engine, on_event=got.append) as sq:
        results = await sq.map("echo", [f"item {i}" for i in range(300)])
        await sq.map("echo", ["one alone"])  # one item: no progress
    progress = [e for e in got if isinstance(e, MapProgress)]
    assert len(results) == 300 and progress[0].done == 0 and progress[-1].done == progress[-1].total == 300
    assert progress[-1].failed == 0 and len(progress) < 300

"""A map starts its items in a window (issue 31): at most ``WINDOW_PER_SLOT`` x slots (at least ``MIN_WINDOW``, or
``max_concurrency``) items are started at once, the next as one ends, in input order; results stay in input order
with their item index, every item runs exactly once, and a fail-fast map names the failure for the items it never
started. Memory then grows with the window and the results, not with 10,000 tasks waiting in admission."""

from __future__ import annotations

import anyio
from hypothesis import given, settings
from hypothesis import strategies as st

from squad import Agent, Squad
from squad.errors import AgentRunError
from squad.events import AgentCancelled, AgentFailed, AgentFinished, AgentStarted, Event
from squad.runtime.conversation import MIN_WINDOW, WINDOW_PER_SLOT
from squad.testing import ScriptedEngine


class _Open:
    """Counts the items started and not yet ended, from the events."""

    def __init__(self) -> None:
        self.open: set[str | None] = set()
        self.most = 0
        self.started: list[int | None] = []

    def __call__(self, event: Event) -> None:
        if isinstance(event, AgentStarted):
            self.open.add(event.conversation)
            self.started.append(event.item)
            self.most = max(self.most, len(self.open))
        elif isinstance(event, (AgentFinished, AgentFailed, AgentCancelled)):
            self.open.discard(event.conversation)


@settings(max_examples=12, deadline=None)
@given(n=st.integers(1, 300), slots=st.integers(1, 12), limit=st.one_of(st.none(), st.integers(1, 40)),
       first=st.integers(0, 5))
def test_a_map_starts_at_most_its_window_in_input_order(n, slots, limit, first) -> None:
    seen = _Open()
    engine = ScriptedEngine(responder=lambda r: r.messages[-1]["content"].upper(), slots=slots)

    async def main():
        async with Squad([Agent(name="echo", max_tokens=4)], engine=engine, on_event=seen) as sq:
            return await sq.map("echo", [f"item {i}" for i in range(n)], max_concurrency=limit, first_item=first)

    results = anyio.run(main)
    window = limit or max(MIN_WINDOW, WINDOW_PER_SLOT * slots)
    assert seen.most <= window
    assert seen.started == list(range(first, first + n))  # started in input order, each once
    assert [r.item for r in results] == list(range(first, first + n))
    assert [r.output for r in results] == [f"ITEM {i}" for i in range(n)]
    assert len(engine.requests) == n
    assert engine.max_in_flight <= min(slots, limit or slots)


def test_a_fail_fast_map_names_the_failure_for_items_it_never_started() -> None:
    n = 400

    def responder(request):
        if request.messages[-1]["content"] == "item 3":
            raise AgentRunError("item 3 broke", agent="echo")
        return "ok"

    seen = _Open()
    engine = ScriptedEngine(responder=responder, slots=2, delay=0.01)

    async def main():
        async with Squad([Agent(name="echo", max_tokens=4)], engine=engine, on_event=seen) as sq:
            return await sq.map("echo", [f"item {i}" for i in range(n)], policy="fail-fast")

    results = anyio.run(main)
    assert [r.item for r in results] == list(range(n))
    assert "broke" in str(results[3].error)
    never = [r for i, r in enumerate(results) if i not in seen.started]
    assert never and len(seen.started) <= MIN_WINDOW + 8  # most of the map never started
    assert all(r.cancelled_reason == "cancelled because 'echo' failed" for r in never)

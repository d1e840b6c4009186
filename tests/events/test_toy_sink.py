"""A new event sink is a new class: a toy one that counts events, flushed when the squad closes
and closed by the run that owns it (``run_sync``)."""

from __future__ import annotations

from collections import Counter

import anyio

from squad.events import Event, Sink
from squad.events.collect import SummaryCollector
from squad.runtime.agent import Agent
from squad.runtime.squad import Squad, run_sync
from squad.testing import FakeEngine


class CountingSink:
    def __init__(self) -> None:
        self.kinds: Counter[str] = Counter()
        self.flushed = 0
        self.closed = 0

    def __call__(self, event: Event) -> None:
        if not self.closed:
            self.kinds[event.kind] += 1

    def flush(self) -> None:
        self.flushed += 1

    def close(self) -> None:
        self.closed += 1


def test_a_toy_sink_counts_a_run_and_is_flushed_and_closed() -> None:
    sink, collector = CountingSink(), SummaryCollector()
    assert isinstance(sink, Sink) and isinstance(collector, Sink)

    async def engine() -> None:
        async with FakeEngine(slots=2) as fe:
            info = fe.info
            result = await anyio.to_thread.run_sync(lambda: run_sync(
                [Agent(name="solo", budget=512, max_tokens=16)], "hi", engine=info, on_event=[sink, collector]))
            assert result.main.ok

    anyio.run(engine)
    assert sink.kinds["agent.started"] == sink.kinds["agent.finished"] == 1
    assert sink.kinds["call.finished"] == 1 and sink.kinds["engine.loaded"] == 1
    assert (sink.flushed, sink.closed) == (2, 1)  # the squad flushed it; the run flushed and closed it
    assert collector.closed and collector.summary().agents["solo"].calls == 1


def test_a_squad_flushes_its_sinks_but_leaves_them_open() -> None:
    sink = CountingSink()

    async def main() -> None:
        async with FakeEngine(slots=1) as fe, Squad([Agent(name="solo", budget=512, max_tokens=16)],
                                                    engine=fe.info, on_event=sink) as sq:
            await sq.run("hi")
            assert sink.flushed == 0

    anyio.run(main)
    assert (sink.flushed, sink.closed) == (1, 0) and sum(sink.kinds.values()) > 0

"""A Ray run's events (squad.cluster.ray) without Ray: each worker's events reach the driver's sinks
placed (worker, engine, prefixed ids, the driver's item index, the driver's clocks), before the
item's result; a lost attempt's events are counted once (item.lost); the view's progress lines.

Real workers (``_Worker``: a squad on a fake llama-server over HTTP) behind an in-process
stand-in for a Ray actor; fake workers behind the real dispatcher for the losses. The real
cluster is in test_ray_real.py."""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import pytest

from cli_support import squad, state  # noqa: F401
from squad.cluster.dispatch import WorkerLost, dispatch
from squad.cluster.ray import _Feed, _Outbox, _Pool, _Worker
from squad.engine.session import EngineSpec
from squad.events import (
    AgentFinished,
    AgentStarted,
    CallAdmitted,
    CallFinished,
    CallReleased,
    ClusterConnected,
    ClusterStarting,
    EngineLoaded,
    Event,
    ItemLost,
    WorkerFailed,
    WorkerStarted,
)
from squad.events.jsonl import JsonlTrace, load_trace
from squad.events.summary import summarize
from squad.events.view import ViewState
from squad.recipes import load_recipe
from squad.runtime.results import AgentResult
from squad.testing import FakeEngine

RECIPE = """\
name: words
params:
  items: {type: list, default: [a, b, c, d, e, f]}
agents:
  echo: {instructions: Repeat., max_tokens: 8}
  boss: {instructions: Be brief., max_tokens: 8}
main: boss
flow:
  - id: words
    map: params.items
    agent: echo
    prompt: "Say {{ item }}"
"""


class _Local:
    """A :class:`_Worker` behind a Ray actor's call shape (``await actor.method.remote(...)``),
    each call in a thread of this process, as Ray runs it in one of the actor's threads."""

    def __init__(self, worker: _Worker) -> None:
        self.worker = worker

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.worker, name)

        class Method:
            @staticmethod
            def remote(*args: Any, **kwargs: Any) -> Any:
                return anyio.to_thread.run_sync(functools.partial(method, *args, **kwargs))

        return Method


@pytest.fixture
def engines():
    """Two fake llama-servers over HTTP, one per worker."""
    fakes = [FakeEngine(slots=2, n_ctx=2048, token_delay=0.005) for _ in range(2)]
    for fake in fakes:
        anyio.run(fake.start)
    yield fakes
    for fake in fakes:
        anyio.run(fake.stop)


def _run_on_local_workers(tmp_path: Path, fakes: list[FakeEngine], monkeypatch, *, max_tokens: int = 8,
                          fail_on: tuple[str, ...] = ()) -> tuple[list[Event], list, list]:
    """The recipe's map over one in-process worker per fake engine, through the real pool
    (start, fetch, dispatch); returns the sinks' events, the results, and the number of
    events the sinks held when each result reached ``on_item``."""
    path = tmp_path / "r.yaml"
    path.write_text(RECIPE.replace("echo: {instructions: Repeat., max_tokens: 8}",
                                   f"echo: {{instructions: Repeat., max_tokens: {max_tokens}}}"))
    recipe = load_recipe(path, {})
    events: list[Event] = []
    seen: list[tuple[int, int]] = []  # (item, events in the sinks when its result came)

    async def main():
        async with anyio.create_task_group() as fetchers:
            pool = _Pool(None, 1, lambda r: seen.append((r.item, len(events))), [events.append], fetchers)
            workers = [_Worker(recipe, EngineSpec(url=fake.base_url), f"w{k}@127.0.0.1", 0.5)
                       for k, fake in enumerate(fakes)]
            try:
                for worker in workers:
                    handle = await pool.start_worker(worker.id, _Local(worker), [])
                    assert handle is not None
                    pool.workers.append(handle)
                results = await pool.map("echo", [f"Say {w}" for w in "abcdef"], max_concurrency=None,
                                         fail_on=fail_on, output_type=None)
            finally:
                for worker in workers:
                    await anyio.to_thread.run_sync(worker.close)
                fetchers.cancel_scope.cancel()
        return results

    return events, anyio.run(main), seen


def test_workers_events_reach_the_driver_placed(tmp_path: Path, engines, monkeypatch, capsys, state) -> None:
    before = time.monotonic()
    events, results, seen = _run_on_local_workers(tmp_path, engines, monkeypatch)
    after = time.monotonic()
    urls = {f"w{k}@127.0.0.1": fake.base_url for k, fake in enumerate(engines)}
    assert [r.item for r in results] == list(range(6)) and all(r.error is None for r in results)

    # one engine.loaded and one worker.started per worker, each naming its worker and engine
    loaded = [e for e in events if isinstance(e, EngineLoaded)]
    assert {(e.worker, e.engine) for e in loaded} == set(urls.items()) and len(loaded) == 2
    started = [e for e in events if isinstance(e, WorkerStarted)]
    assert {(e.worker, e.engine, e.slots, e.pool) for e in started} == {(w, u, 2, 2048) for w, u in urls.items()}

    # every item: its agent.started carries the driver's index; its call ends on its worker's engine
    for r in results:
        [start] = [e for e in events if isinstance(e, AgentStarted) and e.item == r.item]
        short = r.worker.partition("@")[0]
        assert start.worker == r.worker and start.conversation.startswith(short + ":echo#")
        mine = [e for e in events if e.conversation == start.conversation]
        [finished] = [e for e in mine if isinstance(e, CallFinished)]
        assert finished.engine == urls[r.worker] == r.engine and finished.call.startswith(short + ":")
        assert all(e.worker == r.worker and e.engine == urls[r.worker] for e in mine)
        # its events reached the sinks before its result did
        [count] = [n for item, n in seen if item == r.item]
        assert max(events.index(e) for e in mine) < count
    assert {e.engine for e in events if isinstance(e, CallFinished)} == set(urls.values())
    assert all(before <= e.t <= after for e in events)  # on the driver's clock
    assert len({e.call for e in events if isinstance(e, CallFinished)}) == 6  # ids unique across workers

    trace = tmp_path / "run.jsonl"
    with JsonlTrace(trace) as sink:
        for e in events:
            sink(e)
    summary = summarize(load_trace(trace))
    items = {name: a for name, a in summary.agents.items() if name.startswith("echo[")}
    assert sorted(items) == [f"echo[{i}]" for i in range(6)]
    assert all(a.status in ("done", "truncated") and a.calls == 1 for a in items.values()), items
    served = {w: sum(r.worker == w for r in results) for w in urls}
    assert {(w.worker, w.engine, w.items, w.calls) for w in summary.workers} == {
        (w, u, served[w], served[w]) for w, u in urls.items()}
    code, out, err = squad(capsys, "trace", "show", trace)
    text = " ".join(out.split())
    assert code == 0
    for w, u in urls.items():
        assert f"worker {w}: engine {u} ready at" in text and f"served {served[w]} item(s)" in text


def test_each_item_s_own_messages_name_its_driver_index_not_0(tmp_path: Path, engines,
                                                               monkeypatch) -> None:
    """Issue 19: a worker runs each item as a map of one prompt; what the worker itself writes
    about the item (its error, the events' labels, the trace summary) names the item by the
    driver's index: echo[3], never echo[0] for every item."""
    events, results, _ = _run_on_local_workers(tmp_path, engines, monkeypatch, max_tokens=1, fail_on=("truncated",))
    assert [r.item for r in results] == list(range(6))
    for r in results:
        assert r.error is not None and f"agent 'echo[{r.item}]'" in str(r.error), str(r.error)
    trace = tmp_path / "run.jsonl"
    with JsonlTrace(trace) as sink:
        for e in events:
            sink(e)
    loaded = load_trace(trace)
    items = {e.conversation: e.item for e in loaded if isinstance(e, AgentStarted)}
    finished = [e for e in loaded if isinstance(e, AgentFinished)]
    assert sorted(items[e.conversation] for e in finished) == list(range(6))
    for e in finished:  # the summary line the worker wrote names the item as the driver numbers it
        assert e.summary.startswith(f"echo[{items[e.conversation]}]: truncated"), e.summary
    assert sorted(summarize(loaded).agents) == [f"echo[{i}]" for i in range(6)]


def test_outbox_tags_each_event_with_its_item_and_prefixes_ids() -> None:
    from squad.cluster.ray import _ITEM

    box = _Outbox("w3@10.0.0.7")
    box.engine = "http://127.0.0.1:8080"
    token = _ITEM.set(12)
    box(AgentStarted(agent="echo", conversation="echo#1", item=0))
    box(AgentStarted(agent="helper", conversation="helper#2", parent="echo#1"))  # a sub-agent it started
    _ITEM.reset(token)
    box(CallAdmitted(agent="echo", conversation="echo#1", call="c1", tokens=10, slot=0))  # admission's task
    box(EngineLoaded(slots=2, n_ctx=512, pool=1024, engine="http://127.0.0.1:8080"))
    taken = box.take(0)
    assert [item for item, _ in taken] == [12, 12, 12, None] and box.take(0) == [] and box.count == 4
    first, sub, call, loaded = (e for _, e in taken)
    assert (first.item, first.conversation, first.worker, first.engine) == (12, "w3:echo#1", "w3@10.0.0.7",
                                                                           "http://127.0.0.1:8080")
    assert (sub.item, sub.conversation, sub.parent) == (None, "w3:helper#2", "w3:echo#1")
    assert (call.call, call.conversation) == ("w3:c1", "w3:echo#1")
    assert loaded.worker == "w3@10.0.0.7" and loaded.conversation is None


def test_feed_moves_times_onto_the_driver_s_clocks_and_drops_a_lost_item_s_events() -> None:
    sink: list[Event] = []
    feed = _Feed("w0@h", [sink.append], offsets=(100.0, 5.0))
    feed.lost.add(3)
    feed.forward([(1, AgentStarted(agent="echo", conversation="w0:echo#1", item=1, t=150.0, wall=1005.0)),
                  (3, AgentStarted(agent="echo", conversation="w0:echo#2", item=3, t=151.0, wall=1006.0)),
                  (None, EngineLoaded(slots=1, n_ctx=1, pool=1, engine="http://e", t=152.0, wall=1007.0))])
    assert [(e.t, e.wall) for e in sink] == [(50.0, 1000.0), (52.0, 1002.0)]
    assert feed.received == 3 and feed.engine == "http://e"

    async def waits() -> None:
        with anyio.fail_after(5):
            await feed.reached(3)  # already there
            feed.close()
            await feed.reached(10)  # the worker is gone: nothing more will come

    anyio.run(waits)


@dataclass
class EventfulWorker:
    """A fake worker that sends its item's events through its feed (as the fetcher would), then
    answers; ``die_at``: at that item, it sends the item's events up to ``call.finished`` and
    ``agent.finished`` (the answer was made) and dies before the result gets back."""

    id: str
    feed: _Feed
    capacity: int = 2
    die_at: int | None = None
    engine: str = "http://127.0.0.1:1"
    runs: int = 0

    async def run(self, index: int, item: tuple) -> AgentResult:
        name = item[0]
        self.runs = n = self.runs + 1
        await anyio.sleep(0.001 * index)
        short = self.id.partition("@")[0]
        place = dict(agent=name, conversation=f"{short}:{name}#{n}", worker=self.id, engine=self.engine)
        call = dict(place, call=f"{short}:c{n}")
        self.feed.forward([
            (index, AgentStarted(**place, item=index)),
            (index, CallAdmitted(**call, tokens=20, slot=0)),
            (index, CallFinished(**call, finish_reason="stop", prompt_tokens=10, completion_tokens=2)),
            (index, CallReleased(**call, tokens=20, slot=0)),
            (index, AgentFinished(**place)),
        ])
        if index == self.die_at:
            raise WorkerLost("the actor died")
        return AgentResult(agent=name, output=f"{self.id}:{index}", item=index, finish_reason="stop",
                           worker=self.id, engine=self.engine)


def _eventful_pool(*specs: tuple[str, int | None]) -> tuple[_Pool, list[Event], list[EventfulWorker]]:
    events: list[Event] = []
    pool = _Pool(ray=None, retries=1, on_item=None, sinks=[events.append])
    workers = []
    for wid, die_at in specs:
        feed = pool.feed[wid] = _Feed(wid, [events.append])
        workers.append(EventfulWorker(wid, feed, die_at=die_at, engine=f"http://127.0.0.1/{wid}"))
    pool.workers = workers  # type: ignore[assignment]
    return pool, events, workers


def _map(pool: _Pool, n: int) -> list[AgentResult]:
    return anyio.run(lambda: pool.map("echo", [f"Say {i}" for i in range(n)], max_concurrency=None, fail_on=(),
                                      output_type=None))


def test_a_lost_attempt_is_counted_once_and_its_retry_is_in_the_trace(tmp_path: Path, capsys, state) -> None:
    pool, events, (w0, w1) = _eventful_pool(("w0@h", None), ("w1@h", 1))
    results = _map(pool, 5)
    assert [r.item for r in results] == list(range(5)) and results[1].worker == "w0@h" and results[1].retried
    [lost] = [e for e in events if isinstance(e, ItemLost)]
    assert (lost.agent, lost.item, lost.worker, lost.retry, lost.reason) == ("echo", 1, "w1@h", True, "the actor died")
    assert lost.engine == "http://127.0.0.1/w1@h"
    # the lost attempt's call.finished did reach the sinks: twice in the events, once in the summary
    finished = [e for e in events if isinstance(e, CallFinished) and e.conversation in
                {s.conversation for s in events if isinstance(s, AgentStarted) and s.item == 1}]
    assert len(finished) == 2

    # what the lost worker still sends of that item is dropped
    before = len(events)
    w1.feed.forward([(1, CallReleased(agent="echo", conversation="w1:echo#9", call="w1:c9", tokens=1, slot=0))])
    assert len(events) == before

    trace = tmp_path / "run.jsonl"
    with JsonlTrace(trace) as sink:
        for e in events:
            sink(e)
    for summary in (summarize(events), summarize(load_trace(trace))):
        items = {n: a for n, a in summary.agents.items() if n.startswith("echo[")}
        assert sorted(items) == [f"echo[{i}]" for i in range(5)]
        assert all(a.status == "done" and a.calls == 1 and a.completion_tokens == 2 for a in items.values()), items
        assert items["echo[1]"].notes == ["worker w1@h lost (the actor died): run again on another worker"]
        assert len(summary.calls) == 5
    code, out, err = squad(capsys, "trace", "show", trace)
    text = " ".join(out.split())
    assert code == 0 and "echo[1]: worker w1@h lost (the actor died): run again on another worker" in text


def test_an_item_lost_twice_fails_in_the_summary() -> None:
    pool, events, _ = _eventful_pool(("w0@h", 0), ("w1@h", 0))
    results = _map(pool, 2)
    assert results[0].error is not None and "lost 2 times" in str(results[0].error)
    lost = [e for e in events if isinstance(e, ItemLost)]
    assert [(e.worker, e.retry) for e in lost] == [("w0@h", True), ("w1@h", False)] or \
        [(e.worker, e.retry) for e in lost] == [("w1@h", True), ("w0@h", False)]
    summary = summarize(events)
    assert summary.agents["echo[0]"].status == "failed" and summary.agents["echo[0]"].calls == 0
    assert "not run again" in summary.agents["echo[0]"].errors[0]


def test_dispatch_says_when_an_item_s_worker_is_lost() -> None:
    @dataclass
    class Dies:
        id: str
        capacity: int = 1

        async def run(self, index: int, item: str) -> str:
            if self.id == "a":
                raise WorkerLost("gone")
            return item

    told: list[tuple] = []
    served = anyio.run(lambda: dispatch(["x", "y"], [Dies("a"), Dies("b")], on_lost=lambda *a: told.append(a)))
    assert [s.result for s in served] == ["x", "y"]
    assert told == [(0, "a", "gone", True)]


def test_view_prints_a_ray_run_s_progress_and_a_lost_item() -> None:
    state_ = ViewState()
    lines = []
    for event in [
        ClusterStarting(),
        ClusterConnected(nodes=1, workers=2),
        WorkerStarted(worker="w0@127.0.0.1", engine="http://127.0.0.1:41000", node="127.0.0.1", slots=3,
                      n_ctx=256, pool=768),
        WorkerFailed(worker="w1@127.0.0.1", reason="EngineError: no memory"),
        AgentStarted(agent="echo", conversation="w0:echo#1", item=4, worker="w0@127.0.0.1"),
        CallAdmitted(agent="echo", conversation="w0:echo#1", call="w0:c1", tokens=50, slot=0, worker="w0@127.0.0.1"),
        ItemLost(agent="echo", item=4, worker="w0@127.0.0.1", reason="RayActorError: died"),
    ]:
        state_.apply(event)
        lines.append(state_.line(event))
        if isinstance(event, ClusterConnected):
            assert "starting 2 workers" in state_.status_line()  # shown until an engine reports
    text = "\n".join(line for line in lines if line)
    assert "starting a local Ray cluster on 127.0.0.1" in text
    assert "Ray cluster: 1 node, starting 2 workers, each with its own engine" in text
    assert "worker w0@127.0.0.1: engine loaded, 3 slots, pool 768 tokens" in text
    assert "worker w1@127.0.0.1 did not start: EngineError: no memory" in text
    assert "echo[4]: worker w0@127.0.0.1 lost (RayActorError: died): run again on another worker" in text
    row = state_.agents["echo[4]"]
    assert row.state == "retrying" and row.reserved == 0


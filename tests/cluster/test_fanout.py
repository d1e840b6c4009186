"""The fan-out dispatch rule (squad.cluster.dispatch) with fake workers: no Ray, no engine."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import anyio
import pytest

from squad.cluster.dispatch import Served, WorkerLost, dispatch


@dataclass
class FakeWorker:
    """Answers ``"<id>:<item>"`` after a short random pause; dies (every item it holds raises
    WorkerLost) once it has started ``die_after`` items; ``bad`` items come back as failures."""

    id: str
    capacity: int = 2
    die_after: int | None = None
    bad: frozenset[str] = frozenset()
    started: list[int] = field(default_factory=list)
    in_flight: int = 0
    peak: int = 0
    dead: anyio.Event = field(default_factory=anyio.Event)

    async def run(self, index: int, item: str) -> dict:
        if self.dead.is_set():
            raise WorkerLost(f"{self.id} is dead")
        self.started.append(index)
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        try:
            if self.die_after is not None and len(self.started) >= self.die_after:
                self.dead.set()
            with anyio.move_on_after(random.uniform(0, 0.01)):
                await self.dead.wait()
            if self.dead.is_set():
                raise WorkerLost(f"{self.id} died")
            if item in self.bad:
                return {"error": f"{item} is invalid", "by": self.id}
            return {"output": f"{self.id}:{item}", "by": self.id}
        finally:
            self.in_flight -= 1


def run(items: list[str], workers: list[FakeWorker], **kw: object) -> list[Served]:
    return anyio.run(lambda: dispatch(items, workers, **kw))


@pytest.mark.parametrize("seed", range(5))
def test_results_in_input_order_whatever_finishes_first(seed: int) -> None:
    random.seed(seed)
    items = [f"i{n}" for n in range(32)]
    workers = [FakeWorker("a"), FakeWorker("b", capacity=3)]
    served = run(items, workers)
    assert [s.index for s in served] == list(range(32))
    assert [s.result["output"].split(":")[1] for s in served] == items
    assert all(s.result["by"] == s.worker and s.attempts == 1 and not s.retried for s in served)
    assert {s.worker for s in served} == {"a", "b"}


@pytest.mark.parametrize("capacities", [(1,), (1, 1), (2, 3), (4, 1, 2)])
def test_back_pressure_a_worker_never_holds_more_than_its_capacity(capacities: tuple[int, ...]) -> None:
    workers = [FakeWorker(f"w{n}", capacity=c) for n, c in enumerate(capacities)]
    served = run([f"i{n}" for n in range(40)], workers)
    assert all(s.result is not None for s in served)
    for w, c in zip(workers, capacities):
        assert w.peak <= c
    assert sum(len(w.started) for w in workers) == 40  # each item sent once


def test_items_of_a_lost_worker_finish_on_another_once() -> None:
    items = [f"i{n}" for n in range(32)]
    a, b = FakeWorker("a", die_after=5), FakeWorker("b")
    served = run(items, [a, b])
    assert all(s.result is not None and s.error is None for s in served)
    assert all(s.worker == "b" for s in served if s.retried)
    retried = [s for s in served if s.retried]
    assert retried and len(retried) <= a.capacity  # it held at most its capacity when it died
    assert all(s.attempts == 2 and s.lost == ["worker a lost: a died"] for s in retried)
    # none twice: every item has one result, and b started each item at most once
    assert sorted(b.started) == sorted(set(b.started))
    assert [s.result["output"] for s in served] == [f"{s.worker}:{i}" for s, i in zip(served, items)]


def test_an_item_is_retried_at_most_once() -> None:
    # three workers each die on their first item: an item lost twice is not sent a third time
    workers = [FakeWorker(w, capacity=1, die_after=1) for w in "abc"]
    served = run(["x", "y", "z"], workers)
    assert all(s.result is None and s.error for s in served)
    for s in served:
        assert len(s.lost) <= 2
    twice = [s for s in served if len(s.lost) == 2]
    assert all("lost 2 times" in s.error for s in twice)
    assert sum(len(w.started) for w in workers) == 3  # three workers, one start each
    assert any("no worker left" in s.error for s in served)


def test_own_failure_is_reported_not_retried() -> None:
    a, b = FakeWorker("a", bad=frozenset({"i3", "i7"})), FakeWorker("b", bad=frozenset({"i3", "i7"}))
    served = run([f"i{n}" for n in range(10)], [a, b])
    for n in (3, 7):
        assert served[n].result["error"] == f"i{n} is invalid" and not served[n].retried
    assert sum(len(w.started) for w in (a, b)) == 10


def test_all_workers_lost_fails_the_rest_with_a_reason() -> None:
    a = FakeWorker("a", capacity=1, die_after=2)
    served = run([f"i{n}" for n in range(6)], [a])
    assert served[0].result is not None
    assert all(s.result is None and "no worker left" in s.error for s in served[1:])


def test_other_exceptions_propagate() -> None:
    class Broken(FakeWorker):
        async def run(self, index: int, item: str) -> dict:
            raise KeyError("bug")

    with pytest.raises(BaseException) as info:
        run(["a"], [Broken("a")])
    assert "bug" in repr(info.value) or isinstance(info.value, KeyError)


def test_no_workers_or_zero_capacity_is_an_error() -> None:
    with pytest.raises(ValueError):
        run(["a"], [])
    with pytest.raises(ValueError):
        run(["a"], [FakeWorker("a", capacity=0)])


def test_no_items() -> None:
    assert run([], [FakeWorker("a")]) == []


def test_limit_bounds_items_in_flight_over_all_workers() -> None:
    in_flight = peak = 0

    class Counting(FakeWorker):
        async def run(self, index: int, item: str) -> dict:
            nonlocal in_flight, peak
            in_flight += 1
            peak = max(peak, in_flight)
            try:
                return await super().run(index, item)
            finally:
                in_flight -= 1

    workers = [Counting("a", capacity=3), Counting("b", capacity=3)]
    served = run([f"i{n}" for n in range(20)], workers, limit=2)
    assert all(s.result is not None for s in served) and peak <= 2


def test_first_items_spread_over_the_workers() -> None:
    workers = [FakeWorker("a", capacity=4), FakeWorker("b", capacity=4)]
    run([f"i{n}" for n in range(4)], workers)
    assert sorted(workers[0].started) == [0, 2] and sorted(workers[1].started) == [1, 3]

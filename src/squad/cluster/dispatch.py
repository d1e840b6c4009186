"""Fan-out of map items over workers that may die: the dispatch rule, with no cluster in it.

:func:`dispatch` runs items on :class:`Worker` s (a Ray actor in :mod:`squad.cluster.ray`, a fake in
tests). The rule:

- **back-pressure**: a worker holds at most ``worker.capacity`` items at once (its engine's
  slots); every other item waits here, in input order, until a worker has room. Nothing is
  sent ahead, so a worker that dies holds at most ``capacity`` items.
- **spread**: the first items go round the workers one slot at a time; after that each item
  goes to the first worker with a free slot.
- **results in input order**, whatever order they finish in, each saying which worker served it.
- **a worker that is lost** (its :meth:`Worker.run` raises :class:`WorkerLost`: the process,
  its node or its engine died) is taken out for the rest of the run. The item it was running,
  and each other item it held, go back to the queue ahead of the items not started yet and run
  on another worker. At most ``retries`` (default 1) times per item: an item whose worker is
  lost again fails with both reasons and is not sent a third time. :attr:`Served.lost` keeps
  every lost attempt's reason, so the result states each retry.
- **an item that fails for its own reason** (the worker returns a result holding the agent's
  error, an answer that missed its schema) is the worker's answer: reported, never retried.
- when no worker is left, the items not done fail with "no worker left".

Any other exception from a worker (a bug, not a death) ends the dispatch and propagates.
"""

from __future__ import annotations

import contextlib
import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

import anyio

from squad.errors import SquadError

__all__ = ["Worker", "WorkerLost", "Served", "dispatch", "RETRIES"]

T = TypeVar("T")
R = TypeVar("R")
T_contra = TypeVar("T_contra", contravariant=True)
R_co = TypeVar("R_co", covariant=True)

RETRIES = 1
"""How many times an item whose worker was lost is sent to another worker."""


class WorkerLost(SquadError, RuntimeError):
    """A worker died (its process, its node or its engine) while it held an item; the
    message says which and why."""


class Worker(Protocol[T_contra, R_co]):
    """Something that runs one item at a time per slot: ``id`` names it in results,
    ``capacity`` is how many items it may hold at once (at least 1)."""

    @property
    def id(self) -> str: ...

    @property
    def capacity(self) -> int: ...

    async def run(self, index: int, item: T_contra) -> R_co:
        """Run item ``index``; its own failure is inside the returned result. Raises
        :class:`WorkerLost` when the worker died."""
        ...


@dataclass
class Served(Generic[R]):
    """One item's end: ``result`` (the worker's answer, None when it could not be run) from
    worker ``worker``; ``lost``: the reasons of attempts lost with their worker (one per
    retry; ``attempts`` = ``len(lost)`` + 1 when it was served); ``error``: why it could not
    be run at all (its worker lost more than ``retries`` times, or no worker left)."""

    index: int
    result: R | None = None
    worker: str | None = None
    lost: list[str] = field(default_factory=list)
    error: str | None = None

    @property
    def retried(self) -> bool:
        return bool(self.lost)

    @property
    def attempts(self) -> int:
        return len(self.lost) + (self.result is not None)


async def dispatch(items: Sequence[T], workers: Sequence[Worker[T, R]], *,
                   retries: int = RETRIES, limit: int | None = None,
                   on_done: Callable[[Served[R]], None] | None = None,
                   on_lost: Callable[[int, str, str, bool], None] | None = None) -> list[Served[R]]:
    """Run every item of ``items`` on ``workers`` by the rule in the module docstring;
    ``limit``: at most this many items in flight over all workers (None: their capacities);
    ``on_done``: called with each item's :class:`Served` as it ends (served or not run);
    ``on_lost``: called with ``(index, worker id, reason, retry)`` when an item's worker is lost
    while it holds the item (``retry``: it goes back to the queue; False: it fails).

    Returns one :class:`Served` per item, in input order. Raises ``ValueError`` for no
    workers or a capacity below 1; a worker's exception other than :class:`WorkerLost`
    propagates (the other items are cancelled).
    """
    if not workers:
        raise ValueError("dispatch needs at least one worker")
    for worker in workers:
        if worker.capacity < 1:
            raise ValueError(f"worker {worker.id} has capacity {worker.capacity}; give it at least 1")
    run = _Dispatch(items, workers, retries, on_done, on_lost)
    limiter = anyio.CapacityLimiter(limit) if limit else None

    async def lane(worker: Worker[T, R]) -> None:
        while True:
            async with limiter if limiter is not None else contextlib.nullcontext():
                if not await run.one(worker):
                    return

    async with anyio.create_task_group() as tg:  # lanes interleaved: the first items spread over the workers
        for k in range(max(w.capacity for w in workers)):
            for worker in workers:
                if k < worker.capacity:
                    tg.start_soon(lane, worker)
    return run.served


class _Dispatch(Generic[T, R]):
    """The books of one :func:`dispatch`: each item's :class:`Served`, the queue (a heap of
    indices: retried items, lower indices, go first), the workers alive, the items left."""

    def __init__(self, items: Sequence[T], workers: Sequence[Worker[T, R]], retries: int,
                 on_done: Callable[[Served[R]], None] | None,
                 on_lost: Callable[[int, str, str, bool], None] | None) -> None:
        self.items, self.retries, self.on_done, self.on_lost = items, retries, on_done, on_lost
        self.served: list[Served[R]] = [Served(i) for i in range(len(items))]
        self.waiting = list(range(len(items)))
        self.alive = {w.id for w in workers}
        self.left = len(items)
        self.changed = anyio.Condition()

    def finish(self, i: int, **what: object) -> None:
        for key, value in what.items():
            setattr(self.served[i], key, value)
        self.left -= 1
        if self.on_done is not None:
            self.on_done(self.served[i])

    async def take(self, worker: Worker[T, R]) -> int | None:
        async with self.changed:
            while not self.waiting and self.left and worker.id in self.alive:
                await self.changed.wait()
            return heapq.heappop(self.waiting) if self.waiting and worker.id in self.alive else None

    async def one(self, worker: Worker[T, R]) -> bool:
        """Take and run one item on ``worker``; False when there is none for it (any more)."""
        if (i := await self.take(worker)) is None:
            return False
        try:
            result = await worker.run(i, self.items[i])
        except WorkerLost as exc:
            async with self.changed:
                self.lost(i, worker.id, str(exc))
                self.changed.notify_all()
            return False
        async with self.changed:
            self.finish(i, result=result, worker=worker.id)
            self.changed.notify_all()
        return True

    def lost(self, i: int, worker: str, reason: str) -> None:
        """Item ``i``'s ``worker`` was lost: take the worker out, queue the item again or fail
        it (past ``retries``), and fail every waiting item when no worker is left."""
        served = self.served[i]
        self.alive.discard(worker)
        served.lost.append(f"worker {worker} lost: {reason}")
        if self.on_lost is not None:
            self.on_lost(i, worker, reason, len(served.lost) <= self.retries)
        if len(served.lost) > self.retries:
            self.finish(i, error=f"not run: its worker was lost {len(served.lost)} times ({'; '.join(served.lost)})")
        else:
            heapq.heappush(self.waiting, i)
        if not self.alive:
            while self.waiting:
                j = heapq.heappop(self.waiting)
                self.finish(j, error="not run: no worker left" + (
                    f" ({'; '.join(self.served[j].lost)})" if self.served[j].lost else ""))

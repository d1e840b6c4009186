"""``fifo``: lower ``priority`` first, arrival order among equals, no barging.

A head that does not fit keeps every later call waiting. Predictable; a long head can hold
short calls that would fit.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from squad.sched.room import Reservation, Waiting

__all__ = ["FifoQueue"]


class FifoQueue:
    """Lower priority number first, arrival order among equals, never barging.

    Cost per operation, n calls waiting: ``add`` O(log n); ``remove`` O(1) (the heap entry is
    dropped when it reaches the top); ``pick`` O(log n) amortised; ``ordered`` O(n log n) (views only,
    never on the admission path); ``len`` O(1). A min-heap of ``(priority, seq)`` with lazy deletion:
    ``_waiting`` (seq -> call) says which entries are live.
    """

    name = "fifo"

    def __init__(self) -> None:
        self._waiting: dict[int, Waiting] = {}  # seq -> call, the live ones
        self._heap: list[tuple[int, int]] = []  # (priority, seq); an entry whose seq is not in _waiting is dead

    def _key(self, waiting: Waiting) -> tuple[float, ...]:
        return (waiting.reservation.priority, waiting.seq)

    def add(self, waiting: Waiting) -> None:
        self._waiting[waiting.seq] = waiting
        heapq.heappush(self._heap, (waiting.reservation.priority, waiting.seq))

    def remove(self, waiting: Waiting) -> bool:
        if self._waiting.get(waiting.seq) is not waiting:
            return False
        del self._waiting[waiting.seq]
        if len(self._heap) > 2 * len(self._waiting) + 64:  # many dead entries: rebuild, O(n) once per n removals
            self._rebuild()
        return True

    def _rebuild(self) -> None:
        self._heap = [(w.reservation.priority, s) for s, w in self._waiting.items()]
        heapq.heapify(self._heap)

    def head(self) -> Waiting | None:
        """The first call in order (dead heap entries dropped on the way), O(log n) amortised."""
        while self._heap:
            seq = self._heap[0][1]
            waiting = self._waiting.get(seq)
            if waiting is not None:
                return waiting
            heapq.heappop(self._heap)
        return None

    def ordered(self) -> list[Waiting]:
        return sorted(self._waiting.values(), key=self._key)

    def pick(self, fits: Callable[[Reservation], bool]) -> Waiting | None:
        head = self.head()
        if head is not None and fits(head.reservation):
            self.remove(head)
            return head
        return None

    def served(self, reservation: Reservation, held_s: float) -> None:
        return None

    def __len__(self) -> int:
        return len(self._waiting)

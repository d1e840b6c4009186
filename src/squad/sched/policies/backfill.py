"""``backfill``: the ``fifo`` order, but while the head does not fit, a later call that fits the
free room may pass it (the smallest waiting call), at most ``max_bypass`` times per head.

Then the head blocks the queue like ``fifo`` until it fits, so it waits at most for
``max_bypass`` calls plus the ones already running: never unboundedly.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import TYPE_CHECKING

from squad.sched.policies.fifo import FifoQueue

if TYPE_CHECKING:
    from squad.sched.room import Reservation, Waiting

__all__ = ["BackfillQueue"]


class BackfillQueue(FifoQueue):
    """FIFO by priority, and while the head does not fit, the smallest waiting call (fewest tokens,
    then priority and arrival) passes it if it fits, at most ``max_bypass`` times per head (default 8).
    Raises ``ValueError`` for a negative ``max_bypass``.

    Cost per operation, n calls waiting: ``add`` O(log n), ``remove`` O(1), ``pick`` O(log n) amortised:
    the fifo heap plus a second min-heap of ``(tokens, priority, seq)`` (lazy deletion as in fifo) whose
    top is the one call that can fit if any can."""

    name = "backfill"

    def __init__(self, max_bypass: int = 8) -> None:
        super().__init__()
        if max_bypass < 0:
            raise ValueError(f"max_bypass must be 0 or more, got {max_bypass}")
        self.max_bypass = max_bypass
        self._bypassed: dict[int, int] = {}  # head's seq -> times passed
        self._small: list[tuple[int, int, int]] = []  # (tokens, priority, seq); dead when seq is not waiting

    def add(self, waiting: Waiting) -> None:
        super().add(waiting)
        r = waiting.reservation
        heapq.heappush(self._small, (r.tokens, r.priority, waiting.seq))

    def remove(self, waiting: Waiting) -> bool:
        self._bypassed.pop(waiting.seq, None)
        return super().remove(waiting)

    def _rebuild(self) -> None:
        super()._rebuild()
        self._small = [(w.reservation.tokens, w.reservation.priority, s) for s, w in self._waiting.items()]
        heapq.heapify(self._small)

    def _smallest(self) -> Waiting | None:
        while self._small:
            waiting = self._waiting.get(self._small[0][2])
            if waiting is not None:
                return waiting
            heapq.heappop(self._small)
        return None

    def pick(self, fits: Callable[[Reservation], bool]) -> Waiting | None:
        head = self.head()
        if head is None:
            return None
        if fits(head.reservation):
            self.remove(head)
            return head
        if self._bypassed.get(head.seq, 0) >= self.max_bypass:
            return None  # the head has waited long enough: nothing passes it any more
        small = self._smallest()
        if small is not None and small is not head and fits(small.reservation):
            self._bypassed[head.seq] = self._bypassed.get(head.seq, 0) + 1
            self.remove(small)
            return small
        return None

    def bypassed(self, waiting: Waiting) -> int:
        """How many calls have passed ``waiting`` while it was at the head."""
        return self._bypassed.get(waiting.seq, 0)

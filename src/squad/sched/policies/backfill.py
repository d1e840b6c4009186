"""``backfill``: the ``fifo`` order, but while the head does not fit, a later call that fits the
free room may pass it, at most ``max_bypass`` times per head.

Then the head blocks the queue like ``fifo`` until it fits, so it waits at most for
``max_bypass`` calls plus the ones already running: never unboundedly.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from squad.sched.policies.fifo import FifoQueue

if TYPE_CHECKING:
    from squad.sched.room import Reservation, Waiting

__all__ = ["BackfillQueue"]


class BackfillQueue(FifoQueue):
    """FIFO by priority, and a call that fits may pass a head that does not, at most
    ``max_bypass`` times per head (default 8). Raises ``ValueError`` for a negative ``max_bypass``."""

    name = "backfill"

    def __init__(self, max_bypass: int = 8) -> None:
        super().__init__()
        if max_bypass < 0:
            raise ValueError(f"max_bypass must be 0 or more, got {max_bypass}")
        self.max_bypass = max_bypass
        self._bypassed: dict[int, int] = {}  # head's seq -> times passed

    def remove(self, waiting: Waiting) -> bool:
        self._bypassed.pop(waiting.seq, None)
        return super().remove(waiting)

    def pick(self, fits: Callable[[Reservation], bool]) -> Waiting | None:
        order = self.ordered()
        if not order:
            return None
        head = order[0]
        if fits(head.reservation):
            self.remove(head)
            return head
        if self._bypassed.get(head.seq, 0) >= self.max_bypass:
            return None  # the head has waited long enough: nothing passes it any more
        for waiting in order[1:]:
            if fits(waiting.reservation):
                self._bypassed[head.seq] = self._bypassed.get(head.seq, 0) + 1
                self.remove(waiting)
                return waiting
        return None

    def bypassed(self, waiting: Waiting) -> int:
        """How many calls have passed ``waiting`` while it was at the head."""
        return self._bypassed.get(waiting.seq, 0)

"""``fifo``: lower ``priority`` first, arrival order among equals, no barging.

A head that does not fit keeps every later call waiting. Predictable; a long head can hold
short calls that would fit.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from squad.sched.room import Reservation, Waiting

__all__ = ["FifoQueue"]


class FifoQueue:
    """Lower priority number first, arrival order among equals, never barging."""

    name = "fifo"

    def __init__(self) -> None:
        self._waiting: list[Waiting] = []

    def _key(self, waiting: Waiting) -> tuple[float, ...]:
        return (waiting.reservation.priority, waiting.seq)

    def add(self, waiting: Waiting) -> None:
        self._waiting.append(waiting)

    def remove(self, waiting: Waiting) -> bool:
        if waiting in self._waiting:
            self._waiting.remove(waiting)
            return True
        return False

    def ordered(self) -> list[Waiting]:
        return sorted(self._waiting, key=self._key)

    def pick(self, fits: Callable[[Reservation], bool]) -> Waiting | None:
        order = self.ordered()
        if order and fits(order[0].reservation):
            self._waiting.remove(order[0])
            return order[0]
        return None

    def served(self, reservation: Reservation, held_s: float) -> None:
        return None

    def __len__(self) -> int:
        return len(self._waiting)

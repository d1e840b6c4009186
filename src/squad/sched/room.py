"""What a queue policy is shown: a :class:`Waiting` call and the :class:`Room` Admission has free.

Admission (:mod:`squad.sched.admission`) keeps the books and builds a :class:`Room` each time it
asks its :class:`~squad.sched.policy.QueuePolicy` to pick; the policies
(:mod:`squad.sched.policies`) read these two shapes and nothing else of Admission.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from squad.sched.admission import Reservation

__all__ = ["Room", "Waiting"]


class Waiting(Protocol):
    """A call in the queue: its reservation request and its arrival number ``seq``."""

    @property
    def reservation(self) -> Reservation: ...

    @property
    def seq(self) -> int: ...


@dataclass(frozen=True)
class Room:
    """What Admission has free when it asks a policy to pick: call it with a reservation to
    know whether that fits now (a free slot is given: Admission asks only then)."""

    fits: Callable[[Reservation], bool]
    free: int
    """KV cells of the pool not reserved, in tokens."""
    pool: int
    """KV cells of the whole pool, in tokens."""
    slots: int
    running: int
    """Calls in flight."""

    def __call__(self, reservation: Reservation) -> bool:
        return self.fits(reservation)

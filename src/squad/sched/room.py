"""What a queue policy is shown: a :class:`Waiting` call (its :class:`Reservation`) and the :class:`Room`
Admission has free.

Admission (:mod:`squad.sched.admission`) keeps the books and builds a :class:`Room` each time it
asks its :class:`~squad.sched.policy.QueuePolicy` to pick; the policies
(:mod:`squad.sched.policies`) read these two shapes and nothing else of Admission.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from squad.events import Origin

__all__ = ["Reservation", "Room", "Waiting"]


@dataclass
class Reservation:
    """A granted reservation: ``tokens`` KV cells and slot number ``slot`` (0-based) held
    for ``origin`` (its call id ``call``) until the ``reserve()`` block exits; ``queued_s``
    seconds spent waiting."""

    origin: Origin
    tokens: int
    priority: int = 0
    slot: int = -1
    queued_s: float = 0.0
    call: str | None = None
    settling: bool = False
    """Its request has ended on squad's side but the engine may still work on it: still counted
    until :func:`squad.chat.settle.until_engine_free` sees the engine's slot free."""

    @property
    def agent(self) -> str:
        return self.origin.agent


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

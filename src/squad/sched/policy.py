"""Queue policies: which waiting call :class:`~squad.sched.admission.Admission` grants next.

Admission keeps the books (slots, the pool's reserved cells); a policy only orders the
waiting calls and picks one that fits, the split vLLM's scheduler makes between its
``RequestQueue`` and its KV manager. A policy is any object with the methods of
:class:`QueuePolicy`, one per module in :mod:`squad.sched.policies`; pick one by name with
:func:`queue_policy`:

- ``fifo`` (:mod:`~squad.sched.policies.fifo`): lower ``priority`` first, arrival order among
  equals, no barging.
- ``backfill`` (:mod:`~squad.sched.policies.backfill`): the same order, but a later call that fits
  may pass a head that does not, at most ``max_bypass`` times per head.
- ``program`` (default, :data:`DEFAULT_QUEUE`; :mod:`~squad.sched.policies.program`): the program
  that has held the engine least goes first, then the smaller call; large calls are held a moment
  for short ones; bounded so no call waits unboundedly.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from squad.sched.policies.backfill import BackfillQueue
from squad.sched.policies.fifo import FifoQueue
from squad.sched.policies.program import ProgramQueue
from squad.sched.room import Room, Waiting

if TYPE_CHECKING:
    from squad.sched.room import Reservation

__all__ = ["DEFAULT_QUEUE", "QUEUE_POLICIES", "BackfillQueue", "FifoQueue", "ProgramQueue", "QueuePolicy", "Room",
           "Waiting", "queue_name", "queue_policy"]


class QueuePolicy(Protocol):
    """Orders waiting calls. ``pick(fits)`` returns the next call to grant (already removed
    from the queue) or None; ``fits(reservation)`` says whether it fits the free room now (Admission
    passes a :class:`Room`, which also tells the free cells, pool, slots and calls running).
    ``served`` reports a call's end (seconds it held its slot) for policies that weigh service.
    A policy that holds a call for a while may add ``wake_in() -> float | None`` (seconds until a
    hold ends), so Admission asks it again then."""

    @property
    def name(self) -> str: ...

    def add(self, waiting: Waiting) -> None: ...

    def remove(self, waiting: Waiting) -> bool: ...

    def pick(self, fits: Callable[[Reservation], bool]) -> Waiting | None: ...

    def ordered(self) -> list[Waiting]: ...

    def served(self, reservation: Reservation, held_s: float) -> None: ...


DEFAULT_QUEUE = "program"
"""The policy used when none is named: measured in bench/results.md ("Queue policies on mixed
calls"); ``fifo`` stays selectable."""

QUEUE_POLICIES: dict[str, Callable[[], QueuePolicy]] = {
    "fifo": FifoQueue,
    "backfill": BackfillQueue,
    "program": ProgramQueue,
}
"""Policies selectable by name (``queue="fifo"``, ``--queue``, a recipe's ``engine: queue:``)."""


def queue_name(name: str) -> str:
    """``name`` as a key of :data:`QUEUE_POLICIES` (trimmed, lower case). Raises ``ValueError`` naming the known
    policies for an unknown name."""
    key = name.strip().lower()
    if key not in QUEUE_POLICIES:
        raise ValueError(f"unknown queue policy {name!r}: use one of {', '.join(QUEUE_POLICIES)}")
    return key


def queue_policy(policy: str | QueuePolicy | None) -> QueuePolicy:
    """A queue policy from its name (``fifo``, ``backfill``, ``program``), an instance (kept),
    or None (:data:`DEFAULT_QUEUE`). Raises ``ValueError`` naming the known policies for an unknown name."""
    if policy is None:
        return QUEUE_POLICIES[DEFAULT_QUEUE]()
    if isinstance(policy, str):
        return QUEUE_POLICIES[queue_name(policy)]()
    return policy

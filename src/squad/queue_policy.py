"""Queue policies: which waiting call :class:`~squad.admission.Admission` grants next.

Admission keeps the books (slots, the pool's reserved cells); a policy only orders the
waiting calls and picks one that fits, the split vLLM's scheduler makes between its
``RequestQueue`` and its KV manager. A policy is any object with the four methods of
:class:`QueuePolicy`; pick one by name with :func:`queue_policy`:

- ``fifo`` (default): lower ``priority`` first, arrival order among equals, no barging: a
  head that does not fit keeps every later call waiting. Predictable; a long head can hold
  short calls that would fit.
- ``backfill``: the same order, but while the head does not fit, a later call that fits the
  free room may pass it, at most ``max_bypass`` times per head (then the head blocks the
  queue like ``fifo`` until it fits, so it waits at most for ``max_bypass`` calls plus the
  ones already running: never unboundedly).
- ``program``: program-aware (after Autellix's program-level attained service): among calls
  of equal ``priority``, the program that has held the engine least so far goes first (a
  program is a top-level conversation with all the sub-agents it started), then arrival
  order; backfill as above.
"""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING, Callable, Protocol

if TYPE_CHECKING:
    from squad.admission import Reservation

__all__ = ["QUEUE_POLICIES", "BackfillQueue", "FifoQueue", "ProgramQueue", "QueuePolicy", "Waiting", "queue_policy"]


class Waiting(Protocol):
    """A call in the queue: its reservation request and its arrival number ``seq``."""

    @property
    def reservation(self) -> "Reservation": ...

    @property
    def seq(self) -> int: ...


class QueuePolicy(Protocol):
    """Orders waiting calls. ``pick(fits)`` returns the next call to grant (already removed
    from the queue) or None; ``fits(reservation)`` says whether it fits the free room now.
    ``served`` reports a call's end (seconds it held its slot) for policies that weigh service."""

    name: str

    def add(self, waiting: Waiting) -> None: ...

    def remove(self, waiting: Waiting) -> bool: ...

    def pick(self, fits: Callable[["Reservation"], bool]) -> Waiting | None: ...

    def ordered(self) -> list[Waiting]: ...

    def served(self, reservation: "Reservation", held_s: float) -> None: ...


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

    def pick(self, fits: Callable[["Reservation"], bool]) -> Waiting | None:
        order = self.ordered()
        if order and fits(order[0].reservation):
            self._waiting.remove(order[0])
            return order[0]
        return None

    def served(self, reservation: "Reservation", held_s: float) -> None:
        return None

    def __len__(self) -> int:
        return len(self._waiting)


class BackfillQueue(FifoQueue):
    """FIFO by priority, and a call that fits may pass a head that does not, at most
    ``max_bypass`` times per head (default 8)."""

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

    def pick(self, fits: Callable[["Reservation"], bool]) -> Waiting | None:
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


class ProgramQueue(BackfillQueue):
    """Priority first, then the program with the least attained service (seconds its calls held
    a slot), then arrival; backfill bounded by ``max_bypass``."""

    name = "program"

    def __init__(self, max_bypass: int = 8) -> None:
        super().__init__(max_bypass)
        self._root: dict[str, str] = {}  # conversation -> its program (top-level conversation)
        self._service: defaultdict[str, float] = defaultdict(float)

    def program(self, reservation: "Reservation") -> str:
        """The program a call belongs to: its top-level conversation (or its agent's name)."""
        origin = reservation.origin
        conversation = origin.conversation or origin.agent
        if conversation not in self._root:
            parent = origin.parent
            self._root[conversation] = self._root.get(parent, parent) if parent else conversation
        return self._root[conversation]

    def add(self, waiting: Waiting) -> None:
        self.program(waiting.reservation)
        super().add(waiting)

    def _key(self, waiting: Waiting) -> tuple[float, ...]:
        r = waiting.reservation
        return (r.priority, self._service[self.program(r)], waiting.seq)

    def served(self, reservation: "Reservation", held_s: float) -> None:
        self._service[self.program(reservation)] += max(0.0, held_s)

    def attained(self, program: str) -> float:
        """Seconds of slot time the program's calls have held so far."""
        return self._service.get(program, 0.0)


QUEUE_POLICIES: dict[str, Callable[[], QueuePolicy]] = {
    "fifo": FifoQueue,
    "backfill": BackfillQueue,
    "program": ProgramQueue,
}


def queue_policy(policy: "str | QueuePolicy | None") -> QueuePolicy:
    """A queue policy from its name (``fifo``, ``backfill``, ``program``), an instance (kept),
    or None (``fifo``). Raises ``ValueError`` naming the known policies for an unknown name."""
    if policy is None:
        return FifoQueue()
    if isinstance(policy, str):
        try:
            return QUEUE_POLICIES[policy.strip().lower()]()
        except KeyError:
            raise ValueError(f"unknown queue policy {policy!r}: use one of {', '.join(QUEUE_POLICIES)}") from None
    return policy

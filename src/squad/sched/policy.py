"""Queue policies: which waiting call :class:`~squad.sched.admission.Admission` grants next.

Admission keeps the books (slots, the pool's reserved cells); a policy only orders the
waiting calls and picks one that fits, the split vLLM's scheduler makes between its
``RequestQueue`` and its KV manager. A policy is any object with the four methods of
:class:`QueuePolicy`; pick one by name with :func:`queue_policy`:

- ``fifo``: lower ``priority`` first, arrival order among equals, no barging: a
  head that does not fit keeps every later call waiting. Predictable; a long head can hold
  short calls that would fit.
- ``backfill``: the same order, but while the head does not fit, a later call that fits the
  free room may pass it, at most ``max_bypass`` times per head (then the head blocks the
  queue like ``fifo`` until it fits, so it waits at most for ``max_bypass`` calls plus the
  ones already running: never unboundedly).
- ``program`` (default, :data:`DEFAULT_QUEUE`): program-aware (after Autellix's program-level
  attained service): among calls of equal ``priority``, the program that has held the engine least so far goes first (a
  program is a top-level conversation with all the sub-agents it started), then the smaller
  reservation, then arrival; a call that fits passes one that does not; a call larger than one
  share of the pool (``pool / slots``) that would take the last share while others run is held
  ``hold_s`` (0.25 s) so short calls asked with it go first; bounded: once ``max_bypass`` later
  calls worth its own reservation have passed a call, nothing passes it any more.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Protocol

if TYPE_CHECKING:
    from squad.sched.admission import Reservation

__all__ = ["DEFAULT_QUEUE", "QUEUE_POLICIES", "BackfillQueue", "FifoQueue", "ProgramQueue", "QueuePolicy", "Room", "Waiting", "queue_policy"]


class Waiting(Protocol):
    """A call in the queue: its reservation request and its arrival number ``seq``."""

    @property
    def reservation(self) -> "Reservation": ...

    @property
    def seq(self) -> int: ...


@dataclass(frozen=True)
class Room:
    """What Admission has free when it asks a policy to pick: call it with a reservation to
    know whether that fits now (a free slot is given: Admission asks only then)."""

    fits: Callable[["Reservation"], bool]
    free: int
    """KV cells of the pool not reserved, in tokens."""
    pool: int
    slots: int
    running: int
    """Calls in flight."""

    def __call__(self, reservation: "Reservation") -> bool:
        return self.fits(reservation)


class QueuePolicy(Protocol):
    """Orders waiting calls. ``pick(fits)`` returns the next call to grant (already removed
    from the queue) or None; ``fits(reservation)`` says whether it fits the free room now (Admission
    passes a :class:`Room`, which also tells the free cells, pool, slots and calls running).
    ``served`` reports a call's end (seconds it held its slot) for policies that weigh service.
    A policy that holds a call for a while may add ``wake_in() -> float | None`` (seconds until a
    hold ends), so Admission asks it again then."""

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


class ProgramQueue:
    """Program-aware order with room kept for short calls, bounded for every call.

    Order: ``priority``; then the program with the least attained service (seconds its calls
    held a slot); then the smaller reservation (the cheaper call first, what least-attained
    service amounts to between programs that have had nothing yet); then arrival. A call that
    fits may pass one that does not.

    Room: a *large* call (more than one share of the pool, ``pool / slots`` cells) that would
    leave less than one share free while another call runs is held for ``hold_s`` seconds after
    it was asked (0.25 s), so the short calls asked with it go first instead of waiting for it to
    finish; after that it goes like any other call.

    Bound: a call is *due* once at least ``max_bypass`` (8) calls asked after it were granted
    before it and together reserved at least as many cells as it asks for. Due calls
    go first, in arrival order, and one that does not fit stops everything behind it until it
    fits; so no call waits for more than the calls already running, the due calls asked before
    it, and later calls worth its own reservation.
    """

    name = "program"

    def __init__(self, max_bypass: int = 8, hold_s: float = 0.25, clock: Callable[[], float] = time.monotonic) -> None:
        if max_bypass < 0 or hold_s < 0:
            raise ValueError(f"max_bypass and hold_s must be 0 or more, got {max_bypass}, {hold_s}")
        self.max_bypass, self.hold_s, self._clock = max_bypass, hold_s, clock
        self._waiting: dict[int, Waiting] = {}  # seq -> call
        self._asked: dict[int, float] = {}  # seq -> clock() when it was added
        self._passed: dict[int, tuple[int, int]] = {}  # seq -> (calls, cells) granted before it though asked after
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
        self._waiting[waiting.seq] = waiting
        self._asked[waiting.seq] = self._clock()
        self._passed[waiting.seq] = (0, 0)

    def remove(self, waiting: Waiting) -> bool:
        if self._waiting.get(waiting.seq) is not waiting:
            return False
        del self._waiting[waiting.seq], self._asked[waiting.seq], self._passed[waiting.seq]
        return True

    def due(self, waiting: Waiting) -> bool:
        """Whether ``waiting`` has been passed enough that nothing may pass it any more."""
        calls, cells = self._passed.get(waiting.seq, (0, 0))
        return calls >= self.max_bypass and cells >= waiting.reservation.tokens

    def _key(self, waiting: Waiting) -> tuple[float, ...]:
        r = waiting.reservation
        return (r.priority, self._service[self.program(r)], r.tokens, waiting.seq)

    def ordered(self) -> list[Waiting]:
        calls = list(self._waiting.values())
        due = sorted((w for w in calls if self.due(w)), key=lambda w: w.seq)
        return due + sorted((w for w in calls if not self.due(w)), key=self._key)

    def _held(self, waiting: Waiting, room: "Callable[[Reservation], bool]", now: float) -> bool:
        if not isinstance(room, Room) or room.running == 0 or now - self._asked[waiting.seq] >= self.hold_s:
            return False
        share = room.pool // max(room.slots, 1)
        tokens = waiting.reservation.tokens
        return tokens > share and room.free - tokens < share

    def pick(self, fits: Callable[["Reservation"], bool]) -> Waiting | None:
        now = self._clock()
        for waiting in self.ordered():
            due = self.due(waiting)
            if not fits(waiting.reservation) or (not due and self._held(waiting, fits, now)):
                if due:
                    return None  # a due call that cannot go yet: nothing passes it
                continue
            self.remove(waiting)
            for other in self._waiting.values():
                if other.seq < waiting.seq:
                    calls, cells = self._passed[other.seq]
                    self._passed[other.seq] = (calls + 1, cells + waiting.reservation.tokens)
            return waiting
        return None

    def wake_in(self) -> float | None:
        """Seconds until the first hold of a waiting call ends (None: none is held), for
        Admission to look again then even if no call arrives or ends meanwhile."""
        now = self._clock()
        ends = [asked + self.hold_s - now for asked in self._asked.values() if asked + self.hold_s > now]
        return min(ends) if ends else None

    def served(self, reservation: "Reservation", held_s: float) -> None:
        self._service[self.program(reservation)] += max(0.0, held_s)

    def attained(self, program: str) -> float:
        """Seconds of slot time the program's calls have held so far."""
        return self._service.get(program, 0.0)

    def __len__(self) -> int:
        return len(self._waiting)


DEFAULT_QUEUE = "program"
"""The policy used when none is named: measured in bench/results.md ("Queue policies on mixed
calls"); ``fifo`` stays selectable."""

QUEUE_POLICIES: dict[str, Callable[[], QueuePolicy]] = {
    "fifo": FifoQueue,
    "backfill": BackfillQueue,
    "program": ProgramQueue,
}


def queue_policy(policy: "str | QueuePolicy | None") -> QueuePolicy:
    """A queue policy from its name (``fifo``, ``backfill``, ``program``), an instance (kept),
    or None (:data:`DEFAULT_QUEUE`). Raises ``ValueError`` naming the known policies for an unknown name."""
    if policy is None:
        return QUEUE_POLICIES[DEFAULT_QUEUE]()
    if isinstance(policy, str):
        try:
            return QUEUE_POLICIES[policy.strip().lower()]()
        except KeyError:
            raise ValueError(f"unknown queue policy {policy!r}: use one of {', '.join(QUEUE_POLICIES)}") from None
    return policy

"""``program`` (the default): program-aware order, after Autellix's program-level attained service.

Among calls of equal ``priority``, the program that has held the engine least so far goes first
(a program is a top-level conversation with all the sub-agents it started), then the smaller
reservation, then arrival; a call that fits passes one that does not; a large call is held a
moment so short calls asked with it go first; bounded (see :class:`ProgramQueue`).
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable
from typing import TYPE_CHECKING

from squad.sched.room import Room

if TYPE_CHECKING:
    from squad.sched.room import Reservation, Waiting

__all__ = ["ProgramQueue"]


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

    def program(self, reservation: Reservation) -> str:
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

    def _held(self, waiting: Waiting, room: Callable[[Reservation], bool], now: float) -> bool:
        if not isinstance(room, Room) or room.running == 0 or now - self._asked[waiting.seq] >= self.hold_s:
            return False
        share = room.pool // max(room.slots, 1)
        tokens = waiting.reservation.tokens
        return tokens > share and room.free - tokens < share

    def pick(self, fits: Callable[[Reservation], bool]) -> Waiting | None:
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

    def served(self, reservation: Reservation, held_s: float) -> None:
        self._service[self.program(reservation)] += max(0.0, held_s)

    def attained(self, program: str) -> float:
        """Seconds of slot time the program's calls have held so far."""
        return self._service.get(program, 0.0)

    def __len__(self) -> int:
        return len(self._waiting)

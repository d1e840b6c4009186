"""``program`` (the default): program-aware order, after Autellix's program-level attained service.

Among calls of equal ``priority``, the program that has held the engine least so far goes first
(a program is a top-level conversation with all the sub-agents it started), then the smaller
reservation, then arrival; a call that fits passes one that does not; a large call is held a
moment so short calls asked with it go first; bounded (see :class:`ProgramQueue`).
"""

from __future__ import annotations

import heapq
import time
from collections import OrderedDict, defaultdict, deque
from collections.abc import Callable
from typing import TYPE_CHECKING

from squad.sched.room import Room

if TYPE_CHECKING:
    from squad.sched.room import Reservation, Waiting

__all__ = ["ProgramQueue"]

_Group = tuple[int, str]  # (priority, program)

SCAN = 16
"""Programs :meth:`ProgramQueue.pick` looks at in order past ones whose next call does not fit (or is held)
before it grants the smallest waiting call instead (which fits): the cost of a pick stays O(log n)."""


class ProgramQueue:
    """Program-aware order with room kept for short calls, bounded for every call.

    Order: ``priority``; then the program with the least attained service (seconds its calls
    held a slot); then the smaller reservation (the cheaper call first, what least-attained
    service amounts to between programs that have had nothing yet); then arrival. A call that
    fits may pass one that does not (past :data:`SCAN` programs that cannot go, the smallest call goes).

    Room: a *large* call (more than one share of the pool, ``pool / slots`` cells) that would
    leave less than one share free while another call runs is held for ``hold_s`` seconds after
    it was asked (0.25 s), so the short calls asked with it go first instead of waiting for it to
    finish; after that it goes like any other call. A program's larger calls wait behind its held one.

    Bound: a call is *due* once at least ``max_bypass`` (8) calls asked after it were granted
    before it and together reserved at least as many cells as it asks for. Due calls
    go first, in arrival order, and one that does not fit stops everything behind it until it
    fits; so no call waits for more than the calls already running, the due calls asked before
    it, and later calls worth its own reservation.

    Cost per operation, n calls waiting, g programs waiting: ``add`` O(log n); ``remove`` O(log n)
    amortised; ``pick`` O(log n + log g) amortised (at most :data:`SCAN` programs looked at), plus
    one count per older call it passes, and a call is passed at most until it is due
    (``max_bypass`` calls and its own tokens' worth of cells: independent of n); ``served`` O(log g)
    per priority the program waits at; ``wake_in`` O(1) amortised; ``ordered`` O(n log n), for views only.
    The structures: per (priority, program) a min-heap of ``(tokens, seq)``; a min-heap of the
    programs by ``(priority, service, tokens, seq)`` of their next call; a heap of due calls by arrival;
    a min-heap of all calls by tokens; all with lazy deletion (an entry that no longer matches is
    dropped when it reaches the top; rebuilt in O(n) when dead entries outnumber live ones).
    Calls are added in ``seq`` order (Admission numbers them as they ask).
    """

    name = "program"

    def __init__(self, max_bypass: int = 8, hold_s: float = 0.25, clock: Callable[[], float] = time.monotonic) -> None:
        if max_bypass < 0 or hold_s < 0:
            raise ValueError(f"max_bypass and hold_s must be 0 or more, got {max_bypass}, {hold_s}")
        self.max_bypass, self.hold_s, self._clock = max_bypass, hold_s, clock
        self._waiting: OrderedDict[int, Waiting] = OrderedDict()  # seq -> call, in arrival order
        self._asked: dict[int, float] = {}  # seq -> clock() when it was added
        self._passed: dict[int, tuple[int, int]] = {}  # seq -> (calls, cells) granted before it though asked after
        self._root: dict[str, str] = {}  # conversation -> its program (top-level conversation)
        self._service: defaultdict[str, float] = defaultdict(float)
        self._due: list[int] = []  # seqs of due calls, a min-heap
        self._is_due: set[int] = set()
        self._groups: dict[_Group, list[tuple[int, int]]] = {}  # (priority, program) -> heap of (tokens, seq)
        self._of_program: defaultdict[str, set[int]] = defaultdict(set)  # program -> priorities it has a group at
        self._top: list[tuple[int, float, int, int, str]] = []  # (priority, service, tokens, seq, program)
        self._small: list[tuple[int, int]] = []  # (tokens, seq) of every call
        self._holds: deque[tuple[float, int]] = deque()  # (asked, seq) of calls that may be held, arrival order
        self._share: int | None = None  # pool / slots of the last Room seen (None: none seen yet)
        self._entries = 0  # heap entries pushed since the last rebuild (live or dead)

    def program(self, reservation: Reservation) -> str:
        """The program a call belongs to: its top-level conversation (or its agent's name)."""
        origin = reservation.origin
        conversation = origin.conversation or origin.agent
        root = self._root.get(conversation)
        if root is None:
            parent = origin.parent
            root = self._root[conversation] = self._root.get(parent, parent) if parent else conversation
        return root

    # -- the books -----------------------------------------------------------------------

    def add(self, waiting: Waiting) -> None:
        r, seq = waiting.reservation, waiting.seq
        now = self._clock()
        self._waiting[seq] = waiting
        self._asked[seq] = now
        self._passed[seq] = (0, 0)
        group = (r.priority, self.program(r))
        heap = self._groups.get(group)
        if heap is None:
            heap = self._groups[group] = []
            self._of_program[group[1]].add(group[0])
        heapq.heappush(heap, (r.tokens, seq))
        if heap[0][1] == seq:
            self._push_group(group)
        heapq.heappush(self._small, (r.tokens, seq))
        self._entries += 2
        while self._holds and self._holds[0][0] + self.hold_s <= now:
            self._holds.popleft()
        if self._share is None or r.tokens > self._share:
            self._holds.append((now, seq))

    def remove(self, waiting: Waiting) -> bool:
        seq = waiting.seq
        if self._waiting.get(seq) is not waiting:
            return False
        del self._waiting[seq], self._asked[seq], self._passed[seq]
        self._is_due.discard(seq)
        group = (waiting.reservation.priority, self.program(waiting.reservation))
        heap = self._groups.get(group)
        if heap and heap[0][1] == seq:
            self._push_group(group)
        if self._entries > 2 * (2 * len(self._waiting) + len(self._groups)) + 64:
            self._rebuild()
        return True

    def _live(self, seq: int) -> bool:
        """Whether ``seq`` waits in the ordinary order (not removed, not due)."""
        return seq in self._waiting and seq not in self._is_due

    def _head(self, group: _Group) -> tuple[int, int] | None:
        """The group's next call as ``(tokens, seq)``, dead entries dropped; the group goes when empty."""
        heap = self._groups.get(group)
        while heap and not self._live(heap[0][1]):
            heapq.heappop(heap)
        if heap:
            return heap[0]
        if heap is not None:
            del self._groups[group]
            self._of_program[group[1]].discard(group[0])
            if not self._of_program[group[1]]:
                del self._of_program[group[1]]
        return None

    def _push_group(self, group: _Group) -> None:
        """Enter the group's next call in the order of programs (after its head or service changed)."""
        head = self._head(group)
        if head is not None:
            heapq.heappush(self._top, (group[0], self._service[group[1]], head[0], head[1], group[1]))
            self._entries += 1

    def _current(self, entry: tuple[int, float, int, int, str]) -> bool:
        priority, service, tokens, seq, program = entry
        return (self._service[program] == service and self._live(seq)
                and self._head((priority, program)) == (tokens, seq))

    def _rebuild(self) -> None:
        """Every heap again from the live calls: O(n), once per n removals or more."""
        self._groups, self._of_program = {}, defaultdict(set)
        self._small = [(w.reservation.tokens, s) for s, w in self._waiting.items()]
        self._due = [s for s in self._due if s in self._waiting]
        for seq, w in self._waiting.items():
            group = (w.reservation.priority, self.program(w.reservation))
            self._groups.setdefault(group, []).append((w.reservation.tokens, seq))
            self._of_program[group[1]].add(group[0])
        heapq.heapify(self._small)
        heapq.heapify(self._due)
        for heap in self._groups.values():
            heapq.heapify(heap)
        self._top, self._entries = [], 2 * len(self._waiting)
        for group in list(self._groups):
            self._push_group(group)

    # -- the order -----------------------------------------------------------------------

    def due(self, waiting: Waiting) -> bool:
        """Whether ``waiting`` has been passed enough that nothing may pass it any more."""
        calls, cells = self._passed.get(waiting.seq, (0, 0))
        return calls >= self.max_bypass and cells >= waiting.reservation.tokens

    def _key(self, waiting: Waiting) -> tuple[float, ...]:
        r = waiting.reservation
        return (r.priority, self._service[self.program(r)], r.tokens, waiting.seq)

    def ordered(self) -> list[Waiting]:
        calls = list(self._waiting.values())
        due = [w for w in calls if w.seq in self._is_due]
        return due + sorted((w for w in calls if w.seq not in self._is_due), key=self._key)

    def _held(self, waiting: Waiting, room: Callable[[Reservation], bool], now: float) -> bool:
        if not isinstance(room, Room) or room.running == 0 or now - self._asked[waiting.seq] >= self.hold_s:
            return False
        share = room.pool // max(room.slots, 1)
        tokens = waiting.reservation.tokens
        return tokens > share and room.free - tokens < share

    def _first(self, heap: list, index: int) -> Waiting | None:
        """The live call at the top of ``heap`` (its seq at ``index`` of an entry), dead entries dropped."""
        while heap and not self._live(heap[0][index]):
            heapq.heappop(heap)
        return self._waiting[heap[0][index]] if heap else None

    def pick(self, fits: Callable[[Reservation], bool]) -> Waiting | None:
        if isinstance(fits, Room):
            self._share = fits.pool // max(fits.slots, 1)
        while self._due and self._due[0] not in self._waiting:
            heapq.heappop(self._due)
        if self._due:  # due calls first, in arrival order; one that cannot go stops everything
            waiting = self._waiting[self._due[0]]
            return self._grant(waiting) if fits(waiting.reservation) else None
        smallest = self._first(self._small, 1)
        if smallest is None or not fits(smallest.reservation):
            return None  # nothing fits
        now = self._clock()
        looked: list[tuple[int, float, int, int, str]] = []
        chosen = None
        while self._top and len(looked) < SCAN:
            entry = heapq.heappop(self._top)
            if not self._current(entry):
                continue
            waiting = self._waiting[entry[3]]
            if fits(waiting.reservation) and not self._held(waiting, fits, now):
                chosen = waiting
                break
            looked.append(entry)
        for entry in looked:
            heapq.heappush(self._top, entry)
        if chosen is None and len(looked) == SCAN and not self._held(smallest, fits, now):
            chosen = smallest
        return self._grant(chosen) if chosen is not None else None

    def _grant(self, waiting: Waiting) -> Waiting:
        """Take ``waiting`` out and count it against every older call still waiting (each of which is
        passed only until it is due: see the class)."""
        self.remove(waiting)
        tokens = waiting.reservation.tokens
        for other in self._waiting.values():
            if other.seq >= waiting.seq:
                break
            calls, cells = self._passed[other.seq]
            self._passed[other.seq] = passed = (calls + 1, cells + tokens)
            if other.seq not in self._is_due and passed[0] >= self.max_bypass and passed[1] >= other.reservation.tokens:
                self._is_due.add(other.seq)
                heapq.heappush(self._due, other.seq)
                self._entries += 1
                group = (other.reservation.priority, self.program(other.reservation))
                heap = self._groups.get(group)
                if heap and heap[0][1] == other.seq:
                    self._push_group(group)
        return waiting

    def wake_in(self) -> float | None:
        """Seconds until the first hold of a waiting call ends (None: none is held), for
        Admission to look again then even if no call arrives or ends meanwhile."""
        now = self._clock()
        while self._holds and (self._holds[0][0] + self.hold_s <= now or self._holds[0][1] not in self._waiting):
            self._holds.popleft()
        return self._holds[0][0] + self.hold_s - now if self._holds else None

    def served(self, reservation: Reservation, held_s: float) -> None:
        program = self.program(reservation)
        self._service[program] += max(0.0, held_s)
        for priority in list(self._of_program.get(program, ())):
            self._push_group((priority, program))

    def attained(self, program: str) -> float:
        """Seconds of slot time the program's calls have held so far."""
        return self._service.get(program, 0.0)

    def __len__(self) -> int:
        return len(self._waiting)

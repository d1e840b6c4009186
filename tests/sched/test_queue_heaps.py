"""The queue policies on heaps (issue 31: O(log n) per operation in the calls waiting) pick exactly what the
plain sort-everything order picks, for every sequence of adds, cancels, picks and service hypothesis finds."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from squad.events import Origin
from squad.sched.policy import BackfillQueue, FifoQueue, ProgramQueue
from squad.sched.room import Reservation, Room


@dataclass(eq=False)
class W:
    reservation: Reservation
    seq: int


class NaiveProgram:
    """The program order written plainly (sort everything, count every pass): the reference."""

    def __init__(self, max_bypass: int) -> None:
        self.max_bypass = max_bypass
        self.waiting: dict[int, W] = {}
        self.passed: dict[int, tuple[int, int]] = {}
        self.service: dict[str, float] = {}
        self.program: Callable[[Reservation], str] = lambda r: r.origin.conversation or r.origin.agent

    def due(self, w: W) -> bool:
        calls, cells = self.passed[w.seq]
        return calls >= self.max_bypass and cells >= w.reservation.tokens

    def ordered(self) -> list[W]:
        calls = list(self.waiting.values())
        key = lambda w: (w.reservation.priority, self.service.get(self.program(w.reservation), 0.0),  # noqa: E731
                         w.reservation.tokens, w.seq)
        return sorted((w for w in calls if self.due(w)), key=lambda w: w.seq) + sorted(
            (w for w in calls if not self.due(w)), key=key)

    def pick(self, fits: Callable[[Reservation], bool]) -> W | None:
        for w in self.ordered():
            if not fits(w.reservation):
                if self.due(w):
                    return None
                continue
            del self.waiting[w.seq]
            for other in self.waiting.values():
                if other.seq < w.seq:
                    c, t = self.passed[other.seq]
                    self.passed[other.seq] = (c + 1, t + w.reservation.tokens)
            return w
        return None


# an operation: ("add", tokens, priority, program) | ("cancel", index) | ("pick", free) | ("serve", program, s)
_ops = st.lists(st.one_of(
    st.tuples(st.just("add"), st.integers(1, 100), st.integers(0, 2), st.integers(0, 5)),
    st.tuples(st.just("cancel"), st.integers(0, 50)),
    st.tuples(st.just("pick"), st.integers(0, 200)),
    st.tuples(st.just("serve"), st.integers(0, 5), st.floats(0, 3)),
), max_size=120)


def _room(free: int) -> Room:
    return Room(lambda r: r.tokens <= free, free=free, pool=400, slots=4, running=0)


@settings(max_examples=150, deadline=None)
@given(ops=_ops, max_bypass=st.integers(0, 4))
def test_program_heaps_pick_what_the_plain_order_picks(ops, max_bypass):
    """At most 6 programs (< SCAN) and nothing running (no hold): the heap policy and the plain sort
    agree on every pick, and on the order shown."""
    q, ref = ProgramQueue(max_bypass=max_bypass), NaiveProgram(max_bypass)
    added: list[W] = []
    for op in ops:
        if op[0] == "add":
            w = W(Reservation(Origin("a", conversation=f"p{op[3]}"), op[1], priority=op[2]), len(added))
            added.append(w)
            q.add(w)
            ref.waiting[w.seq], ref.passed[w.seq] = w, (0, 0)
        elif op[0] == "cancel" and added:
            w = added[op[1] % len(added)]
            assert q.remove(w) == (ref.waiting.pop(w.seq, None) is not None)
        elif op[0] == "pick":
            assert q.pick(_room(op[1])) is ref.pick(_room(op[1]))
        elif op[0] == "serve":
            r = Reservation(Origin("a", conversation=f"p{op[1]}"), 1)
            q.served(r, op[2])
            ref.service[f"p{op[1]}"] = ref.service.get(f"p{op[1]}", 0.0) + op[2]
        assert len(q) == len(ref.waiting)
        assert q.ordered() == ref.ordered()


@settings(max_examples=150, deadline=None)
@given(ops=_ops, max_bypass=st.integers(0, 3))
def test_fifo_and_backfill_heaps_pick_what_the_plain_order_picks(ops, max_bypass):
    """fifo: the first by (priority, arrival) if it fits; backfill: that, or else the smallest call that fits,
    at most max_bypass times per head."""
    fifo, back = FifoQueue(), BackfillQueue(max_bypass=max_bypass)
    waiting: dict[int, W] = {}
    bypassed: dict[int, int] = {}
    added: list[W] = []
    for op in ops:
        if op[0] == "add":
            w = W(Reservation(Origin("a"), op[1], priority=op[2]), len(added))
            added.append(w)
            fifo.add(w)
            back.add(w)
            waiting[w.seq] = w
        elif op[0] == "cancel" and added:
            w = added[op[1] % len(added)]
            gone = waiting.pop(w.seq, None) is not None
            assert fifo.remove(w) == gone and back.remove(w) == gone
        elif op[0] == "pick":
            order = sorted(waiting.values(), key=lambda w: (w.reservation.priority, w.seq))
            fits = _room(op[1])
            head = order[0] if order else None
            want_fifo = head if head is not None and fits(head.reservation) else None
            assert fifo.pick(fits) is want_fifo
            want = want_fifo
            if head is not None and want is None and bypassed.get(head.seq, 0) < max_bypass:
                small = min(order, key=lambda w: (w.reservation.tokens, w.reservation.priority, w.seq))
                if small is not head and fits(small.reservation):
                    want = small
                    bypassed[head.seq] = bypassed.get(head.seq, 0) + 1
            got = back.pick(fits)
            assert got is want
            if want_fifo is not None:
                waiting.pop(want_fifo.seq)
            if got is not None and got is not want_fifo:
                waiting.pop(got.seq)
                assert fifo.remove(got)
            elif got is None and want_fifo is not None:
                pass
            if want_fifo is not None and got is not want_fifo:
                back.remove(want_fifo)
        assert len(fifo) == len(waiting) and len(back) == len(waiting)
        assert fifo.ordered() == sorted(waiting.values(), key=lambda w: (w.reservation.priority, w.seq))


def test_twenty_thousand_calls_cost_the_policy_no_sort_per_pick():
    """The structures stay O(log n): 20,000 adds and picks of one program each (a map's shape) run without the
    plain order's n-squared work (this would take minutes at O(n) per pick; no wall clock is asserted)."""
    q = ProgramQueue()
    calls = [W(Reservation(Origin("a", conversation=f"a#{i}"), 10 + i % 7), i) for i in range(20_000)]
    for w in calls:
        q.add(w)
    got = [q.pick(_room(400)) for _ in calls]
    assert len(q) == 0 and sorted(w.seq for w in got if w is not None) == list(range(20_000))

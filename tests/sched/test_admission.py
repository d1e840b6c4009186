"""Admission: slots and the unified pool are never over-committed; order is FIFO by priority under
``queue="fifo"`` (the default policy, ``program``, is tested in tests/sched/test_queue_policy.py)."""

from __future__ import annotations

import anyio
import pytest

from squad.errors import AdmissionError
from squad.events import Event
from squad.sched.admission import Admission

pytestmark = pytest.mark.anyio


async def test_one_call_larger_than_the_pool_fails_at_once_naming_agent_and_fix():
    adm = Admission(slots=4, pool=1024)
    with pytest.raises(AdmissionError) as err:
        async with adm.reserve(1100, agent="writer"):
            pass
    msg = str(err.value)
    assert err.value.agent == "writer"
    assert "writer" in msg and "1100" in msg and "1024" in msg
    assert "raise the context to 1280" in msg and "max_tokens" in msg


async def test_per_request_limit_applies():
    adm = Admission(slots=2, pool=2048, per_request_limit=1024)
    with pytest.raises(AdmissionError):
        async with adm.reserve(1500, agent="a"):
            pass


async def test_waits_for_pool_and_never_reserves_more_than_it():
    events: list[Event] = []
    adm = Admission(slots=4, pool=1024, on_event=events.append)
    peak = 0

    async def call(i: int) -> None:
        nonlocal peak
        async with adm.reserve(570, agent=f"a{i}"):
            peak = max(peak, adm.reserved)
            assert adm.reserved <= 1024
            await anyio.sleep(0.02)

    async with anyio.create_task_group() as tg:
        for i in range(4):
            tg.start_soon(call, i)
    assert peak == 570
    kinds = [e.kind for e in events]
    assert kinds.count("call.admitted") == 4 and kinds.count("call.released") == 4
    assert kinds.count("call.queued") == 3
    assert adm.in_flight == 0 and adm.reserved == 0


async def test_slots_bound_in_flight():
    adm = Admission(slots=2, pool=10_000)
    peak = 0

    async def call(i: int) -> None:
        nonlocal peak
        async with adm.reserve(10, agent=f"s{i}") as r:
            peak = max(peak, adm.in_flight)
            assert r.slot in (0, 1)
            await anyio.sleep(0.01)

    async with anyio.create_task_group() as tg:
        for i in range(5):
            tg.start_soon(call, i)
    assert peak == 2


async def _admission_order(adm: Admission, requests: list[tuple[str, int, int]]) -> list[str]:
    """Hold the whole pool, queue ``requests`` (agent, tokens, priority) in order, release."""
    order: list[str] = []
    gate = anyio.Event()

    async def blocker() -> None:
        async with adm.reserve(adm.pool, agent="blocker"):
            await gate.wait()

    async def call(agent: str, tokens: int, priority: int) -> None:
        async with adm.reserve(tokens, agent=agent, priority=priority):
            order.append(agent)
            await anyio.sleep(0.01)

    async with anyio.create_task_group() as tg:
        tg.start_soon(blocker)
        await anyio.sleep(0.01)
        for agent, tokens, priority in requests:
            tg.start_soon(call, agent, tokens, priority)
            await anyio.sleep(0.005)
        assert adm.queued == [a for a, _, _ in sorted(requests, key=lambda r: r[2])]
        gate.set()
    return order


async def test_fifo_among_equal_priority():
    adm = Admission(slots=1, pool=100, queue="fifo")
    assert await _admission_order(adm, [("a", 10, 1), ("b", 10, 1), ("c", 10, 1)]) == ["a", "b", "c"]


async def test_main_agent_goes_before_queued_sub_agents():
    adm = Admission(slots=1, pool=100)
    order = await _admission_order(adm, [("sub1", 10, 1), ("sub2", 10, 1), ("main", 10, 0)])
    assert order == ["main", "sub1", "sub2"]


async def test_head_of_queue_is_not_overtaken_by_smaller_requests():
    """``fifo`` on purpose: no barging (the default, ``program``, lets the small call pass)."""
    adm = Admission(slots=4, pool=100, queue="fifo")
    order: list[str] = []
    release_first = anyio.Event()

    async def hold(agent: str, tokens: int, until: anyio.Event | None) -> None:
        async with adm.reserve(tokens, agent=agent):
            order.append(agent)
            if until is not None:
                await until.wait()
            else:
                await anyio.sleep(0.01)

    async with anyio.create_task_group() as tg:
        tg.start_soon(hold, "first", 60, release_first)
        await anyio.sleep(0.01)
        tg.start_soon(hold, "big", 60, None)  # must wait for 'first'
        await anyio.sleep(0.01)
        tg.start_soon(hold, "small", 10, None)  # would fit now, but 'big' is ahead
        await anyio.sleep(0.02)
        assert order == ["first"] and adm.queued == ["big", "small"]
        release_first.set()
    assert order == ["first", "big", "small"]


async def test_cancelling_a_queued_call_removes_it_cleanly():
    events: list[Event] = []
    adm = Admission(slots=1, pool=100, on_event=events.append)
    gate = anyio.Event()
    admitted: list[str] = []

    async def holder() -> None:
        async with adm.reserve(100, agent="holder"):
            await gate.wait()

    async def later(agent: str) -> None:
        async with adm.reserve(50, agent=agent):
            admitted.append(agent)

    async with anyio.create_task_group() as tg:
        tg.start_soon(holder)
        await anyio.sleep(0.01)
        with anyio.CancelScope() as scope:
            async with anyio.create_task_group() as inner:
                inner.start_soon(later, "doomed")
                await anyio.sleep(0.01)
                assert adm.queued == ["doomed"]
                scope.cancel()
        assert adm.queued == []
        tg.start_soon(later, "next")
        await anyio.sleep(0.01)
        gate.set()
    assert admitted == ["next"]
    assert adm.in_flight == 0 and adm.reserved == 0


async def test_drain_waits_for_in_flight_and_hold_pauses_admission():
    adm = Admission(slots=2, pool=100)
    done = anyio.Event()
    admitted: list[str] = []

    async def running() -> None:
        async with adm.reserve(50, agent="r"):
            await anyio.sleep(0.05)
        done.set()

    async def late() -> None:
        async with adm.reserve(50, agent="late"):
            admitted.append("late")

    async with anyio.create_task_group() as tg:
        tg.start_soon(running)
        await anyio.sleep(0.01)
        await adm.drain(5, hold=True)
        assert done.is_set() and adm.in_flight == 0
        tg.start_soon(late)
        await anyio.sleep(0.02)
        assert admitted == [] and adm.queued == ["late"]
        adm.resize(slots=4, pool=200)
        await anyio.sleep(0.01)
    assert admitted == ["late"] and adm.slots == 4 and adm.pool == 200


async def test_drain_times_out():
    adm = Admission(slots=1, pool=100)
    with pytest.raises(TimeoutError):
        async with adm.reserve(10, agent="stuck"):
            await adm.drain(0.05)


async def test_resize_fails_queued_calls_that_can_no_longer_fit():
    adm = Admission(slots=1, pool=1000)
    gate = anyio.Event()
    errors: list[Exception] = []

    async def holder() -> None:
        async with adm.reserve(1000, agent="holder"):
            await gate.wait()

    async def big() -> None:
        try:
            async with adm.reserve(800, agent="big"):
                pass
        except AdmissionError as exc:
            errors.append(exc)

    async with anyio.create_task_group() as tg:
        tg.start_soon(holder)
        await anyio.sleep(0.01)
        tg.start_soon(big)
        await anyio.sleep(0.01)
        adm.resize(slots=1, pool=512)
        await anyio.sleep(0.01)
        gate.set()
    assert len(errors) == 1 and "big" in str(errors[0])


async def test_a_conversation_gets_back_the_slot_holding_its_prefix_and_others_keep_off_it():
    """Issue 29: between a conversation's calls (its tools running) its slot holds its prefix; it
    gets that slot back when free, a new conversation takes a slot nobody holds a prefix in, and only
    when every free slot holds one does admission take the one released longest ago."""
    from squad.events import Origin

    adm = Admission(slots=3, pool=3000)

    async def once(conversation: str) -> int:
        async with adm.reserve(10, agent=Origin("a", conversation)) as r:
            return r.slot

    assert [await once("a#1"), await once("b#1")] == [0, 1]  # b keeps off a's slot
    assert await once("a#1") == 0 and await once("b#1") == 1  # each gets its own back
    assert await once("c#1") == 2  # the one slot nobody holds
    assert await once("d#1") == 0  # all hold a prefix: the slot released longest ago (a's)
    assert await once("a#1") == 1  # a's slot went to d: a takes the least recently used (b's)

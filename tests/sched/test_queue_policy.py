"""Queue policies behind Admission: fifo keeps today's order, backfill and program let a call that
fits pass a head that does not, never unboundedly (the head is admitted after at most max_bypass)."""

from __future__ import annotations

import anyio
import pytest

from squad.engine.session import EngineSpec
from squad.errors import UserError
from squad.events import Origin
from squad.sched.admission import Admission
from squad.sched.policy import BackfillQueue, FifoQueue, ProgramQueue, queue_policy

pytestmark = pytest.mark.anyio


async def _order(adm: Admission, first: tuple[str, int], later: list[tuple[str, int]],
                 hold: int) -> list[str]:
    """Hold ``hold`` cells, queue ``first`` (agent, tokens) then ``later``, free the hold;
    return the admission order."""
    order: list[str] = []
    gate = anyio.Event()

    async def holder() -> None:
        async with adm.reserve(hold, agent="holder"):
            await gate.wait()

    async def call(agent: str, tokens: int) -> None:
        async with adm.reserve(tokens, agent=agent):
            order.append(agent)
            await anyio.sleep(0.01)

    async with anyio.create_task_group() as tg:
        tg.start_soon(holder)
        await anyio.sleep(0.01)
        for agent, tokens in [first, *later]:
            tg.start_soon(call, agent, tokens)
            await anyio.sleep(0.005)
        await anyio.sleep(0.05)
        gate.set()
    return order


async def test_fifo_never_lets_a_small_call_pass_the_head():
    adm = Admission(slots=4, pool=1000, queue="fifo")
    order = await _order(adm, ("big", 900), [("s1", 50), ("s2", 50)], hold=500)
    assert order == ["big", "s1", "s2"]


async def test_backfill_lets_calls_that_fit_pass_a_head_that_does_not():
    adm = Admission(slots=4, pool=1000, queue="backfill")
    order = await _order(adm, ("big", 900), [("s1", 50), ("s2", 50)], hold=500)
    assert order[:2] == ["s1", "s2"] and order[2] == "big"


async def test_backfill_is_bounded_so_the_head_is_never_starved():
    """An adversarial stream of small calls that always fit: the big head still gets in, after at
    most max_bypass of them passed it."""
    adm = Admission(slots=2, pool=1000, queue=BackfillQueue(max_bypass=3))
    order: list[str] = []
    stop = anyio.Event()

    async def small(i: int) -> None:
        async with adm.reserve(100, agent=f"s{i}"):
            order.append(f"s{i}")
            await anyio.sleep(0.02)

    async def stream() -> None:
        for i in range(60):  # bounded: stops by itself
            if stop.is_set():
                return
            tg.start_soon(small, i)
            await anyio.sleep(0.005)

    async def big() -> None:
        async with adm.reserve(1000, agent="big"):
            order.append("big")
        stop.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(small, -1)  # the pool is partly used when big asks
        await anyio.sleep(0.001)
        tg.start_soon(big)
        await anyio.sleep(0.001)
        tg.start_soon(stream)
    assert "big" in order
    passed = order.index("big") - 1  # s-1 was running before big asked
    assert passed <= 3, order


async def test_program_policy_serves_the_program_with_least_service_first():
    q = ProgramQueue()
    adm = Admission(slots=1, pool=1000, queue=q)
    # program A has already held the engine; B has not
    async with adm.reserve(10, agent=Origin("a", conversation="a#1")):
        await anyio.sleep(0.05)
    assert q.attained("a#1") > 0
    order: list[str] = []
    gate = anyio.Event()

    async def holder() -> None:
        async with adm.reserve(10, agent="holder"):
            await gate.wait()

    async def call(origin: Origin) -> None:
        async with adm.reserve(10, agent=origin):
            order.append(origin.conversation or "")

    async with anyio.create_task_group() as tg:
        tg.start_soon(holder)
        await anyio.sleep(0.01)
        tg.start_soon(call, Origin("sub", conversation="sub#2", parent="a#1"))  # part of program a#1
        await anyio.sleep(0.005)
        tg.start_soon(call, Origin("b", conversation="b#3"))
        await anyio.sleep(0.02)
        gate.set()
    assert order == ["b#3", "sub#2"]


async def test_priority_still_comes_first_under_every_policy():
    for name in ("fifo", "backfill", "program"):
        assert await _admitted_after_a_holder(name) == ["main", "sub"], name


async def _admitted_after_a_holder(queue: str) -> list[str]:
    """A holder of the one slot, then ``sub`` (priority 1), then ``main`` (priority 0): the order they got in."""
    adm = Admission(slots=1, pool=1000, queue=queue)
    order: list[str] = []
    gate = anyio.Event()

    async def holder() -> None:
        async with adm.reserve(10, agent="holder"):
            await gate.wait()

    async def call(agent: str, priority: int) -> None:
        async with adm.reserve(10, agent=agent, priority=priority):
            order.append(agent)

    async with anyio.create_task_group() as tg:
        tg.start_soon(holder)
        await anyio.sleep(0.01)
        tg.start_soon(call, "sub", 1)
        await anyio.sleep(0.005)
        tg.start_soon(call, "main", 0)
        await anyio.sleep(0.02)
        gate.set()
    return order


async def test_cancelled_waiter_leaves_every_policy_cleanly():
    for name in ("fifo", "backfill", "program"):
        adm = Admission(slots=1, pool=100, queue=name)
        async with adm.reserve(100, agent="holder"):
            with anyio.move_on_after(0.02):
                async with adm.reserve(50, agent="gone"):
                    pass
            assert adm.queued == []
        assert adm.in_flight == 0 and adm.reserved == 0


def test_policy_names_and_errors():
    assert isinstance(queue_policy(None), ProgramQueue) and EngineSpec().queue == "program"
    assert isinstance(queue_policy("fifo"), FifoQueue)
    assert queue_policy("Backfill").name == "backfill"
    with pytest.raises(ValueError, match="fifo, backfill, program"):
        queue_policy("lifo")
    with pytest.raises(UserError, match="queue must be one of"):
        EngineSpec(queue="lifo")
    assert EngineSpec(queue="program").queue == "program"


def test_recipe_engine_queue_reaches_the_spec(tmp_path):
    from squad.errors import RecipeError
    from squad.recipes import load_recipe

    text = ("name: r\nmain: a\nagents:\n  a: {instructions: hi, budget: 512, max_tokens: 32}\n"
            "engine: {queue: %s}\nflow:\n  - {agent: a, prompt: hello}\n")
    path = tmp_path / "r.yaml"
    path.write_text(text % "backfill")
    assert load_recipe(path, {}).engine_spec().queue == "backfill"
    path.write_text(text % "lifo")
    with pytest.raises(RecipeError) as err:
        load_recipe(path, {})
    assert "r.yaml:5" in str(err.value) and "fifo" in str(err.value)


class _Clock:
    """A clock the test moves by hand (ProgramQueue's hold is measured on it)."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def test_program_lets_short_calls_asked_with_two_long_ones_go_first():
    """bench/mixed.py's shape: two long calls that together take all but 48 cells of the pool ask
    first, then short ones. The second long call is held while the first runs, the short calls go
    first, and it is admitted beside the first one once they are done (not after it)."""
    clock = _Clock()
    adm = Admission(slots=4, pool=2048, queue=ProgramQueue(clock=clock))
    order: list[str] = []
    long0_may_end = anyio.Event()

    async def call(agent: str, tokens: int, gate: anyio.Event | None = None) -> None:
        async with adm.reserve(tokens, agent=agent):
            order.append(agent)
            if gate is not None:
                await gate.wait()
            else:
                await anyio.sleep(0.005)

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(call, "long0", 1000, long0_may_end)
            await anyio.sleep(0.01)
            tg.start_soon(call, "long1", 1000)
            await anyio.sleep(0.01)
            for i in range(12):
                tg.start_soon(call, f"s{i}", 64)
            while len(order) < 13:
                await anyio.sleep(0.01)
            clock.now += 1.0  # the hold is over: long1 fits beside long0 now that the short calls are done
            while "long1" not in order:
                await anyio.sleep(0.01)
            long0_may_end.set()
    assert order[0] == "long0" and order[-1] == "long1"
    assert sorted(order[1:-1]) == sorted(f"s{i}" for i in range(12))


async def test_program_hold_ends_so_a_lone_long_call_runs_beside_another():
    """No short call comes: the held long call goes when its hold ends, while the first still runs."""
    clock = _Clock()
    adm = Admission(slots=4, pool=2048, queue=ProgramQueue(clock=clock))
    with anyio.fail_after(10):
        async with adm.reserve(1000, agent="long0"):
            async with anyio.create_task_group() as tg:
                admitted = anyio.Event()

                async def long1() -> None:
                    async with adm.reserve(1000, agent="long1"):
                        admitted.set()

                tg.start_soon(long1)
                await anyio.sleep(0.05)
                assert not admitted.is_set() and adm.queued == ["long1"]
                clock.now += 1.0
                await admitted.wait()  # woken by the hold's end, no other call arrived or ended


async def test_program_never_starves_a_long_call_under_a_stream_of_small_ones():
    """An adversarial stream of small calls that always fit and are smaller (so ordered first):
    the long call still gets in, once max_bypass later calls worth its reservation passed it."""
    clock = _Clock()
    q = ProgramQueue(max_bypass=3, clock=clock)
    adm = Admission(slots=2, pool=1000, queue=q)
    order: list[str] = []
    stop, first_may_end = anyio.Event(), anyio.Event()

    async def small(i: int) -> None:
        async with adm.reserve(100, agent=f"s{i}"):
            order.append(f"s{i}")
            await (first_may_end.wait() if i < 0 else anyio.sleep(0.01))

    async def stream() -> None:
        for i in range(200):  # bounded: stops by itself
            if stop.is_set():
                return
            tg.start_soon(small, i)
            if i == 4:
                first_may_end.set()  # big and a few small calls wait: the small ones now keep coming
            await anyio.sleep(0.003)

    async def big() -> None:
        async with adm.reserve(1000, agent="big"):
            order.append("big")
        stop.set()

    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            tg.start_soon(small, -1)  # the pool is partly used when big asks
            await anyio.sleep(0.01)
            tg.start_soon(big)
            await anyio.sleep(0.01)
            tg.start_soon(stream)
    assert "big" in order
    passed = order.index("big") - 1  # s-1 was running before big asked
    assert 1 <= passed <= 1000 // 100 + 2, order  # its reservation's worth of later calls, plus the slots


def test_program_order_prefers_less_service_then_the_smaller_call():
    from squad.sched.admission import Reservation

    class W:
        def __init__(self, seq: int, tokens: int, conversation: str) -> None:
            self.seq, self.reservation = seq, Reservation(Origin(conversation, conversation=conversation), tokens)

    q = ProgramQueue(clock=_Clock())
    a, b, c = W(0, 900, "a#1"), W(1, 50, "b#1"), W(2, 60, "c#1")
    for w in (a, b, c):
        q.add(w)
    assert q.ordered() == [b, c, a]
    q.served(c.reservation, 0.0)
    q.served(b.reservation, 2.0)  # b's program has held the engine: the others go first
    assert q.ordered() == [c, a, b]

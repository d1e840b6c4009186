"""A new queue order is a new class: a toy shortest-first policy, written here and nowhere in
squad, passed as an object to Admission (or named in the registry), orders a real run's calls on
the scripted engine. Admission keeps the books; the policy only picks."""

from __future__ import annotations

from collections.abc import Callable

import anyio
import pytest
from pydantic import ValidationError

from squad import Agent, Squad
from squad.cli.options import _check_queue
from squad.engine.session import EngineSpec
from squad.recipes.spec import EngineSection
from squad.sched.admission import Admission, Reservation
from squad.sched.policy import QUEUE_POLICIES, QueuePolicy, Waiting, queue_policy
from squad.testing import ScriptedEngine

pytestmark = pytest.mark.anyio


class ShortestFirst:
    """The smallest reservation first (arrival among equals); a call that does not fit waits."""

    name = "shortest"

    def __init__(self) -> None:
        self.waiting: list[Waiting] = []
        self.served_calls: list[str] = []

    def add(self, waiting: Waiting) -> None:
        self.waiting.append(waiting)

    def remove(self, waiting: Waiting) -> bool:
        if waiting in self.waiting:
            self.waiting.remove(waiting)
            return True
        return False

    def ordered(self) -> list[Waiting]:
        return sorted(self.waiting, key=lambda w: (w.reservation.tokens, w.seq))

    def pick(self, fits: Callable[[Reservation], bool]) -> Waiting | None:
        for waiting in self.ordered():
            if fits(waiting.reservation):
                self.waiting.remove(waiting)
                return waiting
        return None

    def served(self, reservation: Reservation, held_s: float) -> None:
        self.served_calls.append(reservation.agent)


INPUTS = ["long" + " word" * 11, "tiny", "middle" + " word" * 5, "short" + " word" * 2]


async def _run(policy: QueuePolicy) -> list[str]:
    """A map of four calls on a one-slot engine whose slot is held until all four wait; returns
    the inputs in the order the engine answered them."""
    answered: list[str] = []

    def respond(req) -> str:
        answered.append(req.messages[-1]["content"])
        return "done"

    engine = ScriptedEngine(responder=respond, slots=1)
    engine.admission = adm = Admission.for_engine(engine.engine, queue=policy)
    worker = Agent(name="worker", instructions="Answer.", max_tokens=16)
    async with Squad([worker], engine=engine) as sq:
        gate = anyio.Event()

        async def hold() -> None:
            async with adm.reserve(100, agent="holder"):
                await gate.wait()

        async with anyio.create_task_group() as tg:
            tg.start_soon(hold)
            tg.start_soon(sq.map, "worker", INPUTS)
            with anyio.fail_after(10):
                while len(adm.queued) < len(INPUTS):
                    await anyio.sleep(0.001)
            gate.set()
    return [next(text for text in INPUTS if text.split()[0] in message.split()) for message in answered]


async def test_a_toy_policy_object_orders_a_run():
    policy = ShortestFirst()
    order = await _run(policy)
    assert order == sorted(INPUTS, key=len)
    assert policy.served_calls[0] == "holder" and len(policy.served_calls) == 1 + len(INPUTS)


async def test_the_same_run_in_arrival_order_under_fifo():
    assert await _run(queue_policy("fifo")) == INPUTS


def test_a_registered_policy_is_selectable_by_name(monkeypatch):
    monkeypatch.setitem(QUEUE_POLICIES, "shortest", ShortestFirst)
    assert isinstance(queue_policy("shortest"), ShortestFirst)
    assert EngineSpec(model="m.gguf", queue="shortest").queue == "shortest"
    assert EngineSection(queue="shortest").queue == "shortest"  # a recipe's engine: queue
    assert _check_queue("Shortest") == "shortest"  # the CLI's --queue reads the registry, not a fixed list
    with pytest.raises(ValidationError, match="unknown queue policy 'longest'.*shortest"):
        EngineSection(queue="longest")

"""A fake engine per Ray node: :class:`FakeNodeEngine`, an :class:`~squad.engine.provider.EngineProvider` that
starts a :class:`~squad.testing.FakeEngine` in the process that opens it (a Ray worker, on its node) and stops it
when the squad closes. ``RayFanout(worker_engine=FakeNodeEngine(...))`` gives each worker its own fake instead of
a launched llama-server: the multi-node tests and ``bench/ray_nodes.py`` spread a map over several Ray nodes of
one machine without a model. The fake lives in its worker's process: a node killed takes its engine with it."""

from __future__ import annotations

from dataclasses import dataclass

from squad.engine.control import attach
from squad.engine.provider import EngineHandle
from squad.events import EventSink
from squad.sched.workload import Node
from squad.testing.fake_engine import FakeEngine  # needs the testing extra, as this module's users do

__all__ = ["FakeNodeEngine"]


class _OwnedHandle(EngineHandle):
    """An engine handle that stops the fake it was opened on when it closes."""

    fake: FakeEngine | None = None

    async def aclose(self) -> None:
        await super().aclose()
        fake, self.fake = self.fake, None
        if fake is not None:
            await fake.stop()


@dataclass(frozen=True)
class FakeNodeEngine:
    """Open: start a :class:`~squad.testing.FakeEngine` of ``slots`` slots and an ``n_ctx`` pool answering
    ``token_delay`` seconds per token on 127.0.0.1 (a free port), attach to it (squad admits its calls), and stop
    it on close. Picklable (Ray sends it to each worker)."""

    slots: int = 2
    n_ctx: int = 2048
    token_delay: float = 0.0

    async def open(self, workload: Node | None, on_event: EventSink | None = None) -> EngineHandle:
        fake = FakeEngine(slots=self.slots, n_ctx=self.n_ctx, token_delay=self.token_delay)
        await fake.start()
        handle = _OwnedHandle("launched", emit=on_event)
        handle.fake = fake
        try:
            return await handle.connect(await attach(fake.base_url, None))
        except BaseException:
            await fake.stop()
            raise

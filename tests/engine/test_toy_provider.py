"""A new engine kind is a new provider: a toy one (the fake engine over HTTP, opened with a
handle of its own making) given to ``Squad(engine=provider)`` runs a squad like any other engine."""

from __future__ import annotations

import pytest

from squad.engine.info import EngineInfo
from squad.engine.provider import EngineHandle, EngineProvider
from squad.events import Event, EventSink
from squad.runtime.agent import Agent
from squad.runtime.squad import Squad
from squad.sched.workload import Node
from squad.testing import FakeEngine

pytestmark = pytest.mark.anyio


class ToyProvider:
    """Attaches to a fake engine as it reported itself, squad admitting its calls; counts opens."""

    def __init__(self, info: EngineInfo) -> None:
        self.info = info
        self.opened: list[Node | None] = []

    async def open(self, workload: Node | None, on_event: EventSink | None = None) -> EngineHandle:
        self.opened.append(workload)
        return await EngineHandle("toy", emit=on_event).connect(self.info)


async def test_a_toy_provider_runs_a_squad() -> None:
    events: list[Event] = []
    agents = [Agent(name="lead", agents=("helper",), sub_agent_tools=False, budget=1024, max_tokens=16),
              Agent(name="helper", budget=512, max_tokens=16)]
    async with FakeEngine(slots=2, n_ctx=2048) as fe:
        provider = ToyProvider(fe.info)
        assert isinstance(provider, EngineProvider)
        async with Squad(agents, engine=provider, on_event=events.append) as sq:
            result = await sq.run("@helper say hi")
            assert sq.session.admission is not None and sq.session.admission.slots == 2
            assert sq.session.plan is None and not sq.session.reloadable
    assert result.main.ok and [s.agent for s in result.subs] == ["helper"] and result.subs[0].ok
    assert len(provider.opened) == 1 and provider.opened[0] is not None  # the squad's workload
    loaded = [e for e in events if e.kind == "engine.loaded"]
    assert [e.data["reason"] for e in loaded] == ["toy"] and loaded[0].engine == fe.info.base_url
    assert {e.kind for e in events} >= {"call.admitted", "call.finished", "call.released"}

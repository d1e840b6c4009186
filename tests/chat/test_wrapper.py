"""A toy client layer (issue 20): a new concern around the chat seam is one WrapperChatEngine
subclass in a file of its own, used by a real Squad as is, over the scripted engine and inside
EngineClient's own stack over the HTTP fake engine."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from squad import Agent, Squad
from squad.chat import ChatEngine, ChatRequest, ChatResult
from squad.chat.client import EngineClient
from squad.chat.routing import Router
from squad.chat.wrapper import WrapperChatEngine
from squad.testing import CONTEXT_EXCEEDED, FakeEngine, Reply, ScriptedEngine

pytestmark = pytest.mark.anyio


class Recorded(WrapperChatEngine):
    """The toy layer: records the agent of every call and tags each answer."""

    def __init__(self, inner: ChatEngine) -> None:
        super().__init__(inner)
        self.agents: list[str] = []

    async def complete(self, request: ChatRequest) -> ChatResult:
        self.agents.append(request.agent)
        result = await super().complete(request)
        result.content += " [recorded]"
        return result


if TYPE_CHECKING:  # mypy holds each implementation to the seam (run it on this file)
    from squad.engine.info import EngineInfo
    from squad.engine.session import EngineSession

    def _implementations(info: EngineInfo, sessions: list[EngineSession]) -> list[ChatEngine]:
        return [EngineClient(info), Router(sessions), ScriptedEngine(), Recorded(ScriptedEngine())]


def test_every_chat_engine_satisfies_the_seam():
    assert isinstance(ScriptedEngine(), ChatEngine)
    assert isinstance(Recorded(ScriptedEngine()), ChatEngine)
    for cls in (EngineClient, Router, WrapperChatEngine):
        assert all(hasattr(cls, member) for member in ("engine", "count", "complete", "engine_up", "aclose"))


async def test_a_toy_layer_over_the_scripted_engine_under_a_real_squad():
    layer = Recorded(ScriptedEngine("four", slots=1))
    async with Squad([Agent(name="main", budget=512, max_tokens=16)], engine=layer) as sq:
        result = await sq.run("what is 2 + 2?")
        assert sq.chat is layer and sq.info.slots == 1  # the engine is read through the layer
        assert await layer.engine_up()
    assert result.output == "four [recorded]" and layer.agents == ["main"]


async def test_a_toy_layer_inside_the_clients_stack_sees_every_attempt():
    """Put under the retrying layer, it sees each attempt of a call, the resent one too."""
    async with FakeEngine(slots=2, n_ctx=2048) as fe:
        client = EngineClient(fe.info, counter=None)
        layer = Recorded(client.retrying.inner)
        client.retrying.inner = layer
        fe.script(Reply(status=500, error_message=CONTEXT_EXCEEDED),
                  Reply(content="hello"))  # another client overflowed
        async with Squad([Agent(name="main", budget=512, max_tokens=16)], engine=client) as sq:
            result = await sq.run("say hello")
        await client.aclose()
    assert result.output.startswith("hello [recorded]")
    assert len(layer.agents) >= 2 and set(layer.agents) == {"main"}  # the overflowed attempt, then the resent one
    assert result.main.error is None and len(fe.requests) == 2

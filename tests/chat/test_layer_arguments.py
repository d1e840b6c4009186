"""The client's layers pass what they share as arguments and results, never through a side channel
(issue 33): the admitted layer hands the transport its counted prompt and reservation
(:class:`squad.chat.call.Admitted`); the call id travels on the request; attempts, the reservation
and the restored prefix come back on the result or on the error."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import squad.chat
from squad.chat import ChatRequest, ChatResult
from squad.chat.admitted import SendingEngine
from squad.chat.call import Admitted
from squad.chat.client import EngineClient
from squad.errors import ContextExceeded
from squad.events import Event, Origin
from squad.testing import CONTEXT_EXCEEDED, FakeEngine, Reply

pytestmark = pytest.mark.anyio


def test_no_context_variable_in_the_chat_layers():
    """No module of squad.chat imports contextvars: nothing passes between its layers on the side."""
    for path in Path(squad.chat.__file__).parent.rglob("*.py"):
        tree = ast.parse(path.read_text())
        names = {a.name for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))
                 for a in n.names} | {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        assert "contextvars" not in names and "ContextVar" not in names, path


def _request(text: str = "say hi", max_tokens: int = 16) -> ChatRequest:
    return ChatRequest(origin=Origin("a", "a#1"), messages=[{"role": "user", "content": text}], max_tokens=max_tokens)


async def test_the_admitted_layer_hands_the_transport_its_count_and_reservation(monkeypatch):
    handed: list[tuple[ChatRequest, Admitted]] = []
    async with FakeEngine(slots=2, n_ctx=2048) as fe, EngineClient(fe.info, counter=None) as client:
        assert isinstance(client.transport, SendingEngine)
        send = client.transport.send

        async def recorded(request: ChatRequest, admitted: Admitted) -> ChatResult:
            handed.append((request, admitted))
            return await send(request, admitted)

        monkeypatch.setattr(client.transport, "send", recorded)
        result = await client.complete(_request())
    [(request, admitted)] = handed
    counted = result.usage.prompt_tokens if result.usage else None
    assert admitted.prompt == counted and fe.count_requests == 1  # counted once, by the admitted layer
    assert admitted.admission is client.admission and admitted.slot == result.slot >= 0
    assert result.reserved_tokens == admitted.prompt + 16 and request.call == result.call is not None


async def test_each_call_gets_its_own_id_and_its_attempts_come_back_on_the_result_or_the_error():
    events: list[Event] = []
    async with FakeEngine(slots=2, n_ctx=2048) as fe, EngineClient(fe.info, counter=None, max_attempts=2,
                                                                   on_event=events.append) as client:
        fe.script(Reply(status=500, error_message=CONTEXT_EXCEEDED), Reply(content="hello"))
        request = _request()
        first = await client.complete(request)
        fe.script(*[Reply(status=500, error_message=CONTEXT_EXCEEDED)] * 2)
        with pytest.raises(ContextExceeded) as failed:
            await client.complete(request)  # the same request object: a call of its own
    assert request.call is None and first.attempts == 2 and first.call != failed.value.call_id  # type: ignore[attr-defined]
    finished = [e for e in events if e.kind == "call.finished"]
    failures = [e for e in events if e.kind == "call.failed"]
    assert [e.data["attempts"] for e in finished] == [2] and finished[0].call == first.call
    assert [e.data["attempts"] for e in failures] == [2] and "this call" in str(failed.value)
    assert f"(this call {first.reserved_tokens}: prompt + max_tokens)" in str(failed.value)  # the need came back up


async def test_a_fan_out_members_calls_carry_its_share_group_and_no_one_elses():
    """The runtime hands the admitted layer a member's share group on the request (``ChatRequest.share``),
    not through a context variable: each member's call carries the one group, a lone call none."""
    from squad import Agent, Squad
    from squad.testing import ScriptedEngine

    shared = "".join(f"def f{i}(x):\n    return x + {i}\n" for i in range(60))  # over MIN_SHARED_CHARS
    agents = [Agent(name=n, instructions=f"You review for {n}.", max_tokens=8) for n in ("a", "b")]
    engine = ScriptedEngine(responder=lambda req: "ok", slots=2, n_ctx=65536)
    async with Squad(agents, engine=engine, shared_input="prefix") as sq:
        await sq.parallel([("a", "Review it."), ("b", "Review it.")], check=True, shared=shared)
        members = list(engine.requests)
        await sq.run("Review it.")  # the main agent (a), alone
    assert len(members) == 2 and members[0].share is not None and members[0].share is members[1].share
    assert engine.requests[-1].share is None

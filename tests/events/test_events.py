"""Typed events: every kind documented (docs/design/events.md) is emitted and every emitted kind is
documented; ids place each event (call in conversation in parent conversation, on an engine). Uses the
in-process ScriptedEngine, so no HTTP."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import squad.events as events_module
from squad import Agent, Squad
from squad.errors import AgentRunError
from squad.events import EVENT_TYPES, Event, event_from_record
from squad.testing import ScriptedEngine

SRC = Path(events_module.__file__).parent.parent


def documented_kinds() -> set[str]:
    """The kinds listed in the design doc's table (``| `call.queued` | ... |``)."""
    doc = (SRC.parent.parent / "docs" / "design" / "events.md").read_text()
    return set(re.findall(r"^\| `([a-z_]+\.[a-z_]+)` \|", doc, flags=re.M))


def emitted_kinds() -> set[str]:
    """Kinds whose class the source refers to (constructs or hands to an emitter), outside
    the events module itself."""
    names = {cls.__name__: kind for kind, cls in EVENT_TYPES.items()}
    found: set[str] = set()
    for path in SRC.rglob("*.py"):
        if path.parent == SRC / "events" and path.name in ("__init__.py", "jsonl.py", "view.py"):
            continue  # the events themselves, and their readers (not emitters)
        for node in ast.walk(ast.parse(path.read_text())):
            name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None
            if name in names:
                found.add(names[name])
            elif isinstance(node, ast.alias) and node.asname and node.name in names:  # imported under a new name
                found.add(names[node.name])
    return found


def test_documented_kinds_are_exactly_the_event_classes():
    assert documented_kinds() == set(EVENT_TYPES)


def test_every_event_class_is_emitted_somewhere_and_nothing_else_is():
    assert emitted_kinds() == set(EVENT_TYPES)


def test_records_round_trip_with_ids():
    from squad.events import CallAdmitted

    ev = CallAdmitted(agent="a", conversation="a#1", parent="lead#1", call="c9", engine="http://x", tokens=5, slot=1)
    record = {"kind": ev.kind, "t": 1.0, "wall": 2.0, **ev.ids(), "data": ev.data}
    back = event_from_record(record)
    assert back == CallAdmitted(agent="a", conversation="a#1", parent="lead#1", call="c9", engine="http://x",
                                tokens=5, slot=1, t=1.0, wall=2.0)
    assert event_from_record({"kind": "no.such", "t": 0}) is None


def team() -> list[Agent]:
    return [
        Agent(name="lead", instructions="lead", agents=("a", "b"), sub_agent_tools=False, budget=1024, max_tokens=16),
        Agent(name="a", instructions="a", budget=512, max_tokens=16),
        Agent(name="b", instructions="b", budget=512, max_tokens=16),
    ]


@pytest.mark.anyio
async def test_ids_nest_calls_in_conversations_in_their_parent():
    seen: list[Event] = []
    engine = ScriptedEngine(responder=lambda req: f"answer from {req.agent}", slots=3, on_event=seen.append)
    async with Squad(team(), engine=engine, on_event=seen.append) as sq:
        result = await sq.run("@a @b check this")
    assert result.output == "answer from lead"
    started = {e.agent: e for e in seen if e.kind == "agent.started"}
    lead = started["lead"].conversation
    assert started["lead"].parent is None
    assert started["a"].parent == lead and started["b"].parent == lead
    assert len({e.conversation for e in started.values()}) == 3
    by_call: dict[str, set[str | None]] = {}
    for e in seen:
        if e.call is not None:
            by_call.setdefault(e.call, set()).add(e.conversation)
    assert len(by_call) == 3 and all(len(convs) == 1 for convs in by_call.values())
    assert {c for convs in by_call.values() for c in convs} == {e.conversation for e in started.values()}
    assert all(e.engine == "scripted://engine" for e in seen if e.kind.startswith("call."))
    assert result.main.conversation == lead and {s.conversation for s in result.subs} == {
        started["a"].conversation, started["b"].conversation}


@pytest.mark.anyio
async def test_fail_fast_cancels_the_sibling_with_the_reason():
    def respond(req):
        if req.agent == "a":
            return AgentRunError("a broke", agent="a")
        return f"answer from {req.agent}"

    seen: list[Event] = []
    engine = ScriptedEngine(responder=respond, slots=3, delay=lambda req: 0.01 if req.agent == "a" else 30.0)
    async with Squad(team(), engine=engine, on_event=seen.append) as sq:
        results = await sq.parallel([("a", "x"), ("b", "y")], policy="fail-fast")
    assert str(results[0].error) == "a broke"
    assert results[1].cancelled_reason == "cancelled because 'a' failed"
    cancelled = [e for e in seen if e.kind == "agent.cancelled"]
    assert [(e.agent, e.reason) for e in cancelled] == [("b", "cancelled because 'a' failed")]


@pytest.mark.anyio
async def test_scripted_engine_fails_on_an_unexpected_call():
    async with Squad([Agent(name="solo")], engine=ScriptedEngine("only one")) as sq:
        assert (await sq.run("hi")).output == "only one"
        with pytest.raises(AssertionError, match="unexpected call #2 from agent 'solo'"):
            await sq.run("again")

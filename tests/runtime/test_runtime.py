"""The runtime on the fake engine: mention fan-out, policies, cancel, the cut rule, tools.

The same behaviours against the real llama-server are in ``test_runtime_engine.py``.
"""

from __future__ import annotations

import json
from typing import Any

import anyio
import pytest

from squad.errors import AgentCancelled, MentionError, UserError
from squad.events import Event
from squad.runtime.agent import Agent
from squad.runtime.handback import CUT_MARK
from squad.runtime.squad import Squad, default_workload, run_sync
from squad.runtime.tools import tool
from squad.sched.workload import Call, Delegate, Parallel
from squad.testing import FakeEngine, Reply, count_tokens

pytestmark = pytest.mark.anyio

SUBS = ("security", "style", "tests")


def team(lead_budget: int = 2048, **lead: Any) -> list[Agent]:
    lead_agent = Agent(name="lead", instructions="You are {{ name }}.", budget=lead_budget, max_tokens=32,
                       agents=SUBS, sub_agent_tools=False, **lead)
    return [lead_agent] + [Agent(name=n, instructions="You are {{ name }}.", budget=512, max_tokens=32) for n in SUBS]


def who(body: dict) -> str:
    """The agent a request is from (its system message is 'You are <name>.')."""
    return body["messages"][0]["content"].removeprefix("You are ").rstrip(".")


def by_agent(replies: dict[str, Reply]):
    return lambda body: replies.get(who(body), Reply(content=f"answer from {who(body)}"))


def kinds(events: list[Event], kind: str) -> list[Event]:
    return [e for e in events if e.kind == kind]


async def test_mentions_run_in_parallel_and_come_back_in_one_message() -> None:
    events: list[Event] = []
    async with FakeEngine(slots=4, n_ctx=4096, token_delay=0.02) as fe:
        fe.responder = by_agent({"lead": Reply(content="all three answered")})
        async with Squad(team(), engine=fe.info, on_event=events.append) as sq:
            result = await sq.run("@security @style @tests review this diff: x = 1")
    assert result.output == "all three answered"
    assert [s.agent for s in result.subs] == list(SUBS)
    assert all(s.ok and s.output == f"answer from {s.agent}" for s in result.subs)
    assert fe.max_processing == 3  # the three sub-agents ran at the same time
    lead_calls = [b for b in fe.requests if who(b) == "lead"]
    assert len(lead_calls) == 1
    users = [m for m in lead_calls[0]["messages"] if m["role"] == "user"]
    assert len(users) == 1  # the answers are handed back in ONE message
    for name in SUBS:
        assert f"[@{name}]\nanswer from {name}" in users[0]["content"]
    sub_prompts = [b["messages"][-1]["content"] for b in fe.requests if who(b) != "lead"]
    assert sub_prompts == ["review this diff: x = 1"] * 3  # mentions stripped
    assert result.history[-1] == {"role": "assistant", "content": "all three answered"}
    assert "lead: ok" in result.summary() and "security: ok" in result.summary()
    assert not kinds(events, "mention.queued")


async def test_unknown_mention_fails_before_any_model_call() -> None:
    async with FakeEngine(slots=2) as fe:
        async with Squad(team(), engine=fe.info) as sq:
            with pytest.raises(MentionError, match="@secuirty.*did you mean 'security'"):
                await sq.run("@secuirty look at this")
    assert fe.requests == []


async def test_collect_lets_siblings_finish_and_records_the_error() -> None:
    async with FakeEngine(slots=4, token_delay=0.01) as fe:
        fe.responder = by_agent({"style": Reply(content="half an answer then", truncate_after=2)})
        async with Squad(team(), engine=fe.info) as sq:
            result = await sq.run("@security @style @tests check it")
    subs = {s.agent: s for s in result.subs}
    assert subs["style"].error is not None and subs["style"].output == ""
    assert subs["security"].ok and subs["tests"].ok
    lead_message = [b for b in fe.requests if who(b) == "lead"][0]["messages"][-1]["content"]
    assert "[@style]\n[failed:" in lead_message
    assert "half an answer" not in lead_message  # partial text never becomes an answer


async def test_fail_fast_cancels_siblings_with_the_reason_and_raises_the_culprit() -> None:
    events: list[Event] = []
    slow = Reply(content=" ".join(["word"] * 30), token_delay=0.2)
    async with FakeEngine(slots=4) as fe:
        fe.responder = by_agent({"style": Reply(content="oops here", truncate_after=1, token_delay=0.05),
                                 "security": slow, "tests": slow})
        async with Squad(team(), engine=fe.info, on_event=events.append) as sq:
            results = await sq.parallel([(n, "go") for n in SUBS], policy="fail-fast")
            with pytest.raises(Exception) as raised:
                await sq.run("@security @style @tests go", policy="fail-fast")
        await anyio.sleep(0.3)
        disconnects = fe.disconnects
    by = {r.agent: r for r in results}
    assert by["style"].error is not None and by["style"].cancelled_reason is None
    for name in ("security", "tests"):
        assert by[name].cancelled_reason == "cancelled because 'style' failed"
        assert isinstance(by[name].error, AgentCancelled)
        assert by[name].timings.total_s < 5  # cancelled, not run to the end (30 x 0.2 s)
    assert getattr(raised.value, "agent", None) == "style"  # X's error is what the user sees
    assert not [b for b in fe.requests if who(b) == "lead"]
    assert disconnects >= 2  # the siblings' streams were closed
    reasons = {e.data["reason"] for e in kinds(events, "agent.cancelled")}
    assert reasons == {"cancelled because 'style' failed"}


async def test_cancel_from_outside_cancels_everything_with_that_reason() -> None:
    events: list[Event] = []
    slow = Reply(content=" ".join(["word"] * 50), token_delay=0.1)
    async with FakeEngine(slots=4) as fe:
        fe.responder = lambda body: slow
        async with Squad(team(), engine=fe.info, on_event=events.append) as sq:
            caught: list[BaseException] = []

            async def turn() -> None:
                try:
                    await sq.run("@security @style @tests go")
                except AgentCancelled as exc:
                    caught.append(exc)

            async with anyio.create_task_group() as tg:
                tg.start_soon(turn)
                with anyio.fail_after(10):
                    while fe.processing < 3:
                        await anyio.sleep(0.01)
                sq.cancel("the user pressed stop")
        await anyio.sleep(0.3)
        assert fe.disconnects >= 3
    assert len(caught) == 1 and caught[0].reason == "the user pressed stop"
    cancelled = kinds(events, "agent.cancelled")
    assert {e.agent for e in cancelled} == set(SUBS)
    assert {e.data["reason"] for e in cancelled} == {"the user pressed stop"}


async def test_answers_too_long_for_the_main_budget_are_cut_visibly() -> None:
    events: list[Event] = []
    long = " ".join(f"w{i}" for i in range(200))
    async with FakeEngine(slots=4, n_ctx=4096) as fe:
        fe.responder = by_agent({
            "security": Reply(content=long), "style": Reply(content="short answer"), "tests": Reply(content=long),
            "lead": Reply(content="done"),
        })
        agents = [a.model_copy(update={"max_tokens": 200}) if a.name != "lead" else a for a in team(lead_budget=300)]
        async with Squad(agents, engine=fe.info, on_event=events.append) as sq:
            result = await sq.run("@security @style @tests go")
    lead_body = [b for b in fe.requests if who(b) == "lead"][0]
    assert count_tokens(lead_body["messages"]) + 32 <= 300  # fits the lead's budget
    message = lead_body["messages"][-1]["content"]
    assert "[@style]\nshort answer" in message  # a short answer is kept whole
    cuts = kinds(events, "answer.cut")
    assert sorted(e.agent for e in cuts) == ["security", "tests"]
    for e in cuts:
        assert CUT_MARK.format(n=e.data["omitted_tokens"]) in message
        assert 50 < e.data["omitted_tokens"] < 200
    assert result.output == "done"


async def test_more_mentions_than_slots_queue_and_never_exceed_slots() -> None:
    events: list[Event] = []
    names = [f"s{i}" for i in range(5)]
    agents = [Agent(name="lead", agents=names, sub_agent_tools=False, max_tokens=16)]
    agents += [Agent(name=n, max_tokens=16) for n in names]
    async with FakeEngine(slots=2, token_delay=0.01) as fe:
        async with Squad(agents, engine=fe.info, on_event=events.append) as sq:
            result = await sq.run(" ".join(f"@{n}" for n in names) + " say hi")
    assert all(s.ok for s in result.subs) and len(result.subs) == 5
    assert fe.max_processing == 2
    queued = kinds(events, "mention.queued")
    assert len(queued) == 1 and "slots=2" in queued[0].data["message"]
    in_flight = [e.data["in_flight"] for e in kinds(events, "call.admitted")]
    assert in_flight and max(in_flight) <= 2


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@tool
async def fail(why: str) -> str:
    """Always fails."""
    raise ValueError(why)


async def test_tool_loop_runs_calls_concurrently_and_returns_errors_as_results() -> None:
    agent = Agent(name="calc", tools=["add", "fail"], max_tokens=64)
    async with FakeEngine(slots=2) as fe:
        fe.script(
            Reply(tool_calls=[{"name": "add", "arguments": '{"a": 2, "b": 3}'},
                              {"name": "fail", "arguments": '{"why": "disk full"}'},
                              {"name": "add", "arguments": '{"a": "two"}'}]),
            Reply(content="the sum is 5"),
        )
        async with Squad([agent], engine=fe.info, tools=[add, fail]) as sq:
            result = await sq.run_agent("calc", "add 2 and 3")
    assert result.output == "the sum is 5"
    assert fe.requests[0]["tools"][0]["function"]["name"] == "add"
    tool_messages = [m for m in fe.requests[1]["messages"] if m["role"] == "tool"]
    assert [m["content"] for m in tool_messages][0] == "5"
    assert "ValueError: disk full" in tool_messages[1]["content"]
    assert "bad arguments for add" in tool_messages[2]["content"]
    assert [name for name, _, _ in result.tool_calls] == ["add", "fail", "add"]
    assert result.timings.calls == 2 and result.usage.completion_tokens > 0


async def test_tool_rounds_are_bounded() -> None:
    agent = Agent(name="calc", tools=["add"], max_tokens=64)
    loop = Reply(tool_calls=[{"name": "add", "arguments": '{"a": 1, "b": 1}'}])
    async with FakeEngine(slots=1) as fe:
        fe.script(loop, loop, Reply(content="gave up on tools"))
        async with Squad([agent], engine=fe.info, tools=[add], max_tool_rounds=2) as sq:
            result = await sq.run_agent("calc", "loop")
    assert result.output == "gave up on tools"
    # the last round offers no tools: it says tool_choice none and keeps the same definitions (the prefix stays)
    assert fe.requests[2]["tool_choice"] == "none" and fe.requests[2]["tools"] == fe.requests[0]["tools"]


async def test_sub_agent_as_tool() -> None:
    lead = Agent(name="lead", instructions="You are {{ name }}.", agents=["helper"], max_tokens=64)
    helper = Agent(name="helper", instructions="You are {{ name }}.", description="knows things", max_tokens=32)
    async with FakeEngine(slots=2) as fe:
        replies = iter([Reply(tool_calls=[{"name": "ask_helper", "arguments": '{"task": "what is x"}'}]),
                        Reply(content="x is 42")])
        fe.responder = lambda body: Reply(content="helper says 42") if who(body) == "helper" else next(replies)
        async with Squad([lead, helper], engine=fe.info) as sq:
            result = await sq.run("what is x?")
    spec = fe.requests[0]["tools"][0]["function"]
    assert spec["name"] == "ask_helper" and "knows things" in spec["description"]
    helper_body = next(b for b in fe.requests if who(b) == "helper")
    assert helper_body["messages"][-1]["content"] == "what is x"
    assert result.output == "x is 42"
    assert [s.agent for s in result.subs] == ["helper"] and result.subs[0].output == "helper says 42"


async def test_map_keeps_input_order_and_respects_max_concurrency() -> None:
    agent = Agent(name="echo", max_tokens=4)
    async with FakeEngine(slots=4, token_delay=0.01) as fe:
        async with Squad([agent], engine=fe.info) as sq:
            results = await sq.map("echo", [f"item{i}" for i in range(6)], max_concurrency=2)
    assert [r.output.split()[0] for r in results] == [f"item{i}" for i in range(6)]
    assert fe.max_processing <= 2


async def test_bad_squads_are_user_errors() -> None:
    with pytest.raises(UserError, match="main agent 'boss'"):
        Squad(team(), main="boss")
    with pytest.raises(UserError, match="threads size or start an engine squad launches"):
        Squad(team(), url="http://127.0.0.1:1", threads=2)
    with pytest.raises(UserError, match="not open"):
        await Squad(team()).run("hi")


def test_default_workload_is_main_delegating_to_all_subs_in_parallel() -> None:
    agents = {a.name: a for a in team()}
    node = default_workload(agents, "lead")
    assert node == Delegate(main=Call("lead", 2048),
                                 subs=Parallel(tuple(Call(n, 512) for n in SUBS)))
    assert default_workload({"solo": Agent(name="solo")}, "solo") == Call("solo", None)  # auto


def test_run_sync_from_plain_code() -> None:
    with anyio.from_thread.start_blocking_portal() as portal:
        fe = FakeEngine(slots=4)
        portal.call(fe.start)
        try:
            fe.responder = by_agent({"lead": Reply(content="synced")})
            result = run_sync(team(), "@style hello", engine=fe.info)
        finally:
            portal.call(fe.stop)
    assert result.output == "synced" and result.subs[0].output == "answer from style"
    assert json.loads(json.dumps(result.history))  # plain messages, reusable as history


class ReloadingLauncher:
    """Stands in for squad.engine.launcher.Launcher: reload restarts the fake engine on the
    same port with the new plan's slots."""

    def __init__(self, fe: FakeEngine, plan: Any) -> None:
        self.fe, self.plan, self.info, self.reloads = fe, plan, fe.info, []

    async def reload(self, plan: Any, *, drain: Any = None, drain_timeout: float = 30.0) -> bool:
        if drain is not None:
            await drain()
        self.reloads.append(plan)
        self.fe.slots = plan.slots
        self.info = await self.fe.restart()
        self.plan = plan
        return True

    async def restart(self) -> Any:
        return await self.fe.restart()

    running = True

    def exit_status(self) -> str | None:
        return None  # the fake engine never dies by itself

    async def aclose(self) -> None:
        """The fake engine is stopped by its own context manager."""


async def test_replan_reloads_a_launched_engine_with_more_slots() -> None:
    from squad.sched.planner import EnginePlan

    events: list[Event] = []
    names = [f"s{i}" for i in range(5)]
    agents = [Agent(name="lead", agents=names, sub_agent_tools=False, budget=512, max_tokens=16)]
    agents += [Agent(name=n, budget=256, max_tokens=16) for n in names]
    async with FakeEngine(slots=2, n_ctx=4096, token_delay=0.02) as fe:
        async with Squad(agents, engine=fe.info, replan=True, on_event=events.append) as sq:
            launcher = ReloadingLauncher(fe, EnginePlan.simple("/fake/model.gguf", slots=2, n_ctx=4096))
            sq.session.launcher, sq.session.plan = launcher, launcher.plan  # as if squad had launched it
            result = await sq.run(" ".join(f"@{n}" for n in names) + " say hi")
            assert sq.info.slots == 6 and sq.session.admission.slots == 6
    assert [p.slots for p in launcher.reloads] == [6]  # lead + 5 sub-agents
    assert all(s.ok for s in result.subs)
    assert fe.max_processing == 5  # the whole fan-out at once after the reload
    assert [e.data["to_slots"] for e in kinds(events, "engine.replanning")] == [6]
    assert not kinds(events, "mention.queued")


async def test_engine_gone_during_a_fan_out_is_raised_as_itself_not_a_group() -> None:
    from squad.errors import EngineGone

    async with FakeEngine(slots=2) as fe:
        async with Squad(team(), engine=fe.info) as sq:
            await fe.stop()
            with pytest.raises(EngineGone):
                await sq.parallel([("security", "a"), ("style", "b")])


async def test_tools_the_chat_template_would_drop_are_warned_about_once() -> None:
    from dataclasses import replace

    events: list[Event] = []
    agent = Agent(name="calc", tools=["add"], max_tokens=16)
    async with FakeEngine(slots=1) as fe:
        info = replace(fe.info, template_has_tools=False)
        async with Squad([agent], engine=info, tools=[add], on_event=events.append) as sq:
            await sq.run_agent("calc", "one")
            await sq.run_agent("calc", "two")
    warned = kinds(events, "engine.warning")
    assert len(warned) == 1 and "chat template has no tools section" in warned[0].data["warning"]

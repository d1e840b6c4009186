"""Several engines for one squad (squad.chat.routing) on fake engines: routing by free room, a
conversation staying on its engine, each engine's slots and per-request limit, and failover when
an engine dies (queued calls move, a streaming call is re-run from its start, nothing is lost,
a call's own failure is never re-run). The same with two real llama-servers is in
``test_engines_real.py``."""

from __future__ import annotations

import dataclasses

import anyio
import pytest

from squad.chat import ChatRequest
from squad.chat.routing import EngineGroup, Router, combined
from squad.engine.session import EngineSpec
from squad.errors import EngineGone, PromptTooLong, TruncatedStream, UserError
from squad.events import Event, Origin
from squad.events.summary import summarize
from squad.runtime.agent import Agent
from squad.runtime.squad import Squad
from squad.testing import FakeEngine, Reply, ScriptedEngine

pytestmark = pytest.mark.anyio


def kinds(events: list[Event], kind: str) -> list[Event]:
    return [e for e in events if e.kind == kind]


def worker(max_tokens: int = 8) -> Agent:
    return Agent(name="w", instructions="You work.", budget=512, max_tokens=max_tokens)


def ask(conversation: str, text: str = "say something short", max_tokens: int = 8,
        budget: int | None = None) -> ChatRequest:
    return ChatRequest(origin=Origin("w", conversation), messages=[{"role": "user", "content": text}],
                       max_tokens=max_tokens, budget=budget)


async def test_new_conversations_go_to_the_engine_with_the_most_free_room() -> None:
    events: list[Event] = []
    async with FakeEngine(slots=1, token_delay=0.02) as a, FakeEngine(slots=3, token_delay=0.02) as b:
        async with Squad([worker()], engines=[a.info, b.info], on_event=events.append) as sq:
            results = await sq.map("w", [f"item {i}" for i in range(4)])
            assert sq.info.slots == 4 and sq.session.admission is None
    assert all(r.ok for r in results)
    assert (len(a.requests), len(b.requests)) == (1, 3)  # 4 at once: the 3-slot engine takes three
    assert a.max_processing <= 1 and b.max_processing <= 3
    served = {e.engine for e in kinds(events, "call.finished")}
    assert served == {a.base_url, b.base_url}  # each call's events name the engine that served it


async def test_more_calls_than_slots_queue_evenly_and_never_exceed_any_engine() -> None:
    async with FakeEngine(slots=2, token_delay=0.01) as a, FakeEngine(slots=1, token_delay=0.01) as b:
        async with Squad([worker()], engines=[a.info, b.info]) as sq:
            results = await sq.map("w", [f"item {i}" for i in range(12)])
    assert all(r.ok for r in results) and len(results) == 12
    assert len(a.requests) + len(b.requests) == 12 and a.requests and b.requests
    assert a.max_processing <= 2 and b.max_processing <= 1


async def test_a_conversation_stays_on_the_engine_that_served_it() -> None:
    async with FakeEngine(slots=2) as a, FakeEngine(slots=2) as b:
        async with EngineGroup([a.info, b.info]) as group:
            router = group.chat
            first = await router.complete(ask("x#1"))
            assert first.engine == a.base_url  # a tie: the first engine
            a.script(Reply(content="slow " * 30, token_delay=0.05))
            async with anyio.create_task_group() as tg:
                tg.start_soon(router.complete, ask("y#1", max_tokens=40))  # a tie again: lands on a
                await anyio.sleep(0.2)
                again = await router.complete(ask("x#1"))  # a is busier than b, yet x stays on a
                fresh = await router.complete(ask("z#1"))  # a new conversation takes the free room
    assert again.engine == a.base_url and fresh.engine == b.base_url


async def test_a_call_that_fits_only_one_engine_goes_there() -> None:
    async with FakeEngine(slots=4, n_ctx=256) as small, FakeEngine(slots=1, n_ctx=4096) as big:
        async with EngineGroup([small.info, big.info]) as group:
            long = await group.chat.complete(ask("l#1", " ".join(["word"] * 400), max_tokens=8))
            short = await group.chat.complete(ask("s#1", max_tokens=8))
            assert group.info.n_ctx == 256 and group.info.slots == 5  # the smallest context, the slots summed
    assert long.engine == big.base_url and short.engine == small.base_url


async def test_a_stopped_engine_is_taken_out_its_queue_moves_and_its_stream_is_rerun() -> None:
    events: list[Event] = []
    async with FakeEngine(slots=1, token_delay=0.05) as a, FakeEngine(slots=1, token_delay=0.01) as b:
        async with Squad([worker(max_tokens=12)], engines=[a.info, b.info], on_event=events.append) as sq:
            async with anyio.create_task_group() as tg:
                async def stop_a_while_it_streams() -> None:
                    while not a.processing:
                        await anyio.sleep(0.01)
                    await anyio.sleep(0.1)  # a few tokens streamed
                    await a.stop()

                tg.start_soon(stop_a_while_it_streams)
                results = await sq.map("w", [f"item {i}" for i in range(6)])
    assert len(results) == 6 and all(r.ok and r.output for r in results)  # nothing lost
    assert sorted(r.item for r in results) == list(range(6))  # every item answered once
    lost = kinds(events, "engine.lost")
    assert [e.engine for e in lost] == [a.base_url] and lost[0].data["remaining"] == 1
    moved = kinds(events, "call.moved")
    reruns = [e for e in moved if e.data["rerun"]]
    assert len(reruns) == 1 and reruns[0].engine == a.base_url and reruns[0].data["to_engine"] == b.base_url
    assert len(moved) >= 2  # the queued ones moved too, never having been sent
    noted = [n for r in results for n in r.notes]
    assert len(noted) == 1 and "re-run from its start" in noted[0] and a.base_url in noted[0]
    assert b.max_processing <= 1 and a.max_processing <= 1
    summary = summarize(events)  # the trace: every item done, the moved calls marked, the loss listed
    assert all(agent.status != "failed" and not agent.errors for agent in summary.agents.values())
    assert [loss.engine for loss in summary.lost] == [a.base_url]
    assert sum(span.rerun for span in summary.calls) == 1 and set(summary.engines) == {a.base_url, b.base_url}


async def test_closing_an_admission_fails_its_queued_calls_with_engine_lost_and_keeps_running_ones() -> None:
    from squad.errors import EngineLost
    from squad.sched.admission import Admission

    admission = Admission(1, 1000)
    outcomes: list[str] = []

    async def queued() -> None:
        try:
            async with admission.reserve(10, agent="q"):
                outcomes.append("admitted")
        except EngineLost:
            outcomes.append("lost")

    async with admission.reserve(10, agent="running"):
        async with anyio.create_task_group() as tg:
            tg.start_soon(queued)
            await anyio.sleep(0.05)
            assert admission.queued == ["q"]
            admission.close(EngineLost("gone", engine="http://x", reason="gone"))
        assert outcomes == ["lost"] and admission.in_flight == 1 and admission.queued == []
    with pytest.raises(EngineLost):
        async with admission.reserve(10, agent="later"):
            pass


async def test_when_every_engine_is_lost_the_error_says_so() -> None:
    async with FakeEngine(slots=1) as a, FakeEngine(slots=1) as b:
        async with Squad([worker()], engines=[a.info, b.info]) as sq:
            await a.stop()
            await b.stop()
            with pytest.raises(EngineGone, match="all 2 engines are lost"):
                await sq.run_agent("w", "hello")


async def test_a_call_that_fails_for_its_own_reason_is_not_rerun_elsewhere() -> None:
    events: list[Event] = []
    async with FakeEngine(slots=1, n_ctx=4096) as a, FakeEngine(slots=1) as b:
        async with EngineGroup([a.info, b.info], on_event=events.append) as group:
            a.script(Reply(status=400, error_message="request (5000 tokens) exceeds the available context size "
                                                     "(4096 tokens), try increasing it"))
            with pytest.raises(PromptTooLong):
                await group.chat.complete(ask("p#1"))
            a.script(Reply(content="one two three four", error_after=2, error_message="boom"))
            with pytest.raises(TruncatedStream, match="boom"):  # an error frame from an engine that answers
                await group.chat.complete(ask("q#1"))
    assert not b.requests and not kinds(events, "engine.lost") and not kinds(events, "call.moved")


async def test_squad_takes_several_engines_only_as_engines() -> None:
    with pytest.raises(UserError, match="engines=\\[...\\]"):
        Squad([worker()], engine=[EngineSpec(url="http://127.0.0.1:1")])  # type: ignore[arg-type]
    with pytest.raises(UserError, match="not both"):
        Squad([worker()], engine=EngineSpec(url="http://127.0.0.1:1"), engines=[EngineSpec(url="http://127.0.0.1:2")])
    with pytest.raises(UserError, match="short forms \\(model\\)"):
        Squad([worker()], model="x", engines=[EngineSpec(url="http://127.0.0.1:2")])
    with pytest.raises(UserError, match="no engine"):
        Squad([worker()], engines=[])


async def test_one_engine_in_the_list_is_an_ordinary_session() -> None:
    from squad.engine.session import EngineSession

    async with FakeEngine(slots=1) as a:
        async with Squad([worker()], engines=[a.info]) as sq:
            assert isinstance(sq.session, EngineSession)
            assert (await sq.run_agent("w", "hi")).ok


def test_combined_info_is_the_most_restrictive_per_request_and_the_sum_of_slots() -> None:
    from squad.engine.info import EngineInfo

    one = EngineInfo(base_url="http://a", api_key=None, slots=2, n_ctx=2048, kv_unified=True, pool=4096,
                     template_has_tools=True)
    two = EngineInfo(base_url="http://b", api_key=None, slots=4, n_ctx=1024, kv_unified=True, pool=4096,
                     template_has_tools=None)
    both = combined([one, two])
    assert (both.slots, both.n_ctx, both.pool, both.template_has_tools) == (6, 1024, 8192, None)
    assert "http://a" in both.sources["engines"] and "http://b" in both.sources["engines"]
    assert combined([one]) is one


async def test_an_engine_that_does_not_open_closes_the_others_and_raises_its_own_error() -> None:
    from squad.engine.process import free_port
    from squad.errors import EngineError

    events: list[Event] = []
    async with FakeEngine(slots=1) as a:
        group = EngineGroup([a.info, EngineSpec(url=f"http://127.0.0.1:{free_port()}")], on_event=events.append)
        with pytest.raises(EngineError):
            async with group:
                pass
        assert group._router is None
        with pytest.raises(UserError, match="not open"):
            group.chat  # noqa: B018 - reading it raises


async def test_router_needs_an_engine() -> None:
    with pytest.raises(UserError):
        Router([])




@pytest.mark.parametrize(("a", "b"), [
    ("http://127.0.0.1:18401", "http://127.0.0.1:18401"),
    ("http://127.0.0.1:18401", "http://localhost:18401/"),
    ("http://LOCALHOST:18401/v1", "http://127.0.0.1:18401"),
    ("http://[::1]:18401/v1/", "http://127.0.0.1:18401/"),
    ("HTTP://Box.Example:80", "http://box.example/"),
    ("https://box.example/v1", "https://box.example:443"),
    ("http://box.example:8080/llm/", "http://box.example:8080/llm/v1"),
])
def test_urls_of_one_engine_have_one_key(a: str, b: str) -> None:
    from squad.chat.routing import engine_key

    assert engine_key(a) == engine_key(b)


@pytest.mark.parametrize(("a", "b"), [
    ("http://127.0.0.1:18401", "http://127.0.0.1:18402"),
    ("http://127.0.0.1:8080", "https://127.0.0.1:8080"),
    ("http://box.example:8080", "http://127.0.0.1:8080"),  # no DNS look-up for other names
    ("http://box.example:8080/a", "http://box.example:8080/b"),
])
def test_urls_of_different_engines_have_different_keys(a: str, b: str) -> None:
    from squad.chat.routing import engine_key

    assert engine_key(a) != engine_key(b)


async def test_one_engine_given_twice_is_refused_in_every_form() -> None:
    """Its slots and pool would count twice: admission would let in twice what it holds."""
    async with FakeEngine(slots=2) as a, FakeEngine(slots=2) as b:
        port = a.base_url.rsplit(":", 1)[1]
        twice = [
            [a.info, a.info],  # one EngineInfo object
            [a.info, dataclasses.replace(a.info)],  # two objects, one URL
            [EngineSpec(url=a.base_url), EngineSpec(url=f"http://localhost:{port}/v1")],
            [EngineSpec(url=a.base_url), b.info, EngineSpec(url=a.base_url + "/")],
        ]
        for engines in twice:
            with pytest.raises(UserError, match="engine URL given twice|given twice"):
                Squad([worker()], engines=engines)
            with pytest.raises(UserError, match="given twice"):
                EngineGroup(engines)
        with pytest.raises(UserError, match="engine URL given twice: .* are one engine"):
            Squad([worker()], engines=[EngineSpec(url=a.base_url), EngineSpec(url=f"http://localhost:{port}")])
        async with Squad([worker()], engines=[a.info, b.info]) as sq:  # two engines: fine
            assert sq.info.slots == 4
    scripted = ScriptedEngine()
    with pytest.raises(UserError, match="gives one ScriptedEngine twice \\(items 0 and 1\\)"):
        Squad([worker()], engines=[scripted, scripted])
    Squad([worker()], engines=[ScriptedEngine(), ScriptedEngine()])  # two fakes: two engines
    Squad([worker()], engines=[EngineSpec(model="m"), EngineSpec(model="m")])  # two launched engines of one model


async def test_when_every_engine_is_lost_mid_map_the_waiting_items_say_so() -> None:
    """Not "cancelled by the caller": the items the loss stopped name the engines and why."""
    events: list[Event] = []
    async with FakeEngine(slots=1, token_delay=0.05) as a, FakeEngine(slots=1, token_delay=0.05) as b:
        async with Squad([worker(max_tokens=12)], engines=[a.info, b.info], on_event=events.append) as sq:
            async def stop_both_while_they_stream() -> None:
                while not (a.processing and b.processing):
                    await anyio.sleep(0.01)
                await anyio.sleep(0.1)
                await a.stop()
                await b.stop()

            async def run() -> None:
                with pytest.raises(EngineGone, match="all 2 engines are lost"):
                    await sq.map("w", [f"item {i}" for i in range(6)])

            async with anyio.create_task_group() as tg:
                tg.start_soon(stop_both_while_they_stream)
                await run()
    cancelled = kinds(events, "agent.cancelled")
    assert cancelled and all(e.data["reason"].startswith("all 2 engines are lost (") for e in cancelled)
    assert len(kinds(events, "engine.lost")) == 2


async def test_when_the_one_engine_is_gone_mid_map_the_waiting_items_say_so() -> None:
    events: list[Event] = []
    async with FakeEngine(slots=1, token_delay=0.05) as a:
        async with Squad([worker(max_tokens=12)], engine=a.info, on_event=events.append) as sq:
            async def stop_while_it_streams() -> None:
                while not a.processing:
                    await anyio.sleep(0.01)
                await anyio.sleep(0.1)
                await a.stop()

            async def run() -> None:
                with pytest.raises(EngineGone) as gone:
                    await sq.map("w", [f"item {i}" for i in range(4)])
                cancelled = kinds(events, "agent.cancelled")
                assert cancelled and {e.data["reason"] for e in cancelled} == {str(gone.value)}

            async with anyio.create_task_group() as tg:
                tg.start_soon(stop_while_it_streams)
                await run()

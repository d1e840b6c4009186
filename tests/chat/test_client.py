"""EngineClient against the fake engine: field cases F01, F03-F08, retries, cancellation."""

from __future__ import annotations

import json

import anyio
import httpx
import pytest

from squad.chat import ChatRequest, ChatResult, ToolCall
from squad.chat.client import EngineClient
from squad.chat.wrapper import WrapperChatEngine
from squad.errors import (
    AdmissionError,
    AgentRunError,
    CallTimeout,
    ContextExceeded,
    EngineGone,
    EngineLoadTimeout,
    PromptTooLong,
    TruncatedStream,
)
from squad.events import Event, Origin
from squad.sched.admission import Admission
from squad.testing import CONTEXT_EXCEEDED, FakeEngine, Reply, count_tokens

pytestmark = pytest.mark.anyio


async def complete(client: EngineClient, *, agent: str, **request) -> ChatResult:
    """One call through the chat seam, as the runtime makes it."""
    return await client.complete(ChatRequest(origin=Origin(agent, f"{agent}#1"), **request))


def _user(words: int, word: str = "count") -> list[dict]:
    return [{"role": "user", "content": " ".join([word] * words)}]


async def test_plain_call_result_usage_timings():
    async with FakeEngine(slots=2, n_ctx=1024) as fe, EngineClient(fe.info) as client:
        fe.script(Reply(content="the answer is four", finish_reason="stop"))
        seen: list[str] = []
        r = await complete(client, agent="main", messages=_user(5), max_tokens=50, on_delta=seen.append)
    assert isinstance(r, ChatResult)
    assert r.content == "the answer is four" and "".join(seen) == r.content and r.finish_reason == "stop"
    assert r.usage is not None and (r.usage.prompt_tokens, r.usage.completion_tokens) == (12, 4)
    assert r.reserved_tokens == 12 + 50 and r.attempts == 1
    assert r.timings.ttft_s is not None and r.timings.total_s >= r.timings.ttft_s
    assert r.timings.engine is not None and r.timings.engine["predicted_n"] == 4
    assert fe.requests[0]["stream"] is True and fe.requests[0]["stream_options"] == {"include_usage": True}


async def test_count_prompt_tokens_is_the_engines_count():
    async with FakeEngine() as fe, EngineClient(fe.info) as client:
        tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
        assert await client.count(_user(7), tools) == count_tokens(_user(7), tools)


async def test_f01_four_agents_all_finish_through_admission():
    """The load that kills every naive request (test_fake_engine) finishes through squad."""
    events: list[Event] = []
    peak = 0

    def watch(e: Event) -> None:
        nonlocal peak
        events.append(e)
        peak = max(peak, admission.reserved)

    admission = Admission(slots=4, pool=1024, on_event=watch)
    async with FakeEngine(slots=4, n_ctx=1024, token_delay=0.001) as fe:
        async with EngineClient(fe.info, admission=admission) as client:
            results: list[ChatResult] = []

            async def agent(i: int) -> None:
                results.append(await complete(client, agent=f"a{i}", messages=_user(163), max_tokens=400))

            async with anyio.create_task_group() as tg:
                for i in range(4):
                    tg.start_soon(agent, i)
    assert len(results) == 4 and all(r.usage and r.usage.completion_tokens == 400 for r in results)
    assert fe.overflows == 0 and 0 < peak <= 1024 and fe.max_held <= 1024
    assert [e.kind for e in events].count("call.queued") == 3


async def test_admission_error_before_the_engine_is_called():
    async with FakeEngine(n_ctx=1024) as fe, EngineClient(fe.info) as client:
        with pytest.raises(AdmissionError, match="budget is 300"):
            await complete(client, agent="w", messages=_user(100), max_tokens=250, budget=300)
        with pytest.raises(AdmissionError, match="raise the context to 1280"):
            await complete(client, agent="w", messages=_user(100), max_tokens=1000)
    assert fe.requests == []


async def test_prompt_too_long_is_typed_and_not_retried():
    async with FakeEngine(n_ctx=256) as fe:
        client = EngineClient(fe.info, admission=Admission(slots=2, pool=4096))  # admission thinks it fits
        with pytest.raises(PromptTooLong, match="exceeds the available context size") as err:
            await complete(client, agent="w", messages=_user(300), max_tokens=10)
        await client.aclose()
    assert err.value.agent == "w" and len(fe.requests) == 1


async def test_f03_loading_503_is_waited_out():
    events: list[Event] = []
    async with FakeEngine(load_time=1.0) as fe, EngineClient(fe.info, on_event=events.append) as client:
        r = await complete(client, agent="main", messages=_user(3), max_tokens=5)
    assert r.content and r.attempts > 1
    assert any(e.kind == "call.retried" and "503" in e.data["reason"] for e in events)


async def test_f03_loading_past_the_deadline_says_so():
    async with FakeEngine(load_time=30) as fe, EngineClient(fe.info, load_deadline=0.6) as client:
        with pytest.raises(EngineLoadTimeout, match="still answered 503"):
            await complete(client, agent="main", messages=_user(3), max_tokens=5)


async def test_f04_no_sdk_retries_and_a_timeout_is_not_resent():
    async with FakeEngine(token_delay=0.2) as fe, EngineClient(fe.info, request_timeout=0.5) as client:
        assert client.transport.openai.max_retries == 0
        with pytest.raises(CallTimeout, match="not resent unchanged"):
            await complete(client, agent="slow", messages=_user(3), max_tokens=50)
        with anyio.fail_after(5):
            while fe.processing:
                await anyio.sleep(0.01)
    assert len(fe.requests) == 1


async def test_other_500_is_not_retried_and_the_failure_is_an_event():
    events: list[Event] = []
    async with FakeEngine() as fe, EngineClient(fe.info, on_event=events.append) as client:
        fe.script(Reply(status=500, error_message="boom"))
        with pytest.raises(AgentRunError, match="HTTP 500: boom"):
            await complete(client, agent="a", messages=_user(3), max_tokens=5)
    assert len(fe.requests) == 1
    assert [e.data["error"] for e in events if e.kind == "call.failed"] == ["AgentRunError"]


async def test_f05_error_frame_mid_stream_is_typed_with_the_servers_message():
    async with FakeEngine() as fe, EngineClient(fe.info, max_attempts=1) as client:
        fe.script(Reply(content="partial words here", error_after=2, error_message="slot crashed: out of memory"))
        with pytest.raises(TruncatedStream, match="slot crashed: out of memory") as err:
            await complete(client, agent="a", messages=_user(3), max_tokens=50)
    assert err.value.partial == "partial words"


async def test_f05_stream_without_finish_reason_is_truncated_and_partial_kept_apart():
    async with FakeEngine() as fe, EngineClient(fe.info) as client:
        fe.script(Reply(content="half an answer that stops", truncate_after=3))
        with pytest.raises(TruncatedStream, match="without a finish_reason") as err:
            await complete(client, agent="a", messages=_user(3), max_tokens=50)
    assert err.value.partial == "half an answer"
    assert len(fe.requests) == 1


async def test_f06_usage_only_chunk_is_tolerated_and_recorded():
    async with FakeEngine() as fe, EngineClient(fe.info) as client:
        fe.script(Reply(content="a b", finish_reason="stop"))
        r = await complete(client, agent="a", messages=_user(3), max_tokens=50)
    assert r.usage is not None and r.usage.completion_tokens == 2


async def test_f07_reasoning_apart_and_a_cut_while_thinking_is_a_result():
    async with FakeEngine() as fe, EngineClient(fe.info) as client:
        fe.script(Reply(reasoning="let me think step by step", content="yes"))
        r = await complete(client, agent="t", messages=_user(3), max_tokens=50)
        assert (r.reasoning, r.content) == ("let me think step by step", "yes") and not r.cut_while_thinking
        fe.script(Reply(reasoning=" ".join(["hmm"] * 40), content="never reached"))
        r = await complete(client, agent="t", messages=_user(3), max_tokens=20)  # no error: truncated, in thinking
    assert r.finish_reason == "length" and r.content == "" and r.cut_while_thinking
    assert len(fe.requests) == 2  # not retried


async def test_tool_call_deltas_are_assembled_by_index():
    async with FakeEngine() as fe, EngineClient(fe.info) as client:
        fe.script(Reply(content="", tool_calls=[{"name": "search", "arguments": json.dumps({"q": "x y"})},
                                                {"name": "read", "arguments": "{}"}]))
        r = await complete(client, agent="a", messages=_user(3), max_tokens=50,
                                  tools=[{"type": "function", "function": {"name": "search"}}])
    assert r.finish_reason == "tool_calls"
    assert [(c.name, json.loads(c.arguments)) for c in r.tool_calls] == [("search", {"q": "x y"}), ("read", {})]
    assert all(isinstance(c, ToolCall) and c.id for c in r.tool_calls)


async def test_f08_more_callers_than_slots_never_more_in_flight_and_queued_visible():
    events: list[Event] = []
    async with FakeEngine(slots=2, n_ctx=4096, token_delay=0.002) as fe:
        async with EngineClient(fe.info, on_event=events.append) as client:
            async def agent(i: int) -> None:
                await complete(client, agent=f"sub{i}", messages=_user(5), max_tokens=20, priority=1)

            async with anyio.create_task_group() as tg:
                for i in range(5):
                    tg.start_soon(agent, i)
    assert fe.max_processing == 2 and fe.deferred == 0
    queued = {e.agent for e in events if e.kind == "call.queued"}
    assert len(queued) == 3
    assert max(e.data["in_flight"] for e in events if e.kind == "call.admitted") == 2


async def test_innocent_overflow_by_another_client_is_retried():
    events: list[Event] = []
    async with FakeEngine() as fe, EngineClient(fe.info, on_event=events.append) as client:
        fe.script(Reply(content="a b c", error_after=1))  # error frame: Context size has been exceeded.
        r = await complete(client, agent="a", messages=_user(3), max_tokens=5)
    assert r.attempts == 2 and r.content
    assert any(e.kind == "call.retried" and "another client" in e.data["reason"] for e in events)


async def test_innocent_overflow_gives_up_after_max_attempts():
    async with FakeEngine() as fe, EngineClient(fe.info, max_attempts=2) as client:
        fe.script(*[Reply(status=500, error_message=CONTEXT_EXCEEDED)] * 2)
        with pytest.raises(ContextExceeded, match="another client"):
            await complete(client, agent="a", messages=_user(3), max_tokens=5)
    assert len(fe.requests) == 2


async def test_engine_gone_restarts_once_and_retries():
    fe = FakeEngine()
    await fe.start()
    restarts: list[int] = []

    async def restart():
        restarts.append(1)
        return await fe.restart()

    try:
        async with EngineClient(fe.info, restart=restart) as client:
            await fe.stop()
            r = await complete(client, agent="a", messages=_user(3), max_tokens=5)
            assert r.content and restarts == [1]
            await fe.stop()
            restarts.clear()

            async def dead_restart():
                restarts.append(1)
                return fe.info  # still down

            client.retrying.restart = dead_restart
            with pytest.raises(EngineGone):
                await complete(client, agent="a", messages=_user(3), max_tokens=5)
            assert restarts == [1]  # once per call, then the error
    finally:
        await fe.stop()


async def test_a_live_engine_is_never_restarted_for_connections_that_failed():
    """Two connections fail before the first token but /health answers: the call is resent,
    the engine (alive, maybe only busy) is not restarted under the other calls' feet."""
    restarts: list[int] = []

    async def restart():
        restarts.append(1)
        return fe.info

    async with FakeEngine() as fe, EngineClient(fe.info, restart=restart) as client:
        class Flaky(WrapperChatEngine):  # a layer of its own, under the retrying one
            fails = 2

            async def complete(self, request):
                if self.fails:
                    self.fails -= 1
                    raise EngineGone("connection reset before the first token")
                return await super().complete(request)

        client.retrying.inner = Flaky(client.retrying.inner)
        r = await complete(client, agent="a", messages=_user(3), max_tokens=5)
    assert r.content and restarts == []


async def test_engine_gone_without_restart_fails_at_once():
    fe = FakeEngine()
    await fe.start()
    info = fe.info
    await fe.stop()
    async with EngineClient(info) as client:
        with pytest.raises(EngineGone, match="not answering"):
            await complete(client, agent="a", messages=_user(3), max_tokens=5)


async def test_cancelling_a_call_closes_the_stream_and_frees_the_slot():
    async with FakeEngine(slots=1, token_delay=0.05) as fe, EngineClient(fe.info) as client:
        with anyio.move_on_after(0.3):
            await complete(client, agent="a", messages=_user(3), max_tokens=500)
        assert client.admission.in_flight == 0 and client.admission.reserved == 0
        with anyio.fail_after(5):
            while fe.processing:
                await anyio.sleep(0.01)
        assert fe.disconnects == 1
        fe.script(Reply(content="next", finish_reason="stop"))
        assert (await complete(client, agent="b", messages=_user(3), max_tokens=5)).content == "next"


class _FlakyTransport(httpx.AsyncBaseTransport):
    """Drops the first ``drops`` requests to ``path`` with ``httpx.ReadError('')`` (F22)."""

    def __init__(self, inner: httpx.AsyncBaseTransport, path: str, drops: int) -> None:
        self.inner, self.path, self.drops, self.seen = inner, path, drops, 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == self.path:
            self.seen += 1
            if self.seen <= self.drops:
                raise httpx.ReadError("")
        return await self.inner.handle_async_request(request)


async def test_f22_a_dropped_token_count_is_retried_not_engine_gone():
    async with FakeEngine() as fe, EngineClient(fe.info, counter=None) as client:
        flaky = _FlakyTransport(httpx.AsyncHTTPTransport(), "/v1/chat/completions/input_tokens", drops=2)
        client.transport.http = httpx.AsyncClient(base_url=fe.base_url, transport=flaky)
        assert await client.count(_user(7)) == count_tokens(_user(7))
        assert flaky.seen == 3
        fe.script(Reply(content="fine"))
        assert (await complete(client, agent="a", messages=_user(8), max_tokens=5)).content == "fine"


async def test_f22_control_requests_survive_a_dropped_connection():
    from squad.engine.control import control_client, read_engine

    async with FakeEngine(slots=3) as fe:
        flaky = _FlakyTransport(httpx.AsyncHTTPTransport(), "/props", drops=1)
        async with control_client(fe.base_url, transport=flaky) as http:
            state = await read_engine(http)
    assert state.total_slots == 3 and flaky.seen == 2


async def test_counts_are_remembered_and_local_counts_need_no_round_trip():
    class Words:
        def count_chat(self, messages, tools=None):
            return count_tokens(messages, tools)

        def count_text(self, text):
            return len(text.split())

    async with FakeEngine() as fe, EngineClient(fe.info, counter=Words()) as client:
        fe.script(Reply(content="ok"), Reply(content="ok"))
        for _ in range(2):
            await complete(client, agent="a", messages=_user(9), max_tokens=5)
    assert fe.count_requests == 0

"""``squad serve`` against the fake engine: admission per request (count, reserve, queue by
priority, release on end and on disconnect), the 400 for a request that can never fit, the
default reservation, the key, passthrough, ``/squad/status``, and squad's own client
recognising the endpoint (field case F20). The real engine: tests/serve/test_serve_real.py."""

from __future__ import annotations

import contextlib
import json
import time

import anyio
import httpx
import openai
import pytest

from squad.engine.session import EngineSpec
from squad.serve import DEFAULT_MAX_TOKENS, serving
from squad.serve.demand import Refused, demand_for, read_max_tokens
from squad.testing import FakeEngine, count_tokens

pytestmark = pytest.mark.anyio


def spec(fe: FakeEngine) -> EngineSpec:
    return EngineSpec(url=fe.base_url, api_key=fe.api_key)


def sdk(served) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=served.base_url, api_key=served.api_key, max_retries=0)


def http(served, key: str | None = "served") -> httpx.AsyncClient:
    key = served.api_key if key == "served" else key
    return httpx.AsyncClient(base_url=served.url, headers={"Authorization": f"Bearer {key}"} if key else {},
                             timeout=30)


@contextlib.asynccontextmanager
async def holding(client: httpx.AsyncClient, content: str = "first", headers: dict | None = None):
    """A streamed request that holds its engine slot until the block ends (the client then
    disconnects): a short request could end, and let the queue move, while a test queues others.
    The line iterator is kept: a dropped one closes the stream."""
    body = {"messages": [{"role": "user", "content": content}], "max_tokens": 2000, "stream": True}
    async with client.stream("POST", "/v1/chat/completions", json=body, headers=headers or {}) as held:
        lines = held.aiter_lines()
        while not (await lines.__anext__()).startswith("data: "):
            pass
        yield held


def ask(words: int, tag: str = "w") -> list[dict]:
    return [{"role": "user", "content": " ".join(f"{tag}{i}" for i in range(words))}]


async def test_chat_completes_and_streams_through_serve():
    async with FakeEngine(slots=2, n_ctx=1024, api_key="engine-key", token_delay=0.001) as fe:
        async with serving(spec(fe), port=0) as served:
            async with sdk(served) as client:
                done = await client.chat.completions.create(model="x", messages=ask(5), max_tokens=7)
                assert done.choices[0].finish_reason == "length"
                assert done.usage.completion_tokens == 7
                stream = await client.chat.completions.create(model="x", messages=ask(5), max_tokens=9, stream=True,
                                                              stream_options={"include_usage": True})
                text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
                assert len(text.split()) == 9
            await wait_for(lambda: served.gateway.status()["clients"]["127.0.0.1"]["completed"] == 2)
            status = served.gateway.status()
    assert status["admission"]["reserved"] == 0 and status["admission"]["busy"] == 0


async def test_streams_are_relayed_chunk_by_chunk():
    """Chunks reach the client as the engine makes them: the first long before the last."""
    async with FakeEngine(slots=1, token_delay=0.04) as fe:
        async with serving(spec(fe), port=0) as served, http(served) as client:
            body = {"messages": ask(3), "max_tokens": 12, "stream": True}
            seen = []
            async with client.stream("POST", "/v1/chat/completions", json=body) as r:
                async for line in r.aiter_lines():
                    if line.startswith("data: ") and line != "data: [DONE]":
                        seen.append(time.monotonic())
    assert len(seen) >= 12
    assert seen[-1] - seen[0] > 0.25  # spread over the generation, not delivered at the end


async def test_the_key_is_required_except_for_health_and_serve_binds_loopback():
    async with FakeEngine(slots=1) as fe:
        async with serving(spec(fe), port=0) as served:
            assert served.url.startswith("http://127.0.0.1:")
            assert len(served.api_key) >= 24  # generated
            async with http(served, key=None) as anon, http(served, key="wrong") as wrong, http(served) as ok:
                assert (await anon.get("/health")).status_code == 200
                for client in (anon, wrong):
                    r = await client.post("/v1/chat/completions", json={"messages": ask(2)})
                    assert r.status_code == 401
                    assert r.json()["error"]["type"] == "authentication_error"
                    assert (await client.get("/props")).status_code == 401
                    assert (await client.get("/squad/status")).status_code == 401
                assert (await ok.get("/props")).json()["total_slots"] == 1
                assert (await ok.get("/health")).headers["x-squad-serve"]
    assert fe.requests == []  # nothing unauthorised reached the engine


async def test_a_given_key_is_the_one_it_takes():
    async with FakeEngine(slots=1) as fe:
        async with serving(spec(fe), port=0, api_key="my-key") as served:
            async with http(served, key="my-key") as client:
                assert (await client.get("/squad/status")).status_code == 200


async def test_passthrough_endpoints():
    async with FakeEngine(slots=3, n_ctx=2048, api_key="k") as fe:
        async with serving(spec(fe), port=0) as served, http(served) as client:
            assert (await client.get("/props")).json()["default_generation_settings"]["n_ctx"] == 2048
            assert len((await client.get("/slots")).json()) == 3
            assert (await client.get("/v1/models")).json()["data"][0]["meta"]["n_ctx_train"] == 8192
            counted = await client.post("/v1/chat/completions/input_tokens", json={"messages": ask(4)})
            assert counted.json()["input_tokens"] == count_tokens(ask(4))
            assert (await client.get("/nothing")).status_code == 404


async def test_a_request_that_can_never_fit_gets_400_with_the_numbers():
    async with FakeEngine(slots=2, n_ctx=512) as fe:
        async with serving(spec(fe), port=0) as served, sdk(served) as client:
            prompt = count_tokens(ask(100))
            with pytest.raises(openai.BadRequestError) as caught:
                await client.chat.completions.create(model="x", messages=ask(100), max_tokens=500)
            error = caught.value.body
            assert error["type"] == "exceed_context_size_error"
            assert error["n_prompt_tokens"] == prompt and error["max_tokens"] == 500 and error["n_ctx"] == 512
            assert f"prompt {prompt} + max_tokens 500" in error["message"]
            assert f"lower max_tokens to {512 - prompt}" in error["message"]
            with pytest.raises(openai.BadRequestError, match="prompt is .* tokens"):  # no max_tokens: the prompt alone
                await client.chat.completions.create(model="x", messages=ask(600))
            await wait_for(lambda: served.gateway.status()["clients"]["127.0.0.1"]["refused"] == 2)
    assert fe.requests == []


async def test_a_request_without_max_tokens_gets_the_stated_default_capped_to_fit():
    async with FakeEngine(slots=1, n_ctx=4096) as fe:
        async with serving(spec(fe), port=0) as served, sdk(served) as client:
            await client.chat.completions.create(model="x", messages=ask(3))
            assert fe.requests[-1]["max_tokens"] == DEFAULT_MAX_TOKENS
        async with serving(spec(fe), port=0, default_max_tokens=5000) as served, sdk(served) as client:
            await client.chat.completions.create(model="x", messages=ask(3))
            assert fe.requests[-1]["max_tokens"] == 4096 - count_tokens(ask(3))  # all the room there is


async def test_max_tokens_fields_and_bad_values():
    assert read_max_tokens({}) is None and read_max_tokens({"n_predict": -1}) is None
    assert read_max_tokens({"max_tokens": 10, "max_completion_tokens": 30}) == 30
    for bad in (0, -3, "10", True, 1.5):
        with pytest.raises(Refused, match="whole number"):
            read_max_tokens({"max_tokens": bad})

    async def count(body, kind):
        return 10

    with pytest.raises(Refused, match="one completion per request"):
        await demand_for({"n": 2, "max_tokens": 5}, "chat", count, limit=100, default_max_tokens=50)
    assert (await demand_for({}, "chat", count, limit=100, default_max_tokens=50)).tokens == 60
    assert (await demand_for({}, "chat", count, limit=40, default_max_tokens=50)).max_tokens == 30


async def test_naive_concurrent_clients_all_finish_through_serve_where_they_overflow_directly():
    """8 clients at once, each asking 300 tokens on a 1,024-token pool with 4 slots: sent
    directly the pool overflows and requests fail; through squad serve none does and each
    gets its full max_tokens."""
    messages = ask(10)

    async def burst(base_url: str, key: str | None) -> list:
        async with openai.AsyncOpenAI(base_url=base_url, api_key=key or "none", max_retries=0) as client:
            results: list = [None] * 8

            async def one(i: int) -> None:
                try:
                    stream = await client.chat.completions.create(model="x", messages=messages, max_tokens=300,
                                                                  stream=True)
                    results[i] = len("".join([c.choices[0].delta.content or "" async for c in stream
                                              if c.choices]).split())
                except openai.APIError as exc:
                    results[i] = exc

            async with anyio.create_task_group() as tg:
                for i in range(8):
                    tg.start_soon(one, i)
            return results

    async with FakeEngine(slots=4, n_ctx=1024, token_delay=0.001) as fe:
        direct = await burst(fe.base_url + "/v1", None)
        assert fe.overflows > 0 and any(not isinstance(r, int) or r < 300 for r in direct)
        fe.overflows = 0
        async with serving(spec(fe), port=0) as served:
            through = await burst(served.base_url, served.api_key)
            assert served.gateway.status()["peaks"]["requests"] == 8
    assert through == [300] * 8
    assert fe.overflows == 0


async def test_fifo_within_priority_and_lower_first():
    async with FakeEngine(slots=1, n_ctx=4096, token_delay=0.01) as fe:
        async with serving(spec(fe), port=0) as served, http(served) as client:
            async def send(tag: str, priority: int | None = None) -> None:
                headers = {} if priority is None else {"X-Squad-Priority": str(priority)}
                r = await client.post("/v1/chat/completions", headers=headers,
                                      json={"messages": [{"role": "user", "content": tag}], "max_tokens": 5})
                assert r.status_code == 200

            async with anyio.create_task_group() as tg:
                async with holding(client, "first"):  # the one slot, until every other request is queued
                    for tag, priority in (("low-a", 5), ("high-a", 1), ("low-b", 5), ("high-b", 1), ("plain", None)):
                        tg.start_soon(send, tag, priority)
                        queued = len(served.gateway.admission.queued) + 1
                        await wait_for(lambda n=queued: len(served.gateway.admission.queued) == n)
            order = [r["messages"][0]["content"] for r in fe.requests]
    assert order == ["first", "plain", "high-a", "high-b", "low-a", "low-b"]
    bad = None
    async with FakeEngine(slots=1) as fe:
        async with serving(spec(fe), port=0) as served, http(served) as client:
            bad = await client.post("/v1/chat/completions", headers={"X-Squad-Priority": "soon"},
                                    json={"messages": ask(2)})
    assert bad.status_code == 400 and "X-Squad-Priority".lower() in bad.json()["error"]["message"].lower()


async def test_a_disconnect_mid_stream_frees_the_reservation_and_the_engine_slot():
    async with FakeEngine(slots=1, token_delay=0.05) as fe:
        async with serving(spec(fe), port=0) as served, http(served) as client:
            body = {"messages": ask(3), "max_tokens": 400, "stream": True}
            async with client.stream("POST", "/v1/chat/completions", json=body) as r:
                async for line in r.aiter_lines():
                    if line.startswith("data: "):
                        assert served.gateway.admission.reserved > 0
                        break
            await wait_for(lambda: served.gateway.admission.reserved == 0 and fe.processing == 0)
            status = served.gateway.status()
    assert fe.disconnects == 1
    assert status["clients"]["127.0.0.1"]["disconnected"] == 1
    assert status["running"] == [] and status["admission"]["busy"] == 0


async def test_a_non_streamed_request_whose_client_leaves_stays_reserved_while_the_engine_works_on_it():
    """squad's books keep the reservation of a request whose client left (and the request
    waiting behind it waits) for as long as the engine's /slots shows the slot at work."""
    async with FakeEngine(slots=1, n_ctx=1024, token_delay=0.01) as fe:
        async with serving(spec(fe), port=0) as served, http(served) as client:
            gateway = served.gateway
            with anyio.move_on_after(0.3):  # leaves while the engine generates: the connection closes
                await client.post("/v1/chat/completions", json={"messages": ask(3), "max_tokens": 300})
            async with anyio.create_task_group() as tg:
                after: list = []

                async def next_one() -> None:
                    r = await client.post("/v1/chat/completions", json={"messages": ask(2, "n"), "max_tokens": 5})
                    after.append(r.status_code)

                tg.start_soon(next_one)
                seen = 0
                while fe.completed == 0:  # the engine is still on the request whose client left
                    books = gateway.status()["admission"]
                    engine_busy = fe.processing
                    if engine_busy and fe.completed == 0:
                        seen += 1
                        assert books["reserved"] > 0 and books["busy"] == 1, books
                    await anyio.sleep(0.02)
            assert seen > 0 and after == [200] and fe.max_processing == 1
            await wait_for(lambda: gateway.admission.reserved == 0)
            status = gateway.status()
    assert status["clients"]["127.0.0.1"]["disconnected"] == 1 and status["admission"]["settling"] == 0


async def test_squad_client_keeps_a_cancelled_calls_reservation_until_the_engine_slot_is_free():
    """A call cancelled mid-stream (a fail-fast sibling, Ctrl-C, a deadline) is released by
    squad's own client only once the engine's /slots shows no more slots processing than calls
    squad still runs."""
    from squad.chat import ChatRequest
    from squad.chat.client import EngineClient
    from squad.events import Origin

    async with FakeEngine(slots=2, n_ctx=1024, token_delay=0.02) as fe, EngineClient(fe.info, counter=None) as client:
        started = anyio.Event()

        def on_delta(*_):
            started.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(client.complete, ChatRequest(Origin("a"), ask(3), 400, on_delta=on_delta))
            await started.wait()
            assert client.admission.reserved > 0
            tg.cancel_scope.cancel()
        assert client.admission.reserved == 0 and fe.processing == 0  # released after the engine let go
    assert fe.disconnects == 1


async def test_n_completions_are_one_reservation_each_and_one_answer():
    """n=3 on a 1-slot engine: three requests of n=1 reach the engine one at a time (each
    reserved and released on its own), and the client gets one answer with choices 0..2 and the
    usage summed, streamed or not."""
    async with FakeEngine(slots=1, n_ctx=1024, token_delay=0.002) as fe:
        async with serving(spec(fe), port=0) as served, sdk(served) as client:
            done = await client.chat.completions.create(model="x", messages=ask(4), max_tokens=6, n=3)
            assert [c.index for c in done.choices] == [0, 1, 2] and done.model == "x"  # the request's (shapes)
            assert done.usage.completion_tokens == 18 and done.usage.prompt_tokens == 3 * count_tokens(ask(4))
            stream = await client.chat.completions.create(model="x", messages=ask(4), max_tokens=5, n=2, stream=True,
                                                          stream_options={"include_usage": True})
            texts: dict[int, str] = {}
            usage = None
            async for chunk in stream:
                assert chunk.model == "x"
                for c in chunk.choices:
                    texts[c.index] = texts.get(c.index, "") + (c.delta.content or "")
                usage = chunk.usage or usage
            assert sorted(texts) == [0, 1] and all(len(t.split()) == 5 for t in texts.values())
            assert usage.completion_tokens == 10
            await wait_for(lambda: served.gateway.admission.reserved == 0)
        async with serving(spec(fe), port=0) as served, http(served) as raw:
            for n in (0, "2", 500):
                refused = await raw.post("/v1/chat/completions", json={"messages": ask(2), "max_tokens": 5, "n": n})
                assert refused.status_code == 400 and refused.json()["error"]["param"] == "n"
    assert len(fe.requests) == 5 and all("n" not in r for r in fe.requests) and fe.max_processing == 1


async def test_a_client_that_leaves_while_queued_leaves_the_queue():
    async with FakeEngine(slots=1, token_delay=0.02) as fe:
        async with serving(spec(fe), port=0) as served, http(served) as client:
            async with holding(client, "a0 a1"):
                with anyio.move_on_after(0.3):  # gives up while queued: the connection closes
                    async with httpx.AsyncClient(base_url=served.url, timeout=30,
                                                 headers={"Authorization": f"Bearer {served.api_key}"}) as impatient:
                        await impatient.post("/v1/chat/completions", json={"messages": ask(2, "b"), "max_tokens": 5})
                await wait_for(lambda: served.gateway.admission.queued == [])
                await wait_for(lambda: served.gateway.status()["clients"]["127.0.0.1"]["disconnected"] == 1)
    assert [r["messages"][0]["content"] for r in fe.requests] == ["a0 a1"]  # b never reached the engine


async def test_status_shows_slots_pool_queue_and_per_client_counts():
    async with FakeEngine(slots=1, n_ctx=2048, token_delay=0.02) as fe:
        async with serving(spec(fe), port=0) as served, http(served) as client:
            async with anyio.create_task_group() as tg:
                async with holding(client, "w0 w1", {"X-Squad-Client": "alice"}):  # leaves before it ends
                    for who in ("bob", "bob"):
                        tg.start_soon(lambda who=who: client.post("/v1/chat/completions",
                                                                  headers={"X-Squad-Client": who},
                                                                 json={"messages": ask(2), "max_tokens": 10}))
                    await wait_for(lambda: len(served.gateway.admission.queued) == 2)
                    status = (await client.get("/squad/status")).json()
            await wait_for(lambda: served.gateway.ledger.live == {})
            final = (await client.get("/squad/status")).json()
    assert status["admission"]["slots"] == 1 and status["admission"]["pool"] == 2048
    assert status["admission"]["busy"] == 1 and status["admission"]["queued"] == 2
    assert len(status["running"]) == 1 and len(status["queued"]) == 2
    assert status["admission"]["reserved"] == status["running"][0]["tokens"] == count_tokens(ask(2)) + 2000
    assert final["clients"]["alice"]["disconnected"] == 1 and final["clients"]["bob"]["completed"] == 2
    assert final["squad_serve"] and final["engine"]["pool"] == 2048


async def test_squad_client_recognises_serve_and_does_not_admit_twice():
    """F20: squad attached to a squad serve endpoint sends without reserving (the endpoint
    admits), names itself and passes its priority; the endpoint's admission holds every call."""
    from squad import Agent, Squad
    from squad.engine.control import attach

    async with FakeEngine(slots=2, n_ctx=1024, token_delay=0.002) as fe:
        async with serving(spec(fe), port=0) as served:
            info = await attach(served.url, served.api_key)
            assert info.admits and info.slots == 2
            seen: list = []
            async with Squad([Agent(name="w", budget=512, max_tokens=8)],
                             engine=EngineSpec(url=served.url, api_key=served.api_key), on_event=seen.append) as sq:
                assert sq.session.admission is None
                results = await sq.map("w", [f"item {i}" for i in range(4)])
            await wait_for(lambda: served.gateway.ledger.live == {})
            status = served.gateway.status()
    assert all(r.ok for r in results)
    assert not [e for e in seen if e.kind in ("call.queued", "call.admitted")]
    assert status["clients"]["w"]["completed"] == 4
    assert fe.max_processing <= 2 and fe.overflows == 0


async def test_serve_refuses_to_stack_on_another_serve():
    from squad.errors import UserError

    async with FakeEngine(slots=1) as fe:
        async with serving(spec(fe), port=0) as served:
            with pytest.raises(UserError, match="admits on its own"):
                async with serving(EngineSpec(url=served.url, api_key=served.api_key), port=0):
                    pass


async def test_a_taken_port_is_a_clear_error():
    from squad.errors import UserError

    async with FakeEngine(slots=1) as fe:
        async with serving(spec(fe), port=0) as served:
            port = int(served.url.rsplit(":", 1)[1])
            with pytest.raises(UserError, match=f"cannot listen on 127.0.0.1:{port}"):
                async with serving(spec(fe), port=port):
                    pass


async def wait_for(condition, timeout: float = 10.0) -> None:
    with anyio.fail_after(timeout):
        while not condition():
            await anyio.sleep(0.01)


def test_error_bodies_are_openai_shaped():
    refused = Refused(400, "no", param="n")
    assert json.loads(json.dumps(refused.body)) == {"error": {"message": "no", "type": "invalid_request_error",
                                                              "param": None, "code": 400} | {"param": "n"}}


def test_replan_sizes_grow_to_the_peaks_keep_pins_and_never_shrink():
    from squad.serve.replan import next_size
    from squad.serve.status import Peaks

    assert next_size(2, 4096, Peaks(requests=5, tokens=6000), pin_slots=None, pin_ctx=None) == (5, 6144)
    assert next_size(2, 4096, Peaks(requests=20, tokens=100), pin_slots=None, pin_ctx=None) == (8, 4096)
    assert next_size(2, 4096, Peaks(requests=5, tokens=6000), pin_slots=2, pin_ctx=None) == (2, 6144)
    assert next_size(2, 4096, Peaks(requests=5, tokens=6000), pin_slots=None, pin_ctx=4096) == (5, 4096)
    assert next_size(4, 8192, Peaks(requests=1, tokens=10), pin_slots=None, pin_ctx=None) == (4, 8192)


async def test_a_replan_on_an_attached_engine_does_nothing():
    from squad.serve.replan import Replanner
    from squad.serve.status import Peaks

    async with FakeEngine(slots=1) as fe:
        async with serving(spec(fe), port=0, replan_interval=1.0) as served:
            assert served.replanner is None  # an engine at a URL runs as it was started
            assert await Replanner(served.gateway).replan(Peaks(requests=9, tokens=99999)) is False


def test_client_names_are_bounded_in_the_status_table():
    from squad.serve.status import MAX_CLIENTS, OTHER_CLIENTS, Ledger

    ledger = Ledger()
    for i in range(MAX_CLIENTS + 10):
        ledger.counts(f"client-{i}").requests += 1
    assert len(ledger.clients) == MAX_CLIENTS + 1 and ledger.clients[OTHER_CLIENTS].requests == 10


def test_a_request_for_several_completions_splits_in_openai_choice_order():
    from squad.serve.fanout import MAX_PARTS, split

    assert split({"prompt": ["a", "b"], "n": 2, "max_tokens": 3}, "completion") == [
        {"prompt": p, "max_tokens": 3} for p in ("a", "a", "b", "b")]  # index = prompt x n + choice
    assert split({"prompt": [[1, 2], [3]]}, "completion") == [{"prompt": [1, 2]}, {"prompt": [3]}]
    assert split({"messages": ask(2), "n": 3}, "chat", "/v1/chat/completions") == [{"messages": ask(2)}] * 3
    for one in ({"prompt": "a"}, {"prompt": [1, 2, 3]}, {"prompt": ["a"]}, {"prompt": "a", "n": 1}):
        assert split(one, "completion") is None
    for bad, path, word in (({"prompt": []}, "/v1/completions", "empty"), ({"n": 2.0}, "/v1/completions", "whole"),
                            ({"prompt": ["a"] * (MAX_PARTS + 1)}, "/v1/completions", "at most"),
                            ({"prompt": ["a", "b"]}, "/completion", "/v1/completions")):
        with pytest.raises(Refused, match=word):
            split(bad, "completion", path)


def test_a_streamed_answer_is_put_together_as_the_answer_not_streamed():
    """What llama-server streams for a request the client did not stream (squad serve sends it
    streamed so the engine stops it when the client leaves) becomes the body it would have sent."""
    from squad.serve.assemble import Assembly, streamed_upstream

    assert streamed_upstream({"messages": [], "stream": False}) == {
        "messages": [], "stream": True, "stream_options": {"include_usage": True}}
    head = {"id": "chatcmpl-1", "created": 7, "model": "m", "system_fingerprint": "b0",
            "object": "chat.completion.chunk"}
    lines = [
        {**head, "choices": [{"index": 0, "finish_reason": None, "delta": {"role": "assistant", "content": None}}]},
        {**head, "choices": [{"index": 0, "finish_reason": None, "delta": {"reasoning_content": "hm"}}]},
        {**head, "choices": [{"index": 0, "finish_reason": None, "delta": {"content": "Hel"}}]},
        {**head, "choices": [{"index": 0, "finish_reason": None, "delta": {"content": "lo"}}]},
        {**head, "choices": [{"index": 0, "finish_reason": None, "delta": {"tool_calls": [
            {"index": 0, "id": "call_1", "type": "function", "function": {"name": "add", "arguments": "{\"a\":"}}]}}]},
        {**head, "choices": [{"index": 0, "finish_reason": None, "delta": {"tool_calls": [
            {"index": 0, "function": {"arguments": " 1}"}}]}}]},
        {**head, "choices": [{"index": 0, "finish_reason": "tool_calls", "delta": {}}], "timings": {"predicted_n": 5}},
        {**head, "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8}},
    ]
    got = Assembly()
    for line in [f"data: {json.dumps(x)}" for x in lines] + ["", "data: [DONE]"]:
        got.line(line)
    status, body = got.answer()
    assert status == 200 and got.done
    assert body["object"] == "chat.completion" and body["id"] == "chatcmpl-1" and body["usage"]["total_tokens"] == 8
    (choice,) = body["choices"]
    assert choice["finish_reason"] == "tool_calls" and choice["message"] == {
        "role": "assistant", "content": "Hello", "reasoning_content": "hm",
        "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "add", "arguments": "{\"a\": 1}"}}]}

    text = Assembly()
    for piece, reason in (("Once", None), (" upon", "length")):
        text.chunk({"id": "cmpl-2", "object": "text_completion", "choices": [
            {"index": 0, "text": piece, "logprobs": None, "finish_reason": reason}]})
    assert text.answer()[1]["choices"] == [{"index": 0, "text": "Once upon", "logprobs": None,
                                            "finish_reason": "length"}]

    broken = Assembly()
    broken.line('data: {"error": {"code": 500, "message": "Context size has been exceeded.", "type": "server_error"}}')
    assert broken.answer() == (500, {"error": {"code": 500, "message": "Context size has been exceeded.",
                                               "type": "server_error"}})


def test_responses_and_messages_streams_are_put_together_as_their_answers_not_streamed():
    """The Responses and Messages events b11434 streams (tools/server/server-task.cpp) become the
    bodies it answers not streamed; a Messages stream that lost its message_start still makes a message."""
    from squad.serve.assemble import assembly_for, streamed_upstream

    assert streamed_upstream({"input": "x"}, "responses") == {"input": "x", "stream": True}
    done = {"id": "resp_1", "object": "response", "created_at": 9, "status": "completed", "model": "m",
            "output": [{"type": "message", "content": [{"type": "output_text", "text": "Hi"}]}],
            "usage": {"input_tokens": 3, "output_tokens": 1, "total_tokens": 4}}
    responses = assembly_for("responses")
    for event in ({"type": "response.created", "response": {**done, "status": "in_progress", "output": []}},
                  {"type": "response.output_text.delta", "delta": "Hi"},
                  {"type": "response.completed", "response": done}):
        responses.line(f"data: {json.dumps(event)}")
    assert responses.done and responses.answer() == (200, {**done, "completed_at": 9})

    events = [
        {"type": "message_start", "message": {"id": "msg_1", "type": "message", "role": "assistant", "content": [],
                                              "model": "m", "stop_reason": None, "stop_sequence": None,
                                              "usage": {"cache_read_input_tokens": 0, "input_tokens": 7,
                                                        "output_tokens": 0}}},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "thinking", "thinking": ""}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": "hm"}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "signature_delta", "signature": ""}},
        {"type": "content_block_stop", "index": 0},
        {"type": "content_block_start", "index": 1, "content_block": {"type": "text", "text": ""}},
        {"type": "content_block_delta", "index": 1, "delta": {"type": "text_delta", "text": "안녕"}},
        {"type": "content_block_delta", "index": 1, "delta": {"type": "text_delta", "text": "하세요"}},
        {"type": "content_block_stop", "index": 1},
        {"type": "content_block_start", "index": 2, "content_block": {"type": "tool_use", "id": "t1", "name": "add"}},
        {"type": "content_block_delta", "index": 2, "delta": {"type": "input_json_delta", "partial_json": "{\"a\":"}},
        {"type": "content_block_delta", "index": 2, "delta": {"type": "input_json_delta", "partial_json": " 1}"}},
        {"type": "content_block_stop", "index": 2},
        {"type": "message_delta", "delta": {"stop_reason": "tool_use", "stop_sequence": None},
         "usage": {"output_tokens": 9}},
        {"type": "message_stop"},
    ]
    messages = assembly_for("messages", model="any", input_tokens=5)
    for event in events:
        messages.line(f"data: {json.dumps(event, ensure_ascii=False)}")
    assert messages.done and messages.answer() == (200, {
        "id": "msg_1", "type": "message", "role": "assistant", "model": "m", "stop_reason": "tool_use",
        "stop_sequence": None, "usage": {"cache_read_input_tokens": 0, "input_tokens": 7, "output_tokens": 9},
        "content": [{"type": "thinking", "thinking": "hm", "signature": ""}, {"type": "text", "text": "안녕하세요"},
                    {"type": "tool_use", "id": "t1", "name": "add", "input": {"a": 1}}]})

    lost = assembly_for("messages", model="any", input_tokens=5)  # message_start left out (squad.serve.stream_start)
    for event in events[5:8] + events[-2:]:
        lost.line(f"data: {json.dumps(event, ensure_ascii=False)}")
    status, body = lost.answer()
    assert status == 200 and body["id"].startswith("msg_") and body["model"] == "any"
    assert body["content"] == [{"type": "text", "text": "안녕하세요"}] and body["usage"]["input_tokens"] == 5
    cut = assembly_for("messages")
    cut.line('data: {"error": {"code": 500, "message": "x", "type": "server_error"}}')
    assert not cut.done and cut.answer()[0] == 500

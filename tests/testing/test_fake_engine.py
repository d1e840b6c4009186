"""The fake engine speaks llama-server's API and fails like it (so the client tests mean something)."""

from __future__ import annotations

import json

import anyio
import httpx
import openai
import pytest

from squad.testing import CONTEXT_EXCEEDED, FakeEngine, Reply, count_tokens

pytestmark = pytest.mark.anyio


def _prompt(words: int) -> list[dict]:
    return [{"role": "user", "content": " ".join(["count"] * words)}]


async def test_endpoints_shapes_and_api_key():
    async with FakeEngine(slots=3, n_ctx=1024, api_key="sekret") as fe:
        async with httpx.AsyncClient(base_url=fe.base_url) as c:
            assert (await c.get("/health")).json() == {"status": "ok"}  # no key needed
            denied = await c.get("/props")
            assert denied.status_code == 401 and denied.json()["error"]["type"] == "authentication_error"
            auth = {"Authorization": "Bearer sekret"}
            props = (await c.get("/props", headers=auth)).json()
            assert props["default_generation_settings"]["n_ctx"] == 1024 and props["total_slots"] == 3
            slots = (await c.get("/slots", headers=auth)).json()
            assert [s["is_processing"] for s in slots] == [False] * 3
            meta = (await c.get("/v1/models", headers=auth)).json()["data"][0]["meta"]
            assert meta["n_ctx_train"] == 8192
            n = (await c.post("/v1/chat/completions/input_tokens", headers=auth,
                              json={"messages": _prompt(10)})).json()["input_tokens"]
            assert n == count_tokens(_prompt(10)) == 10 + 4 + 3
        assert fe.info.slots == 3 and fe.info.pool == 1024 and fe.info.api_key == "sekret"


async def test_loading_answers_503_everywhere_then_ok():
    async with FakeEngine(load_time=0.3) as fe:
        async with httpx.AsyncClient(base_url=fe.base_url) as c:
            r = await c.get("/health")
            assert r.status_code == 503
            assert r.json() == {"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}}
            assert (await c.post("/v1/chat/completions", json={"messages": _prompt(1)})).status_code == 503
            await anyio.sleep(0.4)
            assert (await c.get("/health")).status_code == 200


async def test_stream_shape_with_usage_chunk_and_done():
    async with FakeEngine() as fe:
        async with httpx.AsyncClient(base_url=fe.base_url) as c:
            fe.script(Reply(content="one two three", reasoning="hmm ok"))
            r = await c.post("/v1/chat/completions", json={"messages": _prompt(2), "max_tokens": 50, "stream": True,
                                                           "stream_options": {"include_usage": True}})
    frames = [line[6:] for line in r.text.splitlines() if line.startswith("data: ")]
    assert frames[-1] == "[DONE]"
    chunks = [json.loads(f) for f in frames[:-1]]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    reasoning = "".join(c["choices"][0]["delta"].get("reasoning_content", "") for c in chunks if c["choices"])
    content = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert (reasoning, content) == ("hmm ok", "one two three")
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop" and "timings" in chunks[-2]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 5


async def test_prompt_larger_than_context_is_400_with_real_shape():
    async with FakeEngine(n_ctx=256) as fe:
        async with httpx.AsyncClient(base_url=fe.base_url) as c:
            r = await c.post("/v1/chat/completions", json={"messages": _prompt(300), "stream": True})
    err = r.json()["error"]
    assert r.status_code == 400 and err["type"] == "exceed_context_size_error"
    assert err["message"] == "request (307 tokens) exceeds the available context size (256 tokens), try increasing it"
    assert (err["n_prompt_tokens"], err["n_ctx"]) == (307, 256)


async def test_f01_naive_concurrent_calls_overflow_the_pool_and_all_fail():
    """Four ~170-token prompts + max_tokens 400 on a 1024 pool, sent at once: all die."""
    async with FakeEngine(slots=4, n_ctx=1024, token_delay=0.003) as fe:
        sdk = openai.AsyncOpenAI(base_url=fe.base_url + "/v1", api_key="none", max_retries=0)
        errors: list[str] = []

        async def naive() -> None:
            try:
                stream = await sdk.chat.completions.create(model="m", messages=_prompt(163), max_tokens=400,
                                                           stream=True, stream_options={"include_usage": True})
                async for _ in stream:
                    pass
                errors.append("finished")
            except openai.APIError as exc:
                errors.append(exc.message)

        async with anyio.create_task_group() as tg:
            for _ in range(4):
                tg.start_soon(naive)
        await sdk.close()
    assert errors == [CONTEXT_EXCEEDED] * 4
    assert fe.overflows >= 1 and fe.max_processing == 4


async def test_requests_beyond_slots_are_deferred():
    # each request holds its slot ~0.5 s (50 tokens x 0.01 s): a wide window to see the 3 waiting
    async with FakeEngine(slots=2, token_delay=0.01) as fe:
        async with httpx.AsyncClient(base_url=fe.base_url) as c:
            async def one() -> None:
                await c.post("/v1/chat/completions", json={"messages": _prompt(3), "max_tokens": 50})

            async with anyio.create_task_group() as tg:
                for _ in range(5):
                    tg.start_soon(one)
                with anyio.fail_after(10):  # poll until all 5 arrived: 2 processing, 3 deferred
                    while not (fe.deferred == 3 and fe.processing == 2):
                        await anyio.sleep(0.005)
    assert fe.max_processing == 2 and fe.completed == 5


async def test_closing_the_stream_frees_the_slot():
    async with FakeEngine(slots=1, token_delay=0.02) as fe:
        async with httpx.AsyncClient(base_url=fe.base_url) as c:
            body = {"messages": _prompt(3), "max_tokens": 500, "stream": True}
            async with c.stream("POST", "/v1/chat/completions", json=body) as r:
                async for _ in r.aiter_lines():
                    break
                assert fe.processing == 1
            with anyio.fail_after(5):
                while fe.processing:
                    await anyio.sleep(0.01)
    assert fe.disconnects == 1

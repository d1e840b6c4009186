"""F01 and cancellation on the REAL llama-server with the default model.

Engine ``-c 1024 -np 4 --kv-unified``; four requests, each a ~170-token prompt with
``max_tokens=400`` (~570 cells each, ~2,300 together). ``ignore_eos`` (a llama-server request
field) makes the model really generate all 400 tokens, so the pool really fills.
"""

from __future__ import annotations

import anyio
import httpx
import openai
import pytest

from launch_support import THREADS
from squad.chat import ChatRequest, ChatResult
from squad.chat.client import EngineClient
from squad.engine.launcher import Launcher
from squad.engine.llama import CONTEXT_EXCEEDED
from squad.events import Event, Origin
from squad.sched.admission import Admission
from squad.sched.planner import EnginePlan

pytestmark = [pytest.mark.engine, pytest.mark.anyio]

SAMPLING = {"temperature": 0, "ignore_eos": True}
PROMPT = ("Write the numbers from one to five hundred in words, one per line, with no other text. "
          "Do not stop early and do not skip any number. " * 5).strip()


def _messages(i: int) -> list[dict]:
    return [{"role": "system", "content": f"You are counter number {i}. You only count."},
            {"role": "user", "content": PROMPT}]


def _plan(model):
    return EnginePlan.simple(model, slots=4, n_ctx=1024)


@pytest.fixture
async def engine(llama_server_path, default_model_path):
    async with Launcher(_plan(default_model_path), binary=llama_server_path, threads=THREADS) as launcher:
        assert launcher.info is not None
        assert (launcher.info.slots, launcher.info.pool) == (4, 1024)
        yield launcher.info


@pytest.mark.timeout(900)  # through squad the four run one after another: 1,600 tokens on 2 shared cores
async def test_f01_naive_load_overflows_but_squad_finishes_all_four(engine, llama_server_path, default_model_path):
    async with EngineClient(engine) as client:
        prompt_tokens = await client.count_prompt_tokens(_messages(0))
        assert 150 <= prompt_tokens <= 200, prompt_tokens

        # Naive: four concurrent streaming calls straight to the engine.
        sdk = openai.AsyncOpenAI(base_url=engine.base_url + "/v1", api_key=engine.api_key, max_retries=0)
        naive: list[str] = []

        async def send(i: int) -> None:
            try:
                stream = await sdk.chat.completions.create(
                    model="m", messages=_messages(i), max_tokens=400, stream=True,
                    stream_options={"include_usage": True}, extra_body=SAMPLING)
                async for _ in stream:
                    pass
                naive.append("finished")
            except openai.APIError as exc:
                naive.append(exc.message)

        async with anyio.create_task_group() as tg:
            for i in range(4):
                tg.start_soon(send, i)
        await sdk.close()
        print(f"\nnaive: prompt {prompt_tokens} tokens + 400; outcomes {naive}")
        assert naive.count(CONTEXT_EXCEEDED) >= 2

    # Through squad, on a fresh engine of the same plan: the naive phase leaves its slots'
    # cells behind in the pool (another client's, which squad's retry rule handles as such);
    # here the point is that squad alone never overflows, so every call succeeds at once.
    async with Launcher(_plan(default_model_path), binary=llama_server_path, threads=THREADS) as fresh:
        assert fresh.info is not None
        await _squad_phase(fresh.info)


async def _squad_phase(engine) -> None:
    async with EngineClient(engine) as client:
        # admission keeps the reservations under the 1024-cell pool
        peak = 0
        events: list[Event] = []

        def watch(e: Event) -> None:
            nonlocal peak
            events.append(e)
            peak = max(peak, client.admission.reserved)

        client.admission = Admission(engine.slots, engine.pool, on_event=watch)
        client.on_event = watch  # retries too, so a failure says why
        results: list[ChatResult] = []

        async def agent(i: int) -> None:
            results.append(await client.complete(ChatRequest(origin=Origin(f"counter{i}"), messages=_messages(i),
                                                             max_tokens=400, sampling=SAMPLING)))

        async with anyio.create_task_group() as tg:
            for i in range(4):
                tg.start_soon(agent, i)
        print("retries:", [(e.reason, e.error) for e in events if e.kind == "call.retried"])
        print("squad:", [(r.finish_reason, r.usage, round(r.timings.queued_s, 2), round(r.timings.total_s, 2))
                         for r in results], "peak reserved", peak)
        assert len(results) == 4
        # squad alone never overflows the pool: no call is retried for it (a resend after a
        # dropped connection, field case F22, is another rule, allowed here)
        retried = [e for e in events if e.kind == "call.retried"]
        assert not [e for e in retried if "overflow" in e.reason], retried
        assert all(r.usage is not None and r.usage.completion_tokens == 400 for r in results)
        assert 0 < peak <= engine.pool
        assert sum(e.kind == "call.queued" for e in events) >= 2


async def test_cancelling_a_call_frees_the_engine_slot(engine):
    async with EngineClient(engine) as client, httpx.AsyncClient(
            base_url=engine.base_url, headers={"Authorization": f"Bearer {engine.api_key}"}) as http:
        first = anyio.Event()

        async def busy_slots() -> int:
            return sum(s["is_processing"] for s in (await http.get("/slots")).json())

        with anyio.CancelScope() as scope:
            async with anyio.create_task_group() as tg:
                tg.start_soon(lambda: client.complete(ChatRequest(
                    origin=Origin("a"), messages=_messages(0), max_tokens=400, sampling=SAMPLING,
                    on_delta=lambda _: first.set())))
                t0 = anyio.current_time()
                with anyio.fail_after(60):
                    await first.wait()
                assert await busy_slots() == 1
                t1 = anyio.current_time()
                scope.cancel()
        assert client.admission.in_flight == 0
        with anyio.fail_after(10):
            while await busy_slots():
                await anyio.sleep(0.05)
        print(f"\nfirst token after {t1 - t0:.2f} s; slot idle {anyio.current_time() - t1:.2f} s after cancel")

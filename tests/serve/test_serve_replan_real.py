"""``squad serve`` with slots left to squad (``--slots auto``) re-plans on the REAL engine: when
clients keep asking for more requests at once than the engine has slots, it reloads the engine
with more slots at a quiet moment (admitted requests finish, new ones wait in squad's queue), and
every request still completes with its full max_tokens; the reload is listed in /squad/status.
Small requests, 2 threads (a shared machine)."""

from __future__ import annotations

import anyio
import httpx
import pytest

from launch_support import THREADS
from squad.engine.session import EngineSpec
from squad.serve.server import serving

pytestmark = [pytest.mark.engine, pytest.mark.anyio]

WORKERS = 6
ROUNDS = 3  # each worker sends this many requests, one after another: bounded, stops by itself


@pytest.mark.timeout(900)
async def test_sustained_demand_above_the_slots_reloads_the_engine_with_more(llama_server_path, default_model_path):
    spec = EngineSpec(model=default_model_path, binary=llama_server_path, threads=THREADS, slots=None, ctx=3072)
    lines: list[str] = []
    async with serving(spec, port=0, replan_interval=1.0, log=lines.append) as served:
        assert served.replanner is not None
        served.replanner.sustain = 0.5  # the default is 5 s; the check is the same
        before = served.session.info.slots
        assert before < WORKERS, "the default plan must start below the demand for this test"
        got: list[int] = []
        headers = {"Authorization": f"Bearer {served.api_key}"}

        async def worker(i: int) -> None:
            async with httpx.AsyncClient(base_url=served.base_url, headers=headers, timeout=600) as http:
                for r in range(ROUNDS):
                    reply = await http.post("/chat/completions", json={
                        "messages": [{"role": "user", "content": f"Tell story {i}.{r}."}], "max_tokens": 48,
                        "ignore_eos": True})
                    assert reply.status_code == 200, reply.text
                    got.append(reply.json()["usage"]["completion_tokens"])

        async with anyio.create_task_group() as tg:
            for i in range(WORKERS):
                tg.start_soon(worker, i)
        async with httpx.AsyncClient(headers=headers, timeout=30) as http:  # the server shares this loop
            status = (await http.get(served.url + "/squad/status")).json()
        after = served.session.info.slots
    assert got == [48] * (WORKERS * ROUNDS)  # nothing failed or was cut by the reload
    assert after > before and status["replans"], lines
    assert status["replans"][0]["to"][0] == after and any("re-plan" in line for line in lines)

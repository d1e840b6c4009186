"""Deadlines from the work on the REAL llama-server with the default model (issue 19 item 9).

One engine (``-c 8192 -np 1``): first the fact squad depends on (a streaming request with
``return_progress`` gets ``prompt_progress`` chunks when its slot starts and after each batch),
then a ~6,000-token review of squad's own source under a tiny overall floor: it completes
because the bound is derived from the measured speed and each batch's progress keeps it alive.
"""

from __future__ import annotations

from pathlib import Path

import openai
import pytest

from squad.chat import ChatRequest
from squad.client import EngineClient
from squad.deadline import Deadlines
from squad.engine.launcher import Launcher
from squad.events import Origin
from squad.planner import EnginePlan

pytestmark = [pytest.mark.engine, pytest.mark.anyio]

SOURCE = Path(__file__).resolve().parents[1] / "src" / "squad" / "client.py"


def _review(lines: list[str]) -> list[dict]:
    return [{"role": "system", "content": "You review Python code. Answer in one short sentence."},
            {"role": "user", "content": "Review this file:\n\n" + "".join(lines)}]


@pytest.mark.timeout(1200)  # a 6,000-token prompt on 2 shared cores
async def test_a_large_prompt_under_a_tiny_floor_completes_on_progress(llama_server_path, default_model_path):
    plan = EnginePlan.simple(default_model_path, slots=1, n_ctx=8192)
    async with Launcher(plan, binary=llama_server_path, threads=2) as launcher:
        info = launcher.info
        assert info is not None

        # The fact: prompt progress chunks, at the start and after each 2,048-token batch.
        lines = SOURCE.read_text().splitlines(keepends=True)
        sdk = openai.AsyncOpenAI(base_url=info.base_url + "/v1", api_key=info.api_key or "none", max_retries=0)
        progress: list[dict] = []
        stream = await sdk.chat.completions.create(
            model="m", messages=_review(lines[:260]), max_tokens=2, stream=True, temperature=0,
            extra_body={"return_progress": True, "cache_prompt": False})
        async for chunk in stream:
            if isinstance(p := (chunk.model_extra or {}).get("prompt_progress"), dict):
                progress.append(p)
        await sdk.close()
        print(f"\nprompt_progress chunks: {progress}")
        assert len(progress) >= 2 and progress[0]["processed"] == progress[0]["cache"]
        assert {"total", "cache", "processed", "time_ms"} <= set(progress[-1])
        assert progress[-1]["processed"] == progress[-1]["total"] > 2048

        # squad: floors far below what the work takes; the derived deadlines must carry it.
        policy = Deadlines(floor=0.001, no_progress_floor=2.0)
        async with EngineClient(info, deadlines=policy) as client:
            await client.prepare()
            warm = await client.complete(ChatRequest(origin=Origin("warm", "warm#1"), messages=_review(lines[-60:]),
                                                     max_tokens=16, sampling={"temperature": 0}))
            assert warm.content
            speed = client.deadlines.speed
            assert speed.source != "squad's default, nothing measured yet"  # measured (or from /metrics)
            while await client.count(_review(lines)) > 6000:
                lines = lines[:-20]
            messages = _review(lines)
            prompt = await client.count(messages)
            watch = client.deadlines.watch(prompt, 32)
            print(f"measured: {speed.describe(prompt, 32)}; derived bound {watch.overall():.1f} s, "
                  f"no-progress window {watch.window():.1f} s (floors {policy.floor} s / {policy.no_progress_floor} s)")
            r = await client.complete(ChatRequest(origin=Origin("reviewer", "reviewer#1"), messages=messages,
                                                  max_tokens=32, sampling={"temperature": 0}))
            print(f"reviewed {prompt} prompt tokens in {r.timings.total_s:.1f} s: engine timings {r.timings.engine}")
        assert r.finish_reason in ("stop", "length") and r.usage is not None
        assert r.usage.prompt_tokens > 4096  # three batches: progress had to arrive between them
        assert not client.deadlines.active

"""squad serve's metrics and live page in front of the real llama-server (the CLI, as a separate process): with
streams running and queued, ``/squad/metrics`` shows the slots busy, the pool reserved and what the engine's slots
really hold (never more than reserved), and afterwards the admissions, completions, departures and queue waits by
client; the live page, opened in headless Chromium, draws the same. ``SQUAD_LIVE_PAGE_PNG=docs/img/live-page.png``
keeps the screenshot (the one in the docs was taken so)."""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import AsyncIterator

import anyio
import httpx
import pytest

from live_support import Dom, chromium, dump_dom, samples, screenshot, value
from serve_support import squad_serve

pytestmark = [pytest.mark.engine, pytest.mark.anyio]

KEY = "live-test-key-0123456789abcdef"
SLOTS = 3


@pytest.fixture(scope="module")
def served(tmp_path_factory, llama_server_path, default_model_path):
    state = tmp_path_factory.mktemp("state")
    with squad_serve(state, KEY, llama_server_path, default_model_path, ctx=3072, slots=SLOTS) as (url, _):
        yield url


def client(url: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {KEY}"}, timeout=300)


async def status(c: httpx.AsyncClient) -> dict:
    return (await c.get("/squad/status")).json()


async def until(c: httpx.AsyncClient, check, timeout: float = 240.0) -> dict:
    with anyio.fail_after(timeout):
        while not check(s := await status(c)):
            await anyio.sleep(0.2)
    return s


TOPICS = ["the sea", "a lighthouse", "mountains", "a city at night", "rain", "an old library"]


@contextlib.asynccontextmanager
async def traffic(c: httpx.AsyncClient, names: list[str], *, max_tokens: int = 400) -> AsyncIterator[dict]:
    """A stream per name (client ``name``), the first :data:`SLOTS` running and the rest queued; yields the status
    once every slot has begun its answer; each disconnects after the block."""
    started: set[str] = set()
    async with anyio.create_task_group() as tg:
        async def stream(i: int, name: str) -> None:
            body = {"messages": [{"role": "user", "content": f"Write a long story about {TOPICS[i % len(TOPICS)]}."}],
                    "max_tokens": max_tokens, "stream": True, "ignore_eos": True}
            async with c.stream("POST", "/v1/chat/completions", json=body, headers={"X-Squad-Client": name}) as r:
                async for line in r.aiter_lines():
                    if line.startswith("data: {"):
                        started.add(name)

        for i, name in enumerate(names):
            tg.start_soon(stream, i, name)
            await until(c, lambda s, n=name: any(r["client"] == n for r in s["running"] + s["queued"]))
        with anyio.fail_after(240):
            while len(started) < min(SLOTS, len(names)):
                await anyio.sleep(0.1)
        yield await status(c)
        tg.cancel_scope.cancel()


async def test_metrics_against_the_real_engine(served):
    """Known traffic: one request completed; three streams running and one queued, scraped, then all four leave
    (a loaded CI machine generates slowly: nothing waits for long answers)."""
    async with client(served) as c:
        r = await c.post("/v1/chat/completions", headers={"X-Squad-Client": "alice"},
                         json={"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4})
        assert r.status_code == 200
        async with traffic(c, ["bob", "carol", "dave", "erin"]) as during_status:
            during = samples((await c.get("/squad/metrics")).text)
        await until(c, lambda s: s["admission"]["reserved"] == 0 and not s["running"] and not s["queued"])
        after = samples((await c.get("/squad/metrics")).text)
    assert len(during_status["running"]) == SLOTS and len(during_status["queued"]) == 1
    assert value(during, "squad_serve_slots") == SLOTS
    assert value(during, "squad_serve_slots_busy") == SLOTS and value(during, "squad_serve_queued") == 1
    reserved = value(during, "squad_serve_pool_reserved_tokens")
    assert reserved is not None and reserved > 0
    used = value(during, "squad_serve_pool_engine_used_tokens")  # what llama-server's /slots says its slots hold
    assert used is not None and 0 < used <= reserved
    assert value(during, "squad_serve_engine_up") == 1 and value(during, "squad_serve_engine_restarts_total") == 0
    assert value(after, "squad_serve_completed_total", api="chat", client="alice") == 1
    running = [r["client"] for r in during_status["running"]]
    queued = [r["client"] for r in during_status["queued"]]
    for name in ["alice", *running]:
        assert value(after, "squad_serve_admitted_total", api="chat", client=name) == 1
        assert value(after, "squad_serve_queue_wait_seconds_count", api="chat", client=name) == 1
    for name in running:
        assert value(after, "squad_serve_left_total", api="chat", client=name, state="running") == 1
    assert value(after, "squad_serve_left_total", api="chat", client=queued[0], state="queued") == 1
    assert value(after, "squad_serve_admitted_total", api="chat", client=queued[0]) is None
    assert value(after, "squad_serve_slots_busy") == 0 and value(after, "squad_serve_pool_reserved_tokens") == 0


@pytest.mark.browser
@pytest.mark.skipif(chromium() is None, reason="no Chromium (apt-get install chromium; .ci/run does)")
@pytest.mark.xfail(strict=False, reason="failed in the full run of 2026-12-05 on the merged main, not yet traced")
async def test_the_live_page_against_the_real_engine(served, tmp_path):
    async with client(served) as c:
        for name in ("claude-code", "opencode"):  # something in the recent requests
            r = await c.post("/v1/chat/completions", headers={"X-Squad-Client": name},
                             json={"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 8})
            assert r.status_code == 200
        names = ["claude-code", "codex", "opencode", "agents-sdk", "langgraph", "codex"]
        async with traffic(c, names) as seen:
            url = f"{served}/squad/?key={KEY}"
            html = await dump_dom(url, tmp_path / "profile")
            shot = await screenshot(url, tmp_path / "profile2", tmp_path / "live-page.png", size=(1400, 1150))
        await until(c, lambda s: s["admission"]["reserved"] == 0 and not s["running"] and not s["queued"])
    if os.environ.get("SQUAD_LIVE_PAGE_PNG"):
        shutil.copy(shot, os.environ["SQUAD_LIVE_PAGE_PNG"])
    dom = Dom(html)
    assert KEY not in html
    assert [s["data-busy"] for s in dom.having("data-slot")] == ["1"] * SLOTS
    assert f"{len(seen['queued'])} waiting" in dom.texts["queue-n"]
    for row in seen["queued"]:
        assert row["id"] in dom.texts["queue"]
    for name in set(names):
        assert name in dom.texts["clients"]

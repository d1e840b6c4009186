"""squad serve's own metrics (``/squad/metrics``, :mod:`squad.serve.metrics`) and its live page's key handling
(``/squad/``, :mod:`squad.serve.page`) against the fake engine: names, labels and values after known traffic, the
ledger's counts and the metrics agreeing for any sequence of moves (hypothesis), the key never in the page, the
cookie opening only the read-only routes. The page in a real browser: test_serve_live_browser.py; the real engine:
test_serve_live_real.py."""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import anyio
import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from live_support import samples, value
from squad.engine.session import EngineSpec
from squad.serve import serving
from squad.serve.metrics import ServeMetrics, engine_used
from squad.serve.page import COOKIE, page_token
from squad.serve.status import MAX_CLIENTS, OTHER_CLIENTS, RECENT, Ledger, Live
from squad.testing import FakeEngine

pytestmark = pytest.mark.anyio


def http(served, key: str | None = "served", **headers: str) -> httpx.AsyncClient:
    key = served.api_key if key == "served" else key
    auth = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.AsyncClient(base_url=served.url, headers={**auth, **headers}, timeout=30)


def chat(words: int = 3, max_tokens: int = 3, **more: object) -> dict:
    return {"messages": [{"role": "user", "content": " ".join(f"w{i}" for i in range(words))}],
            "max_tokens": max_tokens, **more}


async def wait_for(condition, timeout: float = 15.0) -> None:
    with anyio.fail_after(timeout):
        while not condition():
            await anyio.sleep(0.01)


@contextlib.asynccontextmanager
async def holding(client: httpx.AsyncClient, name: str, max_tokens: int = 400):
    """A stream from client ``name`` that holds the engine's slot until the block ends (then disconnects)."""
    async with client.stream("POST", "/v1/chat/completions", json=chat(max_tokens=max_tokens, stream=True),
                             headers={"X-Squad-Client": name}) as held:
        lines = held.aiter_lines()
        while not (await lines.__anext__()).startswith("data: "):
            pass
        yield held


async def scrape(client: httpx.AsyncClient) -> dict:
    r = await client.get("/squad/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain; version=")
    return samples(r.text)


async def test_metrics_after_known_traffic():
    """Admitted, completed, refused, left (queued and running) by API and client; the queue-wait histogram; the
    slots, the pool reserved beside what the engine's slots hold; no restart."""
    async with FakeEngine(slots=1, n_ctx=1024, token_delay=0.02) as fe:
        async with serving(EngineSpec(url=fe.base_url), port=0) as served, http(served) as client:
            g = served.gateway
            for _ in range(2):
                r = await client.post("/v1/chat/completions", json=chat(), headers={"X-Squad-Client": "alice"})
                assert r.status_code == 200
            r = await client.post("/v1/messages", json={"model": "m", "max_tokens": 3, "messages": [
                {"role": "user", "content": "hi"}]}, headers={"X-Squad-Client": "erin"})
            assert r.status_code >= 500  # the fake engine has no Messages API: failed
            r = await client.post("/v1/chat/completions", json=chat(max_tokens=5000), headers={"X-Squad-Client": "bob"})
            assert r.status_code == 400  # can never fit: refused by squad serve
            async def frank() -> None:
                r = await client.post("/v1/chat/completions", json=chat(), headers={"X-Squad-Client": "frank"})
                assert r.status_code == 200

            async def dave() -> None:  # no name: the peer's address
                await client.post("/v1/chat/completions", json=chat())

            async with anyio.create_task_group() as tg:
                async with holding(client, "carol"):
                    async with anyio.create_task_group() as waiting:  # dave queues behind carol, then leaves
                        waiting.start_soon(dave)
                        await wait_for(lambda: len(g.status()["queued"]) == 1)
                        waiting.cancel_scope.cancel()
                    await wait_for(lambda: not g.status()["queued"])
                    tg.start_soon(frank)  # frank queues behind carol, and is admitted once she leaves
                    await wait_for(lambda: len(g.status()["queued"]) == 1)
                    await anyio.sleep(0.3)  # frank waits at least this long
                    during = await scrape(client)
                    reserved = g.status()["admission"]["reserved"]
            await wait_for(lambda: g.status()["clients"].get("frank", {}).get("completed") == 1)
            await wait_for(lambda: g.status()["admission"]["reserved"] == 0)
            after = await scrape(client)
    assert value(during, "squad_serve_slots") == 1
    assert value(during, "squad_serve_slots_busy") == 1
    assert value(during, "squad_serve_running") == 1 and value(during, "squad_serve_queued") == 1
    assert value(during, "squad_serve_pool_tokens") == 1024
    assert value(during, "squad_serve_pool_reserved_tokens") == reserved > 0
    used = value(during, "squad_serve_pool_engine_used_tokens")
    assert used is not None and 0 < used <= reserved  # the engine holds at most what was reserved for it
    assert value(during, "squad_serve_engine_up") == 1
    assert value(during, "squad_serve_engine_restarts_total") == 0

    chat_ = {"api": "chat"}
    assert value(after, "squad_serve_requests_total", **chat_, client="alice") == 2
    assert value(after, "squad_serve_admitted_total", **chat_, client="alice") == 2
    assert value(after, "squad_serve_completed_total", **chat_, client="alice") == 2
    assert value(after, "squad_serve_requests_total", api="messages", client="erin") == 1
    assert value(after, "squad_serve_failed_total", api="messages", client="erin") == 1
    assert value(after, "squad_serve_refused_total", **chat_, client="bob") == 1
    assert value(after, "squad_serve_admitted_total", **chat_, client="bob") is None
    assert value(after, "squad_serve_left_total", **chat_, client="127.0.0.1", state="queued") == 1
    assert value(after, "squad_serve_left_total", **chat_, client="carol", state="running") == 1
    assert value(after, "squad_serve_queue_wait_seconds_count", **chat_, client="frank") == 1
    assert value(after, "squad_serve_queue_wait_seconds_sum", **chat_, client="frank") >= 0.3
    assert value(after, "squad_serve_queue_wait_seconds_bucket", **chat_, client="frank", le="0.01") == 0
    assert value(after, "squad_serve_queue_wait_seconds_bucket", **chat_, client="frank", le="+Inf") == 1
    assert value(after, "squad_serve_slots_busy") == 0 and value(after, "squad_serve_pool_reserved_tokens") == 0
    assert value(after, "squad_serve_info", version=served.gateway.status()["squad_serve"], engine="llama.cpp",
                 model="fake") == 1


async def test_metrics_need_the_key_and_metrics_stays_the_engines():
    async with FakeEngine(slots=1, n_ctx=1024) as fe:
        async with serving(EngineSpec(url=fe.base_url), port=0) as served:
            async with http(served, key=None) as anonymous:
                assert (await anonymous.get("/squad/metrics")).status_code == 401
            async with http(served) as client:
                ours = await client.get("/squad/metrics")
                theirs = await client.get("/metrics")  # passed through to the engine, as before
    assert "squad_serve_slots" in ours.text and "squad_serve_slots" not in theirs.text


async def test_engine_used_reads_busy_slots_and_tolerates_what_is_not_slots():
    def engine(answer):
        return httpx.AsyncClient(transport=httpx.MockTransport(answer), base_url="http://engine")

    slots = [{"id": 0, "is_processing": True, "n_prompt_tokens": 30, "next_token": [{"n_decoded": 12}]},
             {"id": 1, "is_processing": False, "n_prompt_tokens": 99},
             {"id": 2, "is_processing": True, "n_prompt_tokens": "x", "next_token": "y"}, "junk"]
    async with engine(lambda r: httpx.Response(200, json=slots)) as c:
        assert await engine_used(c) == 42
    for answer in (lambda r: httpx.Response(501, json={}), lambda r: httpx.Response(200, text="not json"),
                   lambda r: httpx.Response(200, json={"slots": 1})):
        async with engine(answer) as c:
            assert await engine_used(c) is None

    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused")

    async with engine(refuse) as c:
        assert await engine_used(c) is None


# -- the ledger and the metrics agree ----------------------------------------------------------------------------

def _metered() -> tuple[Ledger, ServeMetrics]:
    ledger = Ledger()
    gateway = SimpleNamespace(ledger=ledger, keeper=None, engine_state=lambda: ("up", ""),
                              admission=SimpleNamespace(slots=2, in_flight=0, pool=1000, reserved=0),
                              engine=SimpleNamespace(kind="llama.cpp", model_alias="m", model_path=None))
    return ledger, ServeMetrics(gateway)


def _sample(metrics: ServeMetrics, name: str, **labels: str) -> float:
    return metrics.registry.get_sample_value(name, labels) or 0.0


steps = st.lists(st.tuples(st.sampled_from(["alice", "bob", "carol"]), st.sampled_from(["chat", "messages"]),
                           st.lists(st.sampled_from(["queued", "running"]), max_size=3),
                           st.sampled_from(["completed", "refused", "failed", "disconnected", None])),
                 max_size=40)


@settings(max_examples=60, deadline=None)
@given(steps)
def test_metrics_count_what_the_ledger_counts(requests):
    """For any sequence of requests moving through the ledger (ending or not), the metrics per client equal the
    ledger's own counts, admissions are queued-to-running moves, and the recent ring holds at most RECENT rows."""
    ledger, metrics = _metered()
    admitted: dict[tuple[str, str], int] = {}
    left: dict[tuple[str, str, str], int] = {}
    for i, (client, api, moves, outcome) in enumerate(requests):
        live = Live(id=f"r{i}", client=client, priority=0, api=api)
        ledger.open(live)
        for state in moves:
            before = live.state
            ledger.move(live, state, tokens=10)  # type: ignore[arg-type]
            if before == "queued" and state == "running":
                admitted[client, api] = admitted.get((client, api), 0) + 1
        if outcome is not None:
            if outcome == "disconnected":
                left[client, api, live.state] = left.get((client, api, live.state), 0) + 1
            ledger.close(live, outcome)  # type: ignore[arg-type]
    for client, counts in ledger.clients.items():
        for name, field in (("requests", "requests"), ("completed", "completed"), ("refused", "refused"),
                            ("failed", "failed")):
            got = sum(_sample(metrics, f"squad_serve_{name}_total", api=api, client=client)
                      for api in ("chat", "messages"))
            assert got == getattr(counts, field)
        left_all = sum(_sample(metrics, "squad_serve_left_total", api=api, client=client, state=state)
                       for api in ("chat", "messages") for state in ("counting", "queued", "running"))
        assert left_all == counts.disconnected
    for (client, api), n in admitted.items():
        assert _sample(metrics, "squad_serve_admitted_total", api=api, client=client) == n
        assert _sample(metrics, "squad_serve_queue_wait_seconds_count", api=api, client=client) == n
    for (client, api, state), n in left.items():
        assert _sample(metrics, "squad_serve_left_total", api=api, client=client, state=state) == n
    ended = sum(1 for *_, outcome in requests if outcome is not None)
    assert len(ledger.view()["recent"]) == min(ended, RECENT)


def test_client_labels_are_bounded():
    """A client names itself: past MAX_CLIENTS names, the metrics count the rest under (other)."""
    ledger, metrics = _metered()
    for i in range(MAX_CLIENTS + 5):
        ledger.open(Live(id=f"r{i}", client=f"c{i}", priority=0, api="chat"))
    assert _sample(metrics, "squad_serve_requests_total", api="chat", client=OTHER_CLIENTS) == 5
    assert _sample(metrics, "squad_serve_requests_total", api="chat", client=f"c{MAX_CLIENTS + 1}") == 0


# -- the page's key ---------------------------------------------------------------------------------------------

async def test_the_page_takes_the_key_once_and_never_shows_it():
    async with FakeEngine(slots=1, n_ctx=1024) as fe:
        async with serving(EngineSpec(url=fe.base_url), port=0, client_keys={"ci": "ci-key-0123456789"}) as served:
            key = served.api_key
            async with http(served, key=None) as browser:
                r = await browser.get("/squad/")
                assert r.status_code == 401 and "<form" in r.text and key not in r.text  # the form, no key
                assert (await browser.get("/squad/status")).status_code == 401
                r = await browser.get("/squad/?key=wrong")
                assert r.status_code == 401 and COOKIE not in r.headers.get("set-cookie", "")
                r = await browser.get("/squad", params={"key": key})  # -> /squad/?key=...
                assert r.status_code == 308 and r.headers["location"] == f"/squad/?key={key}"
                r = await browser.get("/squad/", params={"key": key})
                assert r.status_code == 303 and r.headers["location"] == "/squad/"  # the key leaves the address
                cookie = r.headers["set-cookie"]
                assert key not in cookie and page_token(key.encode()) in cookie
                assert {"HttpOnly", "SameSite=Strict", "Path=/squad"} <= {p.strip() for p in cookie.split(";")}
                page = await browser.get("/squad/")
                assert page.status_code == 200 and "<script>" in page.text and key not in page.text
                assert "default-src 'none'" in page.headers["content-security-policy"]
                assert (await browser.get("/squad/status")).status_code == 200
                assert (await browser.get("/squad/metrics")).status_code == 200
                # the cookie opens the read-only routes only: no generation, no passthrough
                assert (await browser.post("/v1/chat/completions", json=chat())).status_code == 401
                assert (await browser.get("/slots")).status_code == 401
                r = await browser.get("/squad/logout")
                assert r.status_code == 303 and "Max-Age=0" in r.headers["set-cookie"]
                assert (await browser.get("/squad/status")).status_code == 401
                r = await browser.post("/squad/login", data={"key": "nope"})
                assert r.status_code == 401 and "not the key" in r.text
                r = await browser.post("/squad/login", data={"key": "ci-key-0123456789"})  # a labelled key too
                assert r.status_code == 303 and page_token(b"ci-key-0123456789") in r.headers["set-cookie"]
                assert (await browser.get("/squad/status")).status_code == 200
                r = await browser.put("/squad/")
                assert r.status_code == 405
            for headers in ({"Authorization": f"Bearer {key}"}, {"X-Api-Key": key}):
                async with httpx.AsyncClient(base_url=served.url, headers=headers) as client:
                    r = await client.get("/squad/")  # the key in a header: the page, and the cookie for its polls
                    assert r.status_code == 200 and page_token(key.encode()) in r.headers["set-cookie"]
                    assert key not in r.text
            async with http(served, key=None) as other:
                other.cookies.set(COOKIE, page_token(b"another server's key"), path="/squad")
                assert (await other.get("/squad/status")).status_code == 401
                assert (await other.get("/squad/")).status_code == 401

"""``squad serve`` in front of the real llama-server (the CLI, as a separate process): the openai
SDK streams and completes through it; 8 naive concurrent clients on ``-c 2048 -np 4`` all get
their full max_tokens through it where they fail directly; a disconnect frees the reservation
and the engine slot; no key, no answer; it listens on 127.0.0.1 only. One engine for the module,
small requests (2 threads on a shared machine)."""

from __future__ import annotations

import time

import anyio
import httpx
import openai
import psutil
import pytest

from serve_support import squad_serve

pytestmark = pytest.mark.engine

KEY = "serve-test-key-0123456789abcdef"


@pytest.fixture(scope="module")
def served(tmp_path_factory, llama_server_path, default_model_path):
    """``squad serve -c 2048 -np 4 -t THREADS`` on a free port (:func:`serve_support.squad_serve`); yields
    ``(url, pid)``; the engine it started is stopped with it."""
    state = tmp_path_factory.mktemp("state")
    with squad_serve(state, KEY, llama_server_path, default_model_path, ctx=2048, slots=4) as (url, proc):
        yield url, proc.pid
        engines = [c.pid for c in psutil.Process(proc.pid).children(recursive=True)] if proc.poll() is None else []
    for pid in engines:  # the engine it started is stopped with it
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def status(url: str) -> dict:
    return httpx.get(url + "/squad/status", headers={"Authorization": f"Bearer {KEY}"}, timeout=10).json()


def test_the_openai_sdk_streams_and_completes_through_serve(served):
    url, _ = served
    client = openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0)
    done = client.chat.completions.create(model="any", messages=[{"role": "user", "content": "Say hello."}],
                                          max_tokens=32)
    assert done.choices[0].message.content and done.usage.prompt_tokens > 0
    stream = client.chat.completions.create(model="any", messages=[{"role": "user", "content": "Count to five."}],
                                            max_tokens=32, stream=True, stream_options={"include_usage": True},
                                            extra_body={"ignore_eos": True})
    chunks = list(stream)
    assert sum(1 for c in chunks if c.choices and c.choices[0].delta.content) >= 16  # relayed chunk by chunk
    assert chunks[-1].usage.completion_tokens == 32
    text = client.completions.create(model="any", prompt="Once upon a time", max_tokens=16,
                                     extra_body={"ignore_eos": True})
    assert text.usage.completion_tokens == 16
    assert client.models.list().data


def test_no_key_no_answer_and_it_listens_on_loopback_only(served):
    url, pid = served
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        r = httpx.post(url + "/v1/chat/completions", headers=headers,
                       json={"messages": [{"role": "user", "content": "x"}]})
        assert r.status_code == 401
    listening = [c.laddr for c in psutil.Process(pid).net_connections() if c.status == psutil.CONN_LISTEN]
    assert listening and all(addr.ip == "127.0.0.1" for addr in listening)


@pytest.mark.timeout(900)  # ~8k prompt tokens in all: minutes on a busy 2-core machine
def test_eight_naive_clients_all_finish_through_serve_where_they_fail_directly(served):
    """Each asks ~650 prompt tokens + 48 generated (ignore_eos): four at once need more than the
    2,048-token pool. Directly the engine fails them; through serve each gets all 48 tokens."""
    url, pid = served
    engine = status(url)["engine"]["url"]
    (child,) = [c for c in psutil.Process(pid).children(recursive=True)  # the binary, or squad-llama-server's python
                if "LLAMA_API_KEY" in c.environ()]
    engine_key = child.environ()["LLAMA_API_KEY"]  # squad serve's secret; read here only to go around it

    async def burst(base_url: str, key: str) -> list:
        async with openai.AsyncOpenAI(base_url=base_url, api_key=key, max_retries=0, timeout=300) as client:
            got: list = [None] * 8

            async def one(i: int) -> None:
                words = " ".join(f"w{i}x{k}" for k in range(120))
                try:
                    stream = await client.chat.completions.create(
                        model="any", messages=[{"role": "user", "content": f"Repeat: {words}"}], max_tokens=48,
                        stream=True, stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
                    usage = None
                    async for chunk in stream:
                        usage = chunk.usage or usage
                    got[i] = usage.completion_tokens if usage else "no usage"
                except openai.APIError as exc:
                    got[i] = type(exc).__name__

            async with anyio.create_task_group() as tg:
                for i in range(8):
                    tg.start_soon(one, i)
            return got

    direct = anyio.run(burst, engine + "/v1", engine_key)
    assert any(got != 48 for got in direct), direct
    through = anyio.run(burst, url + "/v1", KEY)
    assert through == [48] * 8
    assert status(url)["peaks"]["requests"] >= 4


def test_a_disconnect_mid_stream_frees_the_reservation_and_the_engine_slot(served):
    url, _ = served
    headers = {"Authorization": f"Bearer {KEY}"}
    body = {"messages": [{"role": "user", "content": "Write a long story."}], "max_tokens": 1500, "stream": True,
            "ignore_eos": True}
    with httpx.Client(base_url=url, headers=headers, timeout=60) as client:
        with client.stream("POST", "/v1/chat/completions", json=body) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    assert status(url)["admission"]["reserved"] > 1500
                    break
        deadline = time.monotonic() + 10
        while True:
            now = status(url)
            busy = sum(1 for s in client.get("/slots").json() if s.get("is_processing"))
            if now["admission"]["reserved"] == 0 and busy == 0:
                break
            assert time.monotonic() < deadline, (now, busy)
            time.sleep(0.05)
    assert now["clients"]["127.0.0.1"]["disconnected"] >= 1

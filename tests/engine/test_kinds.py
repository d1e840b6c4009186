"""Attaching to each kind of OpenAI-compatible server (issue 14, item 1).

llama-server is proved against the real server (the engine-marked test at the end); vLLM,
SGLang, Ollama and LM Studio against fakes answering their documented shapes
(:mod:`squad.testing.fake_kinds`, sources in :mod:`squad.engine.kinds`). For each: the kind
detected, the capacity read and where it came from, and a squad run admitted within that
capacity, including each kind's failure behaviour (preempt past KV capacity, truncate past the
context).
"""

from __future__ import annotations

import json

import anyio
import httpx
import pytest
from starlette.routing import Route

from cli_support import squad
from launch_support import THREADS, model_file, server_bin, state_tmp  # noqa: F401
from squad import Agent, Squad
from squad.engine import control
from squad.engine.control import attach
from squad.engine.kinds import DEFAULT_CTX, parse_cache_config
from squad.errors import AdmissionError
from squad.testing import FakeEngine, FakeLMStudio, FakeOllama, FakeSGLang, FakeVLLM


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(autouse=True)
def fast_polls(monkeypatch):
    monkeypatch.setattr(control, "POLL_INTERVAL", 0.01)


class PlainServer(FakeEngine):
    """An OpenAI-compatible server squad does not know: chat and a bare /v1/models, nothing else."""

    def _routes(self) -> list[Route]:
        keep = ("/v1/chat/completions", "/v1/models")
        return [r for r in super()._routes() if r.path in keep]


def worker(max_tokens: int = 200) -> Agent:
    return Agent(name="w", instructions="Answer.", max_tokens=max_tokens)


async def fan_out(url: str, n: int, *, max_tokens: int = 200, **pins) -> list:
    async with Squad([worker(max_tokens)], url=url, **pins) as sq:
        return await sq.map("w", [f"item {i}" for i in range(n)])


# -- detection and capacity ------------------------------------------------------------------


@pytest.mark.anyio
async def test_vllm_is_detected_and_its_kv_capacity_read():
    async with FakeVLLM(capacity=4096, n_ctx=1024, block_size=16) as fe:
        info = await attach(fe.base_url + "/v1")
    assert (info.kind, info.version, info.model_alias) == ("vllm", "0.11.0", "Qwen/Qwen3-0.6B")
    assert (info.n_ctx, info.pool, info.slots) == (1024, 4096, 4)  # 256 blocks × 16; slots = capacity / max_model_len
    assert "num_gpu_blocks 256 × block_size 16" in info.sources["pool"]
    assert "max_model_len" in info.sources["ctx"] and "--max-num-seqs" in info.sources["slots"]
    assert info.count_with == "tokenize" and "preempts" in info.policy


@pytest.mark.anyio
async def test_vllm_without_metrics_is_still_vllm_and_says_the_pool_is_one_context():
    async with FakeVLLM(n_ctx=1024, metrics=False) as fe:
        info = await attach(fe.base_url)
    assert (info.kind, info.pool, info.slots) == ("vllm", 1024, 1)
    assert "no vllm:cache_config_info" in info.sources["pool"]


@pytest.mark.anyio
async def test_sglang_is_detected_with_max_total_tokens_and_running_requests():
    async with FakeSGLang(capacity=6000, n_ctx=2048, slots=5) as fe:
        info = await attach(fe.base_url)
    assert (info.kind, info.slots, info.n_ctx, info.pool, info.version) == ("sglang", 5, 2048, 6000, "0.5.3")
    assert "effective_max_running_requests_per_dp" in info.sources["slots"]
    assert "max_total_num_tokens" in info.sources["pool"] and info.count_with == "estimate"


@pytest.mark.anyio
async def test_ollama_is_detected_with_its_loaded_context():
    async with FakeOllama(n_ctx=4096) as fe:
        info = await attach(fe.base_url)
        empty = FakeOllama(loaded=False)
        async with empty:
            unloaded = await attach(empty.base_url, ctx=8192, slots=2)
    assert (info.kind, info.slots, info.n_ctx, info.pool, info.model_alias) == ("ollama", 1, 4096, 4096, "llama3.2:3b")
    assert "/api/ps" in info.sources["ctx"] and "OLLAMA_NUM_PARALLEL" in info.sources["slots"]
    assert info.truncates and info.count_with == "estimate"
    assert (unloaded.slots, unloaded.n_ctx, unloaded.pool) == (2, 8192, 16384)  # the pins, said so
    assert unloaded.sources["ctx"].startswith("pin ctx=8192") and unloaded.sources["slots"].startswith("pin slots=2")


@pytest.mark.anyio
@pytest.mark.parametrize("api", ["v1", "v0"])
async def test_lmstudio_is_detected_from_either_rest_api(api):
    async with FakeLMStudio(api=api, n_ctx=8192, slots=4) as fe:
        info = await attach(fe.base_url)
    assert (info.kind, info.n_ctx, info.pool, info.model_alias) == ("lmstudio", 8192, 8192, "qwen/qwen3-4b")
    assert info.slots == (4 if api == "v1" else 1)  # /api/v0 does not report parallel predictions
    assert f"/api/{api}/models" in info.sources["ctx"] and info.truncates


@pytest.mark.anyio
async def test_an_unknown_server_gets_the_conservative_defaults_or_the_pins():
    async with PlainServer(n_ctx=4096) as fe:
        info = await attach(fe.base_url)
        pinned = await attach(fe.base_url, slots=3, ctx=1024)
    assert (info.kind, info.slots, info.n_ctx) == ("openai-compatible", 1, DEFAULT_CTX)
    assert info.sources["slots"].startswith("default 1") and any("concurrency" in w for w in info.warnings)
    assert (pinned.slots, pinned.n_ctx, pinned.pool) == (3, 1024, 3072)


@pytest.mark.anyio
async def test_a_pin_lowers_a_reported_limit_and_never_raises_it():
    async with FakeSGLang(capacity=6000, n_ctx=2048, slots=5) as fe:
        lower = await attach(fe.base_url, slots=2)
        higher = await attach(fe.base_url, slots=50)
    assert lower.slots == 2 and lower.sources["slots"].startswith("pin slots=2")
    assert higher.slots == 5 and any("slots=50 is above" in w for w in higher.warnings)


def test_cache_config_labels_are_read_from_prometheus_text():
    text = '# TYPE vllm:cache_config_info gauge\nvllm:cache_config_info{block_size="16",num_gpu_blocks="661"} 1.0\n'
    assert parse_cache_config(text) == {"block_size": "16", "num_gpu_blocks": "661"}
    assert parse_cache_config("vllm:num_requests_running 0.0\n") is None


# -- admission within each kind's capacity -----------------------------------------------------


@pytest.mark.anyio
async def test_fake_vllm_preempts_when_a_client_sends_more_than_its_kv_capacity():
    """The fake is honest: a client without admission overflows its KV capacity (preemptions)."""
    async with FakeVLLM(capacity=512, n_ctx=512, slots=8, token_delay=0.002) as fe:
        async with httpx.AsyncClient(base_url=fe.base_url, timeout=30) as client:
            body = {"model": fe.model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 200}
            async def send() -> None:
                await client.post("/v1/chat/completions", json=body)

            async with anyio.create_task_group() as tg:
                for _ in range(6):
                    tg.start_soon(send)
    assert fe.preemptions > 0


@pytest.mark.anyio
@pytest.mark.parametrize("fake", [FakeVLLM, FakeSGLang])
async def test_squad_keeps_running_requests_within_the_reported_kv_capacity(fake):
    async with fake(capacity=1024, n_ctx=512, slots=8, token_delay=0.002) as fe:
        results = await fan_out(fe.base_url, 8, slots=8)
    assert all(r.error is None for r in results)
    assert fe.completed == 8 and fe.preemptions == 0 and fe.max_held <= 1024
    assert fe.max_processing > 1  # several at once, as many as the capacity holds


@pytest.mark.anyio
async def test_squad_counts_vllm_prompts_with_its_tokenize_endpoint():
    async with FakeVLLM(capacity=4096, n_ctx=1024) as fe:
        await fan_out(fe.base_url, 2, max_tokens=16)
        assert fe.count_requests >= 1 and all(r["model"] == fe.model for r in fe.requests)


@pytest.mark.anyio
@pytest.mark.parametrize("fake", [FakeOllama, FakeLMStudio])
async def test_squad_refuses_a_prompt_the_server_would_silently_truncate(fake):
    async with fake(n_ctx=512, slots=2, token_delay=0.001) as fe:
        async with Squad([worker(64)], url=fe.base_url) as sq:
            ok = await sq.run("a short question")
            with pytest.raises(AdmissionError, match="silently truncate"):
                await sq.run("word " * 400)
    assert ok.output and fe.truncations == 0 and fe.completed == 1
    assert len(fe.requests) == 1  # the long prompt was never sent


@pytest.mark.anyio
@pytest.mark.parametrize("fake", [FakeOllama, FakeLMStudio, FakeSGLang])
async def test_a_budget_is_not_held_against_the_high_estimate(fake):
    """An agent's budget holds exact counts: on a kind squad can only estimate for (bytes / 2,
    high on purpose), a call that fits its budget is not refused because the estimate does not
    (the shipped summarize recipe failed on these kinds); the engine's own limit still holds."""
    prompt = " ".join(["word"] * 60)  # the server counts ~70 tokens; squad's estimate ~170
    async with fake() as fe:
        async with Squad([Agent(name="w", instructions="Answer.", budget=128, max_tokens=8)], url=fe.base_url) as sq:
            result = await sq.run_agent("w", prompt)
    assert result.ok, result.error


@pytest.mark.anyio
async def test_squad_runs_within_ollamas_parallel_slots():
    async with FakeOllama(n_ctx=1024, slots=2, token_delay=0.002) as fe:
        results = await fan_out(fe.base_url, 6, max_tokens=100, slots=2)
    assert all(r.error is None for r in results) and fe.max_processing <= 2 and fe.truncations == 0


@pytest.mark.anyio
async def test_squad_runs_against_an_unknown_server_one_request_at_a_time():
    async with PlainServer(n_ctx=4096, slots=4, token_delay=0.002) as fe:
        results = await fan_out(fe.base_url, 4, max_tokens=50)
    assert all(r.error is None for r in results) and fe.max_processing == 1


class NotAnEngine(FakeEngine):
    """A web server that answers, but not as an engine: 404 for every engine path."""

    def _routes(self) -> list[Route]:
        return []


@pytest.mark.anyio
async def test_a_server_that_is_not_an_engine_is_refused_before_any_call(capsys):
    from squad.errors import UserError

    async with NotAnEngine() as fe:
        with pytest.raises(UserError, match=r"is not an OpenAI-compatible engine: GET /v1/models answered HTTP 404"):
            await attach(fe.base_url)
        with pytest.raises(UserError, match="not an OpenAI-compatible engine"):
            async with Squad([worker()], url=fe.base_url):
                pass
        code, out, err = await anyio.to_thread.run_sync(lambda: squad(capsys, "engine", "info", "--url", fe.base_url))
    assert code == 2 and "not an OpenAI-compatible engine" in " ".join(err.split()) and "Traceback" not in err


@pytest.mark.anyio
async def test_an_unknown_server_that_refuses_the_key_says_so():
    from squad.errors import UserError

    async with PlainServer(api_key="right") as fe:
        with pytest.raises(UserError, match="refused squad's key .*HTTP 401.*--api-key"):
            await attach(fe.base_url, "wrong")


# -- squad engine info --url ------------------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize("fake, kind", [(FakeVLLM, "vllm"), (FakeSGLang, "sglang"), (FakeOllama, "ollama"),
                                        (FakeLMStudio, "lmstudio"), (PlainServer, "openai-compatible"),
                                        (FakeEngine, "llama.cpp")])
async def test_engine_info_url_prints_kind_capacity_and_sources(fake, kind, capsys):
    async with fake() as fe:
        code, out, err = await anyio.to_thread.run_sync(lambda: squad(capsys, "engine", "info", "--url", fe.base_url))
        code_j, out_j, _ = await anyio.to_thread.run_sync(
            lambda: squad(capsys, "engine", "info", "--url", fe.base_url, "--json"))
    assert code == 0 and code_j == 0, err
    assert f"kind       {kind}" in out and "<-" in out and "admission" in out
    data = json.loads(out_j)
    assert data["kind"] == kind and set(data["sources"]) >= {"slots", "ctx", "pool"}
    assert data["slots"] >= 1 and data["pool"] >= data["n_ctx"] or kind in ("lmstudio",)
    if kind == "openai-compatible":
        err = " ".join(err.split())
        assert "does not know" in err and "conservative defaults" in err
    from squad.engine.kinds import THINKING  # how an agent's thinking_budget reaches this kind (issue 32)

    assert "thinking" in out and data["thinking_budget"] == THINKING.get(kind)


@pytest.mark.anyio
@pytest.mark.parametrize("fake, kind", [(FakeVLLM, "vllm"), (FakeSGLang, "sglang"), (FakeOllama, "ollama"),
                                        (FakeLMStudio, "lmstudio"), (PlainServer, "openai-compatible"),
                                        (FakeEngine, "llama.cpp")])
async def test_engine_status_url_works_for_every_kind_and_names_it(fake, kind, capsys):
    async with fake() as fe:
        code, out, err = await anyio.to_thread.run_sync(
            lambda: squad(capsys, "engine", "status", "--url", fe.base_url, "--api-key", fe.api_key or "k"))
        code_j, out_j, _ = await anyio.to_thread.run_sync(
            lambda: squad(capsys, "engine", "status", "--url", fe.base_url, "--api-key", fe.api_key or "k", "--json"))
    assert code == 0 and code_j == 0, err
    assert f"kind         {kind}" in out and "slots" in out and "pool" in out
    busy = json.loads(out_j)["busy_slots"]
    assert busy == 0 if kind == "llama.cpp" else busy is None  # only llama-server reports busy slots


# -- squad serve in front of each kind --------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize("fake, kind", [(FakeVLLM, "vllm"), (FakeSGLang, "sglang"), (FakeOllama, "ollama"),
                                        (FakeLMStudio, "lmstudio"), (PlainServer, "openai-compatible")])
async def test_squad_serve_fronts_every_kind(fake, kind):
    """Chat through the endpoint is admitted within the kind's capacity; a text prompt is counted
    the kind's way (vLLM's /tokenize with a prompt, else squad's estimate), never with llama-server's
    /tokenize shape; /health answers even where the engine has none; /squad/status names the kind."""
    from squad.engine.session import EngineSpec
    from squad.serve.server import serving

    async with fake() as fe:
        async with serving(EngineSpec(url=fe.base_url, api_key=fe.api_key), port=0) as served:
            async with httpx.AsyncClient(base_url=served.url, timeout=30,
                                         headers={"Authorization": f"Bearer {served.api_key}"}) as client:
                async def ask(i: int) -> int:
                    r = await client.post("/v1/chat/completions", json={
                        "messages": [{"role": "user", "content": f"item {i}"}], "max_tokens": 50})
                    return r.status_code

                codes = [0] * 6
                async with anyio.create_task_group() as tg:
                    for i in range(6):
                        async def one(i: int = i) -> None:
                            codes[i] = await ask(i)
                        tg.start_soon(one)
                before = fe.count_requests
                counted = await served.gateway.count({"prompt": "one two three four"}, "completion")
                health = await client.get("/health")
                status = (await client.get("/squad/status")).json()
    assert codes == [200] * 6
    assert fe.max_processing <= status["engine"]["slots"] and fe.overflows == 0
    assert getattr(fe, "preemptions", 0) == 0 and getattr(fe, "truncations", 0) == 0
    assert status["engine"]["kind"] == kind and status["engine"]["model"]
    assert health.status_code == 200
    if kind == "vllm":
        assert counted == 5 and fe.count_requests == before + 1  # its /tokenize, the completion shape
    else:
        assert counted >= 4 and fe.count_requests == before  # the estimate: no endpoint asked


# -- the real llama-server --------------------------------------------------------------------


@pytest.mark.engine
@pytest.mark.anyio
async def test_real_llama_server_is_detected_as_llama_cpp_with_capacity_from_props(server_bin, model_file,
                                                                                   state_tmp, capsys):
    from squad.engine.launcher import Launcher
    from squad.sched.planner import EnginePlan

    async with Launcher(EnginePlan.simple(model_file, slots=2, n_ctx=2048), binary=server_bin,
                        threads=THREADS) as engine:
        info = await attach(engine.base_url, engine.api_key)
        code, out, err = await anyio.to_thread.run_sync(
            lambda: squad(capsys, "engine", "info", "--url", engine.base_url, "--api-key", engine.api_key, "--json"))
    assert (info.kind, info.slots, info.n_ctx, info.count_with) == ("llama.cpp", 2, 2048, "input_tokens")
    assert info.sources["slots"] == "/props total_slots" and "n_ctx" in info.sources["ctx"]
    data = json.loads(out)
    assert code == 0 and (data["kind"], data["slots"], data["n_ctx"]) == ("llama.cpp", 2, 2048)

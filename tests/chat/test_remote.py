"""Attaching to an engine squad did not launch; waiting out 'Loading model'; engine.json."""

from __future__ import annotations

import os
import stat

import httpx
import pytest

from launch_support import THREADS, anyio_backend, model_file, server_bin, state_tmp  # noqa: F401
from squad.engine import control, process
from squad.engine.control import attach, control_client, pool_warning, read_engine, wait_healthy
from squad.engine.info import EngineInfo
from squad.engine.launcher import Launcher, build_args
from squad.engine.process import free_port
from squad.engine.saved import SavedEngine, SavedPlan, load_saved_engine, save_engine
from squad.errors import EngineError, EngineGone, EngineLoadTimeout, UserError
from squad.sched.planner import EnginePlan

LOADING = {"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}}


def scripted(answers: list) -> httpx.MockTransport:
    """A transport answering /health from ``answers`` in order (an exception is raised)."""

    def handle(request: httpx.Request) -> httpx.Response:
        answer = answers.pop(0) if len(answers) > 1 else answers[0]
        if isinstance(answer, Exception):
            raise answer
        return answer

    return httpx.MockTransport(handle)


@pytest.fixture(autouse=True)
def fast_polls(monkeypatch):
    monkeypatch.setattr(control, "POLL_INTERVAL", 0.01)


@pytest.mark.anyio
async def test_wait_healthy_waits_out_loading():
    answers = ([httpx.ConnectError("refused")] + [httpx.Response(503, json=LOADING)] * 3
               + [httpx.Response(200, json={"status": "ok"})])
    async with control_client("http://engine", transport=scripted(answers)) as client:
        assert await wait_healthy(client, timeout=5) == 3


@pytest.mark.anyio
async def test_wait_healthy_deadline_says_still_loading():
    async with control_client("http://engine", transport=scripted([httpx.Response(503, json=LOADING)])) as client:
        with pytest.raises(EngineLoadTimeout, match="still loading after"):
            await wait_healthy(client, timeout=0.2)


@pytest.mark.anyio
async def test_wait_healthy_stops_when_process_dies():
    def dead() -> None:
        raise EngineError("process exited")

    async with control_client("http://engine", transport=scripted([httpx.Response(503, json=LOADING)])) as client:
        with pytest.raises(EngineError, match="process exited"):
            await wait_healthy(client, timeout=5, check_alive=dead)


@pytest.mark.anyio
async def test_wrong_key_is_a_user_error():
    transport = httpx.MockTransport(
        lambda r: httpx.Response(401, json={"error": {"code": 401, "message": "Invalid API Key",
                                                      "type": "authentication_error"}})
    )
    async with control_client("http://engine", "nope", transport=transport) as client:
        with pytest.raises(UserError, match="rejected the API key"):
            await read_engine(client)


def test_pool_warning_only_when_layout_unknown():
    info = EngineInfo(base_url="http://x", api_key=None, slots=4, n_ctx=4096, kv_unified=None, pool=4096,
                      launched=False)
    assert "does not say whether its 4 slots share one KV pool" in pool_warning(info)
    assert "-np 4 without --kv-unified" in pool_warning(info)
    assert pool_warning(EngineInfo(base_url="http://x", api_key=None, slots=1, n_ctx=4096, kv_unified=False,
                                   pool=4096)) is None
    assert pool_warning(EngineInfo(base_url="http://x", api_key=None, slots=4, n_ctx=4096, kv_unified=True,
                                   pool=4096)) is None


def test_saved_engine_round_trip_is_private(state_tmp):
    assert load_saved_engine() is None
    record = SavedEngine(
        url="http://127.0.0.1:1",
        api_key="k",
        pid=1,
        create_time=1.0,
        log_path="/x.log",
        plan=SavedPlan(model="/m.gguf", slots=2, n_ctx=8192, kv_unified=True),
    )
    path = save_engine(record)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert load_saved_engine() == record
    path.write_text('{"url": "x", "surprise": 1}')
    with pytest.raises(UserError, match="engine.json"):
        load_saved_engine()


@pytest.mark.anyio
async def test_attach_nothing_listening(monkeypatch):
    monkeypatch.setattr(control, "CONNECT_GRACE", 0.3)
    with pytest.raises(EngineGone, match="nothing answers"):
        await attach(f"http://127.0.0.1:{free_port()}")


@pytest.mark.engine
@pytest.mark.anyio
async def test_attach_reads_a_running_engine(server_bin, model_file, state_tmp):
    plan = EnginePlan.simple(model_file, slots=2, n_ctx=2048)
    async with Launcher(plan, binary=server_bin, threads=THREADS) as engine:
        info = await attach(engine.base_url + "/v1/", engine.api_key)
        assert (info.base_url, info.slots, info.n_ctx, info.n_ctx_train) == (engine.base_url, 2, 2048, 8192)
        # squad's own build reports b0-unknown in /props; the launcher names it from the sdist it built
        # (squad.engine.binary.known_build), an attached engine shows what /props says
        assert info.model_path == engine.info.model_path
        assert info.build_info == engine.info.build_info or info.build_info.startswith("b0")
        assert not info.launched and info.kv_unified is None and info.pool == 2048
        assert engine.base_url in pool_warning(info)
        with pytest.raises(UserError, match="401"):
            await attach(engine.base_url, "wrong-key")
        with pytest.raises(UserError, match="401"):
            await attach(engine.base_url)


@pytest.mark.engine
@pytest.mark.anyio
async def test_attach_waits_while_the_engine_loads(server_bin, model_file, tmp_path, monkeypatch):
    """A raw llama-server (not a Launcher) is attached to right after spawn: 503s are waited out."""
    seen = []
    real_wait = control.wait_healthy

    async def counting(*args, **kwargs):
        seen.append(await real_wait(*args, **kwargs))
        return seen[-1]

    monkeypatch.setattr(control, "wait_healthy", counting)
    port = free_port()
    plan = EnginePlan.simple(model_file, slots=1, n_ctx=1024)
    proc = process.spawn(
        server_bin, build_args(plan, port=port, threads=THREADS), api_key="k", log_path=tmp_path / "e.log",
                         detached=False
    )
    try:
        info = await attach(f"http://127.0.0.1:{port}", "k", load_timeout=120)
        assert (info.slots, info.n_ctx, info.kv_unified, info.pool) == (1, 1024, False, 1024)
        assert seen[0] >= 1  # the real engine answered 503 "Loading model" first, and attach waited
    finally:
        proc.kill()
        proc.wait()

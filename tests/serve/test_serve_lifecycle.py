"""squad serve's lifecycle against the fake engine: SIGTERM and SIGINT stop it whatever their inherited disposition
(a job a script starts with ``&`` inherits SIGINT ignored), and the requests it holds then end with an error in their
API's own shape; a given key is never printed. The engine's side (stopped, restarted after a death, files and
modes): tests/serve/test_serve_lifecycle_real.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import anyio
import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from squad.engine.process import free_port
from squad.engine.session import EngineSpec
from squad.serve import serving
from squad.serve.ending import error_event, refusal
from squad.serve.watch import ServeWatch
from squad.testing import FakeEngine

pytestmark = pytest.mark.anyio

KEY = "lifecycle-test-key-0123456789"


def ignore_sigint() -> None:
    """What a non-interactive shell does for a job started with ``&``."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def start_serve(url: str, engine_key: str | None, state: Path) -> tuple[subprocess.Popen, str, Path]:
    port = free_port()
    env = {**os.environ, "SQUAD_STATE_DIR": str(state), "SQUAD_SERVE_API_KEY": KEY,
           "PYTHONPATH": str(Path(__file__).parents[2] / "src")}
    if engine_key:
        env["LLAMA_API_KEY"] = engine_key
    log = state / "serve.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "squad", "serve", "--port", str(port), "--url", url],
                                env=env, stdout=out, stderr=subprocess.STDOUT, preexec_fn=ignore_sigint)
    return proc, f"http://127.0.0.1:{port}", log


async def wait_healthy(proc: subprocess.Popen, url: str, log: Path) -> None:
    async with httpx.AsyncClient(timeout=2) as client:
        for _ in range(600):  # 60 s at most
            assert proc.poll() is None, log.read_text()
            try:
                if (await client.get(url + "/health")).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            await anyio.sleep(0.1)
    raise AssertionError(log.read_text())


def wait_exit(proc: subprocess.Popen, timeout: float = 30) -> int:
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)
        raise


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
async def test_a_signal_stops_serve_started_with_sigint_ignored_and_open_requests_end_clearly(tmp_path, sig, code):
    """The field case: serve started as a background job (SIGINT ignored). The signal stops it (exit 130/143); a
    stream that was running ends with an error event, a request that was queued gets 503, both in their API's shape;
    the given key is printed nowhere."""
    async with FakeEngine(slots=1, n_ctx=4096, api_key="engine-key-abcdefgh", token_delay=0.05) as fe:
        proc, url, log = start_serve(fe.base_url, fe.api_key, tmp_path)
        try:
            await wait_healthy(proc, url, log)
            headers = {"Authorization": f"Bearer {KEY}"}
            got: dict[str, object] = {}
            async with httpx.AsyncClient(base_url=url, headers=headers, timeout=30) as client:
                async def stream() -> None:
                    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2000, "stream": True}
                    lines = []
                    async with client.stream("POST", "/v1/chat/completions", json=body) as r:
                        async for line in r.aiter_lines():
                            lines.append(line)
                            if line.startswith("data: ") and "stream" not in got:
                                got["stream"] = "started"
                    got["lines"] = lines

                async def queued() -> None:
                    body = {"max_tokens": 5, "messages": [{"role": "user", "content": "hello"}]}
                    r = await client.post("/v1/chat/completions", json=body)
                    got["queued"] = (r.status_code, r.json())

                async with anyio.create_task_group() as tg:
                    tg.start_soon(stream)
                    with anyio.fail_after(30):
                        while "stream" not in got:
                            await anyio.sleep(0.02)
                    tg.start_soon(queued)
                    with anyio.fail_after(30):  # the second one waits for the only slot
                        while (await client.get("/squad/status")).json()["admission"]["queued"] < 1:
                            await anyio.sleep(0.02)
                    proc.send_signal(sig)
            assert wait_exit(proc) == code, log.read_text()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
        said = log.read_text()
        events = [json.loads(line[6:]) for line in got["lines"] if line.startswith("data: {")]
        assert "error" in events[-1] and "squad serve is stopping" in events[-1]["error"]["message"], got["lines"]
        status, body = got["queued"]
        assert status == 503 and body["error"]["type"] == "unavailable_error", body
        assert "squad serve is stopping (SIG" in body["error"]["message"], body
        assert "Exception in ASGI application" not in said and "KeyboardInterrupt" not in said, said
        assert ("terminated (SIGTERM)" if sig == signal.SIGTERM else "interrupted") in said
        assert KEY not in said


@pytest.mark.parametrize("when", ["idle", "loading"])
@pytest.mark.parametrize(("sig", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
async def test_a_signal_while_idle_or_while_the_engine_loads_stops_serve(tmp_path, when, sig, code):
    """No request open, or the engine still loading (serve not listening yet): the signal stops it (130/143), and
    the port is free again."""
    async with FakeEngine(slots=1, load_time=60 if when == "loading" else 0) as fe:
        proc, url, log = start_serve(fe.base_url, None, tmp_path)
        try:
            if when == "idle":
                await wait_healthy(proc, url, log)
            else:
                for _ in range(600):  # its first line is out once its signal handlers are in; it waits for the engine
                    if "squad serve: engine at" in log.read_text():
                        break
                    await anyio.sleep(0.05)
            proc.send_signal(sig)
            assert wait_exit(proc) == code, log.read_text()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
        with pytest.raises(httpx.TransportError):
            httpx.get(url + "/health", timeout=2)


async def test_stopping_ends_every_open_request_in_its_api_shape_and_refuses_new_ones():
    """In process: :meth:`Gateway.end_requests` ends a running stream with the API's error event; a request after it
    gets 503; /health says ``stopping``. (The fake engine serves chat only: the Messages and Responses events are
    :func:`test_error_shapes_per_api`.)"""
    async with FakeEngine(slots=1, token_delay=0.05) as fe:
        async with serving(EngineSpec(url=fe.base_url, api_key=fe.api_key), port=0) as served:
            headers = {"Authorization": f"Bearer {served.api_key}"}
            async with httpx.AsyncClient(base_url=served.url, headers=headers, timeout=30) as client:
                got: dict[str, object] = {}

                async def stream() -> None:
                    body = {"max_tokens": 2000, "stream": True, "messages": [{"role": "user", "content": "hi"}]}
                    async with client.stream("POST", "/v1/chat/completions", json=body) as r:
                        got["lines"] = []
                        async for line in r.aiter_lines():
                            got["lines"].append(line)  # type: ignore[union-attr]

                async with anyio.create_task_group() as tg:
                    tg.start_soon(stream)
                    with anyio.fail_after(30):
                        while not any(line.startswith("data:") for line in got.get("lines", [])):  # type: ignore
                            await anyio.sleep(0.02)
                    with anyio.fail_after(10):
                        await served.gateway.end_requests("stopping for the test")
                late = await client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}]})
                health = await client.get("/health")
    lines = got["lines"]
    last = json.loads([line for line in lines if line.startswith("data: ")][-1][6:])
    assert last["error"]["message"] == "stopping for the test" and last["error"]["code"] == 503, lines
    assert late.status_code == 503 and late.json()["error"]["message"] == "stopping for the test"
    assert health.status_code == 503 and health.json()["status"] == "stopping"


def test_error_shapes_per_api():
    assert refusal("messages", 503, "m") == {"type": "error", "error": {"type": "api_error", "message": "m"}}
    assert refusal("chat", 503, "m")["error"]["code"] == 503
    assert error_event("responses", 503, "m").startswith(b"event: error\ndata: ")
    assert json.loads(error_event("messages", 503, "m").split(b"data: ")[1]) == refusal("messages", 503, "m")
    assert json.loads(error_event("chat", 503, "m")[6:])["error"]["message"] == "m"



class DyingLauncher:
    """Stands in for :class:`squad.engine.launcher.Launcher` over a fake engine that can die (:meth:`kill`: its port
    refuses connections, running streams are cut) and be restarted on the same port (taking ``load_time``)."""

    def __init__(self, fe: FakeEngine, *, load_time: float = 0.5, fail_restarts: int = 0) -> None:
        self.fe, self.load_time, self.fail_restarts = fe, load_time, fail_restarts
        self.info, self.base_url, self.log_path = fe.info, fe.base_url, Path("/fake/llama-server.log")
        self.pid, self.dead, self.restarts = 1000, False, 0

    @property
    def running(self) -> bool:
        return not self.dead

    def exit_status(self) -> str | None:
        return "signal 9 SIGKILL" if self.dead else None

    async def kill(self) -> None:
        self.dead = True
        await self.fe.stop()

    async def restart(self):
        from squad.errors import EngineStartError

        self.restarts += 1
        if self.fail_restarts:
            self.fail_restarts -= 1
            raise EngineStartError("llama-server exited (status 1) while starting (the test's)")
        self.pid += 1
        await anyio.sleep(self.load_time)  # the model loads (the real launcher returns once /health is 200)
        self.info = await self.fe.restart()
        self.dead = False
        return self.info

    async def aclose(self) -> None:
        """The fake engine is stopped by its own context manager."""


async def test_a_dead_engine_is_restarted_queued_requests_wait_and_health_tells_the_truth():
    """The engine dies under a running stream with a request queued behind it: the stream ends with an error event,
    /health answers 503 ``restarting`` (never 200 while it is down) then 200, the queued request completes on the
    restarted engine, and /squad/status and serve's log say what happened (I3, I5)."""
    from squad.engine.session import EngineSession

    said: list[str] = []
    async with FakeEngine(slots=1, n_ctx=4096, token_delay=0.05) as fe:
        async with EngineSession(fe.info) as session:
            launcher = DyingLauncher(fe)
            session.launcher = launcher
            async with serving(session, port=0, log=said.append) as served:
                headers = {"Authorization": f"Bearer {served.api_key}"}
                async with httpx.AsyncClient(base_url=served.url, headers=headers, timeout=60) as client:
                    got: dict[str, object] = {"health": []}

                    async def stream() -> None:
                        body = {"max_tokens": 2000, "stream": True, "messages": [{"role": "user", "content": "hi"}]}
                        lines: list[str] = []
                        got["lines"] = lines
                        async with client.stream("POST", "/v1/chat/completions", json=body) as r:
                            async for line in r.aiter_lines():
                                lines.append(line)

                    async def queued() -> None:
                        body = {"max_tokens": 5, "messages": [{"role": "user", "content": "hello there"}]}
                        r = await client.post("/v1/chat/completions", json=body)
                        got["queued"] = (r.status_code, r.json())

                    async def health() -> None:
                        while "queued" not in got:
                            r = await client.get("/health")
                            got["health"].append((r.status_code, r.json().get("status")))  # type: ignore[union-attr]
                            if r.json().get("status") == "restarting" and "watch" not in got:
                                got["watch"] = ServeWatch(served.gateway, ["squad serve"], live=False).summary()
                            await anyio.sleep(0.05)

                    async with anyio.create_task_group() as tg:
                        tg.start_soon(stream)
                        with anyio.fail_after(30):
                            while not any(x.startswith("data: ") for x in got.get("lines", [])):  # type: ignore
                                await anyio.sleep(0.02)
                        tg.start_soon(queued)
                        with anyio.fail_after(30):
                            while served.gateway.status()["admission"]["queued"] < 1:
                                await anyio.sleep(0.02)
                        tg.start_soon(health)
                        await launcher.kill()
                    status = served.gateway.status()
    assert got["queued"][0] == 200, got["queued"]  # type: ignore[index]
    last = [x for x in got["lines"] if x.startswith("data: ")][-1]  # type: ignore[union-attr]
    said_to_client = json.loads(last[6:])["error"]["message"]
    assert "the engine exited while answering this request" in said_to_client, said_to_client  # not an httpx repr
    assert "send the request again" in said_to_client and "Error(" not in said_to_client
    seen = [s for s in got["health"]]  # type: ignore[union-attr]
    assert (503, "restarting") in seen and seen[-1] == (200, "ok"), seen
    assert all(code == 503 for code, state in seen if state in ("restarting", "down")), seen
    assert launcher.restarts == 1
    assert "engine restarting: restarting the engine, which exited (signal 9 SIGKILL)" in got["watch"], got["watch"]
    assert status["engine"]["state"] == "up" and [r["ok"] for r in status["engine"]["restarts"]] == [True]
    assert any("engine exited (signal 9 SIGKILL)" in line and "restarting it with the same plan" in line
               for line in said), said
    assert any("engine restarted" in line for line in said), said
    assert status["admission"]["busy"] == 0 and status["admission"]["reserved"] == 0


async def test_a_crash_loop_gives_up_with_a_clear_message_and_stops_serve():
    """More deaths than ``max_restarts`` within the window (a restart that fails counts as one): serve gives up,
    says why, waiting requests fail, and the ``serving`` block raises EngineError."""
    from squad.engine.session import EngineSession
    from squad.errors import EngineError

    said: list[str] = []
    async with FakeEngine(slots=1, n_ctx=4096) as fe:
        async with EngineSession(fe.info) as session:
            launcher = DyingLauncher(fe, load_time=0.0, fail_restarts=5)
            session.launcher = launcher
            with pytest.raises(EngineError, match="died 3 times within 600 s.*gave up"):
                async with serving(session, port=0, log=said.append, max_restarts=2, restart_window=600) as served:
                    await launcher.kill()
                    with anyio.fail_after(30):
                        await served.wait()
                    async with httpx.AsyncClient(base_url=served.url, timeout=10,
                                                 headers={"Authorization": f"Bearer {served.api_key}"}) as client:
                        health = await client.get("/health")
                        late = await client.post("/v1/chat/completions", json={
                            "max_tokens": 3, "messages": [{"role": "user", "content": "x"}]})
    assert launcher.restarts == 2
    assert any("gave up" in line for line in said), said
    assert health.status_code == 503 and health.json()["status"] == "down" and "gave up" in health.text
    assert late.status_code == 503 and "gave up" in late.json()["error"]["message"]


class _Session:
    """What the keeper uses of an engine session: ``exited``, ``restart`` (fails as the script says), ``admission``,
    ``launcher``."""

    def __init__(self, outcomes: list[bool]) -> None:
        from squad.sched.admission import Admission

        self.outcomes, self.attempts = list(outcomes), 0
        self.admission = Admission(2, 1024)
        self.launcher = None

    def exited(self) -> str | None:
        return None

    async def restart(self):
        from squad.errors import EngineStartError

        self.attempts += 1
        if self.outcomes and not self.outcomes.pop(0):
            raise EngineStartError("did not start (the test's)")
        return FakeEngine(slots=2, n_ctx=1024).info


deaths_strategy = st.lists(st.floats(min_value=0, max_value=50, allow_nan=False), min_size=1, max_size=12)


@settings(max_examples=200, deadline=None)
@given(gaps=deaths_strategy, outcomes=st.lists(st.booleans(), max_size=12), max_restarts=st.integers(0, 4),
       window=st.sampled_from([10.0, 60.0, 600.0]))
def test_the_keeper_restarts_at_most_max_restarts_in_any_window_and_gives_up_only_past_it(gaps, outcomes,
                                                                                          max_restarts, window):
    """Deaths at any times, restarts that fail at random: within any ``window`` seconds the keeper makes at most
    ``max_restarts`` restart attempts; it gives up exactly when one more death would pass that, then tries no more;
    while up, admission admits, and its state, restarts rows and log agree (I3)."""
    from squad.serve.keeper import EngineKeeper

    now = [0.0]
    session = _Session(outcomes)
    said: list[str] = []
    given_up: list[str] = []
    keeper = EngineKeeper(session, max_restarts=max_restarts, window=window, log=said.append,  # type: ignore[arg-type]
                          on_give_up=lambda e: given_up.append(str(e)), clock=lambda: now[0])

    async def main() -> None:
        for gap in gaps:
            now[0] += gap
            if not await keeper._restart("engine exited (signal 9 SIGKILL), log: x"):
                return

    anyio.run(main)
    attempts = [r["at"] for r in keeper.restarts if r["ok"] or r["error"]]
    for t in attempts:  # no window holds more attempts than allowed
        assert sum(1 for u in attempts if t <= u < t + window) <= max_restarts
    assert session.attempts == len(attempts)
    if keeper.gave_up:
        assert len(given_up) == 1 and "gave up" in given_up[0] and keeper.state == "down"
        last = keeper.restarts[-1]
        assert not last["ok"] and last["error"] is None  # the death it gave up on was not restarted
        assert sum(1 for u in attempts if last["at"] - window < u <= last["at"]) == max_restarts
    else:
        assert keeper.state == "up" and not given_up and keeper.restarts[-1]["ok"]
        assert not session.admission._held  # admitting again
    assert sum("restarting it with the same plan" in line for line in said) == len(attempts)
    assert sum("engine restarted in" in line for line in said) == sum(r["ok"] for r in keeper.restarts)


async def test_a_request_sent_as_the_engine_dies_is_answered_by_the_restarted_engine():
    """The engine dies and a request arrives before the keeper has looked (its count, then its send, meet a refused
    connection): it waits for the restart and is answered, never a 502."""
    from squad.engine.session import EngineSession

    async with FakeEngine(slots=2, n_ctx=4096) as fe:
        async with EngineSession(fe.info) as session:
            launcher = DyingLauncher(fe, load_time=0.3)
            session.launcher = launcher
            async with serving(session, port=0) as served:
                headers = {"Authorization": f"Bearer {served.api_key}"}
                async with httpx.AsyncClient(base_url=served.url, headers=headers, timeout=60) as client:
                    body = {"max_tokens": 4, "messages": [{"role": "user", "content": "hello there"}]}
                    assert (await client.post("/v1/chat/completions", json=body)).status_code == 200
                    await launcher.kill()  # the same body again: counted already, its send meets the dead engine
                    answers = [await client.post("/v1/chat/completions", json=body)]
                    await launcher.kill()  # new bodies: their count meets it
                    answers += [await client.post("/v1/chat/completions", json={
                        "max_tokens": 4, "messages": [{"role": "user", "content": f"hello {i} " * (i + 2)}]})
                        for i in range(3)]
                status = served.gateway.status()
    assert [a.status_code for a in answers] == [200] * 4, [a.text for a in answers]
    assert launcher.restarts == 2 and status["engine"]["state"] == "up"


async def test_stopping_while_the_engine_restarts_ends_at_once_and_answers_the_queued_request():
    """A stop (SIGTERM) while a dead engine restarts: the restart is abandoned, the request waiting for it gets 503
    in its API's shape, and the serving block ends without waiting for the engine to load."""
    from squad.engine.session import EngineSession

    async with FakeEngine(slots=1, n_ctx=4096) as fe:
        async with EngineSession(fe.info) as session:
            launcher = DyingLauncher(fe, load_time=120)
            session.launcher = launcher
            got: dict[str, httpx.Response] = {}
            with anyio.fail_after(30):
                async with serving(session, port=0) as served:
                    headers = {"Authorization": f"Bearer {served.api_key}"}
                    async with httpx.AsyncClient(base_url=served.url, headers=headers, timeout=60) as client:
                        await launcher.kill()
                        while served.gateway.engine_state()[0] != "restarting":
                            await anyio.sleep(0.02)

                        async def waiting() -> None:
                            body = {"max_tokens": 4, "messages": [{"role": "user", "content": "hello"}]}
                            got["answer"] = await client.post("/v1/chat/completions", json=body)

                        async with anyio.create_task_group() as tg:
                            tg.start_soon(waiting)
                            while not served.gateway.ledger.live:
                                await anyio.sleep(0.02)
                            await served.gateway.end_requests("squad serve is stopping (SIGTERM)")
    answer = got["answer"]
    assert answer.status_code == 503 and answer.json()["error"]["message"] == "squad serve is stopping (SIGTERM)"


class HangingHealthEngine(FakeEngine):
    """A fake engine whose /health does not answer while ``hung`` (a SIGSTOPped or wedged llama-server: the kernel
    still accepts its connections, nothing answers them)."""

    hung = False

    async def _health(self, request):  # type: ignore[no-untyped-def]
        for _ in range(600):  # 60 s at most
            if not self.hung:
                break
            await anyio.sleep(0.1)
        return await super()._health(request)


async def test_health_of_an_engine_that_does_not_answer_is_a_prompt_503(monkeypatch):
    """A stopped or hung engine (its process alive, so nothing restarts it): /health answers 503 ``unresponsive``
    within HEALTH_TIMEOUT_S instead of hanging for the request timeout (600 s: a SIGSTOPped llama-server under squad
    serve made /health hang); 200 again once the engine answers."""
    from squad.serve import gateway

    monkeypatch.setattr(gateway, "HEALTH_TIMEOUT_S", 0.5)
    async with HangingHealthEngine(slots=1, n_ctx=4096) as fe:
        async with serving(EngineSpec(url=fe.base_url), port=0) as served:
            async with httpx.AsyncClient(base_url=served.url, timeout=30) as client:
                assert (await client.get("/health")).status_code == 200
                fe.hung = True
                with anyio.fail_after(20):
                    r = await client.get("/health")
                assert r.status_code == 503 and r.json()["status"] == "unresponsive", r.text
                assert "did not answer" in r.json()["error"]["message"], r.text
                fe.hung = False
                assert (await client.get("/health")).status_code == 200


async def test_a_restart_that_fails_with_an_os_error_counts_as_a_failed_restart_not_a_crash():
    """The engine's restart can fail with an OSError, not only a SquadError (its log file cannot be opened:
    ``process.spawn``'s ``open_private``; the state folder was removed or replaced by a file): the keeper counts it
    as a restart that failed and gives up past ``max_restarts`` with the reason, instead of letting the OSError
    crash squad serve's task group (a traceback, queued requests never answered)."""
    from squad.serve.keeper import EngineKeeper

    class Session(_Session):
        async def restart(self):
            self.attempts += 1
            raise FileExistsError(17, "File exists", "/state/logs")

    session = Session([])
    said: list[str] = []
    given_up: list[str] = []
    keeper = EngineKeeper(session, max_restarts=1, log=said.append,  # type: ignore[arg-type]
                          on_give_up=lambda e: given_up.append(str(e)))
    assert await keeper._restart("engine exited (signal 9 SIGKILL), log: x") is False
    assert session.attempts == 1 and keeper.gave_up and len(given_up) == 1
    assert "File exists" in keeper.restarts[0]["error"] and "File exists" in given_up[0], keeper.restarts
    assert any("the restart failed" in line and "/state/logs" in line for line in said), said


async def test_a_stream_the_dead_engine_cut_ends_saying_the_engine_exited():
    """The engine dies mid-stream: the stream's last event is the API's error event saying the engine exited and
    to send the request again (not an httpx exception's repr). Each API's own error event: ending.error_event, in
    test_error_shapes_per_api."""
    path, body = "/v1/chat/completions", {"max_tokens": 2000, "stream": True,
                                          "messages": [{"role": "user", "content": "hi"}]}
    from squad.engine.session import EngineSession

    async with FakeEngine(slots=1, n_ctx=4096, token_delay=0.05) as fe:
        async with EngineSession(fe.info) as session:
            launcher = DyingLauncher(fe)
            session.launcher = launcher
            async with serving(session, port=0) as served:
                headers = {"Authorization": f"Bearer {served.api_key}", "anthropic-version": "2023-06-01"}
                async with httpx.AsyncClient(base_url=served.url, headers=headers, timeout=60) as client:
                    lines: list[str] = []
                    async with anyio.create_task_group() as tg:
                        async def stream() -> None:
                            async with client.stream("POST", path, json=body) as r:
                                async for line in r.aiter_lines():
                                    lines.append(line)
                        tg.start_soon(stream)
                        with anyio.fail_after(30):
                            while sum(x.startswith("data: ") for x in lines) < 3:
                                await anyio.sleep(0.02)
                        await launcher.kill()
    events = [x for x in lines if x]
    message = json.loads(events[-1][6:])["error"]["message"]
    assert "the engine exited while answering this request" in message and "send the request again" in message


async def test_a_live_engine_that_stops_answering_is_killed_and_restarted(monkeypatch):
    """An engine whose process lives but does not answer /health (SIGSTOP, hung) is killed with SIGKILL after
    ``hung_after`` seconds and restarted; the restart row and the log say why; an engine that answers is never
    touched, however long it runs."""
    import signal as signals

    from squad.serve import keeper as keeping
    from squad.serve.keeper import EngineKeeper

    class Launcher:
        pid, running = 4242, True

    class Session:
        launcher, admission = Launcher(), None
        restarted = 0

        def exited(self):
            return None if Launcher.running else "engine exited (signal 9 SIGKILL)"

        async def restart(self):
            self.restarted += 1
            Launcher.running = True
            return type("Info", (), {"base_url": "http://127.0.0.1:1", "slots": 1, "pool": 100})()

    killed: list[tuple[int, int]] = []

    def kill(pid: int, sig: int) -> None:
        killed.append((pid, sig))
        Launcher.running = False

    monkeypatch.setattr(keeping.os, "kill", kill)
    answers = {"now": True}

    async def probe() -> bool:
        if not answers["now"]:
            await anyio.sleep(1)  # a stopped engine: the probe's own timeout ends it
        return answers["now"]

    said: list[str] = []
    session = Session()
    keeper = EngineKeeper(session, probe=probe, probe_every=0.05, hung_after=0.3, log=said.append)  # type: ignore
    async with anyio.create_task_group() as tg:
        tg.start_soon(keeper.run)
        await anyio.sleep(0.6)  # it answers: nothing happens
        assert killed == [] and keeper.up
        answers["now"] = False
        with anyio.fail_after(10):
            while not keeper.restarts or not keeper.up:
                await anyio.sleep(0.02)
        answers["now"] = True
        await anyio.sleep(0.3)
        tg.cancel_scope.cancel()
    assert killed == [(4242, signals.SIGKILL)] and session.restarted == 1
    assert "killed by squad serve: it did not answer /health" in keeper.restarts[0]["why"], keeper.restarts
    assert any("has not answered /health" in line and "killing it to restart it" in line for line in said), said

"""squad serve's lifecycle on the real engine (issue 28, part B):

- SIGTERM and SIGINT stop ``squad serve`` started with SIGINT ignored (a job a script starts with ``&``): it exits
  143 / 130, a running stream ends with an error event, and its engine is gone;
- ``squad engine start`` writes neither the serve key nor the engine key into any file but ``engine.json``, and
  every file squad wrote in its state folder is 0600 in 0700 folders;
- ``kill -9`` of the engine under serve: the engine is restarted with the same plan, ``/health`` answers 503
  ``restarting`` then 200, the request queued meanwhile completes, the running one gets its error, and past
  ``--max-restarts`` serve gives up with a clear message and exits 1, leaving nothing running.

The same against the fake engine, in process: tests/serve/test_serve_lifecycle.py."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import psutil
import pytest

from launch_support import THREADS, wait_gone
from squad.engine.process import free_port

pytestmark = pytest.mark.engine

KEY = "lifecycle-real-key-0123456789"
SRC = str(Path(__file__).resolve().parents[2] / "src")


def ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@contextmanager
def serve(state: Path, llama_server: Path, model: Path, *extra: str) -> Iterator[tuple[subprocess.Popen, str, Path]]:
    """``squad serve -np 1 -c 2048`` with SIGINT ignored, as a script's background job; yields once /health is 200.
    Killed if a test leaves it running."""
    port = free_port()
    env = {**os.environ, "SQUAD_STATE_DIR": str(state), "SQUAD_SERVE_API_KEY": KEY, "PYTHONPATH": SRC}
    env.pop("LLAMA_API_KEY", None)
    state.mkdir(parents=True, exist_ok=True)
    log = state.parent / f"serve-{port}.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "squad", "serve", "--port", str(port), "-np", "1", "-c", "2048",
                                 "-t", str(THREADS), "--llama-server", str(llama_server), "-m", str(model), *extra],
                                env=env, stdout=out, stderr=subprocess.STDOUT, preexec_fn=ignore_sigint)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_health(proc, url, log, 200)
        yield proc, url, log
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)


def wait_health(proc: subprocess.Popen, url: str, log: Path, want: int, timeout: float = 180) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        assert proc.poll() is None, log.read_text()
        try:
            if httpx.get(url + "/health", timeout=5).status_code == want:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise AssertionError(log.read_text())


def engine_pid(state: Path) -> int:
    """The engine serve launched, from its pid file (``state/engines/<pid>.json``)."""
    for _ in range(600):  # 60 s at most: serve imports, plans and spawns it first
        found = [json.loads(p.read_text())["pid"] for p in (state / "engines").glob("*.json")]
        if found:
            return found[0]
        time.sleep(0.1)
    raise AssertionError("no engine pid file")


def headers() -> dict[str, str]:
    return {"Authorization": f"Bearer {KEY}"}


class Stream(threading.Thread):
    """A streamed chat request that holds the only slot (up to 1,500 tokens) and records its SSE lines."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url, self.lines, self.started = url, [], threading.Event()

    def run(self) -> None:
        body = {"messages": [{"role": "user", "content": "Count from one to one thousand."}], "max_tokens": 1500,
                "stream": True, "ignore_eos": True, "temperature": 0, "seed": 1}
        try:
            with httpx.stream("POST", self.url + "/v1/chat/completions", json=body, headers=headers(),
                              timeout=300) as r:
                for line in r.iter_lines():
                    self.lines.append(line)
                    if line.startswith("data: "):
                        self.started.set()
        except httpx.HTTPError as exc:
            self.lines.append(f"transport error: {exc!r}")
        self.started.set()

    def events(self) -> list[dict]:
        return [json.loads(line[6:]) for line in self.lines if line.startswith("data: {")]


def queued_count(url: str) -> int:
    return httpx.get(url + "/squad/status", headers=headers(), timeout=10).json()["admission"]["queued"]


@pytest.mark.timeout(600)
@pytest.mark.parametrize(("sig", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_stops_serve_with_sigint_ignored_and_its_engine(tmp_path, llama_server_path, default_model_path,
                                                                 sig, code):
    state = tmp_path / "state"
    with serve(state, llama_server_path, default_model_path) as (proc, url, log):
        engine = engine_pid(state)
        stream = Stream(url)
        stream.start()
        assert stream.started.wait(120), stream.lines
        proc.send_signal(sig)
        assert proc.wait(60) == code, log.read_text()
        stream.join(30)
    said = log.read_text()
    assert wait_gone(engine), f"engine {engine} still runs after squad serve stopped"
    assert not list((state / "engines").glob("*.json"))
    assert "Exception in ASGI application" not in said and "KeyboardInterrupt" not in said, said
    last = stream.events()[-1]
    assert "error" in last and "squad serve is stopping" in last["error"]["message"], stream.lines[-3:]


@pytest.mark.timeout(600)
def test_sigterm_as_the_engine_starts_stops_serve_and_leaves_no_engine(tmp_path, llama_server_path,
                                                                     default_model_path):
    """SIGTERM as soon as the engine process exists (it loads the model, serve does not listen yet; on a fast machine
    it may have just finished): serve exits 143 and the engine is gone, wherever the signal lands."""
    state = tmp_path / "state"
    state.mkdir()
    env = {**os.environ, "SQUAD_STATE_DIR": str(state), "SQUAD_SERVE_API_KEY": KEY, "PYTHONPATH": SRC}
    log = tmp_path / "serve.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "squad", "serve", "--port", str(free_port()), "-np", "1", "-c",
                                 "2048", "-t", str(THREADS), "--llama-server", str(llama_server_path), "-m",
                                 str(default_model_path)],
                                env=env, stdout=out, stderr=subprocess.STDOUT, preexec_fn=ignore_sigint)
    try:
        engine = engine_pid(state)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 143, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
    assert wait_gone(engine), log.read_text()
    assert not list((state / "engines").glob("*.json"))


@pytest.mark.timeout(600)
def test_engine_start_writes_no_key_and_keeps_its_files_private(tmp_path, llama_server_path, default_model_path):
    """`squad engine start` (serve in the background, its output to a log) and a request through it: the serve key
    and the engine key are in no file squad wrote but engine.json; every folder is 0700, every file 0600."""
    state = tmp_path / "state"
    env = {**os.environ, "SQUAD_STATE_DIR": str(state), "PYTHONPATH": SRC}
    env.pop("LLAMA_API_KEY", None)
    since = time.time() - 1
    run = subprocess.run([sys.executable, "-m", "squad", "engine", "start", "-np", "1", "-c", "2048", "-t",
                          str(THREADS), "--llama-server", str(llama_server_path), "-m", str(default_model_path)],
                         env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    record = json.loads((state / "engine.json").read_text())
    engine_key = None
    try:
        engine = engine_pid(state)
        engine_key = psutil.Process(engine).environ()["LLAMA_API_KEY"]  # the key serve gave its engine
        answer = httpx.post(record["url"] + "/v1/chat/completions", timeout=120,
                            headers={"Authorization": f"Bearer {record['api_key']}"},
                            json={"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4})
        assert answer.status_code == 200, answer.text
    finally:
        stopped = subprocess.run([sys.executable, "-m", "squad", "engine", "stop"], env=env, capture_output=True,
                                 text=True, timeout=120)
        assert wait_gone(record["pid"])
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    keys = [record["api_key"].encode(), engine_key.encode()]
    holding, loose = [], []
    cache = Path(os.environ.get("SQUAD_CACHE_DIR") or Path.home() / ".cache" / "squad")
    written = [p for p in state.rglob("*")] + [p for p in cache.rglob("*")
                                               if p.is_file() and p.stat().st_mtime >= since
                                               and p.stat().st_size < 50_000_000]
    assert any(p.name.startswith("squad-serve-") for p in written) and any(p.name.startswith("llama-server-")
                                                                          for p in written), written
    for path in written:
        mode = stat.S_IMODE(path.stat().st_mode)
        if path.is_relative_to(state) and mode != (0o700 if path.is_dir() else 0o600):
            loose.append(f"{path} {mode:o}")
        if path.is_file() and any(key in path.read_bytes() for key in keys):
            holding.append(path.name)
    assert not loose, loose
    assert holding == [] or holding == ["engine.json"], holding  # engine.json is gone after `engine stop`
    assert stat.S_IMODE(state.stat().st_mode) == 0o700


@pytest.mark.timeout(900)
def test_a_killed_engine_is_restarted_queued_requests_complete_and_a_crash_loop_gives_up(
        tmp_path, llama_server_path, default_model_path):
    state = tmp_path / "state"
    with serve(state, llama_server_path, default_model_path, "--max-restarts", "1") as (proc, url, log):
        first = engine_pid(state)
        stream = Stream(url)
        stream.start()
        assert stream.started.wait(120), stream.lines
        got: dict[str, object] = {}

        def queued() -> None:
            r = httpx.post(url + "/v1/chat/completions", headers=headers(), timeout=300,
                           json={"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4})
            got["queued"] = (r.status_code, r.text)

        waiting = threading.Thread(target=queued, daemon=True)
        waiting.start()
        for _ in range(300):
            if queued_count(url) >= 1:
                break
            time.sleep(0.1)
        assert queued_count(url) == 1
        os.kill(first, signal.SIGKILL)
        health = []
        while waiting.is_alive() and len(health) < 3000:  # at most ~300 s
            try:
                r = httpx.get(url + "/health", timeout=5)
                health.append((r.status_code, r.json().get("status")))
            except httpx.TransportError as exc:
                health.append((0, repr(exc)))
            time.sleep(0.1)
        waiting.join(60)
        stream.join(60)
        assert got["queued"][0] == 200, got  # type: ignore[index]
        assert (503, "restarting") in health and all(code != 0 for code, _ in health), health
        assert httpx.get(url + "/health", timeout=5).status_code == 200
        assert "error" in stream.events()[-1], stream.lines[-3:]
        status = httpx.get(url + "/squad/status", headers=headers(), timeout=10).json()
        assert status["engine"]["state"] == "up" and [r["ok"] for r in status["engine"]["restarts"]] == [True]
        assert status["admission"]["busy"] == 0 and status["admission"]["reserved"] == 0
        second = engine_pid(state)  # the first one's pid file went with it
        assert second != first
        said = log.read_text()
        assert "engine exited (signal 9 SIGKILL)" in said and "restarting it with the same plan" in said, said
        assert "engine restarted in" in said, said

        os.kill(second, signal.SIGKILL)  # one death more than --max-restarts 1 allows in 10 minutes
        assert proc.wait(120) == 1, log.read_text()
    said = log.read_text()
    assert "the engine died 2 times within 600 s" in said and "gave up" in said, said
    assert wait_gone(second) and not list((state / "engines").glob("*.json"))


@pytest.mark.timeout(600)
def test_a_stopped_engine_is_killed_and_restarted(tmp_path, llama_server_path, default_model_path):
    """SIGSTOP of the engine (its process lives, it answers nothing): after ``--hung-after`` seconds squad serve kills
    and restarts it, says why in its log and /squad/status, and serves again."""
    state = tmp_path / "state"
    with serve(state, llama_server_path, default_model_path, "--hung-after", "6") as (proc, url, log):
        first = engine_pid(state)
        os.kill(first, signal.SIGSTOP)
        try:
            for _ in range(1200):  # at most ~240 s
                status = httpx.get(url + "/squad/status", headers=headers(), timeout=10).json()
                if status["engine"]["restarts"] and status["engine"]["state"] == "up":
                    break
                time.sleep(0.2)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(first, signal.SIGCONT)
        assert wait_gone(first)
        (row,) = status["engine"]["restarts"]
        assert row["ok"] and "killed by squad serve: it did not answer /health" in row["why"], row
        r = httpx.post(url + "/v1/chat/completions", headers=headers(), timeout=300,
                       json={"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4})
        assert r.status_code == 200, r.text
        said = log.read_text()
        assert "has not answered /health" in said and "killing it to restart it" in said, said

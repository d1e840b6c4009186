"""The engine process is squad's and only squad's (issue 11, kind 6; field cases F15, F16).

Each test proves one line of the "No engine left behind" table (``docs/troubleshooting.md``), on the real
``squad`` command and the real llama-server: SIGINT and SIGTERM of a run (agents cancelled,
engine and wrapper stopped, trace ended, pid file removed, exit 130/143), SIGKILL of squad
(the engine behind a wrapper script dies too), an engine killed mid-run (reported with its
signal and log), a restart after the engine died (an event and a view line), and a port some
other server answers on (refused, never adopted).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from launch_support import THREADS, anyio_backend, gone, model_file, server_bin, state_tmp, wait_gone  # noqa: F401
from squad.engine import process

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals and process groups")

RECIPE = """\
name: long-run
model: {model}
params:
  topics:
    type: list
    default: [{topics}]
agents:
  writer:
    instructions: You write long, detailed stories.
    max_tokens: {max_tokens}
main: writer
flow:
  - id: stories
    map: params.topics
    concurrency: 2
    agent: writer
    prompt: "Write a long story about {{{{ item }}}}."
"""
TOPICS = ", ".join(f"topic {i}" for i in range(40))


def _recipe(tmp_path: Path, model: Path, topics: str = TOPICS, max_tokens: int = 200) -> Path:
    path = tmp_path / "long.yaml"
    path.write_text(RECIPE.format(model=model, topics=topics, max_tokens=max_tokens))
    return path


def _wrapper(tmp_path: Path, server: Path) -> Path:
    """F16's wrapper: sets an environment variable and runs llama-server without exec."""
    path = tmp_path / "wrapper.sh"
    path.write_text(f'#!/bin/sh\nexport SQUAD_TEST_WRAPPED=1\n"{server}" "$@"\n')
    path.chmod(0o755)
    return path


def _events(trace: Path) -> list[dict]:
    if not trace.exists():
        return []
    return [json.loads(line) for line in trace.read_text().splitlines() if line.strip().endswith("}")]


class Run:
    """A `squad run` subprocess on the long recipe, started with SIGINT at its default (a child
    of a non-interactive shell would otherwise inherit it ignored)."""

    def __init__(self, tmp_path: Path, model: Path, binary: Path, state: Path, **recipe: object) -> None:
        self.trace, self.state = tmp_path / "trace.jsonl", state
        self.out, self.err = tmp_path / "out.txt", tmp_path / "err.txt"
        argv = [sys.executable, "-m", "squad", "run", str(_recipe(tmp_path, model, **recipe)),  # type: ignore[arg-type]
                "--llama-server", str(binary), "-t", str(THREADS), "--trace", str(self.trace)]
        with self.out.open("w") as out, self.err.open("w") as err:
            self.proc = subprocess.Popen(argv, stdout=out, stderr=err,
                                         env={**os.environ, "SQUAD_STATE_DIR": str(state)},
                                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))

    def wait_for(self, kind: str, timeout: float = 180.0) -> None:
        end = time.monotonic() + timeout
        while not any(e["kind"] == kind for e in _events(self.trace)):
            assert self.proc.poll() is None, f"squad run ended early: {self.stderr()}"
            assert time.monotonic() < end, f"no {kind} event after {timeout} s"
            time.sleep(0.1)

    def pidfile(self) -> tuple[Path, dict]:
        (path,) = (self.state / "engines").glob("*.json")
        return path, json.loads(path.read_text())

    def engine_pids(self) -> list[int]:
        """The engine's first process (the wrapper, if any) and everything it started."""
        root = psutil.Process(self.pidfile()[1]["pid"])
        return [root.pid, *(c.pid for c in root.children(recursive=True))]

    def stderr(self) -> str:
        return self.err.read_text(errors="replace")

    def finish(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(60)


@pytest.fixture
def run(tmp_path, model_file, server_bin, state_tmp):
    runs: list[Run] = []

    def start(binary: Path | None = None, **recipe: object) -> Run:
        runs.append(Run(tmp_path, model_file, binary or server_bin, state_tmp, **recipe))
        return runs[-1]

    yield start
    for r in runs:
        r.finish()


@pytest.mark.engine
@pytest.mark.parametrize(("sig", "code", "said"), [(signal.SIGINT, 130, "interrupted"),
                                                   (signal.SIGTERM, 143, "terminated (SIGTERM)")])
def test_sigint_and_sigterm_cancel_agents_stop_the_engine_and_end_the_trace(run, tmp_path, server_bin, sig, code, said):
    r = run(_wrapper(tmp_path, server_bin))
    r.wait_for("call.first_token")
    pids, (pidfile, _) = r.engine_pids(), r.pidfile()
    assert len(pids) == 2  # the wrapper and the llama-server it started
    r.proc.send_signal(sig)
    assert r.proc.wait(60) == code, r.stderr()
    assert all(gone(pid) for pid in pids), "the engine or its wrapper outlived squad"  # gone before squad exited
    assert not pidfile.exists()
    assert said in r.stderr() and "Traceback" not in r.stderr()
    events = _events(r.trace)
    started = {e["conversation"] for e in events if e["kind"] == "agent.started"}
    ended = {e["conversation"] for e in events if e["kind"] in ("agent.finished", "agent.failed", "agent.cancelled")}
    assert started and started == ended, "an agent has no end event in the trace"
    assert any(e["kind"] == "agent.cancelled" for e in events)


@pytest.mark.engine
@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_at_the_chat_prompt_ends_squad_chat_at_once(tmp_path, model_file, server_bin, state_tmp, sig, code):
    """The prompt's read blocks in a thread; it must not keep the process from exiting."""
    err = tmp_path / "err.txt"
    with err.open("w") as stderr:
        chat = subprocess.Popen([sys.executable, "-m", "squad", "chat", "-m", str(model_file), "--llama-server",
                                 str(server_bin)], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=stderr,
                                env={**os.environ, "SQUAD_STATE_DIR": str(state_tmp)},
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        end = time.monotonic() + 180
        while "/quit ends" not in err.read_text():
            assert chat.poll() is None and time.monotonic() < end, err.read_text()
            time.sleep(0.1)
        (pidfile,) = (state_tmp / "engines").glob("*.json")
        engine = json.loads(pidfile.read_text())["pid"]
        chat.send_signal(sig)
        assert chat.wait(60) == code
        assert gone(engine) and not pidfile.exists()
    finally:
        if chat.poll() is None:
            chat.kill()
        chat.wait()
        chat.stdin.close()


@pytest.mark.engine
def test_sigkill_of_squad_stops_the_engine_behind_a_wrapper(run, tmp_path, server_bin):
    """F16: squad killed with SIGKILL runs no code; the guard stops the wrapper's whole group."""
    r = run(_wrapper(tmp_path, server_bin))
    r.wait_for("call.first_token")
    pids = r.engine_pids()
    r.proc.kill()
    r.proc.wait(30)
    assert all(wait_gone(pid, 15) for pid in pids), "the wrapper's llama-server outlived a SIGKILLed squad"


@pytest.mark.engine
def test_an_engine_killed_mid_run_is_reported_with_its_signal_and_log(run):
    """Killed while the first answers stream: squad says how the engine ended and where its log
    is (a view line, the trace, and the error of a call it cut), restarts it once, and the
    run's other item goes on (policy collect)."""
    r = run(topics="one, two, three", max_tokens=48)
    r.wait_for("call.first_token")
    _, record = r.pidfile()
    os.kill(record["pid"], signal.SIGKILL)
    code = r.proc.wait(300)
    said = " ".join(r.stderr().split())  # rich may wrap lines
    message = f"engine exited (signal 9 SIGKILL), log: {record['log']}"
    assert message in said and Path(record["log"]).is_file() and "Traceback" not in said
    assert code == 0 or (code == 1 and f"; {message}" in said), said  # a cut answer names the death
    events = _events(r.trace)
    exited = [e for e in events if e["kind"] == "engine.exited"]
    assert len(exited) == 1 and exited[0]["data"]["status"] == "signal 9 SIGKILL"
    assert [e["data"]["reason"] for e in events if e["kind"] == "engine.loaded"] == ["launched", "restarted"]
    assert "engine restarted" in said


@pytest.mark.engine
@pytest.mark.anyio
async def test_a_dead_engine_is_restarted_with_an_event_and_a_view_line(model_file, server_bin, state_tmp):
    from rich.console import Console

    from squad import Agent, EngineSpec, Squad
    from squad.events.view import LiveView

    console = Console(record=True, width=200)
    view = LiveView(console=console, live=False)
    seen = []
    spec = EngineSpec(model=model_file, binary=server_bin, threads=THREADS, slots=1)
    async with Squad([Agent(name="w", max_tokens=8)], engine=spec, on_event=[seen.append, view]) as sq:
        first = await sq.run_agent("w", "Say hi.")
        dead = sq.session.launcher.pid
        os.kill(dead, signal.SIGKILL)
        assert wait_gone(dead, 10)
        second = await sq.run_agent("w", "Say hi again.")
        assert sq.session.launcher.pid != dead
    assert first.ok and second.ok
    kinds = [e.kind for e in seen]
    exited = kinds.index("engine.exited")
    assert kinds.index("engine.loaded", exited) > exited
    assert [e.reason for e in seen if e.kind == "engine.loaded"] == ["launched", "restarted"]
    text = console.export_text()
    assert "engine exited (signal 9 SIGKILL), log: " in text and "engine restarted: 1 slots" in text


# --- F15: a port another server answers on ------------------------------------------------------

IMPOSTOR = textwrap.dedent(
    """
    import json, sys
    from http.server import BaseHTTPRequestHandler, HTTPServer
    ANS = {"/health": {"status": "ok"}, "/v1/models": {"data": [{"meta": {"n_ctx_train": 8192}}]},
           "/props": {"default_generation_settings": {"n_ctx": 512}, "total_slots": 1,
                      "model_path": "/impostor.gguf"}}
    class H(BaseHTTPRequestHandler):
        def do_GET(self):
            body = json.dumps(ANS.get(self.path, {})).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        def log_message(self, *args):
            pass
    server = HTTPServer(("127.0.0.1", int(sys.argv[1])), H)
    print("up", flush=True)
    server.serve_forever()
    """
)


@pytest.fixture
def impostor():
    """A llama-server look-alike on a free port of 127.0.0.1 (answers every GET, any key)."""
    port = process.free_port()
    proc = subprocess.Popen([sys.executable, "-c", IMPOSTOR, str(port)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "up"
    yield port
    proc.kill()
    proc.wait()
    proc.stdout.close()


def _squad(*args: str, state: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "squad", *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "SQUAD_STATE_DIR": str(state)})


@pytest.mark.engine
@pytest.mark.parametrize("late", [False, True])
def test_engine_start_on_a_port_another_server_answers_is_refused(impostor, tmp_path, server_bin, model_file,
                                                                   state_tmp, late):
    """F15: `squad engine start --port P` with P taken: "port P is in use", never "engine up" with the
    other server's model, also with a binary that binds half a second late."""
    binary = server_bin
    if late:
        binary = tmp_path / "late.sh"
        binary.write_text(f'#!/bin/sh\nsleep 0.5\nexec "{server_bin}" "$@"\n')
        binary.chmod(0o755)
    started = _squad("engine", "start", "--port", str(impostor), "--llama-server", str(binary), "-m", str(model_file),
                     "-t", str(THREADS), state=state_tmp)
    said = " ".join(started.stderr.split())
    # engine start runs squad serve on --port (F20), which refuses a taken port as a usage error
    assert started.returncode == 2 and f"port {impostor} on 127.0.0.1 is in use by another program" in said
    assert "engine up" not in started.stdout and "GGUF" not in said and "Traceback" not in said
    assert not (state_tmp / "engine.json").exists()
    status = _squad("engine", "status", state=state_tmp)
    assert status.returncode == 2 and "impostor" not in status.stdout


# --- fast: without the real engine -----------------------------------------------------------------

SILENT = "#!/bin/sh\nexec sleep 60\n"  # a 'llama-server' that never binds: the impostor answers alone


@pytest.mark.anyio
async def test_a_server_without_this_launchs_key_is_not_adopted(impostor, tmp_path, state_tmp, model_file,
                                                                 monkeypatch):
    """F15 where the OS does not tell who listens (psutil AccessDenied): the key check alone
    finds that the server answering demands no key, so it is not the one squad started."""
    from squad.engine.launcher import Launcher
    from squad.errors import EngineStartError
    from squad.sched.planner import EnginePlan

    monkeypatch.setattr(process, "port_in_use", lambda port: False)  # it came after the check
    monkeypatch.setattr(process, "listens", lambda pid, port: None)
    binary = tmp_path / "silent.sh"
    binary.write_text(SILENT)
    binary.chmod(0o755)
    launcher = Launcher(EnginePlan(model=model_file, slots=1, n_ctx=512, kv_unified=False), binary=binary,
                        port=impostor, grace=1.0)
    with pytest.raises(EngineStartError,
                       match=f"port {impostor} on 127.0.0.1 is in use.*without this launch's API key"):
        await launcher.start()
    assert launcher.pid is None and launcher.info is None


LOADING = textwrap.dedent(
    """
    import sys
    from http.server import BaseHTTPRequestHandler, HTTPServer
    class H(BaseHTTPRequestHandler):
        def do_GET(self):
            body = b'{"error": {"code": 503, "message": "Loading model"}}'
            self.send_response(503)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        def log_message(self, *args):
            pass
    HTTPServer(("127.0.0.1", int(sys.argv[sys.argv.index("--port") + 1])), H).serve_forever()
    """
)


def _forever_loading(tmp_path: Path) -> Path:
    """A 'llama-server' that binds and answers 503 Loading model forever."""
    (tmp_path / "loading.py").write_text(LOADING)
    binary = tmp_path / "loading.sh"
    binary.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{tmp_path / "loading.py"}" "$@"\n')
    binary.chmod(0o755)
    return binary


@pytest.mark.anyio
async def test_the_load_wait_reports_progress_and_keeps_its_deadline(tmp_path, state_tmp, model_file):
    from squad.engine.launcher import Launcher
    from squad.errors import EngineLoadTimeout
    from squad.sched.planner import EnginePlan

    seen: list[tuple[float, float]] = []
    launcher = Launcher(EnginePlan(model=model_file, slots=1, n_ctx=512, kv_unified=False),
                        binary=_forever_loading(tmp_path), load_timeout=3.5, grace=1.0,
                        on_progress=lambda elapsed, limit: seen.append((elapsed, limit)))
    with pytest.raises(EngineLoadTimeout, match=r"still loading after 4 s .*--load-timeout SECONDS"):
        await launcher.start()
    assert len(seen) >= 2 and all(limit == 3.5 for _, limit in seen)
    assert [e for e, _ in seen] == sorted(e for e, _ in seen) and seen[-1][0] >= 2
    assert launcher.pid is None


def test_load_timeout_on_the_command_line(tmp_path, state_tmp, model_file):
    """`--load-timeout` reaches the launch; the error says which flag raises it; nothing is left."""
    binary = _forever_loading(tmp_path)
    done = _squad("engine", "start", "--load-timeout", "2", "--llama-server", str(binary), "-m", str(model_file),
                  state=state_tmp)
    said = " ".join(done.stderr.split())
    assert done.returncode == 1 and "still loading after 2 s" in said and "--load-timeout" in said, said
    assert "Traceback" not in said and not (state_tmp / "engine.json").exists()
    for command in (["run"], ["chat"], ["verify"], ["engine", "start"]):
        assert "--load-timeout" in _squad(*command, "--help", state=state_tmp).stdout


def test_load_timeout_in_the_engine_spec():
    from squad import EngineSpec
    from squad.errors import UserError

    assert EngineSpec(load_timeout=300).load_timeout == 300
    for bad in (0, -1, True, "10"):
        with pytest.raises(UserError, match="load_timeout must be a positive number of seconds"):
            EngineSpec(load_timeout=bad)  # type: ignore[arg-type]
    with pytest.raises(UserError, match="load_timeout"):
        EngineSpec(url="http://127.0.0.1:1", load_timeout=10)


def test_the_view_shows_loading_exit_and_restart_in_both_modes():
    from rich.console import Console

    from squad.events import EngineExited, EngineLoaded, EngineLoading, EnginePlanned
    from squad.events.view import LiveView

    for live in (False, True):
        console = Console(record=True, width=200, force_terminal=live)
        view = LiveView(console=console, live=live)
        view(EnginePlanned(slots=2, n_ctx=1024, t=0.0))
        for second in range(1, 13):
            view(EngineLoading(model="m.gguf", elapsed_s=float(second), timeout_s=90.0, t=float(second)))
        assert "loading m.gguf: 12 s of at most 90 s" in view.state.status_line()
        view(EngineLoaded(slots=2, n_ctx=1024, pool=1024, t=13.0))
        view(EngineExited(status="signal 9 SIGKILL", log_path="/l.log", message="engine exited (signal 9 SIGKILL), "
                          "log: /l.log", t=20.0))
        view(EngineLoaded(slots=2, n_ctx=1024, pool=1024, reason="restarted", t=25.0))
        text = console.export_text()
        assert "engine exited (signal 9 SIGKILL), log: /l.log" in text and "engine restarted: 2 slots" in text
        if not live:  # plain mode: a loading line on the first report and every 10 s, not every second
            assert text.count("loading m.gguf") == 2


@pytest.mark.parametrize(("returncode", "said"), [(-9, "signal 9 SIGKILL"), (-15, "signal 15 SIGTERM"),
                                                  (1, "status 1"), (137, "status 137")])
def test_describe_exit(returncode, said):
    assert process.describe_exit(returncode) == said


def _cli(*args: str, cwd: Path | None = None, **env: str) -> subprocess.CompletedProcess:
    """``squad ARGS`` in ``cwd``, importing this squad wherever it runs."""
    here = str(Path(process.__file__).parents[2])
    path = os.pathsep.join([here, *filter(None, [os.environ.get("PYTHONPATH")])])
    return subprocess.run([sys.executable, "-m", "squad", *args], capture_output=True, text=True, timeout=120,
                          cwd=cwd, env={**os.environ, "COLUMNS": "200", "PYTHONPATH": path, **env})


def test_a_binary_printing_bytes_that_are_not_utf8(tmp_path):
    binary = tmp_path / "garbage.sh"
    binary.write_text("#!/bin/sh\nprintf 'version: \\377\\376 b\\n\\200\\201' >&2\nprintf '\\377' \n")
    binary.chmod(0o755)
    done = _cli("engine", "info", "--llama-server", str(binary))
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert "llama.cpp  build unknown" in done.stdout


def test_a_relative_squad_llama_server_is_taken_from_the_current_directory(tmp_path):
    binary = tmp_path / "wrapper.sh"
    binary.write_text("#!/bin/sh\necho 'version: 0.6.0-dev (build 5000, commit 1a2b3c)' >&2\n")
    binary.chmod(0o755)
    found = _cli("engine", "info", "--json", cwd=tmp_path, SQUAD_LLAMA_SERVER="wrapper.sh")
    assert found.returncode == 0, found.stderr
    info = json.loads(found.stdout)
    assert info["path"] == str(binary) and info["llama_cpp"] == "b5000 (commit 1a2b3c)"
    missing = _cli("engine", "info", cwd=tmp_path, SQUAD_LLAMA_SERVER="nothere.sh")
    said = " ".join(missing.stderr.split())
    assert missing.returncode == 2 and "Traceback" not in said
    assert f"SQUAD_LLAMA_SERVER names nothere.sh (taken from the current directory: {tmp_path / 'nothere.sh'})" in said


def test_a_directory_as_binary_or_model_is_a_clear_error(tmp_path):
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "llama-server").write_text("#!/bin/sh\n")
    (tmp_path / "bin" / "llama-server").chmod(0o755)
    as_binary = _cli("engine", "info", "--llama-server", str(tmp_path / "bin"))
    said = " ".join(as_binary.stderr.split())
    assert as_binary.returncode == 2
    assert f"which is a directory: did you mean {tmp_path / 'bin' / 'llama-server'}?" in said
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "a.gguf").write_bytes(b"GGUF")
    as_model = _cli("models", "info", str(tmp_path / "models"))
    said = " ".join(as_model.stderr.split())
    assert as_model.returncode == 2 and "is a directory: pass one of a.gguf inside it" in said
    assert "Traceback" not in said


@pytest.mark.parametrize(("version", "build"), [
    ("0.6.0-dev (build 0, commit unknown)", None),
    ("0.6.0-dev (build 5000, commit 1a2b3c)", "b5000 (commit 1a2b3c)"),
    ("5000 (1a2b3c)", "b5000 (commit 1a2b3c)"),
    ("0.6.0-dev (build 7000, commit unknown)", "b7000"),
    ("\ufffd\ufffd b", None),
    (None, None),
    ("xllamacpp 2026.10.11549 (llama.cpp b11549)", "b11549"),  # the prebuilt engine (squad-llama-server)
])
def test_llama_cpp_build_from_the_version_line(tmp_path, version, build):
    from squad.engine.binary import EngineBinary, llama_cpp_build

    assert llama_cpp_build(EngineBinary(path=tmp_path / "llama-server", source="flag", version=version)) == build


def test_engine_info_names_the_llama_cpp_build_squad_built(llama_server_path):
    from squad.engine.binary import read_build_info

    tag = (read_build_info(llama_server_path) or {}).get("llama_cpp_tag")
    if tag is None:
        pytest.skip("this llama-server was not built by squad")
    done = _cli("engine", "info", "--llama-server", str(llama_server_path))
    assert done.returncode == 0 and f"llama.cpp  {tag}" in done.stdout


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_while_the_model_loads_stops_the_engine(tmp_path, model_file, state_tmp, sig, code):
    r = Run(tmp_path, model_file, _forever_loading(tmp_path), state_tmp)
    try:
        r.wait_for("engine.loading", timeout=60)
        pids, (pidfile, _) = r.engine_pids(), r.pidfile()
        r.proc.send_signal(sig)
        assert r.proc.wait(60) == code, r.stderr()
        assert all(gone(pid) for pid in pids) and not pidfile.exists()
        assert "Traceback" not in r.stderr()
    finally:
        r.finish()

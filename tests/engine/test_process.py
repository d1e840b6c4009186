"""The engine process without an engine: process groups (F16), ports (F15), pid-file reaping.

``sh -c "sleep 300; :"`` stands in for a wrapper script that runs llama-server without ``exec``
(the trailing ``:`` keeps the shell from exec-ing ``sleep``).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from launch_support import anyio_backend, gone, state_tmp, wait_gone  # noqa: F401
from squad.engine import process

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="process groups are POSIX")

WRAPPER = ["-c", "sleep 300; :"]


def _wrapper(tmp_path: Path, *, detached: bool = False, engine_id: str | None = None) -> tuple[subprocess.Popen, int]:
    """A shell (the 'wrapper') and the pid of its child ``sleep`` (the 'engine')."""
    proc = process.spawn(Path("/bin/sh"), WRAPPER, api_key="k", log_path=tmp_path / "w.log", detached=detached,
                         engine_id=engine_id)
    deadline = time.monotonic() + 10
    while not (children := psutil.Process(proc.pid).children()):
        assert time.monotonic() < deadline, "the wrapper never started its child"
        time.sleep(0.01)
    return proc, children[0].pid


def _kill(*pids: int) -> None:
    for pid in pids:
        try:
            psutil.Process(pid).kill()
        except psutil.Error:
            pass


def test_spawn_starts_its_own_process_group(tmp_path):
    proc, child = _wrapper(tmp_path)
    try:
        assert psutil.Process(proc.pid).ppid() == psutil.Process().pid
        assert os.getpgid(proc.pid) == proc.pid and os.getpgid(child) == proc.pid
        assert psutil.Process(child).environ()[process.ENGINE_ID_VAR]
    finally:
        _kill(child, proc.pid)
        proc.wait()


@pytest.mark.anyio
async def test_stop_reaches_a_wrapper_scripts_child(tmp_path):
    """F16: stopping the engine stops what the wrapper started too."""
    proc, child = _wrapper(tmp_path)
    try:
        await process.stop(proc, grace=2.0)
        assert proc.returncode is not None
        assert wait_gone(child, 5)
    finally:
        _kill(child)


@pytest.mark.anyio
async def test_stop_of_an_already_reaped_engine_signals_nothing(tmp_path):
    proc = process.spawn(Path("/bin/sh"), ["-c", "exit 3"], api_key="k", log_path=tmp_path / "w.log", detached=False)
    proc.wait()
    await process.stop(proc, grace=0.5)
    assert proc.returncode == 3


def test_stop_pid_stops_the_group_of_a_detached_engine(tmp_path):
    """``squad engine stop`` on an engine started through a wrapper (F16)."""
    proc, child = _wrapper(tmp_path, detached=True)
    try:
        assert process.stop_pid(proc.pid, create_time=psutil.Process(proc.pid).create_time(), grace=2.0)
        proc.wait(5)
        assert wait_gone(child, 5)
    finally:
        _kill(child, proc.pid)


def _dead_owner() -> tuple[int, float]:
    owner = subprocess.Popen([sys.executable, "-c", "pass"])
    created = psutil.Process(owner.pid).create_time()
    owner.wait()
    return owner.pid, created


def _record(state: Path, proc: subprocess.Popen, engine_id: str) -> Path:
    owner_pid, owner_created = _dead_owner()
    path = state / "engines" / f"{proc.pid}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({
        "pid": proc.pid, "create_time": psutil.Process(proc.pid).create_time(), "owner_pid": owner_pid,
        "owner_create_time": owner_created, "engine_id": engine_id, "url": "http://127.0.0.1:1", "log": "",
    }))
    return path


def test_reaping_finds_a_wrappers_child_after_the_wrapper_died(tmp_path, state_tmp):
    """F16 when squad was SIGKILLed: PDEATHSIG killed only the wrapper; the next launch reaps
    the child it left, found by process group and SQUAD_ENGINE_ID."""
    proc, child = _wrapper(tmp_path, engine_id="f16-test")
    try:
        pidfile = _record(state_tmp, proc, "f16-test")
        proc.kill()  # what PDEATHSIG does to the wrapper
        proc.wait()
        assert not gone(child)
        assert process.reap_stale_engines() == [child]
        assert wait_gone(child, 5) and not pidfile.exists()
    finally:
        _kill(child)


def test_reaping_leaves_group_members_without_the_engine_id(tmp_path, state_tmp):
    proc = process.spawn(Path("/bin/sh"), ["-c", "env -u SQUAD_ENGINE_ID sleep 300; :"], api_key="k",
                         log_path=tmp_path / "w.log", detached=False, engine_id="mine")
    deadline = time.monotonic() + 10
    while not (children := psutil.Process(proc.pid).children()) or children[0].name() != "sleep":
        assert time.monotonic() < deadline
        time.sleep(0.01)
    stranger = children[0].pid
    try:
        _record(state_tmp, proc, "mine")
        proc.kill()
        proc.wait()
        assert process.reap_stale_engines() == []
        assert not gone(stranger)
    finally:
        _kill(stranger)


def test_port_in_use_and_listens():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        assert process.port_in_use(port)
        assert process.listens(psutil.Process().pid, port) is True
        assert process.listens(psutil.Process().pid, port + 1 if port < 65535 else port - 1) is False
    assert not process.port_in_use(port)


def test_start_error_says_the_port_is_taken(tmp_path):
    """llama.cpp b11434 logs this line and exits 1 when it cannot bind (measured: F15)."""
    log = tmp_path / "e.log"
    log.write_text("0.00.013.898 E srv         start: couldn't bind HTTP server socket, hostname: 127.0.0.1, "
                   "port: 8080\n0.00.013.992 E srv  llama_server: exiting due to HTTP server error\n")
    proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(1)"])
    proc.wait()
    err = process.start_error(proc, "/m.gguf", log)
    assert "in use by another program" in str(err) and "GGUF" not in str(err)



def _ended(tmp_path, script: str, log_text: str) -> tuple[subprocess.Popen, object]:
    """A stand-in 'llama-server' (a shell script) that writes ``log_text`` to the log and then runs
    ``script``; its start error."""
    log = tmp_path / "e.log"
    log.write_text(log_text)
    binary = tmp_path / "llama-server"
    binary.write_text(f"#!/bin/sh\n{script}\n")
    binary.chmod(0o755)
    proc = subprocess.Popen([str(binary)])
    proc.wait()
    return proc, process.start_error(proc, "/models/m.gguf", log)


LOADER_LINE = ("llama-server: error while loading shared libraries: libggml-base.so: cannot open shared object file: "
               "No such file or directory\n")
MODEL_LINES = ("0.00.100.000 I llama_model_loader: loaded meta data with 3 key-value pairs\n"
               "0.00.100.100 E gguf_init_from_file_impl: invalid magic characters: 'this', expected 'GGUF'\n"
               "0.00.100.200 E llama_model_load: error loading model: llama_model_loader: failed to load model from "
               "/models/m.gguf\n0.00.100.300 E srv    load_model: failed to load model, '/models/m.gguf'\n")


@pytest.mark.parametrize(("script", "log_text", "says"), [
    ("exit 127", LOADER_LINE, "error while loading shared libraries: libggml-base.so"),
    ("exit 127", "./wrapper.sh: 3: exec: /opt/llama/llama-server: not found\n", "not found"),
    ("kill -SEGV $$", "", "crashed (signal 11 SIGSEGV) before it read the model"),
    ("kill -ILL $$", "0.00.000.100 I build: 11434 (abc) with cc for x86_64-linux-gnu\n",
     "crashed (signal 4 SIGILL) before it read the model"),
    ("exit 1", "", "exited (status 1) without logging anything"),
])
def test_a_binary_that_cannot_start_is_not_blamed_on_the_model(tmp_path, script, log_text, says):
    """Issue 19: exec errors, a missing shared library and a crash before the model is read are
    the binary's fault; the error says so and how to get a working one."""
    _, err = _ended(tmp_path, script, log_text)
    text = str(err)
    assert says in text, text
    assert "GGUF" not in text
    assert "not the model" in text or "not a problem of /models/m.gguf" in text
    assert "squad engine install --force" in text and "--llama-server" in text


def test_a_model_that_fails_to_load_is_blamed_on_the_model(tmp_path):
    _, err = _ended(tmp_path, "exit 1", MODEL_LINES)
    text = str(err)
    assert "could not load the model /models/m.gguf (status 1)" in text
    assert "invalid magic characters" in text and "complete GGUF file" in text
    _, err = _ended(tmp_path, "kill -SEGV $$", MODEL_LINES[:60])  # a crash once loading started: the model's
    assert "could not load" not in str(err) and "before it read the model" not in str(err)


# --- squad's own death: the guard (squad.children) -------------------------------------------------

_SQUAD = """
import sys, time, psutil
from squad import children
proc = children.start(["/bin/sh", "-c", "sleep 300; :"])
while not psutil.Process(proc.pid).children():
    time.sleep(0.01)
print(proc.pid, psutil.Process(proc.pid).children()[0].pid, children.guard_pid(), flush=True)
if sys.argv[1] == "exit":
    sys.exit(0)
time.sleep(300)
"""


def _squad(mode: str) -> tuple[subprocess.Popen, list[int]]:
    """A stand-in squad process that starts a wrapper (shell + its child) as its child."""
    squad = subprocess.Popen([sys.executable, "-c", _SQUAD, mode], stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": str(Path(process.__file__).parents[2])})
    line = squad.stdout.readline()
    assert line.strip(), "the stand-in squad printed nothing"
    return squad, [int(p) for p in line.split()]


@pytest.mark.parametrize("how", ["SIGKILL", "exit"])
def test_a_wrappers_children_die_with_squad(how):
    """F16 when squad dies without cleanup (SIGKILL), or exits forgetting its child: the guard
    stops the child's whole group, then exits itself."""
    squad, (wrapper, child, guard) = _squad("sleep" if how == "SIGKILL" else "exit")
    try:
        assert not gone(child) and psutil.Process(guard).ppid() == squad.pid
        assert os.getpgid(guard) != os.getpgid(squad.pid)  # a signal to squad's group does not reach it
        if how == "SIGKILL":
            squad.kill()
        squad.wait(30)
        assert wait_gone(child, 10) and wait_gone(wrapper, 10), "the wrapper's child outlived squad"
        assert wait_gone(guard, 10), "the guard outlived its work"
    finally:
        _kill(child, wrapper)
        squad.stdout.close()


@pytest.mark.anyio
async def test_a_stopped_child_is_released_from_the_guard(tmp_path):
    """After a normal stop the guard forgets the group: its id may be reused by anyone."""
    from squad import children

    proc, child = _wrapper(tmp_path)
    assert proc.pid in children._guard._groups
    await process.stop(proc, grace=2.0)
    assert proc.pid not in children._guard._groups and wait_gone(child, 5)


def test_a_detached_child_is_guarded_until_it_is_let_go(tmp_path):
    """`squad engine start`: a squad killed while the model loads leaves nothing; once the
    engine is up and handed over, the guard no longer stops it."""
    from squad import children

    proc, child = _wrapper(tmp_path, detached=True)
    try:
        assert proc.pid in children._guard._groups
        process.let_go(proc)
        assert proc.pid not in children._guard._groups
    finally:
        _kill(child, proc.pid)
        proc.wait()


@pytest.mark.parametrize("sig, code, said", [(signal.SIGINT, 130, "interrupted"),
                                             (signal.SIGTERM, 143, "terminated (SIGTERM)")])
def test_an_interrupt_while_the_command_line_imports_is_quiet(tmp_path, sig, code, said):
    """Issue 19: Ctrl-C (or SIGTERM) in the first second, while Python still imports squad's
    command line, exits 130 (143) with one line, never a traceback. The signal is sent at
    several moments; the command (``squad plan --agents``) needs no engine."""
    env = {**os.environ, "SQUAD_STATE_DIR": str(tmp_path / "state")}
    script = Path(sys.executable).with_name("squad")  # the console script, as a user runs it
    command = [str(script)] if script.is_file() else [sys.executable, "-c", "import _squad_entry; _squad_entry.main()"]
    for delay in (0.1, 0.2, 0.4, 0.7):
        proc = subprocess.Popen([*command, "plan", "--agents", "a:100"], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(delay)
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=60)
        if "Fatal Python error: init_" in err:  # the interpreter itself was still starting: no code of ours ran
            continue
        assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
        if proc.returncode not in (0, -sig):  # 0: it finished first; -sig: before Python ran any code of squad
            assert proc.returncode == code and err.strip().splitlines()[-1].startswith(said), (proc.returncode, err)


def test_engines_get_the_users_openmp_wait_policy_and_none_imposed(tmp_path, monkeypatch):
    """OMP_WAIT_POLICY set by the user (passive helps a busy machine: bench/results.md, engines)
    reaches the engine; unset, squad imposes none (passive cut one stream 131 -> 45 tok/s idle)."""
    for given, expected in ((None, ""), ("passive", "passive")):
        if given is None:
            monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
        else:
            monkeypatch.setenv("OMP_WAIT_POLICY", given)
        out = tmp_path / f"env-{expected}.txt"
        proc = process.spawn(Path("/bin/sh"), ["-c", f'printf %s "$OMP_WAIT_POLICY" > "{out}"'], api_key="k",
                             log_path=tmp_path / "e.log", detached=False)
        proc.wait(30)
        process.children.release(proc)
        assert out.read_text() == expected

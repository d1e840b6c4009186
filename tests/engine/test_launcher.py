"""The launcher: arguments, plan-vs-applied comparison, and the real llama-server lifecycle."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from dataclasses import replace
from pathlib import Path

import anyio
import psutil
import pytest

from launch_support import THREADS, anyio_backend, gone, model_file, server_bin, state_tmp, wait_gone  # noqa: F401
from squad.engine import control, process
from squad.engine import launcher as launcher_mod
from squad.engine.launcher import (
    Launcher,
    build_args,
    check_applied,
    default_load_timeout,
    expected_slot_ctx,
)
from squad.engine.process import reap_stale_engines
from squad.errors import EngineStartError, PlanMismatch
from squad.sched.planner import EnginePlan

M = Path("/models/m.gguf")


def plan(slots: int, n_ctx: int, unified: bool | None = None) -> EnginePlan:
    return EnginePlan(model=M, slots=slots, n_ctx=n_ctx, kv_unified=slots >= 2 if unified is None else unified)


# --- unit: no engine -------------------------------------------------------------------------


def test_build_args_binds_localhost_and_keeps_key_out_of_argv():
    args = build_args(plan(4, 8192), port=12345, request_timeout=600, threads=2, extra_args=["--foo"])
    assert args[: len(plan(4, 8192).server_args())] == plan(4, 8192).server_args()
    assert args[args.index("--host") + 1] == "127.0.0.1"
    assert args[args.index("--port") + 1] == "12345"
    assert "--metrics" in args
    assert int(args[args.index("-to") + 1]) >= 600  # F04: engine timeout >= squad's deadline
    assert args[args.index("-t") + 1] == "2"
    assert args[-1] == "--foo"
    assert not any("key" in a.lower() for a in args)


def test_build_args_without_threads_leaves_t_out():
    assert "-t" not in build_args(plan(1, 1024), port=1, request_timeout=0.5)
    assert int((a := build_args(plan(1, 1024), port=1, request_timeout=0.5))[a.index("-to") + 1]) >= 1


@pytest.mark.parametrize(
    ("slots", "n_ctx", "unified", "n_ctx_train", "expected"),
    [
        (4, 1000, True, 8192, 1024),  # round-up to 256 is what llama.cpp applies
        (2, 8192, True, 8192, 8192),  # unified: each slot may use the whole pool
        (2, 8192, False, 8192, 4096),  # not unified: pad256(8192 / 2)
        (3, 1024, False, None, 512),  # pad256(1024 / 3 = 341)
        (2, 16384, True, 8192, 8192),  # capped at the training context
        (1, 4096, False, 8192, 4096),
    ],
)
def test_expected_slot_ctx(slots, n_ctx, unified, n_ctx_train, expected):
    assert expected_slot_ctx(plan(slots, n_ctx, unified), n_ctx_train) == expected


def test_check_applied_accepts_round_up():
    check_applied(plan(4, 1000), total_slots=4, n_ctx=1024, n_ctx_train=8192)


def test_check_applied_names_both_numbers_when_kv_not_unified():
    with pytest.raises(PlanMismatch) as exc:
        check_applied(plan(2, 8192), total_slots=2, n_ctx=4096, n_ctx_train=8192)
    message = str(exc.value)
    assert "4096" in message and "8192" in message and "--kv-unified" in message


def test_check_applied_slot_count():
    with pytest.raises(PlanMismatch, match="engine applied 4 slots, plan asked 2"):
        check_applied(plan(2, 8192), total_slots=4, n_ctx=8192, n_ctx_train=8192)


def test_default_load_timeout_grows_with_model(tmp_path):
    small = tmp_path / "small.gguf"
    small.write_bytes(b"x" * 1024)
    assert 60 <= default_load_timeout(small) < 61
    assert default_load_timeout(tmp_path / "missing.gguf") == 60


def test_reap_stale_engines_kills_only_orphans(state_tmp):
    orphan = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    kept = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    dead_owner = subprocess.Popen([sys.executable, "-c", "pass"])
    dead_owner.wait()
    pids = state_tmp / "engines"
    pids.mkdir(parents=True)
    me = psutil.Process()
    for proc, owner_pid, owner_ct in [(orphan, dead_owner.pid, 1.0), (kept, me.pid, me.create_time())]:
        record = {
            "pid": proc.pid,
            "create_time": psutil.Process(proc.pid).create_time(),
            "owner_pid": owner_pid,
            "owner_create_time": owner_ct,
        }
        (pids / f"{proc.pid}.json").write_text(json.dumps(record))
    try:
        assert reap_stale_engines() == [orphan.pid]
        orphan.wait(5)
        assert kept.poll() is None
        assert (pids / f"{kept.pid}.json").exists() and not (pids / f"{orphan.pid}.json").exists()
    finally:
        for proc in (orphan, kept):
            proc.kill()
            proc.wait()


# --- the real engine -------------------------------------------------------------------------


def real(model: Path, slots: int, n_ctx: int, unified: bool | None = None) -> EnginePlan:
    return EnginePlan(model=model, slots=slots, n_ctx=n_ctx, kv_unified=slots >= 2 if unified is None else unified)


@pytest.mark.engine
@pytest.mark.anyio
async def test_reads_back_rounded_context_and_slots(server_bin, model_file, state_tmp, monkeypatch):
    monkeypatch.setattr(control, "POLL_INTERVAL", 0.02)
    async with Launcher(real(model_file, 4, 1000), binary=server_bin, threads=THREADS) as engine:
        info = engine.info
        assert (info.n_ctx, info.slots, info.pool, info.kv_unified) == (1024, 4, 1024, True)
        assert info.n_ctx_train == 8192 and info.launched
        assert info.model_path == str(model_file) and info.build_info
        assert engine.loading_polls >= 1  # F03: 503 "Loading model" was seen and waited out
        argv = psutil.Process(engine.pid).cmdline()
        assert engine.api_key not in " ".join(argv)  # the key travels in the environment
        assert "127.0.0.1" in argv and engine.log_path.is_file()
        assert engine.log_path.parent == state_tmp / "logs"
        pid = engine.pid
    assert gone(pid)


@pytest.mark.engine
@pytest.mark.anyio
async def test_unified_slots_each_get_the_whole_context(server_bin, model_file, state_tmp):
    async with Launcher(real(model_file, 2, 2048), binary=server_bin, threads=THREADS) as engine:
        assert engine.info.n_ctx == 2048 and engine.info.slots == 2


@pytest.mark.engine
@pytest.mark.anyio
async def test_context_above_training_length_is_capped_per_slot(server_bin, model_file, state_tmp):
    # measured: /props reports min(n_ctx, n_ctx_train) per slot; the whole pool is still allocated
    async with Launcher(real(model_file, 2, 16384), binary=server_bin, threads=THREADS) as engine:
        assert (engine.info.n_ctx, engine.info.pool) == (8192, 16384)


@pytest.mark.engine
@pytest.mark.anyio
async def test_engine_without_kv_unified_is_a_plan_mismatch(server_bin, model_file, state_tmp, monkeypatch):
    original = EnginePlan.server_args
    monkeypatch.setattr(EnginePlan, "server_args", lambda self: [a for a in original(self) if a != "--kv-unified"])
    launcher = Launcher(real(model_file, 2, 8192), binary=server_bin, threads=THREADS)
    with pytest.raises(PlanMismatch) as exc:
        await launcher.start()
    assert "engine applied n_ctx 4096 per slot, plan asked 8192" in str(exc.value)
    assert launcher.pid is None and not launcher.running


@pytest.mark.engine
@pytest.mark.anyio
async def test_garbage_model_reports_start_error_with_log_tail(server_bin, tmp_path, state_tmp):
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"this is not a gguf file" * 100)
    with pytest.raises(EngineStartError) as exc:
        async with Launcher(real(bad, 1, 512), binary=server_bin, threads=THREADS):
            pytest.fail("must not start")
    err = exc.value
    assert "could not load the model" in str(err) and str(bad) in str(err) and "(status" in str(err)
    assert "complete GGUF" in str(err)
    assert err.log_tail and Path(err.log_path).is_file()
    assert "gguf" in err.log_tail.lower() or "model" in err.log_tail.lower()


@pytest.mark.anyio
async def test_a_binary_missing_a_shared_library_is_blamed_on_the_binary(model_file, tmp_path, state_tmp):
    """Issue 19: a real ELF program linked against a library that is gone (what a moved or
    half-removed llama.cpp build looks like): the dynamic loader refuses it, exit 127; the error
    names the library and the fix for the binary, never the model."""
    import shutil

    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to build the stand-in binary")
    (tmp_path / "ggmlx.c").write_text("int ggmlx(void) { return 0; }\n")
    (tmp_path / "main.c").write_text("int ggmlx(void);\nint main(void) { return ggmlx(); }\n")
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(tmp_path / "libggmlx.so"), str(tmp_path / "ggmlx.c")], check=True)
    binary = tmp_path / "llama-server"
    subprocess.run([cc, "-o", str(binary), str(tmp_path / "main.c"), f"-L{tmp_path}", "-lggmlx"], check=True)
    (tmp_path / "libggmlx.so").unlink()
    with pytest.raises(EngineStartError) as info:
        async with Launcher(real(model_file, 1, 512), binary=binary, threads=THREADS):
            pytest.fail("must not start")
    text = str(info.value)
    assert "cannot start (status 127)" in text and "libggmlx.so" in text
    assert "The binary is at fault, not the model" in text and "GGUF" not in text


@pytest.mark.engine
@pytest.mark.anyio
async def test_no_orphan_after_exception_or_cancellation(server_bin, model_file, state_tmp, monkeypatch):
    pids = []
    with pytest.raises(RuntimeError, match="boom"):
        async with Launcher(real(model_file, 1, 512), binary=server_bin, threads=THREADS) as engine:
            pids.append(engine.pid)
            raise RuntimeError("boom")
    with anyio.CancelScope() as scope:  # cancelled while running (what Ctrl-C does to squad's tasks)
        async with Launcher(real(model_file, 1, 512), binary=server_bin, threads=THREADS) as engine:
            pids.append(engine.pid)
            scope.cancel()
            await anyio.sleep(60)
    # cancelled while still loading: the stop must be shielded too
    launcher = Launcher(real(model_file, 1, 512), binary=server_bin, threads=THREADS)
    with anyio.CancelScope() as scope:

        async def loading_forever(*args, **kwargs):
            pids.append(launcher.pid)
            scope.cancel()
            await anyio.sleep(60)

        monkeypatch.setattr(launcher_mod, "wait_healthy", loading_forever)
        await launcher.start()
    assert launcher.pid is None
    assert len(pids) == 3 and all(wait_gone(pid, 10) for pid in pids)
    assert not list((state_tmp / "engines").glob("*.json"))


@pytest.mark.engine
@pytest.mark.anyio
async def test_reload_is_noop_for_equal_plan_and_restarts_for_a_different_one(server_bin, model_file, state_tmp):
    first = real(model_file, 1, 512)
    port = process.free_port()  # the runtime keeps one port (and key) across reloads
    async with Launcher(first, binary=server_bin, threads=THREADS, port=port) as engine:
        url, key = engine.base_url, engine.api_key
        pid = engine.pid
        same = replace(first, reasons=("different reasons do not matter",))
        assert await engine.reload(same) is False and engine.pid == pid
        drained = []

        async def drain() -> None:
            drained.append(True)

        assert await engine.reload(real(model_file, 2, 1024), drain=drain) is True
        assert drained and engine.pid != pid and gone(pid)
        assert (engine.info.slots, engine.info.n_ctx) == (2, 1024)
        assert (engine.base_url, engine.info.api_key) == (url, key)
        os.kill(engine.pid, signal.SIGKILL)  # the engine died; restart brings it back
        dead = engine.pid
        infos, pids_after = [], set()

        async def restart() -> None:
            infos.append(await engine.restart())
            pids_after.add(engine.pid)

        async with anyio.create_task_group() as tg:  # two requests saw it gone at once
            tg.start_soon(restart)
            tg.start_soon(restart)
        assert engine.pid != dead and len(pids_after) == 1 and infos[0] == infos[1]
        assert infos[0].slots == 2


# --- F15: a server squad did not start is never adopted ------------------------------------------


def _impostor(port: int) -> subprocess.Popen:
    """A llama-server look-alike on ``port``: /health 200 and /props of another model."""
    code = textwrap.dedent(
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
    proc = subprocess.Popen([sys.executable, "-c", code, str(port)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "up"
    return proc


def _script(tmp_path: Path, name: str, body: str) -> Path:
    path = tmp_path / name
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(0o755)
    return path


@pytest.mark.anyio
async def test_a_port_in_use_is_refused_before_the_spawn(server_bin, model_file, state_tmp):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        launcher = Launcher(real(model_file, 1, 512), binary=server_bin, threads=THREADS, port=port)
        with pytest.raises(EngineStartError, match=f"port {port} on 127.0.0.1 is in use"):
            await launcher.start()
        assert launcher.pid is None


@pytest.mark.anyio
async def test_a_port_squad_picked_and_lost_is_picked_again_never_pass_another_port(model_file, tmp_path, state_tmp,
                                                                                     monkeypatch):
    """Issue 19 (C23): the user gave no port, so "pass another port" is advice they cannot take.
    squad picks again; when every pick is taken, it says so without blaming the user's choice."""
    socks = [socket.socket() for _ in range(3)]
    for sock in socks:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
    ports = iter([sock.getsockname()[1] for sock in socks])
    monkeypatch.setattr(process, "free_port", lambda: next(ports))
    spawned = []
    monkeypatch.setattr(process, "spawn", lambda *a, **k: spawned.append(a) or pytest.fail("no spawn on a taken port"))
    try:
        with pytest.raises(EngineStartError) as info:
            await Launcher(real(model_file, 1, 512), binary=sys.executable, threads=THREADS).start()
    finally:
        for sock in socks:
            sock.close()
    text = str(info.value)
    assert "each free when squad picked it, were taken by another program" in text
    assert "pass another port" not in text.lower() and info.value.port_taken


@pytest.mark.engine
@pytest.mark.anyio
async def test_a_picked_port_taken_before_the_engine_binds_is_picked_again(server_bin, model_file, state_tmp,
                                                                           monkeypatch):
    """The real engine: the first port squad picks is taken by the time llama-server binds it
    (its own bind error); squad starts it on the next pick."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        taken = sock.getsockname()[1]
        picks = iter([taken])
        real_free = process.free_port
        monkeypatch.setattr(process, "free_port", lambda: next(picks, None) or real_free())
        monkeypatch.setattr(process, "port_in_use", lambda port: False)  # taken after the check
        async with Launcher(real(model_file, 1, 512), binary=server_bin, threads=THREADS) as launcher:
            assert launcher.base_url is not None and not launcher.base_url.endswith(f":{taken}")
            assert launcher.info is not None and launcher.info.slots == 1


@pytest.mark.engine
@pytest.mark.anyio
async def test_a_late_engine_does_not_adopt_the_server_already_answering(server_bin, model_file, tmp_path, state_tmp,
                                                                          monkeypatch):
    """F15: the binary binds late and something else answers /health meanwhile."""
    monkeypatch.setattr(process, "port_in_use", lambda port: False)  # the impostor came after the check
    port = process.free_port()
    late = _script(tmp_path, "late.sh", f'sleep 1\nexec "{server_bin}" "$@"')
    impostor = _impostor(port)
    try:
        launcher = Launcher(real(model_file, 1, 512), binary=late, threads=THREADS, port=port)
        with pytest.raises(EngineStartError,
                           match=f"port {port} on 127.0.0.1 is in use.*not from the llama-server squad started"):
            await launcher.start()
        assert launcher.pid is None and launcher.info is None
    finally:
        impostor.kill()
        impostor.wait()
        impostor.stdout.close()


@pytest.mark.engine
@pytest.mark.anyio
async def test_an_engine_that_cannot_bind_says_the_port_is_taken(server_bin, model_file, state_tmp, monkeypatch):
    """F15 with the plain binary: the error names the port, not the model file."""
    monkeypatch.setattr(process, "port_in_use", lambda port: False)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        with pytest.raises(EngineStartError, match="could not listen.*in use by another program") as exc:
            await Launcher(real(model_file, 1, 512), binary=server_bin, threads=THREADS, port=port).start()
    assert "GGUF" not in str(exc.value)


# --- F16: an engine behind a wrapper script --------------------------------------------------------


@pytest.mark.engine
@pytest.mark.anyio
async def test_an_engine_behind_a_wrapper_script_is_stopped_with_it(server_bin, model_file, tmp_path, state_tmp):
    """F16: the wrapper runs llama-server without exec; leaving the block stops both."""
    wrapper = _script(tmp_path, "wrapper.sh", f'export SQUAD_TEST_WRAPPED=1\n"{server_bin}" "$@"')
    async with Launcher(real(model_file, 1, 512), binary=wrapper, threads=THREADS) as engine:
        (child,) = psutil.Process(engine.pid).children()
        # the binary itself, or the interpreter running the prebuilt engine's script (squad-llama-server)
        assert str(server_bin) in (child.exe(), *child.cmdline()[:2]) and engine.info.slots == 1
        pids = (engine.pid, child.pid)
    assert all(wait_gone(pid, 10) for pid in pids)


_CHILD = textwrap.dedent(
    """
    import signal
    # a child started from a non-interactive shell or under nohup inherits SIGINT ignored;
    # restore python's handler so SIGINT raises KeyboardInterrupt as it does in a terminal
    signal.signal(signal.SIGINT, signal.default_int_handler)
    import sys, anyio
    from squad import children
    from squad.engine.launcher import Launcher
    from squad.sched.planner import EnginePlan
    if sys.argv[3] == "no-guard":  # neither PDEATHSIG nor the guard: only the pid file is left
        children._pdeathsig_preexec = lambda: None
        children._guard.watch = lambda pgid: None
    elif sys.argv[3] == "guard-only":
        children._pdeathsig_preexec = lambda: None
    async def main():
        plan = EnginePlan(model=sys.argv[2], slots=1, n_ctx=512, kv_unified=False)
        async with Launcher(plan, binary=sys.argv[1], threads=1) as engine:
            print(engine.pid, flush=True)
            await anyio.sleep(300)
    anyio.run(main)
    """
)


def _run_child(server_bin: Path, model_file: Path, mode: str) -> tuple[subprocess.Popen, int]:
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(server_bin), str(model_file), mode],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        line = child.stdout.readline()
        assert line.strip().isdigit(), f"child printed {line!r}"
    except BaseException:
        _stop(child)
        raise
    return child, int(line)


def _stop(child: subprocess.Popen, engine_pid: int | None = None) -> None:
    """Kill ``child`` (and ``engine_pid`` if it still runs) so a failed test leaves nothing behind."""
    if child.poll() is None:
        child.kill()
    child.wait(30)
    child.stdout.close()
    if engine_pid is not None and not gone(engine_pid):
        os.kill(engine_pid, signal.SIGKILL)


@pytest.mark.engine
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT, signal.SIGTERM])
def test_no_orphan_when_squad_is_killed(server_bin, model_file, state_tmp, sig):
    child, engine_pid = _run_child(server_bin, model_file, "pdeathsig")
    try:
        assert not gone(engine_pid)
        # SIGINT runs the `async with` cleanup; SIGKILL and python's default SIGTERM run nothing,
        # there the kernel's PDEATHSIG kills the engine
        child.send_signal(sig)
        child.wait(30)
        assert wait_gone(engine_pid), f"llama-server {engine_pid} outlived squad after {sig.name}"
    finally:
        _stop(child, engine_pid)


@pytest.mark.engine
def test_pid_file_fallback_reaps_engine_of_a_killed_squad(server_bin, model_file, state_tmp):
    child, engine_pid = _run_child(server_bin, model_file, "no-guard")
    try:
        child.kill()
        child.wait(30)
        time.sleep(0.5)
        assert not gone(engine_pid)  # without PDEATHSIG and the guard it survives ...
        assert reap_stale_engines() == [engine_pid]  # ... until the next launch reaps it
        assert wait_gone(engine_pid)
    finally:
        _stop(child, engine_pid)



@pytest.mark.engine
@pytest.mark.parametrize("mode", ["pdeathsig", "guard-only"])
def test_a_wrapped_engine_dies_with_a_killed_squad(server_bin, model_file, tmp_path, state_tmp, mode):
    """F16 when squad is SIGKILLed: PDEATHSIG kills only the wrapper; the guard stops the
    llama-server the wrapper started (same process group), with no later launch needed."""
    wrapper = _script(tmp_path, "wrapper.sh", f'"{server_bin}" "$@"')
    child, wrapper_pid = _run_child(wrapper, model_file, mode)
    (engine,) = psutil.Process(wrapper_pid).children()
    try:
        child.kill()
        child.wait(30)
        assert wait_gone(wrapper_pid) and wait_gone(engine.pid), "the wrapper's llama-server outlived squad"
    finally:
        _stop(child, engine.pid)


def test_public_names():
    assert set(launcher_mod.__all__) >= {"Launcher", "build_args", "check_applied", "expected_slot_ctx"}

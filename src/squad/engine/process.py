"""The engine process: spawn, stop, pid files, reaping, and its log.

**No llama-server outlives squad.** The engine is a child like every other squad starts
(:mod:`squad.children`): its own session and process group, so a wrapper script that runs
llama-server without ``exec`` (field case F16) is stopped together with what it started.
:class:`~squad.engine.launcher.Launcher` stops the whole group (SIGTERM, then SIGKILL after
:data:`GRACE` seconds, :func:`stop`) when the ``async with`` block ends normally, with an
exception, or by cancellation (Ctrl-C, SIGTERM of the CLI); the stop runs shielded from
cancellation. If squad itself dies without running that code (SIGKILL, a hard crash), the
guard process of :mod:`squad.children` stops the group, and on Linux the kernel SIGKILLs the
engine's first process at once (``prctl(PR_SET_PDEATHSIG)``; it fires when the *thread* that
spawned it exits, so the launcher spawns from the event loop's thread).

The last resort, if the guard was killed too: each launch writes a pid file to
``state_dir()/engines``, and the next launch stops engines whose squad process is gone,
checking pid *and* start time (psutil) so a reused pid is never killed, and finding a
wrapper's leftovers by process group and the ``SQUAD_ENGINE_ID`` the launch put in their
environment (never by pid alone). Engines started with ``detached=True`` (``squad engine
start``) are meant to outlive squad: no PDEATHSIG and no pid file, and the guard lets them go
(:func:`let_go`) once they are up.

The API key reaches the engine through ``LLAMA_API_KEY`` in its environment, never argv (argv
is visible to every user in ``ps``). The engine log (stdout + stderr) goes to one file per
launch; :func:`start_error` turns its tail into the error a user sees when loading fails.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import signal
import socket
import subprocess
from pathlib import Path

import psutil

from squad import children
from squad.dirs import open_private, private_dir, state_dir
from squad.engine.llama import ENGINE_ENV
from squad.errors import EngineNotFound, EngineStartError

__all__ = [
    "GRACE",
    "alive",
    "describe_exit",
    "free_port",
    "let_go",
    "listens",
    "new_engine_id",
    "port_in_use",
    "log_tail",
    "prune_logs",
    "reap_stale_engines",
    "spawn",
    "start_error",
    "stop",
    "stop_pid",
    "write_pidfile",
]

GRACE = children.GRACE

LOG_TAIL_LINES = 30
KEEP_LOGS = 50
"""Engine logs kept in the log directory; older ones are deleted at each start."""


def free_port() -> int:
    """A TCP port that was free on 127.0.0.1 a moment ago (bind to port 0, read it, close)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def port_in_use(port: int) -> bool:
    """True if something accepts TCP connections on 127.0.0.1:``port`` now (field case F15)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(1.0)
        try:
            return sock.connect_ex(("127.0.0.1", port)) == 0
        except OSError:
            return False


def listens(pid: int, port: int) -> bool | None:
    """Whether process ``pid`` or one of its descendants listens on TCP ``port``: proof that
    the server answering there is the one squad started (field case F15). None when the
    operating system does not tell (psutil ``AccessDenied``)."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return False
    for proc in procs:
        try:
            conns = proc.net_connections(kind="tcp") if hasattr(proc, "net_connections") else proc.connections("tcp")
        except psutil.NoSuchProcess:
            continue
        except psutil.AccessDenied:
            return None
        if any(c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port for c in conns):
            return True
    return False


# --- spawning ------------------------------------------------------------------------------------


ENGINE_ID_VAR = "SQUAD_ENGINE_ID"
"""Environment variable holding a random id per launch: marks the engine's processes (and a
wrapper script's children, which inherit it) for :func:`reap_stale_engines`."""


def new_engine_id() -> str:
    """A fresh random ``SQUAD_ENGINE_ID``."""
    return secrets.token_hex(8)


def spawn(
    binary: Path, args: list[str], *, api_key: str, log_path: Path, detached: bool, engine_id: str | None = None,
) -> subprocess.Popen:
    """Start ``binary args`` in its own session and process group (process group id = its pid)
    with ``LLAMA_API_KEY=api_key``, ``SQUAD_ENGINE_ID=engine_id`` (None: a fresh one) and
    :data:`~squad.engine.llama.ENGINE_ENV` where squad's environment does not set it,
    stdout + stderr appended to ``log_path``. Not ``detached``: PDEATHSIG on Linux (call from
    the event loop's thread). ``detached``: no PDEATHSIG. Raises :class:`EngineNotFound` when the
    binary cannot be run."""
    env = {**ENGINE_ENV, **os.environ, "LLAMA_API_KEY": api_key, ENGINE_ID_VAR: engine_id or new_engine_id()}
    private_dir(log_path.parent)
    with open_private(log_path, "ab") as log:  # 0600; the engine's own files (slot saves) too: umask 077
        try:  # its own process group, guarded: a stop, or squad's death, reaches a wrapper's children (F16)
            return children.start([str(binary), *args], stdout=log, stderr=subprocess.STDOUT, env=env,
                                  detached=detached, pdeathsig=True, umask=0o077)
        except OSError as exc:
            raise EngineNotFound(f"cannot run llama-server at {binary}: {exc.strerror or exc}") from exc


# --- the log -------------------------------------------------------------------------------------


def prune_logs(log_dir: Path, keep: int = KEEP_LOGS) -> None:
    """Delete all but the ``keep`` newest ``llama-server-*.log`` files in ``log_dir``."""
    logs = sorted(log_dir.glob("llama-server-*.log"), key=lambda p: p.stat().st_mtime, reverse=True)
    for old in logs[keep:]:
        old.unlink(missing_ok=True)


def log_tail(log_path: Path, lines: int = LOG_TAIL_LINES) -> str:
    """The last ``lines`` lines of an engine log ("" if unreadable)."""
    try:
        text = log_path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


_REASON = re.compile(r"(error|failed|invalid|cannot|unable|not found|no such)", re.IGNORECASE)
_PREFIX = re.compile(r"^[\d.:]+\s+[A-Z]\s+")  # "0.00.217.549 W " timestamps and levels


_BIND_FAILED = "couldn't bind HTTP server socket"


def _reason(tail: str) -> str:
    for line in tail.splitlines():
        if _REASON.search(line):
            return _PREFIX.sub("", line).strip()
    return "no error line in the log"


def describe_exit(returncode: int | None) -> str:
    """``"signal 9 SIGKILL"`` for a process a signal ended (Popen's negative returncode),
    ``"status 1"`` otherwise."""
    if returncode is not None and returncode < 0:
        try:
            return f"signal {-returncode} {signal.Signals(-returncode).name}"
        except ValueError:
            return f"signal {-returncode}"
    return f"status {returncode}"


_NO_LIBRARY = "error while loading shared libraries"
"""The dynamic loader's line when the binary needs a library it cannot find (exit 127)."""
_MODEL_FAILED = re.compile(r"(error loading model|failed to load model|model loading error|gguf_init_from_file|"
                           r"invalid magic|unknown model architecture|failed to read|tensor .* data is not within)",
                           re.IGNORECASE)
"""Lines llama.cpp logs when it has the model file and cannot load it (llama_model_load,
gguf_init_from_file_impl, common_init_from_params, server load_model)."""
_MODEL_STARTED = re.compile(r"(llama_model_load|llama_model_loader|load_model|loading model|gguf)", re.IGNORECASE)
"""Lines that show the engine got as far as reading the model."""
_CRASH = {signal.SIGSEGV, signal.SIGILL, signal.SIGBUS, signal.SIGABRT, signal.SIGFPE}


def start_error(proc: subprocess.Popen, model: Path | str, log_path: Path) -> EngineStartError:
    """The :class:`EngineStartError` for an engine that exited before it was ready, read from
    its log: the port is taken; the *binary* cannot start (a missing shared library, exit
    126/127 from a wrapper that cannot run it, a crash before the model is touched, nothing
    logged at all); or the *model* failed to load (llama.cpp's own model-loading errors). Each
    with its first error-like line, the fix for that cause, the log tail and path."""
    tail = log_tail(log_path)
    binary = os.fsdecode(proc.args if isinstance(proc.args, (str, bytes, os.PathLike)) else proc.args[0])
    code = proc.returncode
    ended = describe_exit(code)
    if _BIND_FAILED in tail:  # llama.cpp tools/server/server.cpp, when the port is taken (F15)
        return EngineStartError(
            f"llama-server could not listen: {_reason(tail)}. The port is in use by another program: "
            f"pass another port, or none so squad picks a free one; full log: {log_path}",
            log_tail=tail,
            log_path=str(log_path),
            port_taken=True,
        )
    fix_binary = (f"rebuild it (`squad engine install --force`) or pass a llama-server that runs here "
                  f"(--llama-server PATH or SQUAD_LLAMA_SERVER); `{binary} --version` shows the same failure")
    model_failed = next((line for line in tail.splitlines() if _MODEL_FAILED.search(line)), None)
    crashed = code is not None and code < 0 and -code in {int(s) for s in _CRASH}
    if _NO_LIBRARY in tail or code in (126, 127):
        line = next((ln for ln in tail.splitlines() if _NO_LIBRARY in ln or "not found" in ln), _reason(tail))
        return EngineStartError(
            f"llama-server at {binary} cannot start ({ended}): {_PREFIX.sub('', line).strip()}. The binary is at "
            f"fault, not the model (it never read {model}): {fix_binary}; full log: {log_path}",
            log_tail=tail, log_path=str(log_path))
    if model_failed is None and (not tail.strip() or (crashed and not _MODEL_STARTED.search(tail))):
        what = (f"crashed ({ended}) before it read the model" if crashed else
                f"exited ({ended}) without logging anything")
        return EngineStartError(
            f"llama-server at {binary} {what}: the binary does not run on this machine or is not llama-server, "
            f"not a problem of {model}; {fix_binary}; full log: {log_path}",
            log_tail=tail, log_path=str(log_path))
    if model_failed is not None:
        return EngineStartError(
            f"llama-server could not load the model {model} ({ended}): {_PREFIX.sub('', model_failed).strip()}. "
            f"Check that the model is a complete GGUF file llama.cpp supports (fetch or copy it again, or pick "
            f"another); full log: {log_path}",
            log_tail=tail, log_path=str(log_path))
    return EngineStartError(
        f"llama-server exited ({ended}) while starting with {model}: {_reason(tail)}. The log shows no "
        f"model-loading error: read it to see whether the binary or the model is at fault; full log: {log_path}",
        log_tail=tail, log_path=str(log_path))


# --- stopping: the process group, as for every child squad starts (squad.children) ----------------


def alive(pid: int, create_time: float) -> bool:
    """True if process ``pid`` runs and started at ``create_time`` (±1 s; else the pid was reused)."""
    try:
        return abs(psutil.Process(pid).create_time() - create_time) <= 1.0
    except psutil.Error:
        return False


stop = children.stop
stop_pid = children.stop_pid
let_go = children.let_go


# --- pid files: the fallback against orphans where PDEATHSIG does not exist ----------------------


def _pid_dir() -> Path:
    return private_dir(state_dir() / "engines")


def write_pidfile(proc: subprocess.Popen, base_url: str, log_path: Path, engine_id: str) -> Path:
    """Record ``proc`` (its process group and ``SQUAD_ENGINE_ID``) and its owner (this
    process), each with its start time, in ``state_dir()/engines/<pid>.json``; returns the path
    (delete it once the engine is stopped)."""
    me = psutil.Process()
    record = {
        "pid": proc.pid,
        "create_time": psutil.Process(proc.pid).create_time(),
        "owner_pid": me.pid,
        "owner_create_time": me.create_time(),
        "engine_id": engine_id,
        "url": base_url,
        "log": str(log_path),
    }
    path = _pid_dir() / f"{proc.pid}.json"
    with open_private(path, "w") as out:
        out.write(json.dumps(record))
    return path


def _survivors(pgid: int, engine_id: str) -> list[psutil.Process]:
    """Processes still in group ``pgid`` whose environment carries ``engine_id``: what a wrapper
    script started after PDEATHSIG killed the wrapper itself (F16)."""
    found = []
    for proc in psutil.process_iter():
        with contextlib.suppress(OSError, psutil.Error):
            if os.getpgid(proc.pid) == pgid and proc.environ().get(ENGINE_ID_VAR) == engine_id:
                found.append(proc)
    return found


def reap_stale_engines() -> list[int]:
    """Stop engines a squad process launched and left behind when it died; return their pids.

    Reads ``state_dir()/engines/*.json``; an engine is stale when its owner (pid + start time)
    is gone. Its whole process group is stopped; when the engine itself is gone, the processes
    left in its group that carry its ``SQUAD_ENGINE_ID`` are. Pid files of live owners are kept;
    unreadable ones are removed.
    """
    reaped = []
    for path in _pid_dir().glob("*.json"):
        try:
            record = json.loads(path.read_text())
            if alive(record["owner_pid"], record["owner_create_time"]):
                continue
            if stop_pid(record["pid"], create_time=record["create_time"], grace=2.0):
                reaped.append(record["pid"])
            elif hasattr(os, "getpgid") and record.get("engine_id"):
                survivors = _survivors(record["pid"], record["engine_id"])
                children.terminate(None, survivors, 2.0)
                reaped.extend(p.pid for p in survivors)
        except (OSError, ValueError, KeyError, TypeError):
            pass
        path.unlink(missing_ok=True)
    return reaped

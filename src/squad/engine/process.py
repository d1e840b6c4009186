"""The engine process: spawn, stop, pid files, reaping, and its log.

**No llama-server outlives squad.** :class:`~squad.engine.launcher.Launcher` stops its engine
(SIGTERM, then SIGKILL after a grace period, :func:`stop`) when the ``async with`` block ends
normally, with an exception, or by cancellation (Ctrl-C); the stop runs shielded from
cancellation. If squad itself dies without running that code (SIGKILL, a hard crash): on Linux
the engine is started with ``prctl(PR_SET_PDEATHSIG, SIGKILL)`` so the kernel kills it when
squad goes. The signal fires when the *thread* that spawned the engine exits, so the launcher
spawns from the event loop's thread, never from a worker thread. Elsewhere (macOS, Windows)
each launch writes a pid file to ``state_dir()/engines``; the next launch kills engines whose
squad process is gone, checking pid *and* process start time (psutil) so a reused pid is never
killed. Engines started with ``detached=True`` (``squad engine start``) are meant to outlive
squad and are exempt from both.

The engine may be a wrapper script that runs llama-server without ``exec`` (field case F16).
So every engine starts in its own session and process group, and every stop (:func:`stop`,
:func:`stop_pid`, reaping) signals the whole group and waits for the engine and every process
it started, not only for the one squad started. PDEATHSIG reaches only that one: when squad is SIGKILLed, such a
wrapper's llama-server survives until the next launch reaps it, found by its process group and
the ``SQUAD_ENGINE_ID`` the launch put in its environment (never by pid alone).

The API key reaches the engine through ``LLAMA_API_KEY`` in its environment, never argv (argv
is visible to every user in ``ps``). The engine log (stdout + stderr) goes to one file per
launch; :func:`start_error` turns its tail into the error a user sees when loading fails.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import anyio
import psutil

from squad.dirs import state_dir
from squad.errors import EngineNotFound, EngineStartError

__all__ = [
    "GRACE",
    "alive",
    "free_port",
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

GRACE = 5.0
"""Seconds between SIGTERM and SIGKILL when stopping an engine."""

LOG_TAIL_LINES = 30
KEEP_LOGS = 50
"""Engine logs kept in the log directory; older ones are deleted at each start."""
_PR_SET_PDEATHSIG = 1


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


def _pdeathsig_preexec() -> Callable[[], None] | None:
    """A preexec function asking the kernel to SIGKILL the child when its parent thread dies."""
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl  # resolved in the parent: no dlopen after fork
    parent = os.getpid()

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before prctl took effect
            os._exit(1)

    return preexec


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
    with ``LLAMA_API_KEY=api_key`` and ``SQUAD_ENGINE_ID=engine_id`` (None: a fresh one),
    stdout + stderr appended to ``log_path``. Not ``detached``: PDEATHSIG on Linux (call from
    the event loop's thread). ``detached``: no PDEATHSIG. Raises :class:`EngineNotFound` when the
    binary cannot be run."""
    env = {**os.environ, "LLAMA_API_KEY": api_key, ENGINE_ID_VAR: engine_id or new_engine_id()}
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        try:
            return subprocess.Popen(
                [str(binary), *args],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                preexec_fn=None if detached else _pdeathsig_preexec(),
                start_new_session=True,  # its own process group: a stop reaches a wrapper's children (F16)
                close_fds=True,
            )
        except OSError as exc:
            raise EngineNotFound(f"cannot run llama-server at {binary}: {exc}") from exc


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


def start_error(proc: subprocess.Popen, model: Path | str, log_path: Path) -> EngineStartError:
    """The :class:`EngineStartError` for an engine that exited while loading ``model``: the
    first error-like line of its log, a hint (the port is taken, not a llama-server, or the
    model), the log tail and path."""
    tail = log_tail(log_path)
    if _BIND_FAILED in tail:  # llama.cpp tools/server/server.cpp, when the port is taken (F15)
        return EngineStartError(
            f"llama-server could not listen: {_reason(tail)}. The port is in use by another program: "
            f"pass another port, or none so squad picks a free one; full log: {log_path}",
            log_tail=tail,
            log_path=str(log_path),
        )
    if not tail.strip():  # it never got as far as logging: not a working llama-server at all
        hint = (f"{proc.args[0] if isinstance(proc.args, list) else proc.args} printed nothing: check that it "
                "is llama-server (`squad engine info`, or --llama-server / SQUAD_LLAMA_SERVER)")
    else:
        hint = "Check that the model is a complete GGUF file llama.cpp supports"
    return EngineStartError(
        f"llama-server exited with status {proc.returncode} while loading {model}: {_reason(tail)}. "
        f"{hint}; full log: {log_path}",
        log_tail=tail,
        log_path=str(log_path),
    )


# --- stopping ------------------------------------------------------------------------------------


def alive(pid: int, create_time: float) -> bool:
    """True if process ``pid`` runs and started at ``create_time`` (±1 s; else the pid was reused)."""
    try:
        return abs(psutil.Process(pid).create_time() - create_time) <= 1.0
    except psutil.Error:
        return False


def _members(proc: psutil.Process) -> list[psutil.Process]:
    """``proc`` and its descendants (psutil objects: each remembers its start time, so a later
    signal never reaches a reused pid)."""
    try:
        return [proc, *proc.children(recursive=True)]
    except psutil.NoSuchProcess:
        return [proc]


def _running(members: list[psutil.Process]) -> list[psutil.Process]:
    """The ``members`` still running (a zombie has stopped)."""
    running = []
    for member in members:
        with contextlib.suppress(psutil.NoSuchProcess):
            if member.is_running() and member.status() != psutil.STATUS_ZOMBIE:
                running.append(member)
    return running


def _signal(leader: psutil.Process | None, members: list[psutil.Process], sig: int) -> None:
    """Send ``sig`` to the process group ``leader`` leads (skipped once the leader is gone:
    its id could be reused) and to each of ``members`` still running (some may have left it)."""
    if leader is not None and hasattr(os, "killpg") and leader.is_running():
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(leader.pid, sig)
    for member in _running(members):
        with contextlib.suppress(psutil.Error):
            member.send_signal(sig)


def _group_leader(proc: psutil.Process) -> psutil.Process | None:
    """``proc`` when it leads its own process group (every engine :func:`spawn` starts does)."""
    try:
        return proc if hasattr(os, "getpgid") and os.getpgid(proc.pid) == proc.pid else None
    except OSError:
        return None


def _terminate(leader: psutil.Process | None, members: list[psutil.Process], grace: float) -> None:
    """SIGTERM, wait up to ``grace`` s for every member, SIGKILL and wait for the rest; blocking."""
    _signal(leader, members, signal.SIGTERM)
    _, running = psutil.wait_procs(members, timeout=grace)
    if running:
        _signal(leader, running, signal.SIGKILL)
        psutil.wait_procs(running, timeout=grace)


def stop_pid(pid: int, *, create_time: float | None = None, grace: float = GRACE) -> bool:
    """SIGTERM a process and, when it leads a process group, the whole group (a wrapper script's
    llama-server, F16); SIGKILL what still runs after ``grace`` seconds; blocking. False if it was
    not running (a zombie is not), or its start time differs from ``create_time``: the pid was
    reused."""
    try:
        proc = psutil.Process(pid)
        if create_time is not None and abs(proc.create_time() - create_time) > 1.0:
            return False
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
    except psutil.NoSuchProcess:
        return False
    _terminate(_group_leader(proc), _members(proc), grace)
    return True


async def stop(proc: subprocess.Popen, grace: float = GRACE) -> None:
    """SIGTERM the engine's process group, wait up to ``grace`` s for each of its processes,
    SIGKILL what is left, reap. Shielded: runs to the end under cancellation.

    The group is signalled only while squad has not reaped the engine (alive or a zombie, its
    pid and so its group id cannot be reused); processes that left the group are signalled one
    by one."""
    with anyio.CancelScope(shield=True):
        leader, members = None, []
        if proc.returncode is None:
            with contextlib.suppress(psutil.NoSuchProcess):
                leader = psutil.Process(proc.pid)
                members = _members(leader)
        _signal(leader, members, signal.SIGTERM)
        with anyio.move_on_after(grace):
            while _running(members):
                await anyio.sleep(0.05)
        if _running(members):
            _signal(leader, members, signal.SIGKILL)
            while _running(members):
                await anyio.sleep(0.02)
        while proc.poll() is None:  # reap; the kill only matters if psutil could not see it
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await anyio.sleep(0.02)


# --- pid files: the fallback against orphans where PDEATHSIG does not exist ----------------------


def _pid_dir() -> Path:
    path = state_dir() / "engines"
    path.mkdir(parents=True, exist_ok=True)
    return path


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
    path.write_text(json.dumps(record))
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
                _terminate(None, survivors, 2.0)
                reaped.extend(p.pid for p in survivors)
        except (OSError, ValueError, KeyError, TypeError):
            pass
        path.unlink(missing_ok=True)
    return reaped

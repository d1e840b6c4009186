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


def spawn(binary: Path, args: list[str], *, api_key: str, log_path: Path, detached: bool) -> subprocess.Popen:
    """Start ``binary args`` with ``LLAMA_API_KEY=api_key``, stdout + stderr appended to
    ``log_path``. Not ``detached``: PDEATHSIG on Linux (call from the event loop's thread).
    ``detached``: its own session, no PDEATHSIG. Raises :class:`EngineNotFound` when the binary
    cannot be run."""
    env = {**os.environ, "LLAMA_API_KEY": api_key}
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
                start_new_session=detached,
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


def _reason(tail: str) -> str:
    for line in tail.splitlines():
        if _REASON.search(line):
            return _PREFIX.sub("", line).strip()
    return "no error line in the log"


def start_error(proc: subprocess.Popen, model: Path | str, log_path: Path) -> EngineStartError:
    """The :class:`EngineStartError` for an engine that exited while loading ``model``: the
    first error-like line of its log, a hint, the log tail and path."""
    tail = log_tail(log_path)
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


def stop_pid(pid: int, *, create_time: float | None = None, grace: float = GRACE) -> bool:
    """SIGTERM a process, SIGKILL it after ``grace`` seconds; blocking. False if it was not running
    (or its start time differs from ``create_time``: the pid was reused)."""
    try:
        proc = psutil.Process(pid)
        if create_time is not None and abs(proc.create_time() - create_time) > 1.0:
            return False
        proc.terminate()
        try:
            proc.wait(grace)
        except psutil.TimeoutExpired:
            proc.kill()
            proc.wait(grace)
    except psutil.NoSuchProcess:
        return False
    return True


async def stop(proc: subprocess.Popen, grace: float = GRACE) -> None:
    """SIGTERM, wait up to ``grace`` s, SIGKILL, reap. Shielded: runs to the end under cancellation."""
    with anyio.CancelScope(shield=True):
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.terminate()
            with anyio.move_on_after(grace):
                while proc.poll() is None:
                    await anyio.sleep(0.05)
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                while proc.poll() is None:
                    await anyio.sleep(0.02)


# --- pid files: the fallback against orphans where PDEATHSIG does not exist ----------------------


def _pid_dir() -> Path:
    path = state_dir() / "engines"
    path.mkdir(parents=True, exist_ok=True)
    return path


def write_pidfile(proc: subprocess.Popen, base_url: str, log_path: Path) -> Path:
    """Record ``proc`` and its owner (this process), each with its start time, in
    ``state_dir()/engines/<pid>.json``; returns the path (delete it once the engine is stopped)."""
    me = psutil.Process()
    record = {
        "pid": proc.pid,
        "create_time": psutil.Process(proc.pid).create_time(),
        "owner_pid": me.pid,
        "owner_create_time": me.create_time(),
        "url": base_url,
        "log": str(log_path),
    }
    path = _pid_dir() / f"{proc.pid}.json"
    path.write_text(json.dumps(record))
    return path


def reap_stale_engines() -> list[int]:
    """Stop engines a squad process launched and left behind when it died; return their pids.

    Reads ``state_dir()/engines/*.json``; an engine is stale when its owner (pid + start time)
    is gone. Pid files of live owners are kept; unreadable ones are removed.
    """
    reaped = []
    for path in _pid_dir().glob("*.json"):
        try:
            record = json.loads(path.read_text())
            if alive(record["owner_pid"], record["owner_create_time"]):
                continue
            if stop_pid(record["pid"], create_time=record["create_time"], grace=2.0):
                reaped.append(record["pid"])
        except (OSError, ValueError, KeyError, TypeError):
            pass
        path.unlink(missing_ok=True)
    return reaped

"""The launcher: starts, reloads and stops one llama-server for an :class:`EnginePlan`.

``async with Launcher(plan) as engine:`` starts ``llama-server`` with the plan's arguments on
``127.0.0.1`` and a free port, waits until ``/health`` answers 200 (503 ``Loading model`` is
waited out until a deadline sized to the model file), reads back ``/props`` and ``/v1/models``
and refuses to go on (:class:`PlanMismatch`) when the engine applied other slots or another
per-slot context than the plan (llama.cpp's round-up to a multiple of 256 is not a mismatch).
``engine.info`` is the :class:`EngineInfo` read back; that, never the plan, is what squad uses.

The API key is random per launch and reaches the engine through ``LLAMA_API_KEY`` in its
environment, never argv (argv is visible to every user in ``ps``). The engine log
(stdout + stderr) goes to ``state_dir()/logs``.

**No llama-server outlives squad.** The launcher stops its engine (SIGTERM, then SIGKILL after
a grace period) when the ``async with`` block ends normally, with an exception, or by
cancellation (Ctrl-C); the stop runs shielded from cancellation. If squad itself dies without
running that code (SIGKILL, a hard crash): on Linux the engine is started with
``prctl(PR_SET_PDEATHSIG, SIGKILL)`` so the kernel kills it when squad goes. The signal
fires when the *thread* that spawned the engine exits, so the launcher spawns from the event
loop's thread, never from a worker thread. Elsewhere (macOS, Windows) each launch writes a pid
file to ``state_dir()/engines``; the next launch kills engines whose squad process is gone,
checking pid *and* process start time (psutil) so a reused pid is never killed.
Engines started with ``detached=True`` (``squad engine start``) are meant to outlive squad and
are exempt from both.
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
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

import anyio
import psutil
from anyio.abc import AsyncResource

from squad.dirs import state_dir
from squad.engine.info import EngineInfo
from squad.engine.remote import EngineState, control_client, read_engine, wait_healthy
from squad.errors import EngineNotFound, EngineStartError, PlanMismatch
from squad.engine.llama import launch_args, slot_ctx
from squad.planner import EnginePlan

__all__ = [
    "Launcher",
    "build_args",
    "expected_slot_ctx",
    "check_applied",
    "default_load_timeout",
    "free_port",
    "reap_stale_engines",
    "stop_pid",
]

GRACE = 5.0
"""Seconds between SIGTERM and SIGKILL when stopping an engine."""

LOG_TAIL_LINES = 30
KEEP_LOGS = 50
"""Engine logs kept in the log directory; older ones are deleted at each start."""
_PR_SET_PDEATHSIG = 1
_GIB = 1024**3


# --- pure parts: arguments, expectations, comparison -------------------------------------------


def build_args(
    plan: EnginePlan,
    *,
    port: int,
    request_timeout: float = 600.0,
    threads: int | None = None,
    extra_args: Sequence[str] = (),
) -> list[str]:
    """llama-server arguments (without the binary) for ``plan`` on ``127.0.0.1:port``: the
    plan's own (:meth:`EnginePlan.server_args`) then the launch's
    (:func:`squad.engine.llama.launch_args`)."""
    return [*plan.server_args(), *launch_args(port=port, request_timeout=request_timeout, threads=threads,
                                               extra_args=extra_args)]


def expected_slot_ctx(plan: EnginePlan, n_ctx_train: int | None = None) -> int:
    """The per-slot context (tokens) ``/props`` must report for ``plan``
    (:func:`squad.engine.llama.slot_ctx`)."""
    return slot_ctx(plan.n_ctx, plan.slots, plan.kv_unified, n_ctx_train)


def check_applied(plan: EnginePlan, *, total_slots: int, n_ctx: int, n_ctx_train: int | None) -> None:
    """Raise :class:`PlanMismatch` unless the engine applied ``plan`` (field case F02).

    ``total_slots`` and ``n_ctx`` (per slot, tokens) are what ``/props`` reported.
    """
    if total_slots != plan.slots:
        raise PlanMismatch(
            f"engine applied {total_slots} slots, plan asked {plan.slots}: check that extra "
            "llama-server arguments do not override -np"
        )
    expected = expected_slot_ctx(plan, n_ctx_train)
    if n_ctx == expected:
        return
    if plan.kv_unified and plan.slots >= 2 and n_ctx == slot_ctx(plan.n_ctx, plan.slots, False, n_ctx_train):
        hint = (
            "the slots do not share one KV pool (--kv-unified was not applied), so each request "
            f"gets only 1/{plan.slots} of the context; use a llama-server that supports "
            "--kv-unified and do not pass --no-kv-unified in extra arguments"
        )
    else:
        hint = "check that extra llama-server arguments do not override -c, -np or --kv-unified"
    raise PlanMismatch(f"engine applied n_ctx {n_ctx} per slot, plan asked {expected}: {hint}")


def default_load_timeout(model: Path | str) -> float:
    """Seconds to wait for ``Loading model`` to end: 60 s + 60 s per GiB of model file."""
    try:
        size = Path(model).stat().st_size
    except OSError:
        size = 0
    return 60.0 + 60.0 * size / _GIB


def free_port() -> int:
    """A TCP port that was free on 127.0.0.1 a moment ago (bind to port 0, read it, close)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# --- the process ---------------------------------------------------------------------------------


def _resolve_binary(explicit: Path | str | None) -> Path:
    from squad.engine.binary import resolve_llama_server

    return Path(resolve_llama_server(explicit).path)


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


def _spawn(binary: Path, args: list[str], *, api_key: str, log_path: Path, detached: bool) -> subprocess.Popen:
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


def _prune_logs(log_dir: Path, keep: int = KEEP_LOGS) -> None:
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


def _start_error(proc: subprocess.Popen, plan: EnginePlan, log_path: Path) -> EngineStartError:
    tail = log_tail(log_path)
    if not tail.strip():  # it never got as far as logging: not a working llama-server at all
        hint = (f"{proc.args[0] if isinstance(proc.args, list) else proc.args} printed nothing: check that it "
                "is llama-server (`squad engine info`, or --llama-server / SQUAD_LLAMA_SERVER)")
    else:
        hint = "Check that the model is a complete GGUF file llama.cpp supports"
    return EngineStartError(
        f"llama-server exited with status {proc.returncode} while loading {plan.model}: {_reason(tail)}. "
        f"{hint}; full log: {log_path}",
        log_tail=tail,
        log_path=str(log_path),
    )


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


async def _stop(proc: subprocess.Popen, grace: float) -> None:
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


def _write_pidfile(proc: subprocess.Popen, base_url: str, log_path: Path) -> Path:
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


def _alive(pid: int, create_time: float) -> bool:
    try:
        return abs(psutil.Process(pid).create_time() - create_time) <= 1.0
    except psutil.Error:
        return False


def reap_stale_engines() -> list[int]:
    """Stop engines a squad process launched and left behind when it died; return their pids.

    Reads ``state_dir()/engines/*.json``; an engine is stale when its owner (pid + start time)
    is gone. Pid files of live owners are kept; unreadable ones are removed.
    """
    reaped = []
    for path in _pid_dir().glob("*.json"):
        try:
            record = json.loads(path.read_text())
            if _alive(record["owner_pid"], record["owner_create_time"]):
                continue
            if stop_pid(record["pid"], create_time=record["create_time"], grace=2.0):
                reaped.append(record["pid"])
        except (OSError, ValueError, KeyError, TypeError):
            pass
        path.unlink(missing_ok=True)
    return reaped


# --- the launcher --------------------------------------------------------------------------------


class Launcher(AsyncResource):
    """Owns one llama-server process realising an :class:`EnginePlan`.

    ``async with Launcher(plan) as engine`` → ``engine.info`` (:class:`EngineInfo` read back),
    ``engine.plan``, ``engine.base_url``, ``engine.log_path``, ``engine.pid``.

    - ``binary``: llama-server path (None → ``squad.engine.binary`` resolution).
    - ``threads``: ``-t`` (None → llama-server's default).
    - ``load_timeout``: seconds to wait out 503 ``Loading model`` (None → 60 s + 60 s/GiB).
    - ``request_timeout``: squad's per-request deadline in seconds; the engine's ``-to`` is above it.
    - ``log_dir``: where engine logs go (None → ``state_dir()/logs``).
    - ``detached``: leave the engine running after :meth:`detach` (``squad engine start``):
      no PDEATHSIG, own session, no pid file.

    Starting raises :class:`EngineNotFound`, :class:`EngineStartError` (process exited; carries
    the log tail), :class:`EngineLoadTimeout`, :class:`PlanMismatch`. The engine is stopped
    before any of them propagates.
    """

    def __init__(
        self,
        plan: EnginePlan,
        *,
        binary: Path | str | None = None,
        threads: int | None = None,
        load_timeout: float | None = None,
        request_timeout: float = 600.0,
        log_dir: Path | None = None,
        extra_args: Sequence[str] = (),
        port: int | None = None,
        grace: float = GRACE,
        detached: bool = False,
    ) -> None:
        self.plan = plan
        self._binary_arg = binary
        self.threads = threads
        self.load_timeout = load_timeout
        self.request_timeout = request_timeout
        self.log_dir = log_dir
        self.extra_args = tuple(extra_args)
        self.port = port
        self.grace = grace
        self.detached = detached
        self.api_key = secrets.token_urlsafe(24)
        self.info: EngineInfo | None = None
        self.log_path: Path | None = None
        self.base_url: str | None = None
        self.loading_polls = 0
        """How many 503 ``Loading model`` answers the last start waited out."""
        self._proc: subprocess.Popen | None = None
        self._pidfile: Path | None = None
        self._lock = anyio.Lock()  # one start/stop/reload at a time
        self._starts = 0  # how many times an engine was started (lets concurrent restarts coalesce)

    @property
    def pid(self) -> int | None:
        """The engine's process id while it runs."""
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        """True while the engine process exists (it may have crashed since the last request)."""
        return self._proc is not None and self._proc.poll() is None

    async def __aenter__(self) -> Launcher:
        await self.start()
        return self

    async def start(self) -> EngineInfo:
        """Start the engine for ``self.plan``; return what it applied. No-op when running."""
        async with self._lock:
            return await self._start()

    async def _start(self) -> EngineInfo:
        if self.running and self.info is not None:
            return self.info
        self._starts += 1
        if not self.detached:
            await anyio.to_thread.run_sync(reap_stale_engines)
        binary = _resolve_binary(self._binary_arg)
        port = self.port or free_port()
        self.base_url = f"http://127.0.0.1:{port}"
        logs = self.log_dir or state_dir() / "logs"
        self.log_path = logs / f"llama-server-{time.strftime('%Y%m%d-%H%M%S')}-{port}.log"
        if logs.is_dir():
            _prune_logs(logs)
        args = build_args(
            self.plan, port=port, request_timeout=self.request_timeout, threads=self.threads, extra_args=self.extra_args
        )
        self._proc = _spawn(binary, args, api_key=self.api_key, log_path=self.log_path, detached=self.detached)
        try:
            if not self.detached:
                self._pidfile = _write_pidfile(self._proc, self.base_url, self.log_path)
            self.info = await self._ready()
        except BaseException:
            await self._stop()
            raise
        return self.info

    async def _ready(self) -> EngineInfo:
        proc, plan, log_path = self._proc, self.plan, self.log_path
        assert proc is not None and log_path is not None and self.base_url is not None

        def check_alive() -> None:
            if proc.poll() is not None:
                raise _start_error(proc, plan, log_path)

        timeout = self.load_timeout if self.load_timeout is not None else default_load_timeout(plan.model)
        async with control_client(self.base_url, self.api_key) as client:
            self.loading_polls = await wait_healthy(client, timeout=timeout, check_alive=check_alive)
            state = await read_engine(client, with_slots=False)
        return self._info_from(state)

    def _info_from(self, state: EngineState) -> EngineInfo:
        assert self.base_url is not None
        check_applied(self.plan, total_slots=state.total_slots, n_ctx=state.n_ctx, n_ctx_train=state.n_ctx_train)
        return state.info(self.base_url, self.api_key, kv_unified=self.plan.kv_unified, launched=True,
                          requested_ctx=self.plan.n_ctx)

    async def reload(
        self,
        plan: EnginePlan,
        *,
        drain: Callable[[], Awaitable[None]] | None = None,
        drain_timeout: float = 30.0,
    ) -> bool:
        """Restart the engine with ``plan`` unless it equals the current one.

        Returns False (nothing done) when ``plan == self.plan`` and the engine runs. Otherwise
        awaits ``drain()`` (let in-flight requests finish) for at most ``drain_timeout`` seconds,
        stops the engine, starts it with ``plan`` and returns True. Raises like :meth:`start`.
        """
        async with self._lock:
            if plan == self.plan and self.running:
                return False
            if drain is not None and self.running:
                with anyio.move_on_after(drain_timeout):
                    await drain()
            await self._stop()
            self.plan = plan
            await self._start()
            return True

    async def restart(self) -> EngineInfo:
        """Stop (if still running) and start again with the same plan, e.g. after the engine died.

        Calls that overlap (several requests saw the engine gone at once) restart it once.
        """
        seen = self._starts
        async with self._lock:
            if self._starts != seen and self.running and self.info is not None:
                return self.info  # another caller restarted it meanwhile
            await self._stop()
            return await self._start()

    def detach(self) -> None:
        """Forget the process without stopping it (only for ``detached=True`` launchers)."""
        if not self.detached:
            raise RuntimeError("only a Launcher(detached=True) can leave its engine running")
        self._proc = None

    async def aclose(self) -> None:
        """Stop the engine: SIGTERM, SIGKILL after ``grace`` seconds. Safe to call twice; runs to
        the end even when the caller is being cancelled."""
        with anyio.CancelScope(shield=True):
            async with self._lock:
                await self._stop()

    async def _stop(self) -> None:
        proc, self._proc, self.info = self._proc, None, None
        if proc is not None:
            await _stop(proc, self.grace)
        if self._pidfile is not None:
            self._pidfile.unlink(missing_ok=True)
            self._pidfile = None

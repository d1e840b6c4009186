"""Child processes squad starts: each in a process group of its own, stopped whole, and never
left behind, not even when squad itself is killed.

One mechanism for every child (the engine, ``llama-server --version``, a build, MCP servers,
also when started through ``npx``/``uvx``-style wrappers):

- :func:`start` runs the child in a new session, so its process id is also its process group
  id and everything it starts (a wrapper script's real server, field case F16) is in that group.
- :func:`stop` (async) and :func:`stop_pid` (blocking) send SIGTERM to the whole group, wait up
  to a grace period for *every* process of it, then SIGKILL what is left.
- **Squad's own death** (SIGKILL, a crash, an exit that skipped cleanup) is covered by the
  *guard*: one small helper process per squad process (``python -I -S squad/_guard.py``, a script
that imports nothing of squad; about 10 MB), in a
  session of its own so a terminal's Ctrl-C or a signal to squad's group does not reach it. Squad
  tells it each group it starts and each group it has stopped, over a pipe only squad holds. When
  the pipe reaches end-of-file, squad is gone: the guard SIGTERMs every group still registered,
  SIGKILLs what survives :data:`GRACE` seconds, and exits. A squad that exits normally has
  released every group first, so the guard then just exits.
- ``pdeathsig=True`` additionally asks the Linux kernel to SIGKILL the direct child when the
  thread that started it ends (``prctl(PR_SET_PDEATHSIG)``): immediate, and independent of
  the guard. Use it only from a thread that lives as long as the child (the event loop's).

A child another library spawns in a session of its own (the MCP SDK's ``stdio_client``) joins
the same mechanism with :func:`adopt` (the guard watches its group) and :func:`stop_group` (what
is left of the group once the library has stopped its leader).

``detached=True`` children (``squad engine start``) are meant to outlive squad: no PDEATHSIG,
and the guard watches them only until :func:`let_go` hands them over (once the engine is up). Windows has no process
groups to signal: there only the direct child is stopped.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any

import anyio
import psutil

__all__ = ["GRACE", "start", "stop", "stop_pid", "kill_now", "let_go", "release", "terminate", "guard_pid", "adopt",
           "stop_group"]

GRACE = 5.0
"""Seconds between SIGTERM and SIGKILL when stopping a child's process group."""

_PR_SET_PDEATHSIG = 1
_GUARD_SCRIPT = Path(__file__).with_name("_guard.py")
_GROUPS = hasattr(os, "killpg")


# --- starting ------------------------------------------------------------------------------------


def start(
    argv: Sequence[str],
    *,
    env: dict[str, str] | None = None,
    stdin: int | IO[Any] | None = subprocess.DEVNULL,
    stdout: int | IO[Any] | None = None,
    stderr: int | IO[Any] | None = None,
    text: bool = False,
    detached: bool = False,
    pdeathsig: bool = False,
    umask: int = -1,
) -> subprocess.Popen:
    """Start ``argv`` as a child squad owns (module docstring): its own session and process
    group, registered with the guard (a ``detached`` child until :func:`let_go`);
    ``pdeathsig`` (Linux, not with ``detached``): the kernel SIGKILLs it when the calling
    thread ends. ``stdin``/``stdout``/
    ``stderr``/``text``/``env`` as for :class:`subprocess.Popen` (text decodes with
    ``errors="replace"``: a child printing bytes that are not UTF-8 never raises). ``umask``: the child's
    (-1: this process's), e.g. 0o077 for an engine whose files (slot saves) only their owner may read.

    Raises :class:`OSError` when ``argv[0]`` cannot be run.
    """
    preexec = _pdeathsig_preexec() if pdeathsig and not detached else None
    proc = subprocess.Popen(
        list(argv), stdin=stdin, stdout=stdout, stderr=stderr, env=env, text=text,
        errors="replace" if text else None, preexec_fn=preexec, start_new_session=True, close_fds=True, umask=umask,
    )
    if _GROUPS:
        _guard.watch(proc.pid)
    return proc


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


# --- stopping ------------------------------------------------------------------------------------


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
    if leader is not None and _GROUPS and leader.is_running():
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(leader.pid, sig)
    for member in _running(members):
        with contextlib.suppress(psutil.Error):
            member.send_signal(sig)


def _continue(leader: psutil.Process | None, members: list[psutil.Process]) -> None:
    """SIGCONT after SIGTERM: a stopped process (SIGSTOP, Ctrl-Z) acts on SIGTERM only once continued, so a stopped
    engine ends now instead of after the grace period's SIGKILL (POSIX only)."""
    sig = getattr(signal, "SIGCONT", None)
    if sig is not None:
        _signal(leader, members, sig)


def _group_leader(proc: psutil.Process) -> psutil.Process | None:
    """``proc`` when it leads its own process group (every child :func:`start` starts does)."""
    try:
        return proc if _GROUPS and os.getpgid(proc.pid) == proc.pid else None
    except OSError:
        return None


def terminate(leader: psutil.Process | None, members: list[psutil.Process], grace: float) -> None:
    """SIGTERM the group ``leader`` leads (None: no group) and ``members``, wait up to ``grace``
    seconds for every member, SIGKILL and wait for the rest; blocking."""
    _signal(leader, members, signal.SIGTERM)
    _continue(leader, members)
    _, running = psutil.wait_procs(members, timeout=grace)
    if running:
        _signal(leader, running, signal.SIGKILL)
        psutil.wait_procs(running, timeout=grace)


def stop_pid(pid: int, *, create_time: float | None = None, grace: float = GRACE) -> bool:
    """SIGTERM a process and, when it leads a process group, the whole group; SIGKILL what
    still runs after ``grace`` seconds; blocking. False if it was not running (a zombie is
    not), or its start time differs from ``create_time`` (±1 s): the pid was reused."""
    try:
        proc = psutil.Process(pid)
        if create_time is not None and abs(proc.create_time() - create_time) > 1.0:
            return False
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
    except psutil.NoSuchProcess:
        return False
    terminate(_group_leader(proc), _members(proc), grace)
    _guard.release(pid)
    return True


async def stop(proc: subprocess.Popen, grace: float = GRACE) -> None:
    """SIGTERM the child's process group, wait up to ``grace`` s for each of its processes,
    SIGKILL what is left, reap, and release the group from the guard. Shielded: runs to the
    end under cancellation.

    The group is signalled only while squad has not reaped the child (alive or a zombie, its
    pid and so its group id cannot be reused); processes that left the group are signalled one
    by one."""
    with anyio.CancelScope(shield=True):
        leader, members = None, []
        if proc.returncode is None:
            with contextlib.suppress(psutil.NoSuchProcess):
                leader = psutil.Process(proc.pid)
                members = _members(leader)
        _signal(leader, members, signal.SIGTERM)
        _continue(leader, members)
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
        _guard.release(proc.pid)


def kill_now(proc: subprocess.Popen) -> None:
    """SIGKILL the child's whole group at once and reap it; blocking (a hung helper such as
    ``llama-server --version`` behind a wrapper that never returns, an interrupted build)."""
    if proc.returncode is None:  # not reaped yet: its group id cannot have been reused
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL) if _GROUPS else proc.kill()
    proc.wait()
    _guard.release(proc.pid)


def let_go(proc: subprocess.Popen) -> None:
    """Let a ``detached`` child outlive squad: the guard forgets its group."""
    _guard.release(proc.pid)


def release(proc: subprocess.Popen) -> None:
    """Tell the guard a child that ended on its own (and was reaped) needs no stopping."""
    if proc.returncode is not None:
        _guard.release(proc.pid)


def adopt(pgid: int) -> None:
    """Watch the process group ``pgid`` a library started for squad (its leader in a session of
    its own, so its pid is the group id): the guard stops it if squad dies. Release it with
    :func:`stop_group`."""
    if _GROUPS:
        _guard.watch(pgid)


async def stop_group(pgid: int, grace: float = GRACE) -> None:
    """Stop what is left of an :func:`adopt`-ed process group (processes its leader started
    that outlived it), SIGTERM then SIGKILL after ``grace`` seconds, and release it from the
    guard. Call it right after the leader was stopped and reaped: a group id is not reused
    while any process of the group lives. Shielded from cancellation."""
    with anyio.CancelScope(shield=True):
        if _GROUPS:
            for sig in (signal.SIGTERM, signal.SIGKILL):
                if not _group_alive(pgid):
                    break
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pgid, sig)
                with anyio.move_on_after(grace):
                    while _group_alive(pgid):
                        await anyio.sleep(0.05)
        _guard.release(pgid)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# --- the guard -----------------------------------------------------------------------------------

class _Guard:
    """The guard process of this squad process (module docstring), started on first use."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self._owner = 0  # the pid that started it: a forked copy of squad starts its own
        self._groups: set[int] = set()

    def watch(self, pgid: int) -> None:
        with self._lock:
            self._groups.add(pgid)
            self._send(f"+ {pgid}\n")

    def release(self, pgid: int) -> None:
        with self._lock:
            if pgid in self._groups:
                self._groups.discard(pgid)
                self._send(f"- {pgid}\n")

    def pid(self) -> int | None:
        with self._lock:
            return self._proc.pid if self._proc is not None and self._proc.poll() is None else None

    def _send(self, line: str) -> None:
        for _ in range(2):  # a guard that died is replaced, and told every group again
            try:
                stdin = self._running()
                stdin.write(line)
                stdin.flush()
                return
            except (OSError, ValueError):
                self._proc = None
                line = "".join(f"+ {g}\n" for g in self._groups)

    def _running(self) -> IO[str]:
        if self._proc is None or self._proc.poll() is not None or self._owner != os.getpid():
            self._proc = subprocess.Popen(
                [sys.executable, "-I", "-S", str(_GUARD_SCRIPT), str(GRACE)], stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True, start_new_session=True,
                close_fds=True,
            )
            self._owner = os.getpid()
        assert self._proc.stdin is not None
        return self._proc.stdin


_guard = _Guard()


def guard_pid() -> int | None:
    """The guard process's pid while it runs (None before the first child, or on Windows)."""
    return _guard.pid()

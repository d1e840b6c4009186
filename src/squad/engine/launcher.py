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

A server squad did not start is never adopted (field case F15): a port something already
answers on is refused before the spawn, and after ``/health`` the launcher checks that the
process it started (or a child of it) is the one listening and that the server demands this
launch's random API key; either failing is "port P is in use by another program".

**No llama-server outlives squad.** The launcher stops its engine (its whole process group)
when the ``async with`` block ends normally, with an exception, or by cancellation (Ctrl-C),
shielded from cancellation; if squad dies without running that code, the guard process of
:mod:`squad.children` stops the group (and PDEATHSIG, on Linux, the engine's first process); the
pid files the next launch reaps are the last resort. How, and what each guarantee rests on:
:mod:`squad.engine.process`.
"""

from __future__ import annotations

import dataclasses
import secrets
import subprocess
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

import anyio
import httpx
from anyio.abc import AsyncResource

from squad.dirs import private_dir, state_dir
from squad.engine import process
from squad.engine.binary import known_build, resolve_llama_server
from squad.engine.control import EngineState, control_client, read_engine, wait_healthy
from squad.engine.info import EngineInfo
from squad.engine.llama import launch_args, slot_ctx, slot_save_args
from squad.engine.stores import model_bytes
from squad.errors import EngineError, EngineLoadTimeout, EngineStartError, ModelError, PlanMismatch
from squad.sched.plan import EnginePlan

__all__ = [
    "Launcher",
    "build_args",
    "expected_slot_ctx",
    "check_applied",
    "default_load_timeout",
]

_GIB = 1024**3


# --- pure parts: arguments, expectations, comparison -------------------------------------------


def build_args(
    plan: EnginePlan,
    *,
    port: int,
    request_timeout: float | None = None,
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
        size = model_bytes(model)
    except (OSError, ModelError):
        size = 0
    return 60.0 + 60.0 * size / _GIB


_PICKS = 3
"""Free ports squad tries in turn when another program takes the one it picked before the
engine binds it."""


def _resolve_binary(explicit: Path | str | None) -> Path:
    return Path(resolve_llama_server(explicit).path)


# --- the launcher --------------------------------------------------------------------------------


class Launcher(AsyncResource):
    """Owns one llama-server process realising an :class:`EnginePlan`.

    ``async with Launcher(plan) as engine`` → ``engine.info`` (:class:`EngineInfo` read back),
    ``engine.plan``, ``engine.base_url``, ``engine.log_path``, ``engine.pid``.

    - ``binary``: llama-server path (None → ``squad.engine.binary`` resolution).
    - ``threads``: ``-t`` (None → llama-server's default).
    - ``load_timeout``: seconds to wait out 503 ``Loading model`` (None → 60 s + 60 s/GiB).
    - ``request_timeout``: squad's fixed per-request deadline in seconds (None: derived per call,
      :mod:`squad.chat.deadline`); the engine's ``-to`` is above it.
    - ``log_dir``: where engine logs go (None → ``state_dir()/logs``).
    - ``detached``: leave the engine running after :meth:`detach` (``squad engine start``):
      no PDEATHSIG, no pid file; the guard watches it only until :meth:`detach` (squad killed
      while the model loads leaves nothing).
    - ``on_progress(elapsed, deadline)``: called about once a second while the model loads,
      both in seconds (``deadline`` is the load timeout in force).

    Starting raises :class:`EngineNotFound`, :class:`EngineStartError` (process exited, carrying
    the log tail; or the port is taken by another program, F15), :class:`EngineLoadTimeout`,
    :class:`PlanMismatch`. The engine is stopped before any of them propagates.
    """

    def __init__(
        self,
        plan: EnginePlan,
        *,
        binary: Path | str | None = None,
        threads: int | None = None,
        load_timeout: float | None = None,
        request_timeout: float | None = None,
        log_dir: Path | None = None,
        extra_args: Sequence[str] = (),
        port: int | None = None,
        grace: float = process.GRACE,
        detached: bool = False,
        on_progress: Callable[[float, float], None] | None = None,
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
        self.on_progress = on_progress
        self.api_key = secrets.token_urlsafe(24)
        self.info: EngineInfo | None = None
        self.log_path: Path | None = None
        self.base_url: str | None = None
        self.loading_polls = 0
        """How many 503 ``Loading model`` answers the last start waited out."""
        self._proc: subprocess.Popen | None = None
        self._binary: Path | None = None
        self._pidfile: Path | None = None
        self._lock = anyio.Lock()  # one start/stop/reload at a time
        self._starts = 0  # starts that completed (lets concurrent restarts coalesce)

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
        if not self.detached:
            await anyio.to_thread.run_sync(process.reap_stale_engines)
        binary = self._binary = _resolve_binary(self._binary_arg)
        if self.port is not None:
            return await self._start_on(binary, self.port)
        taken: list[int] = []
        for _ in range(_PICKS):  # a port squad picked can be taken before the engine binds it: pick again
            port = process.free_port()
            try:
                return await self._start_on(binary, port)
            except EngineStartError as exc:
                if not exc.port_taken:
                    raise
                taken.append(port)
        raise EngineStartError(
            f"ports {', '.join(map(str, taken))} on 127.0.0.1, each free when squad picked it, were taken by another "
            "program before the engine could listen there; something on this machine is grabbing free ports: run "
            "again, or pass a port you reserve for the engine (--port)", port_taken=True)

    async def _start_on(self, binary: Path, port: int) -> EngineInfo:
        """Start the engine on ``port`` (given by the caller, or picked free by squad)."""
        if process.port_in_use(port):  # never adopt a server squad did not start (F15)
            raise EngineStartError(self._port_message(port, "is in use by another program"), port_taken=True)
        self.base_url = f"http://127.0.0.1:{port}"
        logs = self.log_dir or state_dir() / "logs"
        self.log_path = logs / f"llama-server-{time.strftime('%Y%m%d-%H%M%S')}-{port}.log"
        if logs.is_dir():
            process.prune_logs(logs)
        # shared input (squad.sched.share): slots are saved and restored there; idle slots keep their
        # cells (b11434 clears idle slots when a task starts unless told not to, losing a restore)
        slots_dir = state_dir() / "slots" / str(port)
        save = slot_save_args(slots_dir)
        try:
            private_dir(slots_dir.parent)
            private_dir(slots_dir)
            for stale in slots_dir.glob("squad-share-*.bin"):
                stale.unlink()
        except OSError:  # not writable: no sharing, calls go as before
            save = []
        if any(a in self.extra_args for a in save[:1]):  # the caller chose its own
            save = []
        shared_dir = slots_dir if save else None
        args = build_args(
            self.plan, port=port, request_timeout=self.request_timeout, threads=self.threads,
            extra_args=[*save, *self.extra_args]
        )
        engine_id = process.new_engine_id()
        self._proc = process.spawn(binary, args, api_key=self.api_key, log_path=self.log_path, detached=self.detached,
                                   engine_id=engine_id)
        try:
            if not self.detached:
                self._pidfile = process.write_pidfile(self._proc, self.base_url, self.log_path, engine_id)
            self.info = await self._ready(port)
            self.info = dataclasses.replace(self.info, pid=self._proc.pid, log_path=str(self.log_path))
            if shared_dir is not None:
                self.info = dataclasses.replace(self.info, slot_save_dir=str(shared_dir))
        except BaseException:
            await self._stop()
            raise
        self._starts += 1
        return self.info

    async def _ready(self, port: int) -> EngineInfo:
        proc, plan, log_path = self._proc, self.plan, self.log_path
        assert proc is not None and log_path is not None and self.base_url is not None

        def check_alive() -> None:
            if proc.poll() is not None:
                raise process.start_error(proc, plan.model, log_path)

        timeout = self.load_timeout if self.load_timeout is not None else default_load_timeout(plan.model)
        on_progress = self.on_progress
        progress = (lambda elapsed: on_progress(elapsed, timeout)) if on_progress is not None else None
        async with control_client(self.base_url, self.api_key) as client:
            try:
                self.loading_polls = await wait_healthy(client, timeout=timeout, check_alive=check_alive,
                                                        progress=progress)
            except EngineError as exc:
                if isinstance(exc, (EngineStartError, EngineLoadTimeout)):
                    raise
                check_alive()  # it answered like no llama-server: ours exited, or another program answers
                raise self._not_ours(port, proc.pid, "it answers /health like no llama-server") from exc
            await self._check_ours(client, port, proc.pid)
            state = await read_engine(client, with_slots=False)
        return self._info_from(state)

    async def _check_ours(self, client: httpx.AsyncClient, port: int, pid: int) -> None:
        """Raise :class:`EngineStartError` unless the server answering on ``port`` is the one squad
        started (field case F15): the process ``pid`` (or a child of it) listens there, and the
        server demands this launch's random API key (a wrong key gets HTTP 401, the right one not;
        llama-server checks the key on every endpoint but ``/health`` and ``/v1/models``)."""
        if process.listens(pid, port) is False:
            raise self._not_ours(port, pid, f"pid {pid} does not listen there")
        wrong = await client.get("/props", headers={"Authorization": f"Bearer {secrets.token_urlsafe(24)}"})
        if wrong.status_code != 401:
            raise self._not_ours(port, pid, f"it answers without this launch's API key (HTTP {wrong.status_code})")
        right = await client.get("/props")
        if right.status_code == 401:
            raise self._not_ours(port, pid, "it refuses this launch's API key")

    def _not_ours(self, port: int, pid: int, why: str) -> EngineStartError:
        return EngineStartError(self._port_message(
            port, f"is in use by another program: a server answered there, but not from the llama-server squad "
                  f"started (pid {pid}; {why})"), port_taken=True)

    def _port_message(self, port: int, what: str) -> str:
        """``port ... {what}`` and the fix: another port for a port the caller gave; for one squad
        picked itself (it was free a moment ago), a start that picks again."""
        if self.port is not None:
            return f"port {port} on 127.0.0.1 {what}: pass another port, or none so squad picks a free one"
        return (f"port {port} on 127.0.0.1, which squad picked because it was free, {what}; squad picks another "
                "port and starts again")

    def exit_status(self) -> str | None:
        """How the engine process ended (``"signal 9 SIGKILL"``, ``"status 1"``) once it ended by
        itself (squad did not stop it); None while it runs or when none was started. Its log is
        :attr:`log_path`."""
        proc = self._proc
        if proc is None or proc.poll() is None:
            return None
        return process.describe_exit(proc.returncode)

    def _info_from(self, state: EngineState) -> EngineInfo:
        assert self.base_url is not None
        check_applied(self.plan, total_slots=state.total_slots, n_ctx=state.n_ctx, n_ctx_train=state.n_ctx_train)

        info = state.info(self.base_url, self.api_key, kv_unified=self.plan.kv_unified, launched=True,
                          requested_ctx=self.plan.n_ctx)
        build = known_build(info.build_info, self._binary)  # squad's own build reports b0-unknown
        return info if build == info.build_info else dataclasses.replace(info, build_info=build)

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

        Calls that overlap (several requests saw the engine gone at once, or while a restart was
        loading the model) restart it once.
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
        if self._proc is not None:
            process.let_go(self._proc)
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
            await process.stop(proc, self.grace)
        if self._pidfile is not None:
            self._pidfile.unlink(missing_ok=True)
            self._pidfile = None

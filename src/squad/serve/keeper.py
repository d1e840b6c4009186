"""squad serve keeps the engine it launched up: a dead engine is restarted with the same plan.

:class:`EngineKeeper` looks at the launched engine's process every :data:`POLL_S` seconds (and at once when a
request saw the engine gone, :meth:`EngineKeeper.check`). When it has exited by itself it:

1. holds admission (queued requests stay queued, new ones wait; the requests that were running got their error from
   the broken connection, :mod:`squad.serve.relay`);
2. restarts it with :meth:`squad.engine.session.EngineSession.restart`, the restart ``squad run``'s client makes
   (same plan, same port and key; ``engine.exited`` then ``engine.loaded`` with reason ``restarted``), and says so
   in serve's log;
3. resumes admission: the queued requests go to the new engine.

An engine whose process lives but does not answer (stopped with SIGSTOP, hung) is found by ``probe`` (a ``GET
/health`` with a timeout, every :data:`PROBE_S` seconds): when it has not answered for :data:`HUNG_AFTER_S` seconds
the keeper kills it (``SIGKILL``, which also ends a stopped process) and restarts it as above, saying why.

``state`` is what ``/health``, ``/squad/status`` and ``--watch`` show: ``up``, ``restarting`` (503 on ``/health``),
``down`` (503: it died and squad serve gave up). A crash loop is bounded: more than ``max_restarts`` deaths within
``window`` seconds (a restart that fails to start counts as one) and the keeper gives up: ``state`` is ``down`` for
good, new requests get 503 with the message, and ``on_give_up`` receives it (squad serve then stops, ending the
requests it holds with it, and exits 1).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Literal

import anyio

from squad.errors import EngineError, SquadError

if TYPE_CHECKING:
    from squad.engine.session import EngineSession

__all__ = ["EngineKeeper", "EngineState", "MAX_RESTARTS", "RESTART_WINDOW_S", "POLL_S", "PROBE_S", "HUNG_AFTER_S"]

EngineState = Literal["up", "restarting", "down"]

MAX_RESTARTS = 3
"""Restarts squad serve makes within :data:`RESTART_WINDOW_S` before it gives up (a crash loop)."""
RESTART_WINDOW_S = 600.0
"""Seconds over which deaths count towards :data:`MAX_RESTARTS`."""
POLL_S = 0.25
"""Seconds between two looks at the engine's process (``Popen.poll``: no system call beyond ``waitpid``)."""
PROBE_S = 10.0
"""Seconds between two ``probe`` calls (each may take up to this long: a probe that does not answer in time fails)."""
HUNG_AFTER_S = 60.0
"""Seconds an engine whose process lives may go without answering ``/health`` before it is killed and restarted.
llama-server answers ``/health`` on its HTTP threads, not between tokens, so a busy engine answers at once; a
loaded machine delays that by milliseconds, not a minute."""


class EngineKeeper:
    """Restart ``session``'s launched engine when it dies (module docstring). ``log`` receives one line per death,
    restart and give-up; ``on_give_up`` the message when it gives up; ``clock``: Unix seconds (a test's own).
    Run :meth:`run` in a task."""

    def __init__(self, session: EngineSession, *, max_restarts: int = MAX_RESTARTS,
                 window: float = RESTART_WINDOW_S, log: Callable[[str], None] | None = None,
                 on_give_up: Callable[[EngineError], None] | None = None,
                 clock: Callable[[], float] = time.time, probe: Callable[[], Awaitable[bool]] | None = None,
                 probe_every: float = PROBE_S, hung_after: float = HUNG_AFTER_S) -> None:
        self.session = session
        self.max_restarts = max_restarts
        self.window = window
        self.state: EngineState = "up"
        self.detail = ""
        """Why the engine is not up (its exit, the restart under way, why squad serve gave up)."""
        self.hung = ""
        """Why the keeper killed a live engine (it stopped answering), until its restart says so."""
        self.restarts: list[dict[str, Any]] = []
        """One row per death: ``at`` (Unix time), ``why``, ``ok`` (the restart succeeded), ``took_s``, ``error``."""
        self._log = log or (lambda line: None)
        self._on_give_up = on_give_up
        self._up = anyio.Event()
        self._up.set()
        self._wake = anyio.Event()
        self._clock = clock
        self._probe, self.probe_every, self.hung_after = probe, probe_every, hung_after

    @property
    def up(self) -> bool:
        return self.state == "up"

    @property
    def gave_up(self) -> bool:
        """The engine died too often: it stays down (module docstring)."""
        return self.state == "down" and self.detail.startswith("gave up")

    def check(self) -> None:
        """Look at the engine now (a request saw its connection refused or cut)."""
        self._wake.set()

    async def wait_up(self, timeout: float | None = None) -> bool:
        """Wait while the engine restarts (at most ``timeout`` seconds); True when it is up."""
        if not self.up:
            with anyio.move_on_after(timeout):
                await self._up.wait()
        return self.up

    async def gone(self, settle: float = 0.5) -> bool:
        """After a request's connection to the engine failed: True when the engine had died and is up again
        (restarted: the request may be sent again), False when it did not die (the connection failed, not the
        engine) or could not be restarted."""
        if self.session.launcher is None:
            return False
        if self.up:
            if not await self.exited(settle):
                return False
            with anyio.move_on_after(POLL_S * 4):  # the keeper takes it from here
                while self.up:
                    await anyio.sleep(0.02)
        return await self.wait_up()

    async def exited(self, settle: float = 0.5) -> bool:
        """Whether the launched engine's process has ended, waiting up to ``settle`` seconds (a process whose socket
        closed first takes a moment to end); True at once while it restarts; False for an engine squad did not
        launch. An ended one is looked at now (:meth:`check`)."""
        launcher = self.session.launcher
        if launcher is None:
            return False
        if not self.up:
            return True
        with anyio.move_on_after(settle):
            while launcher.running:
                await anyio.sleep(0.02)
        if launcher.running:
            return False
        self.check()
        return True

    async def run(self) -> None:
        """Watch the engine until cancelled, or until it gave up (returns then)."""
        async with anyio.create_task_group() as tg:
            if self._probe is not None:
                tg.start_soon(self._watch_answers)
            await self._watch_process()
            tg.cancel_scope.cancel()

    async def _watch_answers(self) -> None:
        """Kill an engine whose process lives but has not answered ``probe`` for ``hung_after`` seconds (module
        docstring); :meth:`_watch_process` then restarts it."""
        assert self._probe is not None
        silent = 0.0
        while True:
            started = time.monotonic()
            launcher = self.session.launcher
            if not self.up or launcher is None or not launcher.running:
                silent = 0.0
            else:
                answered = False
                with anyio.move_on_after(self.probe_every):
                    answered = await self._probe()
                silent = 0.0 if answered else silent + max(time.monotonic() - started, self.probe_every)
                pid = launcher.pid
                if silent >= self.hung_after and pid is not None and self.up and launcher.running:
                    self._log(f"squad serve: the engine (pid {pid}) has not answered /health for {silent:.0f} s "
                              "(stopped or hung): killing it to restart it")
                    self.hung = f"did not answer /health for {silent:.0f} s"
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                    self.check()
                    silent = 0.0
            await anyio.sleep(max(0.0, self.probe_every - (time.monotonic() - started)))

    async def _watch_process(self) -> None:
        while True:
            with anyio.move_on_after(POLL_S):
                await self._wake.wait()
            self._wake = anyio.Event()
            why = self.session.exited()  # reports engine.exited, once per process
            if why is None:
                continue
            if self.hung:  # killed by _watch_answers: say why it was killed
                why, self.hung = f"{why} (killed by squad serve: it {self.hung})", ""
            if not await self._restart(why):
                return

    async def _restart(self, why: str) -> bool:
        admission = self.session.admission
        self.state, self.detail, self._up = "down", why, anyio.Event()
        if admission is not None:
            admission.hold()
        while True:
            now = self._clock()
            recent = [r for r in self.restarts if now - r["at"] < self.window]
            row: dict[str, Any] = {"at": now, "why": why, "ok": False, "took_s": None, "error": None}
            self.restarts.append(row)
            if len(recent) >= self.max_restarts:
                return self._give_up(why, len(recent) + 1)
            self.state, self.detail = "restarting", f"restarting the engine, which {why.removeprefix('engine ')}"
            self._log(f"squad serve: {why}; restarting it with the same plan "
                      f"(restart {len(recent) + 1} of at most {self.max_restarts} in {self.window:.0f} s)")
            started = time.monotonic()
            try:
                info = await self.session.restart()
            except (SquadError, OSError) as exc:  # it did not start again (OSError: its log file could not be
                # opened, process.spawn): counts as another death, never a crash of squad serve
                row["error"] = str(exc)
                why = f"engine did not start again: {exc}"
                self._log(f"squad serve: the restart failed: {exc}")
                continue
            if admission is not None:
                admission.resume()  # the session's restart adopted the engine (and resumed); resume is idempotent
            row["ok"], row["took_s"] = True, round(time.monotonic() - started, 2)
            self.state, self.detail = "up", ""
            self._up.set()
            self._log(f"squad serve: engine restarted in {row['took_s']:.1f} s at {info.base_url} "
                      f"({info.slots} slots, pool {info.pool:,} tokens); queued requests go on")
            return True

    def _give_up(self, why: str, deaths: int) -> bool:
        message = (f"the engine died {deaths} times within {self.window:.0f} s (last: {why}); squad serve gave up "
                   "restarting it: read the engine's log, fix the cause, and start squad serve again")
        self.state, self.detail = "down", f"gave up: {message}"
        self._log(f"squad serve: {message}")
        self._up.set()  # waiters look again and find it down
        if self._on_give_up is not None:
            self._on_give_up(EngineError(message))
        return False

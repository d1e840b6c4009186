"""The launched engine: squad plans llama-server for the workload and starts it
(:class:`LaunchedEngine`, an :class:`~squad.engine.provider.EngineProvider`)."""

from __future__ import annotations

from dataclasses import dataclass

import anyio

from squad.engine.launcher import Launcher
from squad.engine.planning import plan_engine
from squad.engine.process import free_port
from squad.engine.provider import EngineHandle
from squad.engine.spec import EngineSpec
from squad.errors import UserError
from squad.events import EnginePlanned, EventSink
from squad.sched.workload import Node

__all__ = ["LaunchedEngine"]


@dataclass(frozen=True)
class LaunchedEngine:
    """Plan ``spec`` for the workload (:func:`~squad.engine.planning.plan_engine`), launch it
    (:class:`~squad.engine.launcher.Launcher`) and connect to what it reports.

    - ``share``: the fraction (0 < share <= 1) of this machine's KV memory the plan (and a
      later replan) may use, when several engines on one machine divide it;
    - ``restart``: a launched engine that dies is restarted (False: its calls fail with
      :class:`~squad.errors.EngineGone`, and whoever holds it takes it out: several engines,
      a Ray worker).

    Events: ``engine.planned``, ``engine.loading`` while the model loads, then on the handle
    ``engine.exited``, ``engine.loaded`` (restarted, reloaded), ``engine.replanning``.
    Raises :class:`~squad.errors.UserError` for a ``spec`` with a ``url`` or a bad share, and
    the planner's and launcher's errors.
    """

    spec: EngineSpec
    share: float = 1.0
    restart: bool = True

    def __post_init__(self) -> None:
        if self.spec.url is not None:
            raise UserError("a launched engine has no url: attach to it instead (squad.engine.attached.AttachedEngine)")
        if isinstance(self.share, bool) or not isinstance(self.share, (int, float)) or not 0 < self.share <= 1:
            raise UserError(f"share must be a fraction in (0, 1], got {self.share!r}")

    async def open(self, workload: Node | None, on_event: EventSink | None = None) -> EngineHandle:
        spec = self.spec
        planned = await anyio.to_thread.run_sync(lambda: plan_engine(spec, workload, share=self.share))
        if on_event is not None:
            on_event(EnginePlanned(slots=planned.slots, n_ctx=planned.n_ctx, reasons=list(planned.reasons),
                                   warnings=list(planned.warnings)))
        handle = EngineHandle("launched", emit=on_event, plan=planned, share=self.share)
        handle.launcher = Launcher(planned, binary=spec.binary, threads=spec.threads,
                                   request_timeout=spec.request_timeout, load_timeout=spec.load_timeout,
                                   port=free_port(),  # one port across reloads
                                   # the handle's own progress sink (squad.engine.provider)
                                   on_progress=handle._loading if on_event is not None else None)  # noqa: SLF001
        try:
            info = await handle.launcher.start()
            return await handle.connect(info, admits=spec.admits, queue=spec.queue,
                                        request_timeout=spec.request_timeout, restart=self.restart)
        except BaseException:
            await handle.aclose()
            raise

"""The engine session: which engine a squad uses, opened through a provider and held for the run.

Data flows one way through here::

    EngineSpec + workload --plan_engine()--> EnginePlan --Launcher--> EngineInfo (read back)
        --> Admission.for_engine(info) --> EngineClient (the ChatEngine the runtime calls)

- :class:`EngineSpec` (:mod:`squad.engine.spec`) says what engine to use: a model and the pins
  the user set, or the URL of a running engine.
- :func:`plan_engine` (:mod:`squad.engine.planning`) is the ONE way from a spec and a workload to
  a plan; ``Squad``, ``squad run`` and ``squad plan`` all call it.
- An :class:`~squad.engine.provider.EngineProvider` opens the engine (launched, attached, a chat
  engine given as is, or any other kind): :func:`provider_for`.
- :class:`EngineSession` holds what it opened for the run: the client, the admission, reload
  and replan, and why the engine died. A squad holds one session per engine.
"""

from __future__ import annotations

from collections.abc import Iterable

from anyio.abc import AsyncResource

from squad.chat import ChatEngine
from squad.engine.attached import AttachedEngine, GivenChat
from squad.engine.info import EngineInfo
from squad.engine.launched import LaunchedEngine
from squad.engine.launcher import Launcher
from squad.engine.planning import plan_engine, with_chat_template
from squad.engine.provider import EngineHandle, EngineProvider, loaded_event
from squad.engine.spec import EngineSpec
from squad.errors import UserError
from squad.events import Event, EventSink, emit_to
from squad.sched.admission import Admission
from squad.sched.plan import EnginePlan
from squad.sched.workload import Call, Node

__all__ = ["EngineSpec", "EngineSession", "EngineSource", "plan_engine", "provider_for", "with_chat_template"]

EngineSource = EngineSpec | EngineInfo | ChatEngine | EngineProvider
"""What ``engine=`` takes: a spec (launch or attach), an engine's info, a chat engine, a provider."""


class EngineSession(AsyncResource):
    """One engine for a squad: ``async with EngineSession(engine, workload) as session``.

    ``engine`` is one of:

    - an :class:`EngineSpec`: launch (planned for ``workload``) or attach (``url``);
    - an :class:`EngineInfo`: an engine that is already running, used as it reported itself;
    - a :class:`~squad.chat.ChatEngine`: used as is (``squad.testing.ScriptedEngine``, a proxy);
    - an :class:`~squad.engine.provider.EngineProvider`: any engine source (:func:`provider_for`
      turns the others into one).

    After entry: ``info`` (what the engine reported), ``chat`` (the :class:`ChatEngine` to
    call), ``admission`` (None when the chat engine admits on its own), and for a launched
    engine ``plan`` and ``launcher``. Events: ``engine.planned``, ``engine.loaded`` (each load,
    with its reason), ``engine.replanning``. Leaving stops a launched engine.

    ``share``: the fraction of this machine's KV memory a launched engine plans for
    (:func:`plan_engine`); ``restart=False``: a launched engine that dies is not restarted (its
    calls fail with :class:`~squad.errors.EngineGone`; :mod:`squad.chat.routing` takes it out instead).
    Both apply to an engine given as an :class:`EngineSpec`; a provider carries its own.
    """

    def __init__(self, engine: EngineSource, workload: Node | None = None, *,
                 on_event: EventSink | None = None, share: float = 1.0, restart: bool = True) -> None:
        self.spec = engine if isinstance(engine, EngineSpec) else None
        self._engine = engine
        self.workload = workload
        self._sinks: list[EventSink] = [on_event] if on_event is not None else []
        self._handle: EngineHandle | None = None
        self.share = share
        self.restart_on_death = restart
        """Restart a launched engine that dies (False: whoever holds the session takes it out); read on entry."""

    # -- what the runtime uses ---------------------------------------------------------------

    @property
    def handle(self) -> EngineHandle:
        """The open engine (:class:`~squad.engine.provider.EngineHandle`); raises :class:`UserError` before entry."""
        if self._handle is None:
            raise UserError("the engine is not open yet: use `async with Squad(...) as sq:` "
                            "(or `async with EngineSession(...)`)")
        return self._handle

    @property
    def chat(self) -> ChatEngine:
        return self.handle.chat

    @property
    def info(self) -> EngineInfo:
        return self.chat.engine

    @property
    def admission(self) -> Admission | None:
        return self.handle.admission

    @property
    def plan(self) -> EnginePlan | None:
        """The plan of an engine squad launched (None: attached, given, or not open yet)."""
        return self._handle.plan if self._handle is not None else None

    @plan.setter
    def plan(self, value: EnginePlan | None) -> None:
        self.handle.plan = value

    @property
    def launcher(self) -> Launcher | None:
        """The :class:`~squad.engine.launcher.Launcher` of an engine squad launched, else None."""
        return self._handle.launcher if self._handle is not None else None

    @launcher.setter
    def launcher(self, value: Launcher | None) -> None:
        self.handle.launcher = value

    @property
    def reloadable(self) -> bool:
        """True when squad launched this engine and may reload it with another plan."""
        return self.launcher is not None and self.plan is not None

    # -- open and close ----------------------------------------------------------------------

    async def __aenter__(self) -> EngineSession:
        provider = provider_for(self._engine, share=self.share, restart=self.restart_on_death)
        self._handle = await provider.open(self.workload, self._emit if self._sinks else None)
        self._emit(loaded_event(self._handle.info, self._handle.reason))
        return self

    async def aclose(self) -> None:
        """Close the client, then stop a launched engine (shielded; safe to call twice)."""
        if self._handle is not None:
            await self._handle.aclose()

    # -- reload and liveness -----------------------------------------------------------------

    async def reload(self, new: EnginePlan, *, drain_timeout: float = 30.0) -> bool:
        """Reload a launched engine with ``new``: admitted calls finish first (new ones wait),
        then the engine restarts and admission and client adopt what it reports. Returns False
        when ``new`` equals the current plan. Raises :class:`UserError` for an engine squad did
        not launch, and the launcher's errors."""
        return await self.handle.reload(new, drain_timeout=drain_timeout)

    async def restart(self) -> EngineInfo:
        """Restart a launched engine that died, with the same plan (as a call's client does after the engine died:
        ``engine.loaded`` with reason ``restarted``); client and admission adopt it. Raises :class:`UserError`
        for an engine squad did not launch, and the launcher's errors."""
        return await self.handle.restart()

    async def replan(self, concurrent: Iterable[Call], *, why: str = "") -> bool:
        """Reload with more slots/context when ``concurrent`` agents will run at once and the
        current plan cannot hold them (:func:`squad.sched.planner.plan_for_replan`, within this
        engine's memory share). Returns True when the engine was reloaded; False when it already
        holds them, cannot be reloaded, or the bigger plan would not fit in memory."""
        return await self.handle.replan(concurrent, why=why)

    def exited(self) -> str | None:
        """``"engine exited (signal 9 SIGKILL), log: PATH"`` once the engine squad launched has
        ended by itself (reported as ``engine.exited``, once), else None."""
        return self._handle.exited() if self._handle is not None else None

    async def death(self, error: BaseException, *, settle: float = 0.5) -> str | None:
        """Why this engine is dead after a call failed with ``error``, or None when it still
        serves (the call failed for its own reason). Dead: the launched engine's process ended
        (waiting up to ``settle`` seconds for one whose socket closed first); or ``error`` is
        :class:`~squad.errors.EngineGone` (the client raises it only once ``/health`` is down) or a
        cut stream (:class:`~squad.errors.TruncatedStream`) and ``/health`` no longer answers.
        The one rule for several engines (:mod:`squad.chat.routing`) and Ray workers (:mod:`squad.cluster.ray`)."""
        return await self.handle.death(error, settle=settle)

    def _emit(self, event: Event) -> None:
        emit_to(self._sinks, event)


def provider_for(engine: EngineSource, *, share: float = 1.0, restart: bool = True) -> EngineProvider:
    """The provider of ``engine`` as :class:`EngineSession` takes it: a provider as it is; a spec
    with a ``url`` attached, else launched (with ``share`` and ``restart``); an
    :class:`EngineInfo` attached as reported; anything else a :class:`~squad.chat.ChatEngine`
    used as it is."""
    if isinstance(engine, EngineSpec):
        if engine.url is not None:
            return AttachedEngine(engine)
        return LaunchedEngine(engine, share=share, restart=restart)
    if isinstance(engine, EngineInfo):
        return AttachedEngine(info=engine)
    if isinstance(engine, EngineProvider):
        return engine
    return GivenChat(engine)

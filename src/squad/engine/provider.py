"""Engine providers: where a squad's engine comes from.

An :class:`EngineProvider` opens an engine for a workload and returns an :class:`EngineHandle`:
the :class:`~squad.chat.ChatEngine` to call, its :class:`~squad.sched.admission.Admission` (None
when the engine admits on its own), why it is dead when a call failed, and for an engine squad
launched its plan and launcher (reload, replan, restart). The kinds squad ships:

- :class:`squad.engine.launched.LaunchedEngine`: plan and launch llama-server (restart policy,
  memory share);
- :class:`squad.engine.attached.AttachedEngine`: a running server at a URL, or one whose
  :class:`~squad.engine.info.EngineInfo` is given;
- :class:`squad.engine.attached.GivenChat`: a ChatEngine used as it is (``ScriptedEngine``, a proxy).

A new engine kind is a new module with a provider class; ``Squad(engine=provider)`` and
:class:`~squad.engine.session.EngineSession` take any object with :meth:`EngineProvider.open`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any, Protocol, cast, runtime_checkable

import anyio

from squad.chat import ChatEngine
from squad.chat.client import EngineClient
from squad.engine.facts import read_model_facts
from squad.engine.info import EngineInfo
from squad.engine.launcher import Launcher
from squad.errors import EngineGone, TruncatedStream, UserError
from squad.events import EngineExited, EngineLoaded, EngineLoading, EngineReplanning, Event, EventSink
from squad.sched.admission import Admission
from squad.sched.memory import GpuLayers, kv_memory, memory_for_kv
from squad.sched.plan import EnginePlan
from squad.sched.planner import plan_for_replan
from squad.sched.policy import DEFAULT_QUEUE
from squad.sched.workload import Call, Node

__all__ = ["EngineProvider", "EngineHandle", "loaded_event"]


@runtime_checkable
class EngineProvider(Protocol):
    """What a squad needs from an engine source: :meth:`open` it for ``workload`` (the calls the
    squad will make; None: unknown), giving events to ``on_event`` (None: nobody listens, so
    build none). Returns the open :class:`EngineHandle`; its ``aclose`` closes what it opened.
    Raises the errors of :mod:`squad.errors` (a model not found, a plan that cannot fit, an
    engine that does not start or answer)."""

    async def open(self, workload: Node | None, on_event: EventSink | None = None) -> EngineHandle: ...


def loaded_event(info: EngineInfo, reason: str) -> EngineLoaded:
    """``engine.loaded`` for what the engine reported (``reason``: launched, attached, given,
    reloaded, restarted)."""
    return EngineLoaded(slots=info.slots, n_ctx=info.n_ctx, pool=info.pool, base_url=info.base_url,
                        reason=reason, engine=info.base_url)


class EngineHandle:
    """One open engine: ``chat`` (the ChatEngine to call), ``admission``, ``reason`` (how it was
    opened: ``launched``, ``attached``, ``given``), and for a launched engine ``plan`` and
    ``launcher`` (both settable: a test may hand a fake launcher to any handle).

    Build one with :meth:`connect` (an engine reported as ``info``: admission and client made
    here) or :meth:`use` (a ChatEngine used as it is, not closed by :meth:`aclose`). ``emit``
    receives the engine events (None: none are built); ``share``: the fraction of the machine's
    KV memory a replan may use (:func:`squad.engine.planning.plan_engine`).
    """

    def __init__(self, reason: str, *, emit: Callable[[Event], None] | None = None, plan: EnginePlan | None = None,
                 launcher: Launcher | None = None, share: float = 1.0) -> None:
        self.reason = reason
        self.plan = plan
        self.launcher = launcher
        self.share = share
        self._emit_to = emit
        self._chat: ChatEngine | None = None
        self._client: EngineClient | None = None  # the client this handle made (and closes)
        self._admission: Admission | None = None
        self._reload_lock = anyio.Lock()
        self._exit_reported: int | None = None  # pid of the engine process whose death was reported
        self._restarted_pid: int | None = None  # pid of the engine the last restart started

    # -- building ------------------------------------------------------------------------------

    async def connect(self, info: EngineInfo, *, admits: bool = False, queue: str = DEFAULT_QUEUE,
                      request_timeout: float | None = None, restart: bool = False) -> EngineHandle:
        """Make the admission (none when the engine admits on its own: ``admits``, or a squad
        serve endpoint that says so) and the client for ``info``, and read the model's tokenizer
        so calls count prompts without a round trip. ``restart``: a launched engine that dies is
        restarted by the client (else its calls fail with :class:`EngineGone`)."""
        emit = self._emit_to
        admission = None if admits or info.admits else Admission.for_engine(info, on_event=emit, queue=queue)
        client = EngineClient(info, admission=admission, request_timeout=request_timeout, on_event=emit,
                              restart=self._restart if restart and self.launcher is not None else None,
                              gone_reason=self._exited if self.launcher is not None else None)
        self._chat, self._client, self._admission = client, client, admission
        try:
            await client.prepare()
        except BaseException:
            with anyio.CancelScope(shield=True):
                await client.aclose()
            self._client = None
            raise
        return self

    def use(self, chat: ChatEngine) -> EngineHandle:
        """Use ``chat`` as it is (its own admission, if it has one); :meth:`aclose` leaves it open."""
        self._chat, self._admission = chat, getattr(chat, "admission", None)
        return self

    # -- what the session reads ----------------------------------------------------------------

    @property
    def chat(self) -> ChatEngine:
        if self._chat is None:
            raise UserError("the engine handle is not connected: call connect() or use() first")
        return self._chat

    @property
    def info(self) -> EngineInfo:
        return self.chat.engine

    @property
    def admission(self) -> Admission | None:
        return self._admission

    async def aclose(self) -> None:
        """Close the client this handle made, then stop a launched engine (shielded; safe twice)."""
        with anyio.CancelScope(shield=True):
            client, self._client = self._client, None
            if client is not None:
                await client.aclose()
            if self.launcher is not None:
                self._report_exit()  # an engine that died unnoticed (no call after it) is still reported
                await self.launcher.aclose()

    # -- liveness ------------------------------------------------------------------------------

    async def death(self, error: BaseException, *, settle: float = 0.5) -> str | None:
        """Why this engine is dead after a call failed with ``error``, or None when it still
        serves (the rule: :meth:`squad.engine.session.EngineSession.death`)."""
        if self.launcher is not None and (why := await self._exited(settle)) is not None:
            return why
        if isinstance(error, EngineGone):
            return str(error)
        if isinstance(error, TruncatedStream):
            up: Callable[[], Awaitable[bool]] | None = getattr(self._chat, "engine_up", None)
            if up is not None and not await up():
                return f"not answering after a stream it served was cut ({error})"
        return None

    def exited(self) -> str | None:
        """``"engine exited (signal 9 SIGKILL), log: PATH"`` once the launched engine has ended by
        itself (reported as ``engine.exited``, once), else None."""
        return self._report_exit()

    async def _exited(self, settle: float = 0.5) -> str | None:
        """The client's hook when the engine stopped answering or cut a stream: :meth:`exited`,
        after waiting up to ``settle`` seconds for a process whose socket closed but that has not
        finished exiting yet."""
        assert self.launcher is not None
        with anyio.move_on_after(settle):
            while self.launcher.running:
                await anyio.sleep(0.05)
        return self._report_exit()

    def _report_exit(self) -> str | None:
        launcher = self.launcher
        status = launcher.exit_status() if launcher is not None else None
        if launcher is None or status is None:
            return None
        message = f"engine exited ({status}), log: {launcher.log_path}"
        if self._exit_reported != launcher.pid:
            self._exit_reported = launcher.pid
            self._emit(EngineExited(status=status, log_path=str(launcher.log_path), message=message,
                                    engine=launcher.base_url))
        return message

    async def restart(self) -> EngineInfo:
        """Restart a launched engine that died, with the same plan: the restart squad's client makes on its own
        (:meth:`_restart`), then the client and admission adopt what the new engine reports. Raises
        :class:`UserError` for an engine squad did not launch, and the launcher's errors."""
        if self.launcher is None:
            raise UserError("only an engine squad launched can be restarted")
        info = await self._restart()
        self._adopt(info)
        return info

    async def _restart(self) -> EngineInfo:
        """The client's restart hook after the engine died: same plan, new process."""
        assert self.launcher is not None
        await self._exited()
        info = await self.launcher.restart()
        if self.launcher.pid != self._restarted_pid:  # calls that overlapped share one restart: one event
            self._restarted_pid = self.launcher.pid
            self._emit(loaded_event(info, "restarted"))
        return info

    # -- reload --------------------------------------------------------------------------------

    async def reload(self, new: EnginePlan, *, drain_timeout: float = 30.0) -> bool:
        """Reload a launched engine with ``new`` (rule: :meth:`squad.engine.session.EngineSession.reload`)."""
        if self.launcher is None or self.plan is None:
            raise UserError("only an engine squad launched can be reloaded")
        admission = self._admission
        drain = (lambda: admission.drain(drain_timeout, hold=True)) if admission is not None else None
        try:
            changed = await self.launcher.reload(new, drain=drain, drain_timeout=drain_timeout)
        finally:
            self.plan = self.launcher.plan
            if self.launcher.info is not None:
                self._adopt(self.launcher.info)
            elif admission is not None:
                admission.resume()
        if changed:
            self._emit(loaded_event(self.info, "reloaded"))
        return changed

    async def replan(self, concurrent: Iterable[Call], *, why: str = "") -> bool:
        """Reload with a plan that holds ``concurrent`` at once, within this engine's share of the
        machine's KV memory (rule: :meth:`squad.engine.session.EngineSession.replan`)."""
        if self.launcher is None or self.plan is None:
            return False
        async with self._reload_lock:
            group = list(concurrent)
            new = plan_for_replan(self.plan, group, memory_for_kv=int(self._room(self.plan) * self.share))
            if new is None or new == self.plan:
                return False
            self._emit(EngineReplanning(from_slots=self.info.slots, to_slots=new.slots, n_ctx=new.n_ctx,
                                        agents=len(group)))
            return await self.reload(new)

    @staticmethod
    def _room(plan: EnginePlan) -> int:
        """Bytes the machine has for the KV cache of ``plan``'s model: RAM on the CPU, else the
        memory its offloaded layers' KV lives in (:func:`squad.sched.memory.kv_memory`)."""
        if plan.gpu_layers in (None, 0):  # the engine runs on the CPU: RAM, as planned
            return memory_for_kv(plan.model)
        layers = read_model_facts(plan.model).n_layer
        return kv_memory(plan.model, n_layer=layers, gpu_layers=cast("GpuLayers", plan.gpu_layers)).bytes

    def _adopt(self, info: EngineInfo) -> None:
        chat: Any = self.chat
        chat.engine = info
        if self._admission is not None:
            self._admission.adopt(info)

    def _loading(self, elapsed: float, timeout: float) -> None:
        """The launcher's progress hook while the model loads."""
        assert self.plan is not None
        self._emit(EngineLoading(model=Path(self.plan.model).name, elapsed_s=round(elapsed, 1),
                                 timeout_s=round(timeout, 1)))

    def _emit(self, event: Event) -> None:
        if self._emit_to is not None:
            self._emit_to(event)

"""Engines squad did not launch: :class:`AttachedEngine` (a server already running, at a URL or
as its :class:`~squad.engine.info.EngineInfo`) and :class:`GivenChat` (a
:class:`~squad.chat.ChatEngine` used as it is). Both are
:class:`~squad.engine.provider.EngineProvider` s."""

from __future__ import annotations

from dataclasses import dataclass, field

from squad.chat import ChatEngine
from squad.engine.control import attach
from squad.engine.info import EngineInfo
from squad.engine.provider import EngineHandle
from squad.engine.spec import EngineSpec
from squad.errors import UserError
from squad.events import EventSink
from squad.sched.workload import Node

__all__ = ["AttachedEngine", "GivenChat"]


@dataclass(frozen=True)
class AttachedEngine:
    """A running server of any kind (:mod:`squad.engine.kinds`): read back from ``spec.url``
    (:func:`squad.engine.control.attach`; ``spec.slots``/``ctx`` as capacity pins), or used as
    ``info`` reports it. Squad admits its calls (``spec.queue`` orders them) unless ``spec.admits``
    or the engine says it admits on its own. Never restarted. Raises :class:`UserError` when
    neither ``spec.url`` nor ``info`` is given, and the errors of attaching."""

    spec: EngineSpec = field(default_factory=EngineSpec)
    info: EngineInfo | None = None

    def __post_init__(self) -> None:
        if self.info is None and self.spec.url is None:
            raise UserError("attach to an engine by its url (EngineSpec(url=...)) or its EngineInfo")

    async def open(self, workload: Node | None, on_event: EventSink | None = None) -> EngineHandle:
        spec = self.spec
        if self.info is not None:
            info, reason = self.info, "given"
        else:
            assert spec.url is not None
            info, reason = await attach(spec.url, spec.api_key, slots=spec.slots, ctx=spec.ctx), "attached"
        handle = EngineHandle(reason, emit=on_event)
        return await handle.connect(info, admits=spec.admits, queue=spec.queue, request_timeout=spec.request_timeout)


@dataclass(frozen=True)
class GivenChat:
    """A :class:`~squad.chat.ChatEngine` used as it is (``squad.testing.ScriptedEngine``, a proxy):
    its own admission if it has one, left open when the squad closes."""

    chat: ChatEngine

    async def open(self, workload: Node | None, on_event: EventSink | None = None) -> EngineHandle:
        return EngineHandle("given", emit=on_event).use(self.chat)

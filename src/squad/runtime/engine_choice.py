"""How ``Squad(engine=..., engines=..., model=..., url=..., queue=...)`` becomes the squad's
session: one :class:`~squad.engine.session.EngineSession` (any engine source, a provider
included), or an :class:`~squad.chat.routing.EngineGroup` over several. Raises :class:`UserError`
for forms given together that exclude each other."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from squad.chat.routing import EngineGroup
from squad.engine.session import EngineSession, EngineSource, EngineSpec
from squad.errors import UserError
from squad.events import EventSink
from squad.sched.policy import DEFAULT_QUEUE
from squad.sched.workload import Node

__all__ = ["chosen_engine", "session_for", "renamed_hint", "MOVED"]

MOVED = {"plan": "Squad.session.plan", "launcher": "Squad.session.launcher",
          "admission": "Squad.session.admission", "client": "Squad.chat"}
"""Attributes earlier versions had on Squad, and where they are now."""


def chosen_engine(engine: Any, engines: Any, short: Mapping[str, Any], queue: str | None) -> Any:
    """``engine`` checked against the short forms (``short``: model, slots, ..., None where not
    given) and with ``queue`` applied to a spec. Raises :class:`UserError` for both forms, or a
    ``queue`` for an engine it cannot order."""
    if engine is not None and any(v is not None for v in short.values()):
        given = ", ".join(k for k, v in short.items() if v is not None)
        raise UserError(f"give the engine as engine=... or as short forms ({given}), not both")
    if queue is not None:
        if isinstance(engine, EngineSpec):
            return engine.but(queue=queue)
        if engine is not None or engines is not None:
            raise UserError("queue= orders the calls of the engine squad opens from short forms; for engine= "
                            "or engines= give EngineSpec(..., queue=...) instead")
    return engine


def session_for(engine: Any, engines: Any, short: Mapping[str, Any], queue: str | None, workload: Node,
                sink: EventSink | None) -> EngineSession | EngineGroup:
    """The session of a squad: ``engines=[...]`` (:func:`_several`), ``engine=`` (any
    :data:`~squad.engine.session.EngineSource`), else the spec the short forms make."""
    if engines is not None or isinstance(engine, (list, tuple)):
        return _several(engine, engines, short, workload, sink)
    source: EngineSource = engine if engine is not None else EngineSpec(**short, queue=queue or DEFAULT_QUEUE)
    return EngineSession(source, workload, on_event=sink)


def _several(engine: Any, engines: Any, short: Mapping[str, Any], workload: Node,
             sink: EventSink | None) -> EngineSession | EngineGroup:
    """The session for ``engines=[...]``: one engine alone is an ordinary session."""
    if isinstance(engine, (list, tuple)):
        raise UserError("engine= takes one engine: give several as engines=[...]")
    if engine is not None:
        raise UserError("give engine=... (one engine) or engines=[...] (several), not both")
    given = ", ".join(k for k, v in short.items() if v is not None)
    if given:
        raise UserError(f"give the engines as engines=[EngineSpec(...), ...] or as short forms ({given}), not both")
    if isinstance(engines, (str, bytes)) or not isinstance(engines, Sequence):
        raise UserError(f"engines= takes a list of EngineSpec, EngineInfo or ChatEngine, got {engines!r}")
    if len(engines) == 1:
        return EngineSession(engines[0], workload, on_event=sink)
    return EngineGroup(engines, workload, on_event=sink)


def renamed_hint(given: Mapping[str, Any]) -> str:
    names = ", ".join(f"{k}=" for k in given)
    engine = [k for k in given if k in ("binary", "request_timeout", "cache_type_k", "cache_type_v")]
    hint = (f"pass them in the engine spec: engine=EngineSpec({', '.join(f'{k}=...' for k in engine)}, ...)"
            if engine else "see help(Squad) for its arguments")
    return f"Squad() got unknown arguments {names}: {hint}"

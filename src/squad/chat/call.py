"""One call's state, shared by the layers of :class:`squad.chat.client.EngineClient`.

The outermost layer opens a :class:`Call` for a :class:`~squad.chat.ChatRequest` (:func:`opened`);
the layers under it find it with :func:`call_for` (a ``ContextVar``, so a layer of one's own put
between them passes it on untouched): the retrying layer counts attempts on it, the admitted layer
puts the attempt's count and reservation on it, the transport reads them. A layer used alone (no
call open for its request) gets a fresh :class:`Call`.
"""

from __future__ import annotations

import itertools
import time
from contextvars import ContextVar, Token
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from squad.chat import ChatRequest
from squad.chat.settle import Ending
from squad.events import Event, EventSink

if TYPE_CHECKING:
    from squad.sched.admission import Admission

__all__ = ["Call", "call_for", "opened", "emit"]

_IDS = itertools.count(1)
"""Call ids are unique in the process: ``c1``, ``c2``, ..."""

_CURRENT: ContextVar[Call | None] = ContextVar("squad_chat_call", default=None)


@dataclass(eq=False)
class Call:
    """One ``complete()`` call across its attempts; ``id`` is the call id its events carry."""

    request: ChatRequest
    id: str = field(default_factory=lambda: f"c{next(_IDS)}")
    started: float = field(default_factory=time.monotonic)
    attempts: int = 0
    restarted: bool = False
    first_loading: float | None = None
    overflows: int = 0
    gone: int = 0
    held: int = 0
    """The most tokens this process had reserved when the engine overflowed (F20 message)."""
    need: int = 0
    """This call's own reservation (prompt + max_tokens)."""
    # -- the current attempt, set by the admitted layer, read by the transport -----------------
    prompt: int | None = None
    """Counted prompt tokens (None: not counted yet)."""
    admission: Admission | None = None
    """The admission that reserved this attempt (None: none, or the endpoint admits on its own)."""
    upstream: bool = False
    """The endpoint admits on its own (squad serve): it is told who asks, and may queue the request."""
    slot: int = -1
    pin: int | None = None
    """The engine slot (``id_slot``) the call is sent to: the slot admission granted, which holds the
    conversation's prefix or a fan-out's restored one (:mod:`squad.sched.share`)."""
    shared: int = 0
    """Tokens of a fan-out's common prefix restored into the call's slot (0: none)."""
    ending: Ending = field(default_factory=Ending)

    @property
    def agent(self) -> str:
        return self.request.origin.agent


def call_for(request: ChatRequest) -> Call:
    """The call open for ``request`` (:func:`opened`), else a fresh one."""
    call = _CURRENT.get()
    return call if call is not None and call.request is request else Call(request)


class opened:
    """``with opened(request) as call``: open a :class:`Call` for ``request`` for the layers below,
    or take the one already open for it (then nothing is set: a layer costs a look-up)."""

    __slots__ = ("call", "_token")

    def __init__(self, request: ChatRequest) -> None:
        self.call = call_for(request)
        self._token: Token[Call | None] | None = None

    def __enter__(self) -> Call:
        if _CURRENT.get() is not self.call:
            self._token = _CURRENT.set(self.call)
        return self.call

    def __exit__(self, *exc: object) -> None:
        if self._token is not None:
            _CURRENT.reset(self._token)


def emit(sink: EventSink | None, kind: type[Event], call: Call, engine: str, **data: Any) -> None:
    """Send ``kind`` for ``call`` on ``engine`` (its base URL) to ``sink``; a failing sink is ignored
    (a display bug must not break a call)."""
    if sink is not None:
        origin = call.request.origin
        try:
            sink(kind(agent=origin.agent, conversation=origin.conversation, parent=origin.parent,
                      call=call.id, engine=engine, **data))
        except Exception:  # noqa: BLE001 - a display bug must not break a call
            pass

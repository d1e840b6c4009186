"""What the layers of :class:`squad.chat.client.EngineClient` pass one another, as arguments.

Nothing is shared on the side: the outermost layer gives the request its call id
(:func:`with_call_id`, the ``call`` field of :class:`~squad.chat.ChatRequest`); the retrying
layer keeps its attempts in a :class:`Call` of its own; the admitted layer hands the transport
what it counted and reserved as an :class:`Admitted` (``transport.send(request, admitted)``);
what goes back up travels on the result (``reserved_tokens``, ``slot``, ``shared_tokens``,
``attempts``) or on the error raised (``need`` and ``reserved`` of an overflow, ``attempts``).
A layer of one's own put between them sees only the request and the result.
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from squad.chat import ChatRequest
from squad.chat.settle import Ending
from squad.events import Event, EventSink

if TYPE_CHECKING:
    from squad.sched.admission import Admission

__all__ = ["Call", "Admitted", "new_call_id", "with_call_id", "emit"]

_IDS = itertools.count(1)
"""Call ids are unique in the process: ``c1``, ``c2``, ..."""


def new_call_id() -> str:
    """A fresh call id: ``c1``, ``c2``, ..."""
    return f"c{next(_IDS)}"


def with_call_id(request: ChatRequest, *, fresh: bool = False) -> ChatRequest:
    """``request`` with a call id: its own, or a new one when it has none (or ``fresh``)."""
    if request.call is not None and not fresh:
        return request
    return dataclasses.replace(request, call=new_call_id())


@dataclass(frozen=True)
class Admitted:
    """What the admitted layer hands the transport for one attempt (its argument, never shared).

    - ``prompt``: the counted prompt tokens (None: not counted; the transport counts);
    - ``admission``: the admission that reserved the attempt (None: none, or the endpoint admits);
    - ``upstream``: the endpoint admits on its own (squad serve): it is told who asks, and may queue it;
    - ``slot``: squad's slot of the reservation (-1: none); ``pin``: the engine slot (``id_slot``) the
      call is sent to (the granted one, holding the conversation's prefix or a fan-out's restored one);
    - ``ending``: how the attempt ended, read to release the reservation on the engine's word.
    """

    prompt: int | None = None
    admission: Admission | None = None
    upstream: bool = False
    slot: int = -1
    pin: int | None = None
    ending: Ending = field(default_factory=Ending)


@dataclass(eq=False)
class Call:
    """The retrying layer's record of one call across its attempts (its own, passed as an argument);
    ``id`` is the call id its events carry."""

    request: ChatRequest
    id: str = field(default_factory=new_call_id)
    started: float = field(default_factory=time.monotonic)
    attempts: int = 0
    restarted: bool = False
    first_loading: float | None = None
    overflows: int = 0
    gone: int = 0
    held: int = 0
    """The most tokens this process had reserved when the engine overflowed (F20 message)."""
    need: int = 0
    """This call's own reservation (prompt + max_tokens), from the overflow error."""

    @property
    def agent(self) -> str:
        return self.request.origin.agent


def emit(sink: EventSink | None, kind: type[Event], request: ChatRequest | Call, engine: str, **data: Any) -> None:
    """Send ``kind`` for the call of ``request`` on ``engine`` (its base URL) to ``sink``; a failing sink is
    ignored (a display bug must not break a call)."""
    if sink is not None:
        call = request.id if isinstance(request, Call) else request.call
        origin = request.request.origin if isinstance(request, Call) else request.origin
        try:
            sink(kind(agent=origin.agent, conversation=origin.conversation, parent=origin.parent,
                      call=call, engine=engine, **data))
        except Exception:  # noqa: BLE001 - a display bug must not break a call
            pass

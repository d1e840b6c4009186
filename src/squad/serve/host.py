"""What the request paths of squad serve need of its gateway, as protocols.

:class:`squad.serve.gateway.Gateway` satisfies each; the modules that take one (``relay``, ``fanout``, ``watch``,
``apis``) import these, not the gateway, which imports them: the data path stays one-way, type-only imports included.
"""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any, Protocol

from squad.serve.apis import Api, Counting

if TYPE_CHECKING:
    import httpx

    from squad.chat.settle import Ending
    from squad.events import Event
    from squad.sched.admission import Admission
    from squad.sched.room import Reservation
    from squad.serve.demand import Kind
    from squad.serve.programs import Program, Programs
    from squad.serve.shares import ClientQueue
    from squad.serve.status import Ledger, Live

__all__ = ["Counting", "RelayHost", "Watched", "Fanned"]


class Watched(Protocol):
    """What squad serve's live view reads of the gateway."""

    ledger: Ledger
    """Where each request stands (counting, queued, running), for ``/squad/status`` and the live view."""
    reloading: bool
    """Whether the engine is being reloaded (a replan)."""

    @property
    def admission(self) -> Admission: ...

    def engine_state(self) -> tuple[str, str]:
        """``(state, detail)``: ``up``, ``restarting``, ``down`` (:mod:`squad.serve.keeper`), ``stopping``."""
        ...


class RelayHost(Counting, Protocol):
    """What a relay needs of squad serve's gateway (:class:`squad.serve.gateway.Gateway` is one): its counting,
    admission and engine, and these. A protocol, so that this module does not import the gateway, which imports it."""

    ledger: Ledger
    """Where each request stands (queued, running, done), for ``/squad/status``."""
    shares: ClientQueue
    """The queue between clients (:mod:`squad.serve.shares`)."""
    programs: Programs
    """The programs seen lately (:mod:`squad.serve.programs`), for ``/squad/status``."""
    max_queue_wait: float | None
    """Seconds a request may wait in the queue before it gets 503 with ``Retry-After`` (None: no limit)."""
    early_after: float | None
    """Seconds a stream waits before its answer starts early (:mod:`squad.serve.early`)."""
    keepalive_every: float | None
    """Seconds between two keep-alives of a waiting stream."""

    @property
    def pins(self) -> bool:
        """Whether requests are pinned (``id_slot``) to the slot admission granted."""
        ...

    @property
    def observed(self) -> bool:
        """Whether an event sink listens."""
        ...

    def generation_upstream(self) -> httpx.AsyncClient:
        """The HTTP client one generation request goes through."""
        ...

    async def engine_back(self) -> bool:
        """After a connection to the engine failed: True when the engine had died and was restarted (send again)."""
        ...

    async def engine_exited(self) -> bool:
        """After an answer broke off: True when the engine's process had exited (squad serve restarts it)."""
        ...

    def until_engine_free(self, held: Reservation) -> AbstractAsyncContextManager[Ending]:
        """Wraps the engine round trip of an admitted request; releases ``held`` when the engine's slot is free."""
        ...

    def emit(self, event: Event) -> None:
        """Hands ``event`` to the gateway's sinks."""
        ...



class Fanned(Protocol):
    """What a fan-out (several completions of one request) reads of the relay that holds the request."""

    g: RelayHost
    live: Live
    scope: dict[str, Any]
    body: dict[str, Any]
    kind: Kind
    api: Api
    """The request's API (:mod:`squad.serve.apis`)."""
    big: bool
    """Whether its body is large enough to be counted off the event loop."""
    program: Program | None
    """The program it belongs to (:mod:`squad.serve.programs`)."""

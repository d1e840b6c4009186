"""Release a reservation only when the engine's slot is really free.

A request can end on squad's side while the engine still works on it: its client left, it was
cancelled or timed out, the connection broke. squad then closes the connection, and llama-server
(b11434) stops the task once it notices: a streamed answer at its next token (it looks at the
socket before each one: cpp-httplib's ``is_socket_alive``, a zero-time ``select`` and a
``MSG_PEEK`` read), otherwise only after a whole ``HTTP_POLLING_SECONDS`` = 1 s without any result
of any task (``server_response::recv_with_timeout`` in ``tools/server/server-queue.cpp``), which
is why squad serve streams every request from llama-server (:mod:`squad.serve.assemble`). The
task is stopped between two decode steps. Until then it holds its slot and its KV cells, so squad
must go on counting them.

:func:`until_engine_free` wraps the part of a ``reserve()`` block that talks to the engine. A
request that never reached the engine, or whose answer was read to its end (an error answer
included), is released as before. Any other end keeps the reservation counted (``settling``)
until a ``/slots`` read shows the engine processing no more slots than squad holds live (not
settling) reservations on it. ``/slots`` names tasks, not clients, so that read is taken only
once the engine had time to notice: at once when it had started answering (its task was
running, it stops at its next write), else :data:`ENGINE_NOTICE_S` after the close (a request
the engine had not picked up yet is picked up and stopped within it). An engine without
``/slots`` (vLLM, Ollama, SGLang, ...) gets :data:`ENGINE_NOTICE_S`. One that never shows the
slot free (another program uses it directly) is given up on after :data:`SETTLE_TIMEOUT`
(:data:`CALL_SETTLE_TIMEOUT` for squad's own client) with an ``engine.warning``. An engine that stopped answering holds
nothing.
"""

from __future__ import annotations

import math
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

import anyio
import httpx

from squad.events import EngineWarning, EventSink

if TYPE_CHECKING:
    from squad.sched.admission import Admission, Reservation

__all__ = ["EngineSlots", "Ending", "until_engine_free", "ENGINE_NOTICE_S", "SETTLE_TIMEOUT", "CALL_SETTLE_TIMEOUT",
           "SETTLE_POLL_S"]

ENGINE_NOTICE_S = 1.5
"""Seconds llama-server may take to notice a closed connection of a request it is not streaming
(it looks every 1 s), plus a margin."""
SETTLE_POLL_S = 1.25
"""Seconds between ``/slots`` reads while a reservation settles: more than a second, because each
read wakes every llama-server HTTP thread waiting for a result and starts its 1 s wait again, and
only a wait that runs out makes it look at its connection (:mod:`squad.serve.assemble`); reading
more often kept a stalled engine from noticing clients that had left (measured)."""
SETTLE_TIMEOUT = 60.0
"""Seconds a settling reservation is kept at most (then released, with an ``engine.warning``)."""
CALL_SETTLE_TIMEOUT = 10.0
"""The same for squad's own client, whose cancelled call waits for it (a fail-fast sibling, Ctrl-C):
llama-server lets go within about a second, so only an engine other programs also use waits this long."""
READ_TIMEOUT = 5.0
"""Seconds for one ``/slots`` read."""


class _Gone(Exception):
    """The engine does not answer at all: it holds nothing."""


class EngineSlots:
    """An engine's ``/slots``, read for everyone settling on it: one read at a time, and a caller
    that needs a read taken after time T shares one that started after T.

    ``client``: returns the ``httpx.AsyncClient`` for the engine (base URL and key set; a
    function, so a reload to a new URL is followed). :meth:`close` ends every wait at once
    (squad shuts down: its connections are closed, the engine stops what they asked).
    """

    def __init__(self, client: Callable[[], httpx.AsyncClient]) -> None:
        self._client = client
        self._lock = anyio.Lock()
        self._read_at = -math.inf
        self._busy: int | None = None
        self._gone = False
        self.closed = False

    def close(self) -> None:
        self.closed = True

    async def busy(self, after: float) -> int | None:
        """Slots processing (``is_processing``) in a read started at or after ``after``
        (``time.monotonic()`` seconds); None when the engine has no ``/slots`` (404, 501) or
        refuses it. Raises :class:`_Gone` when nothing answers."""
        async with self._lock:
            if self._read_at < after:
                started = time.monotonic()
                self._busy, self._gone = await self._read()
                self._read_at = started
            if self._gone:
                raise _Gone
            return self._busy

    async def _read(self) -> tuple[int | None, bool]:
        try:
            r = await self._client().get("/slots", timeout=READ_TIMEOUT)
        except (httpx.ConnectError, httpx.RemoteProtocolError):
            return None, True
        except httpx.HTTPError:  # slow (a long prefill batch on a busy machine): try again
            return self._busy if self._busy is not None else 1 << 30, False
        if r.status_code == 503:  # loading: the engine restarted, its old tasks are gone
            return None, True
        if r.status_code != 200:
            return None, False
        try:
            return sum(1 for s in r.json() if isinstance(s, dict) and s.get("is_processing")), False
        except ValueError:
            return None, False


@dataclass
class Ending:
    """How a request to the engine went, told to :func:`until_engine_free` by its caller."""

    sent_at: float | None = None
    """``time.monotonic()`` when the request was handed to the connection (None: never sent)."""
    answering: bool = False
    """The engine began its answer (status line received): its task was running."""
    ended: bool = False
    """The engine's answer was read to its end (an error answer included): its task is over."""

    def sent(self) -> None:
        self.sent_at = self.sent_at or time.monotonic()

    def started(self) -> None:
        self.answering = True

    def done(self) -> None:
        self.ended = True


@asynccontextmanager
async def until_engine_free(admission: Admission | None, reservation: Reservation, slots: EngineSlots | None, *,
                            on_event: EventSink | None = None, timeout: float = SETTLE_TIMEOUT,
                            ) -> AsyncIterator[Ending]:
    """Use inside ``async with admission.reserve(...) as reservation:`` around the request; tell
    the yielded :class:`Ending` when it was sent, when the answer began and when it was read to
    its end. On leaving (however: return, error, cancel) a request that was sent and not read to
    its end keeps ``reservation`` counted (``reservation.settling``) until the engine's slot is
    free (module docstring), shielded from cancellation, at most ``timeout`` seconds; then the
    ``reserve()`` block releases it. ``admission`` None (an engine that admits on its own) or
    ``slots`` None: nothing to wait for. Never raises on its own."""
    ending = Ending()
    try:
        yield ending
    finally:
        if admission is not None and slots is not None and ending.sent_at is not None and not ending.ended:
            with anyio.CancelScope(shield=True):
                await _settle(admission, reservation, slots, ending, on_event, timeout)


async def _settle(admission: Admission, reservation: Reservation, slots: EngineSlots, ending: Ending,
                  on_event: EventSink | None, timeout: float) -> None:
    reservation.settling = True
    closed = time.monotonic()
    earliest = closed if ending.answering else closed + ENGINE_NOTICE_S
    with anyio.move_on_after(timeout) as bounded:
        while not slots.closed:
            now = time.monotonic()
            if now < earliest:
                await anyio.sleep(min(earliest - now, SETTLE_POLL_S))
                continue
            try:
                busy = await slots.busy(after=max(earliest, now - SETTLE_POLL_S / 2))
            except _Gone:
                return
            if busy is None:  # no /slots to read: the engine had ENGINE_NOTICE_S
                await anyio.sleep(max(0.0, closed + ENGINE_NOTICE_S - time.monotonic()))
                return
            if busy <= admission.in_flight - admission.settling:
                return
            await anyio.sleep(SETTLE_POLL_S)
    if bounded.cancelled_caught and on_event is not None:
        try:
            on_event(EngineWarning(
                agent=reservation.agent, call=reservation.call, engine=admission.engine,
                warning=(f"the engine still showed more slots processing than squad's requests {timeout:.0f} s after "
                         f"call {reservation.call or '?'} ended on squad's side; its {reservation.tokens} reserved "
                         "tokens are released now. If another program sends requests to this engine directly, "
                         "send them through squad serve instead")))
        except Exception:  # noqa: BLE001 - a display bug must not break admission
            pass

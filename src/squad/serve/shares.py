"""Fair shares and caps between the clients of ``squad serve``: a queue policy over squad's own.

Each client (its key's label, ``--client-key NAME=KEY``, else the name it gives, :func:`squad.serve.http.client_name`)
has its own queue, ordered by squad's policy (``program`` by default: its programs by least attained service, a
program's main thread before its sub-agents, :mod:`squad.serve.programs`). Between clients :class:`ClientQueue`
decides first:

- **Order**: the client with the fewest requests running goes first, then the one whose requests have held slots
  least (seconds), then the one waiting longest.
- **Caps** (``--client-limit NAME=slots:2,pool:50%``; ``*`` for every client not named): a client at its
  ``slots`` requests running, or whose next request would take its reserved cells past ``pool`` (a share of the
  pool), waits; the others go.
- **Bound** (the default fairness rule): a request of a client with nothing running waits at most until one
  running request ends, when it fits the pool's free room then (a client with nothing running is first in order;
  ties among such clients go by service, then arrival). When it does not fit, the requests of other clients may
  pass it at most ``max_bypass`` (8) times; then nothing else is admitted until it fits. So one client's flood
  (any number of requests, programs or priorities) delays another client's first request by at most one running
  request's end, or eight admissions more when its reservation is larger than the free room.

The per-client queue is any :class:`~squad.sched.policy.QueuePolicy` (squad serve's ``--queue``); ``X-Squad-Priority``
orders a client's own requests only, never one client's before another's.
"""

from __future__ import annotations

import math
import re
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from squad.errors import UserError
from squad.sched.room import Room

if TYPE_CHECKING:
    from squad.sched.policy import QueuePolicy
    from squad.sched.room import Reservation, Waiting

__all__ = ["ClientLimit", "ClientQueue", "parse_client_limit", "client_limits", "EVERY_CLIENT"]

EVERY_CLIENT = "*"
"""The name in ``--client-limit`` for every client not named on its own."""
KEPT_IDLE = 256
"""Idle clients whose service ClientQueue remembers (the least recently seen forgotten first)."""


@dataclass(frozen=True)
class ClientLimit:
    """A client's caps: ``slots`` requests running at once, ``pool`` share (0 < pool <= 1) of the KV pool its
    running requests may reserve. None: no cap."""

    slots: int | None = None
    pool: float | None = None

    def text(self) -> str:
        parts = ([f"slots:{self.slots}"] if self.slots is not None else []) + (
            [f"pool:{self.pool * 100:g}%"] if self.pool is not None else [])
        return ",".join(parts) or "none"


_EXAMPLE = "write NAME=slots:N,pool:P% (e.g. --client-limit crawler=slots:2,pool:50%; * for every other client)"


def parse_client_limit(text: str) -> tuple[str, ClientLimit]:
    """``NAME=slots:2,pool:50%`` as ``(NAME, ClientLimit)``; ``pool`` also as a fraction (``0.5``). Raises
    :class:`~squad.errors.UserError` naming what is wrong."""
    name, eq, spec = text.partition("=")
    name = name.strip()
    if not eq or not name or not spec.strip():
        raise UserError(f"--client-limit {text!r}: {_EXAMPLE}")
    slots: int | None = None
    pool: float | None = None
    for part in spec.split(","):
        key, colon, value = part.partition(":")
        key, value = key.strip().lower(), value.strip()
        if not colon or key not in ("slots", "pool") or not value:
            raise UserError(f"--client-limit {text!r}: {part.strip()!r} is not slots:N or pool:P%; {_EXAMPLE}")
        if key == "slots":
            if not re.fullmatch(r"\d+", value) or int(value) < 1:
                raise UserError(f"--client-limit {text!r}: slots must be a whole number of 1 or more, got {value!r}")
            slots = int(value)
        else:
            try:
                share = float(value[:-1]) / 100 if value.endswith("%") else float(value)
            except ValueError:
                share = math.nan
            if not 0 < share <= 1:
                raise UserError(f"--client-limit {text!r}: pool must be a share above 0 up to 100% (or 1), "
                                f"got {value!r}")
            pool = share
    return name, ClientLimit(slots=slots, pool=pool)


def client_limits(items: list[str] | tuple[str, ...] | None) -> dict[str, ClientLimit]:
    """Each ``--client-limit`` parsed (:func:`parse_client_limit`); a name given twice is an error."""
    out: dict[str, ClientLimit] = {}
    for item in items or ():
        name, limit = parse_client_limit(item)
        if name in out:
            raise UserError(f"--client-limit: {name!r} is given twice")
        out[name] = limit
    return out


class _Client:
    __slots__ = ("queue", "running", "cells", "service", "granted")

    def __init__(self, queue: QueuePolicy) -> None:
        self.queue = queue
        self.running = 0
        self.cells = 0
        self.service = 0.0
        self.granted = 0


class ClientQueue:
    """The queue policy of squad serve: one inner policy per client, clients in the order of the module
    docstring. ``inner`` makes a client's queue; ``client`` names the client of a reservation (its origin's
    agent); ``limits`` maps client names (or :data:`EVERY_CLIENT`) to their :class:`ClientLimit`.

    Cost per operation, c clients waiting: ``add``/``remove`` the inner policy's; ``pick`` O(c log c) plus the
    inner picks of the clients it looks at (each client at most once); ``served`` the inner's plus O(1)."""

    def __init__(self, inner: Callable[[], QueuePolicy], *, limits: dict[str, ClientLimit] | None = None,
                 client: Callable[[Reservation], str] = lambda r: r.origin.agent, max_bypass: int = 8) -> None:
        if max_bypass < 0:
            raise ValueError(f"max_bypass must be 0 or more, got {max_bypass}")
        self._inner, self._client_of = inner, client
        self.limits = dict(limits or {})
        self.max_bypass = max_bypass
        self.name = f"clients+{inner().name}"
        self._clients: OrderedDict[str, _Client] = OrderedDict()
        self._of: dict[int, str] = {}  # seq -> client of a waiting call
        self._first: dict[str, int] = {}  # client -> seq of the call that ended its last idle time (it waits since)
        self._passed: tuple[str, int] | None = None  # (client, times) the first client in order was passed
        self.admitted = 0
        """Calls granted so far, all clients."""
        self._watched: dict[str, tuple[int, int | None]] = {}  # call id -> granted_to_others at watch, at grant

    # -- the books -----------------------------------------------------------------------

    def limit(self, client: str) -> ClientLimit:
        """The caps of ``client`` (its own, else :data:`EVERY_CLIENT`'s, else none)."""
        return self.limits.get(client) or self.limits.get(EVERY_CLIENT) or ClientLimit()

    def _book(self, name: str) -> _Client:
        book = self._clients.get(name)
        if book is None:
            book = self._clients[name] = _Client(self._inner())
            self._forget()
        else:
            self._clients.move_to_end(name)
        return book

    def _forget(self) -> None:
        idle = [n for n, b in self._clients.items() if not b.running and not len(b.queue)]  # type: ignore[arg-type]
        for name in idle[:max(0, len(self._clients) - KEPT_IDLE)]:
            del self._clients[name]

    def add(self, waiting: Waiting) -> None:
        name = self._client_of(waiting.reservation)
        book = self._book(name)
        book.queue.add(waiting)
        self._of[waiting.seq] = name
        if name not in self._first:
            self._first[name] = waiting.seq

    def remove(self, waiting: Waiting) -> bool:
        name = self._of.get(waiting.seq)
        if name is None:
            return False
        book = self._clients[name]
        if not book.queue.remove(waiting):
            return False
        del self._of[waiting.seq]
        self._left(name, book)
        return True

    def _left(self, name: str, book: _Client) -> None:
        if not len(book.queue):  # type: ignore[arg-type]
            self._first.pop(name, None)

    def served(self, reservation: Reservation, held_s: float) -> None:
        name = self._client_of(reservation)
        book = self._clients.get(name)
        if book is None:
            return
        book.running = max(0, book.running - 1)
        book.cells = max(0, book.cells - reservation.tokens)
        book.service += max(0.0, held_s)
        book.queue.served(reservation, held_s)

    # -- the order -----------------------------------------------------------------------

    def _key(self, name: str) -> tuple[int, float, int]:
        book = self._clients[name]
        return (book.running, book.service, self._first.get(name, 0))

    def waiting_clients(self) -> list[str]:
        """Clients with calls waiting, in the order they are asked."""
        return sorted((n for n in self._first), key=self._key)

    def capped(self, name: str, reservation: Reservation | None, pool: int) -> str | None:
        """Why ``name`` may not start ``reservation`` now (its cap), or None."""
        book, limit = self._clients[name], self.limit(name)
        if limit.slots is not None and book.running >= limit.slots:
            return f"its cap of {limit.slots} requests at once"
        if limit.pool is not None and reservation is not None and book.cells + reservation.tokens > limit.pool * pool:
            return f"its cap of {limit.pool * 100:g}% of the pool"
        return None

    def pick(self, fits: Callable[[Reservation], bool]) -> Waiting | None:
        pool = fits.pool if isinstance(fits, Room) else 0
        head: str | None = None
        for name in self.waiting_clients():
            book, limit = self._clients[name], self.limit(name)
            if limit.slots is not None and book.running >= limit.slots:
                continue  # at its cap: the others go
            share = limit.pool * pool if limit.pool is not None and pool else math.inf

            def mine(r: Reservation, _book: _Client = book, _share: float = share) -> bool:
                return _book.cells + r.tokens <= _share and fits(r)

            room = (Room(mine, free=fits.free, pool=fits.pool, slots=fits.slots, running=fits.running)
                    if isinstance(fits, Room) else mine)
            if head is None:
                head = name
                if self._passed is not None and self._passed[0] == name and self._passed[1] >= self.max_bypass:
                    chosen = book.queue.pick(room)  # passed enough: it goes, or nothing does
                    return self._granted(name, book, chosen) if chosen is not None else None
            chosen = book.queue.pick(room)
            if chosen is not None:
                if name != head:
                    times = self._passed[1] if self._passed is not None and self._passed[0] == head else 0
                    self._passed = (head, times + 1) if head is not None else None
                return self._granted(name, book, chosen)
        return None

    def _granted(self, name: str, book: _Client, waiting: Waiting) -> Waiting:
        self._of.pop(waiting.seq, None)
        book.running += 1
        book.cells += waiting.reservation.tokens
        book.granted += 1
        self.admitted += 1
        call = waiting.reservation.call
        if call is not None and call in self._watched:
            self._watched[call] = (self._watched[call][0], self.granted_to_others(name))
        if self._passed is not None and self._passed[0] == name:
            self._passed = None
        self._left(name, book)
        return waiting

    def granted_to_others(self, name: str) -> int:
        """Calls granted so far to clients other than ``name`` (a request's difference over its wait: how many
        requests of other clients went before it)."""
        book = self._clients.get(name)
        return self.admitted - (book.granted if book is not None else 0)

    def watch(self, call: str, client: str) -> None:
        """Count, for call id ``call`` of ``client``, the calls of other clients granted from now until its own
        grant (read it with :meth:`passed`)."""
        self._watched[call] = (self.granted_to_others(client), None)

    def passed(self, call: str) -> int:
        """Calls of other clients granted between :meth:`watch` and the grant of ``call`` (0 when it was not
        granted); forgets ``call``."""
        before, at = self._watched.pop(call, (0, None))
        return at - before if at is not None else 0

    def wake_in(self) -> float | None:
        times = [w() for b in self._clients.values() if (w := getattr(b.queue, "wake_in", None)) is not None]
        found = [t for t in times if t is not None]
        return min(found) if found else None

    def ordered(self) -> list[Waiting]:
        return [w for name in self.waiting_clients() for w in self._clients[name].queue.ordered()]

    def __len__(self) -> int:
        return len(self._of)

    # -- views ---------------------------------------------------------------------------

    def view(self, pool: int) -> list[dict[str, Any]]:
        """Per client: requests running and waiting, cells reserved, share of the pool, seconds held, its caps."""
        return [{"client": name, "running": b.running, "queued": len(b.queue),  # type: ignore[arg-type]
                 "reserved": b.cells, "pool_share": round(b.cells / pool, 3) if pool else 0.0,
                 "held_s": round(b.service, 3), "admitted": b.granted, "limit": self.limit(name).text()}
                for name, b in self._clients.items()]

"""What ``squad serve`` is doing: the requests it holds and per-client counts, for
``/squad/status`` and for re-planning (:mod:`squad.serve.replan`).

A client is named by the ``X-Squad-Client`` header, else the OpenAI ``user`` field of the
request, else the peer's address. Times are ``time.monotonic()`` seconds; tokens are KV cells.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, Protocol

__all__ = ["Live", "ClientCounts", "Ledger", "Peaks", "LedgerListener", "Outcome", "RECENT"]

State = Literal["counting", "queued", "running"]
Outcome = Literal["completed", "refused", "failed", "disconnected"]

MAX_CLIENTS = 256
"""Client names /squad/status keeps counts for; later names count together."""
OTHER_CLIENTS = "(other)"
RECENT = 50
"""Ended requests /squad/status keeps (newest first), for the live page (:mod:`squad.serve.page`)."""


@dataclass
class Live:
    """One request squad serve holds: ``id`` (``r17``), ``client``, ``tokens`` reserved or
    asked, ``priority``, ``state`` and since when (``since``), and its admission ``slot`` once running."""

    id: str
    client: str
    priority: int
    tokens: int = 0
    state: State = "counting"
    since: float = field(default_factory=time.monotonic)
    slot: int = -1
    stream: bool = False
    api: str = ""
    """The API it came through (``chat``, ``completion``, ``responses``, ``messages``, ``embeddings``)."""
    opened: float = field(default_factory=time.monotonic)
    """When squad serve received it (``since`` restarts at each state)."""
    queued_s: float | None = None
    """Seconds it waited in the queue, once admitted."""


class LedgerListener(Protocol):
    """Told of each request's moves (squad serve's metrics, :mod:`squad.serve.metrics`); called on the event loop,
    so each must return at once."""

    def opened(self, live: Live) -> None:
        """``live`` was received (its body read and parsed)."""
        ...

    def moved(self, live: Live, before: State) -> None:
        """``live`` went from ``before`` to ``live.state`` (``live.queued_s`` is set once it left the queue)."""
        ...

    def closed(self, live: Live, before: State, outcome: Outcome) -> None:
        """``live`` ended, in state ``before``, with ``outcome``."""
        ...


@dataclass
class ClientCounts:
    """One client's requests since squad serve started: ``requests`` received, ``completed``
    (the engine's answer was relayed to the end), ``refused`` (answered by squad serve with 400:
    can never fit, bad request), ``failed`` (the engine answered an error or broke off),
    ``disconnected`` (the client left first), and now ``queued``/``running``."""

    requests: int = 0
    completed: int = 0
    refused: int = 0
    failed: int = 0
    disconnected: int = 0
    queued: int = 0
    running: int = 0
    reserved: int = 0
    """Tokens its running requests hold now."""


@dataclass
class Peaks:
    """The most requests wanting a slot at once (running + queued) and the most tokens they
    wanted together, since the last :meth:`Ledger.reset_peaks`."""

    requests: int = 0
    tokens: int = 0


class Ledger:
    """The live requests and the counts per client (one per server; not thread-safe: the
    server's event loop only)."""

    def __init__(self) -> None:
        self.live: dict[str, Live] = {}
        self.clients: dict[str, ClientCounts] = {}
        self.peaks = Peaks()
        self.started = time.monotonic()
        self.recent: deque[dict[str, Any]] = deque(maxlen=RECENT)
        """The last :data:`RECENT` ended requests, oldest first (``ended``: ``time.monotonic()``)."""
        self.listeners: list[LedgerListener] = []

    def counts(self, client: str) -> ClientCounts:
        """``client``'s counts; past :data:`MAX_CLIENTS` names, new ones count under ``(other)``
        (a client picks its own name: the table must not grow without bound)."""
        if client not in self.clients and len(self.clients) >= MAX_CLIENTS:
            client = OTHER_CLIENTS
        return self.clients.setdefault(client, ClientCounts())

    def open(self, live: Live) -> None:
        self.live[live.id] = live
        self.counts(live.client).requests += 1
        for listener in self.listeners:
            listener.opened(live)

    def move(self, live: Live, state: State, *, tokens: int | None = None, slot: int = -1) -> None:
        counts = self.counts(live.client)
        before, now = live.state, time.monotonic()
        if before == "queued" and state == "running":
            live.queued_s = now - live.since
        self._leave(live, counts)
        live.state, live.since, live.slot = state, now, slot
        if tokens is not None:
            live.tokens = tokens
        if state == "queued":
            counts.queued += 1
        elif state == "running":
            counts.running += 1
            counts.reserved += live.tokens
        self._observe()
        for listener in self.listeners:
            listener.moved(live, before)

    def close(self, live: Live, outcome: Outcome) -> None:
        if self.live.pop(live.id, None) is None:
            return
        counts = self.counts(live.client)
        before, now = live.state, time.monotonic()
        self._leave(live, counts)
        setattr(counts, outcome, getattr(counts, outcome) + 1)
        self.recent.append({"id": live.id, "client": live.client, "api": live.api, "stream": live.stream,
                            "outcome": outcome, "left_while": before if outcome == "disconnected" else None,
                            "tokens": live.tokens, "slot": live.slot,
                            "queued_s": None if live.queued_s is None else round(live.queued_s, 3),
                            "total_s": round(now - live.opened, 3), "ended": now})
        for listener in self.listeners:
            listener.closed(live, before, outcome)

    def reset_peaks(self) -> Peaks:
        """The peaks so far; starts new ones from what is held now."""
        peaks, self.peaks = self.peaks, Peaks()
        self._observe()
        return peaks

    def wanting(self) -> tuple[int, int]:
        """``(requests, tokens)`` queued or running now."""
        held = [r for r in self.live.values() if r.state in ("queued", "running")]
        return len(held), sum(r.tokens for r in held)

    def view(self) -> dict[str, Any]:
        """The ledger as JSON-ready data (times as ages in seconds)."""
        now = time.monotonic()

        def row(r: Live) -> dict[str, Any]:
            return {"id": r.id, "client": r.client, "tokens": r.tokens, "priority": r.priority, "slot": r.slot,
                    "stream": r.stream, "api": r.api, "for_s": round(now - r.since, 3)}

        return {
            "running": [row(r) for r in self.live.values() if r.state == "running"],
            "queued": [row(r) for r in self.live.values() if r.state == "queued"],
            "counting": len([r for r in self.live.values() if r.state == "counting"]),
            "clients": {name: asdict(c) for name, c in self.clients.items()},
            "peaks": asdict(self.peaks),
            "recent": [{**{k: v for k, v in r.items() if k != "ended"}, "ago_s": round(now - r["ended"], 1)}
                       for r in reversed(self.recent)],
            "uptime_s": round(now - self.started, 1),
        }

    @staticmethod
    def _leave(live: Live, counts: ClientCounts) -> None:
        if live.state == "queued":
            counts.queued -= 1
        elif live.state == "running":
            counts.running -= 1
            counts.reserved -= live.tokens
        live.state = "counting"

    def _observe(self) -> None:
        requests, tokens = self.wanting()
        self.peaks.requests = max(self.peaks.requests, requests)
        self.peaks.tokens = max(self.peaks.tokens, tokens)

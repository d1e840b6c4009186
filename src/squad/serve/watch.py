"""``squad serve --watch``: the live view of what squad serve holds, drawn from its own books
(the :class:`~squad.serve.status.Ledger` and :class:`~squad.sched.admission.Admission`), so it shows
what ``/squad/status`` says: a request whose client left is gone at once.

It shows the URL and key clients use, the engine's slots and pool, one row per live request
(client, API, what it waits for and for how long, tokens reserved) and one row per client
(counts since start). On a terminal a rich ``Live`` redraws 4 times a second; elsewhere one
summary line is printed every :data:`PLAIN_EVERY` seconds while something is held.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

if TYPE_CHECKING:
    from squad.serve.host import Watched
    from squad.serve.status import Live as Held

__all__ = ["ServeWatch", "waits_for", "PLAIN_EVERY"]

PLAIN_EVERY = 5.0
"""Seconds between two summary lines when the output is not a terminal."""


def waits_for(gateway: Watched, held: Held) -> str:
    """What a live request waits for, in words: ``counting the prompt``, ``a slot (all 4 busy)``,
    ``pool room (needs 700, 312 free)``, ``its turn (#3 in the queue)``, ``the engine's reload``,
    or ``running on slot 2``."""
    if held.state == "counting":
        return "counting the prompt"
    if held.state == "running":
        return f"running on slot {held.slot}"
    admission = gateway.admission
    if gateway.reloading:
        return "the engine's reload (a replan)"
    if gateway.engine_state()[0] == "restarting":
        return "the engine's restart (it died)"
    order = [call for call, _ in admission.queued_calls]
    position = order.index(held.id) if held.id in order else 0
    if position > 0:
        return f"its turn (#{position + 1} in the queue)"
    if admission.in_flight >= admission.slots:
        return f"a slot (all {admission.slots} busy)"
    free = admission.pool - admission.reserved
    if held.tokens > free:
        return f"pool room (needs {held.tokens:,}, {free:,} free)"
    return "admission"


class ServeWatch:
    """The live view of one :class:`~squad.serve.gateway.Gateway`; a context manager.

    ``header``: the lines shown above the tables (the URL and key line first)."""

    def __init__(self, gateway: Watched, header: list[str], *, console: Console | None = None,
                 live: bool | None = None) -> None:
        self.gateway, self.header = gateway, header
        self.console = console or Console(stderr=True)
        self.live_mode = self.console.is_terminal if live is None else live
        self._live: Live | None = None
        self._printed = 0.0

    def __enter__(self) -> ServeWatch:
        if self.live_mode:
            self._live = Live(self, console=self.console, refresh_per_second=4, transient=False)
            self._live.__enter__()
        else:
            for line in self.header:
                self.console.print(line, markup=False, highlight=False, soft_wrap=True)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            self._live.__exit__(None, None, None)
            self._live = None

    def tick(self) -> None:
        """Print the summary line when not on a terminal (call it about once a second)."""
        now = time.monotonic()
        quiet = not self.gateway.ledger.live and self.gateway.engine_state()[0] == "up"
        if self.live_mode or now - self._printed < PLAIN_EVERY or quiet:
            return
        self._printed = now
        self.console.print(self.summary(), markup=False, highlight=False, soft_wrap=True)

    def summary(self) -> str:
        """One line: slots busy, pool reserved, requests queued and counting; the engine's state when it is not up
        (restarting after it died, down, squad serve stopping: :mod:`squad.serve.keeper`)."""
        a = self.gateway.admission
        rows = list(self.gateway.ledger.live.values())
        queued = sum(1 for r in rows if r.state == "queued")
        counting = sum(1 for r in rows if r.state == "counting")
        state, detail = self.gateway.engine_state()
        return (f"slots {a.in_flight}/{a.slots} busy · pool {a.reserved:,}/{a.pool:,} tokens reserved · "
                f"{queued} queued · {counting} counting" + (" · engine reloading" if self.gateway.reloading else "")
                + (f" · engine {state}: {detail}" if state != "up" else ""))

    def __rich__(self) -> RenderableType:
        return self.render()

    def render(self, now: float | None = None) -> RenderableType:
        """The view as a rich renderable (``now``: ``time.monotonic()`` by default)."""
        now = time.monotonic() if now is None else now
        g = self.gateway
        requests = Table(title="requests", title_justify="left", expand=False)
        for name in ("id", "client", "api", "waits for / state", "for", "tokens"):
            requests.add_column(name, justify="right" if name in ("for", "tokens") else "left")
        for held in sorted(g.ledger.live.values(), key=lambda r: (r.state != "running", r.since)):
            requests.add_row(held.id, held.client, held.api or "-", waits_for(g, held), f"{now - held.since:.1f}s",
                             f"{held.tokens:,}" if held.tokens else "-")
        clients = Table(title="clients", title_justify="left", expand=False)
        for name in ("client", "requests", "completed", "refused", "failed", "left", "queued", "running", "reserved"):
            clients.add_column(name, justify="left" if name == "client" else "right")
        for name, c in g.ledger.clients.items():
            clients.add_row(name, str(c.requests), str(c.completed), str(c.refused), str(c.failed),
                            str(c.disconnected), str(c.queued), str(c.running), f"{c.reserved:,}")
        lines = [Text(line) for line in self.header]
        return Group(*lines, Text(self.summary()), requests, clients)

"""The live terminal view of a run: one row per agent, slots busy, pool reserved vs n_ctx.

Driven only by :mod:`squad.events` objects. :class:`ViewState` is a pure state
machine (``apply(event)``), so it is tested without a terminal; :class:`LiveView` draws it
with rich's ``Live`` when stdout is a terminal, prints one plain line per event otherwise,
and prints nothing when turned off (``--quiet``)::

    with live_view(on=not quiet) as sink:
        async with Squad(..., on_event=sink) as squad: ...

Agent states: ``started`` (running, no engine call yet), ``waiting`` (in squad's admission
queue: no slot or no room in the pool), ``prefill`` (admitted, no token yet), ``generating``
(tokens arriving), ``idle`` (between calls), ``retrying`` (a call failed and will be resent), ``done``, and
the non-answers of :mod:`squad.runtime.outcome`: ``truncated`` (stopped at max_tokens), ``empty``, ``failed``,
``cancelled``. Warnings (the engine's, a recipe step's non-answer with its fix, an MCP server's
stdout noise or exit mid-run) are printed
as ``warning: ...`` lines in both modes.

With several engines (:mod:`squad.chat.routing`) the status line shows each engine's busy slots (a
lost one as ``lost``), the table an ``engine`` column (the engine of each agent's latest call),
and a lost engine and each call moved off it are printed in both modes.
A Ray run's progress (the cluster, each worker's engine, an item whose worker was lost: its
row shows ``retrying``) is printed as lines in both modes too.
"""

from __future__ import annotations

import threading
import time

from rich.console import Console, RenderableType
from rich.live import Live

from squad.events import (
    CallMoved,
    EngineExited,
    EngineLoaded,
    EngineLost,
    EnginePlanned,
    EngineWarning,
    Event,
    MCPWarning,
    OutputRetried,
    ShareSkipped,
    StepWarning,
    ToolLimited,
    ToolTruncated,
)
from squad.events.view_state import _RAY, AgentRow, EngineRow, ViewState

__all__ = ["AgentRow", "EngineRow", "ViewState", "LiveView", "live_view"]


class LiveView:
    """An :data:`~squad.events.EventSink` that shows the run; use as a context manager.

    - ``on=False``: shows nothing (``--quiet``).
    - stdout is a terminal: a rich ``Live`` table redrawn 4 times per second.
    - otherwise: one plain line per event (``[   0.52s] style   admitted ...``).

    Safe to call from any thread; the state is guarded by a lock.
    """

    def __init__(self, on: bool = True, *, console: Console | None = None, live: bool | None = None) -> None:
        self.on = on
        self.console = console or Console()
        self.live_mode = self.console.is_terminal if live is None else live
        self.state = ViewState()
        self._lock = threading.Lock()
        self._live: Live | None = None
        self._clock_offset: float | None = None

    def __enter__(self) -> LiveView:
        if self.on and self.live_mode:
            self._live = Live(_Renderable(self), console=self.console, refresh_per_second=4, transient=False)
            self._live.__enter__()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def flush(self) -> None:
        """Redraw the live table now (plain lines are printed as they come)."""
        if self._live is not None:
            self._live.refresh()

    def close(self) -> None:
        """Stop the live table (its last state stays on screen); safe to call twice."""
        if self._live is not None:
            self._live.refresh()
            self._live.__exit__(None, None, None)
            self._live = None

    def __call__(self, event: Event) -> None:
        with self._lock:
            self.state.apply(event)
            if self._clock_offset is None:
                self._clock_offset = time.monotonic() - event.t
            if self.on and not self.live_mode:
                text = self.state.line(event)
                if text is not None:
                    self.console.print(text, markup=False, highlight=False, soft_wrap=True)
            if self.on and isinstance(event, (EnginePlanned, EngineWarning, ToolLimited, ToolTruncated, OutputRetried,
                                              StepWarning, MCPWarning)):
                found = (event.warnings if isinstance(event, EnginePlanned) else  # warnings, both modes
                         [event.message] if isinstance(event, (ToolLimited, ToolTruncated, OutputRetried))
                         else [event.warning])
                for warning in found:
                    self.console.print(f"warning: {warning}", markup=False, highlight=False, soft_wrap=True)
            restarted = isinstance(event, EngineLoaded) and event.reason == "restarted"
            shown = (EngineExited, EngineLost, CallMoved, ShareSkipped, *_RAY)
            if self.on and self.live_mode and (isinstance(event, shown) or restarted):  # in both modes
                self.console.print(self.state.line(event), markup=False, highlight=False, soft_wrap=True)

    def renderable(self) -> RenderableType:
        with self._lock:
            now = time.monotonic() - (self._clock_offset or 0.0)
            return self.state.render(now=max(now, self.state.last))


class _Renderable:
    """Re-renders the view each time rich refreshes the ``Live`` display."""

    def __init__(self, view: LiveView) -> None:
        self.view = view

    def __rich__(self) -> RenderableType:
        return self.view.renderable()


def live_view(on: bool = True, *, console: Console | None = None) -> LiveView:
    """The view for ``squad run``/``chat``: a context manager whose value is an EventSink."""
    return LiveView(on, console=console)

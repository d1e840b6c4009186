"""``squad serve --slots auto`` / ``--ctx auto``: plan for what is coming.

The server starts from the default plan (:func:`squad.engine.session.plan_engine` with no workload).
:class:`Replanner` watches what clients want: requests running or queued and the tokens they
reserve or ask for together (:class:`~squad.serve.status.Ledger`). When that stays above the
engine's slots or pool for ``sustain`` seconds, it plans again for the peaks it saw (slots up to
the peak concurrency, at most :data:`~squad.engine.llama.MAX_SLOTS`; the context up to the peak
demand, rounded to 256; pinned values are kept; never smaller than now), and reloads the engine
at a quiet moment: admitted requests finish, new ones wait in squad's queue
(:meth:`~squad.engine.session.EngineSession.reload` drains and holds admission), then all go to the new
engine. At most one reload per ``interval`` seconds; each is logged with its reason and listed
in ``/squad/status`` ``replans``. A plan whose KV cache would not fit in memory is not loaded
(logged once).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import anyio

from squad.engine.llama import MAX_SLOTS, round_ctx
from squad.engine.session import plan_engine
from squad.events import EngineReplanning
from squad.serve.status import Peaks

if TYPE_CHECKING:
    from squad.sched.plan import EnginePlan
    from squad.serve.gateway import Gateway

__all__ = ["Replanner", "next_size", "REPLAN_INTERVAL", "SUSTAIN_S"]

REPLAN_INTERVAL = 300.0
"""Default seconds between two reloads."""
SUSTAIN_S = 5.0
"""Seconds demand must stay above the plan before a reload."""


def next_size(slots: int, n_ctx: int, peaks: Peaks, *, pin_slots: int | None, pin_ctx: int | None) -> tuple[int, int]:
    """``(slots, n_ctx)`` for ``peaks`` on an engine with ``slots`` and ``n_ctx`` now: grown to the
    peak (slots at most :data:`MAX_SLOTS`, context rounded up to 256), pins kept, never shrunk."""
    new_slots = pin_slots if pin_slots is not None else min(MAX_SLOTS, max(slots, peaks.requests))
    new_ctx = round_ctx(pin_ctx) if pin_ctx is not None else max(n_ctx, round_ctx(max(1, peaks.tokens)))
    return new_slots, new_ctx


class Replanner:
    """Watches a :class:`~squad.serve.gateway.Gateway` and reloads its engine (module docstring).

    ``interval``: seconds between reloads at least; ``sustain``: seconds demand must stay above
    the plan; ``check_every``: seconds between looks; ``log``: receives one line per decision.
    """

    def __init__(self, gateway: Gateway, *, interval: float = REPLAN_INTERVAL, sustain: float = SUSTAIN_S,
                 check_every: float = 0.25, log: Callable[[str], None] | None = None) -> None:
        self.gateway, self.interval, self.sustain, self.check_every = gateway, interval, sustain, check_every
        self.log = log
        self._stopped = False
        self._last_reload = float("-inf")
        self._refused: set[tuple[int, int]] = set()

    def stop(self) -> None:
        self._stopped = True

    async def run(self) -> None:
        """Look every ``check_every`` seconds until :meth:`stop`."""
        over_since: float | None = None
        while not self._stopped:
            await anyio.sleep(self.check_every)
            info, ledger = self.gateway.engine, self.gateway.ledger
            requests, tokens = ledger.wanting()
            now = time.monotonic()
            if requests <= info.slots and tokens <= info.pool:
                over_since = None
                continue
            if over_since is None:
                over_since = now
                ledger.reset_peaks()
            if now - over_since < self.sustain or now - self._last_reload < self.interval:
                continue
            if await self.replan(ledger.reset_peaks(), held_s=now - over_since):
                self._last_reload = time.monotonic()
                over_since = None

    async def replan(self, peaks: Peaks, *, held_s: float = 0.0) -> bool:
        """Reload for ``peaks`` if that changes the plan and fits in memory; True when reloaded."""
        session = self.gateway.session
        spec, current = session.spec, session.plan
        if spec is None or current is None or not session.reloadable:
            return False
        slots, n_ctx = next_size(current.slots, current.n_ctx, peaks, pin_slots=spec.slots, pin_ctx=spec.ctx)
        if (slots, n_ctx) == (current.slots, current.n_ctx) or (slots, n_ctx) in self._refused:
            return False
        new = await self._plan(slots, n_ctx)
        reason = (f"re-plan: up to {peaks.requests} requests and {peaks.tokens:,} tokens wanted at once for "
                  f"{held_s:.0f} s, above {current.slots} slots / {current.n_ctx:,} tokens: "
                  f"reloading with {slots} slots / {n_ctx:,} tokens")
        if new is None:
            self._refused.add((slots, n_ctx))
            self._say(f"{reason} skipped: its KV cache would not fit in this machine's memory")
            return False
        new = dataclasses.replace(new, reasons=(*new.reasons, reason))
        self._say(reason + " (admitted requests finish first; new ones wait)")
        self.gateway.emit(EngineReplanning(from_slots=current.slots, to_slots=slots, n_ctx=n_ctx,
                                           agents=peaks.requests))
        started = time.monotonic()
        self.gateway.reloading = True
        try:
            await session.reload(new, drain_timeout=self.gateway.request_timeout)
        finally:
            self.gateway.reloading = False
        took = time.monotonic() - started
        self.gateway.replans.append({"wall": time.time(), "from": [current.slots, current.n_ctx],
                                     "to": [slots, n_ctx], "reason": reason, "took_s": round(took, 1)})
        self._say(f"engine reloaded in {took:.1f} s: {session.info.slots} slots, pool {session.info.pool:,} tokens")
        return True

    async def _plan(self, slots: int, n_ctx: int) -> EnginePlan | None:
        spec = self.gateway.session.spec
        assert spec is not None
        plan = await anyio.to_thread.run_sync(plan_engine, spec.but(slots=slots, ctx=n_ctx), None)
        memory = plan.memory_for_kv  # what the planner measured (RAM, or GPU memory when offloaded)
        if plan.kv_bytes and memory is not None and plan.kv_bytes > memory:
            return None
        return plan

    def _say(self, line: str) -> None:
        if self.log is not None:
            self.log(line)

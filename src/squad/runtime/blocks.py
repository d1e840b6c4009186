"""Operations and parallel blocks: the structured-concurrency part of the runtime.

- :class:`Operations` gives each public squad operation a cancel scope that
  ``Squad.cancel(reason)`` can reach; the cancelled operation raises
  :class:`~squad.errors.AgentCancelled` with that reason, and every agent inside records it
  (:func:`cancel_reason`). An error that ends the operation on its own (every engine lost)
  is recorded as the reason too (:func:`stopped_by`), for the agents its cancellation stops.
- :func:`run_block` runs one parallel block under a policy, at most a window of its items
  started at once:

  - ``"collect"``: every item finishes; failures are recorded beside the results;
  - ``"fail-fast"``: the first failure X cancels its siblings at once (their HTTP streams are
    closed by the cancellation); each sibling records ``"cancelled because 'X' failed"``.

- :func:`single_errors` lets a squad error raised inside a task group (e.g.
  :class:`~squad.errors.EngineGone`, which no agent result can hold) leave as itself, not
  wrapped in an ExceptionGroup nobody downstream catches.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from contextvars import ContextVar
from typing import Literal

import anyio

from squad.errors import AgentCancelled, SquadError, UserError, leaf_errors
from squad.runtime.results import AgentResult, cancelled_result

__all__ = ["Policy", "Operations", "run_block", "single_errors", "cancel_reason", "stopped_by", "One"]

Policy = Literal["collect", "fail-fast"]

_OP_REASON: ContextVar[list[str | None]] = ContextVar("squad_cancel_reason")
"""The running operation's cancel reason holder (set by ``Operations.cancel``), seen by its tasks."""

One = Callable[[int, "anyio.CapacityLimiter | None", Callable[[], "str | None"], Callable[[AgentResult], None]],
              Awaitable[AgentResult]]
"""Runs item ``i`` of a block with the block's limiter, its sibling-cancel reason and a
``record`` callback it must call with its result before a cancellation propagates."""


def cancel_reason() -> str:
    """Why the running operation was cancelled ("cancelled by the caller" when not said)."""
    return _OP_REASON.get([None])[0] or "cancelled by the caller"


def stopped_by(reason: str) -> None:
    """Record why the running operation ends when an error no agent result can hold leaves it
    (:class:`~squad.errors.EngineGone`: every engine lost): the agents that cancellation stops
    then say ``reason`` instead of "cancelled by the caller". The first reason stays."""
    holder = _OP_REASON.get(None)
    if holder is not None and holder[0] is None:
        holder[0] = reason


class Operations:
    """The cancel scopes of a squad's running operations."""

    def __init__(self) -> None:
        self._scopes: dict[anyio.CancelScope, list[str | None]] = {}

    @contextlib.asynccontextmanager
    async def operation(self) -> AsyncIterator[None]:
        """A cancel scope :meth:`cancel` can reach; turns that cancellation into AgentCancelled."""
        holder: list[str | None] = [None]
        token = _OP_REASON.set(holder)
        try:
            with anyio.CancelScope() as scope:
                self._scopes[scope] = holder
                try:
                    yield
                finally:
                    del self._scopes[scope]
        finally:
            _OP_REASON.reset(token)
        if scope.cancelled_caught:
            raise AgentCancelled(holder[0] or "cancelled by the caller")

    def cancel(self, reason: str) -> None:
        """Cancel every running operation with ``reason``; later ones run normally."""
        for scope, holder in list(self._scopes.items()):
            holder[0] = reason
            scope.cancel(reason)


@contextlib.contextmanager
def single_errors() -> Iterator[None]:
    """See the module docstring."""
    try:
        yield
    except BaseExceptionGroup as group:
        leaves = leaf_errors(group)
        first = next((e for e in leaves if isinstance(e, SquadError)), None)
        if first is not None and all(isinstance(e, (SquadError, anyio.get_cancelled_exc_class())) for e in leaves):
            raise first from group
        raise


async def run_block(names: Sequence[str], one: One, *, policy: Policy,
                    max_concurrency: int | None = None, window: int | None = None) -> list[AgentResult]:
    """Run ``one(i, ...)`` for every item (at most ``max_concurrency`` at a time);
    ``names[i]`` is item i's agent. Results in item order; an item cancelled before it began
    gets a cancelled result. Raises :class:`UserError` for an unknown policy.

    ``window``: at most this many items are started (a task each, rendered, counted, waiting in
    admission) at once; the next one starts as one ends, in input order (None: all at once). A
    map of 10,000 items then holds a window of tasks and the results so far, not 10,000 tasks
    waiting; admission still orders the waiting calls of every running operation."""
    if policy not in ("collect", "fail-fast"):
        raise UserError(f"policy {policy!r}: use 'collect' or 'fail-fast'")
    results: list[AgentResult | None] = [None] * len(names)
    limiter = anyio.CapacityLimiter(max_concurrency) if max_concurrency else None
    room = anyio.Semaphore(window) if window is not None and window < len(names) else None
    failed: list[str] = []

    def reason() -> str | None:
        return f"cancelled because {failed[0]!r} failed" if failed else None

    with single_errors():
        async with anyio.create_task_group() as tg:

            async def run(i: int) -> None:
                def record(result: AgentResult) -> None:
                    results[i] = result

                try:
                    results[i] = result = await one(i, limiter, reason, record)
                finally:
                    if room is not None:
                        room.release()
                if (policy == "fail-fast" and result.error is not None and result.cancelled_reason is None
                        and not failed):
                    failed.append(names[i])
                    tg.cancel_scope.cancel(f"sibling {names[i]!r} failed")

            for i in range(len(names)):
                if room is not None:
                    await room.acquire()  # cancelled with the group (fail-fast, the caller): the rest never start
                tg.start_soon(run, i)
    return [r if r is not None else cancelled_result(names[i], reason() or "cancelled before it started")
            for i, r in enumerate(results)]

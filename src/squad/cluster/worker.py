"""The Ray worker: the actor (``ray.remote(_Worker)``) that runs a squad with its own launched
engine on one node, and :class:`WorkerInfo`, what it reports when it started. Rules:
:mod:`squad.cluster.ray`."""

from __future__ import annotations

import functools
import os
import time
from dataclasses import dataclass, replace
from typing import Any

from anyio.from_thread import start_blocking_portal

from squad.cluster.relay import _ITEM, _Outbox
from squad.engine.build import usable_cores
from squad.engine.launched import LaunchedEngine
from squad.engine.provider import EngineProvider
from squad.engine.session import EngineSpec, provider_for
from squad.errors import EngineError, EngineGone
from squad.events import Event
from squad.recipes.model import Recipe
from squad.runtime.results import AgentResult
from squad.runtime.squad import Squad

__all__ = ["WorkerInfo", "node_threads"]


@dataclass(frozen=True)
class WorkerInfo:
    """One worker as it started: ``id`` (``w<k>@<node ip>``), ``node`` (its node's IP),
    ``engine`` (its llama-server's base URL on that node), ``engine_pid``, ``slots``, ``n_ctx``
    and ``pool`` (tokens, read back from the engine), ``memory`` (bytes it planned the KV cache against),
    ``share`` (its fraction of the node's memory), ``pid`` (the worker's process on its node) and ``node_id`` (its
    Ray node's id: several nodes may share one IP, e.g. a test cluster on one machine)."""

    id: str
    node: str
    pid: int
    engine: str
    engine_pid: int | None
    slots: int
    n_ctx: int
    memory: int
    share: float
    pool: int = 0
    node_id: str = ""

    def as_dict(self) -> dict[str, Any]:
        return dict(vars(self))


def node_threads(workers: int) -> int:
    """CPU threads (``-t``) for each of ``workers`` engines on this node: its usable cores shared, at least 1.

    llama.cpp's threads wait for one another at every operation of the graph, so engines that together run more
    threads than there are cores wait on each other's time slices: two engines of ``-t 2`` on 2 cores took 2.49x as
    long as two of ``-t 1`` (decode 3.7x slower; ``bench/threads.py``, bench/results.md#threads)."""
    return max(1, usable_cores() // max(1, workers))


class _Worker:
    """The Ray actor (``ray.remote(_Worker)``): one :class:`~squad.runtime.squad.Squad` with the
    recipe's agents and its own launched engine, on an event loop of its own (an anyio
    blocking portal: the engine is spawned from that loop's thread, which lives as long as the
    actor). Ray calls its methods from up to 64 threads at once; the dispatcher sends at most
    the engine's slots."""

    def __init__(self, recipe: Recipe, spec: EngineSpec, worker_id: str, share: float, per_node: int = 1,
                 engine: EngineProvider | None = None, node_id: str = "") -> None:
        self.id, self.recipe, self.spec, self.share = worker_id, recipe, spec, share
        self.engine, self.node_id = engine, node_id
        """``engine``: the provider this worker opens instead of launching from ``spec``
        (``RayFanout.worker_engine``)."""
        self.per_node = per_node
        """Workers on this node, each with an engine (they share its cores: :func:`node_threads`)."""
        self._portal_cm: Any = None
        self._portal: Any = None
        self._squad_cm: Any = None
        self.squad: Squad | None = None
        self.outbox = _Outbox(worker_id)
        self.engine_lost: str | None = None
        """Why this worker's engine died (it serves no item after that), else None."""

    def clock(self) -> tuple[float, float]:
        """This process's ``time.monotonic()`` and ``time.time()`` (the driver lines events up by them)."""
        return time.monotonic(), time.time()

    def events(self, timeout: float) -> list[tuple[int | None, Event]]:
        """The events emitted since the last call, waiting up to ``timeout`` seconds for one
        (:meth:`_Outbox.take`)."""
        return self.outbox.take(timeout)

    def start(self) -> tuple[WorkerInfo, int]:
        """Plan for this node's share, launch the engine; return what it reported and how many
        events were emitted so far. The engine is planned (and replanned) for ``share`` of the
        node's KV memory and is not restarted when it dies: the worker is taken out instead
        (:class:`~squad.engine.launched.LaunchedEngine`). Raises the planner's and launcher's errors."""
        self._portal_cm = start_blocking_portal()
        portal = self._portal = self._portal_cm.__enter__()
        recipe = self.recipe
        squad = Squad(list(recipe.agents.values()), main=recipe.main, engine=self.provider(),
                      workload=recipe.workload(), variables={"params": recipe.params},
                      mcp_servers=recipe.mcp_servers, on_event=self.outbox)
        self._squad_cm = portal.wrap_async_context_manager(squad)
        self.squad = self._squad_cm.__enter__()
        info = self.squad.info
        self.outbox.engine = info.base_url
        launcher, plan = self.squad.session.launcher, self.squad.session.plan
        node = self.id.partition("@")[2]
        return WorkerInfo(id=self.id, node=node, pid=os.getpid(), engine=info.base_url,
                          engine_pid=launcher.pid if launcher else None, slots=info.slots, n_ctx=info.n_ctx,
                          memory=plan.memory_for_kv or 0 if plan is not None else 0, share=self.share,
                          pool=info.pool, node_id=self.node_id), self.outbox.count

    def provider(self) -> EngineProvider:
        """The worker's engine: launched from ``spec`` for its ``share`` of the node's KV memory and, unless the
        spec pins ``threads``, its share of the node's cores (:func:`node_threads`), never restarted; a ``spec``
        with a ``url`` (tests) is attached as it is; a given ``engine`` is opened as it is."""
        if self.engine is not None:
            return self.engine
        if self.spec.url is not None:
            return provider_for(self.spec)
        spec = self.spec
        if spec.threads is None and self.per_node > 1:
            spec = replace(spec, threads=node_threads(self.per_node))
        return LaunchedEngine(spec, share=self.share, restart=False)

    def run(self, index: int, name: str, prompt: str, *, fail_on: frozenset[Any],
            output_type: Any, shared: str | None = None) -> tuple[AgentResult, int]:
        """Item ``index``: ``name`` on ``prompt`` (one ``Squad.map`` call); returns its result
        and how many events were emitted by then (its own among them). The agent's own failure
        is in the result. Raises :class:`EngineGone` when the item failed because this worker's
        engine died (:meth:`_engine_death`), and for every item after that: the driver takes
        the worker out and runs the item elsewhere."""
        assert self.squad is not None and self._portal is not None
        squad = self.squad
        if self.engine_lost is not None:
            raise EngineGone(f"its engine is gone ({self.engine_lost})")

        async def one() -> AgentResult:
            _ITEM.set(index)  # this task's events, and its children's, are item index's
            [result] = await squad.map(name, [prompt], fail_on=fail_on, output_type=output_type, first_item=index,
                                       shared=[shared])
            return result

        try:
            result = self._portal.call(one)
        except EngineError as exc:
            self.engine_lost = self.engine_lost or self._engine_death(exc) or str(exc)
            raise
        if result.error is not None and (why := self._engine_death(result.error)) is not None:
            self.engine_lost = self.engine_lost or why
            raise EngineGone(f"{why} (the item failed with it: {type(result.error).__name__})")
        value = getattr(result.output_value, "model_dump", None)
        return replace(result, item=index, worker=self.id, engine=squad.info.base_url,
                       output_value=value(mode="json") if callable(value) else result.output_value), self.outbox.count

    def _engine_death(self, error: BaseException, settle: float = 1.0) -> str | None:
        """Why this worker's engine is dead after an item failed with ``error``, or None when it
        still serves (the item failed for its own reason): :meth:`squad.engine.session.EngineSession.death`.
        Synchronous on purpose: one ``async def`` method makes Ray run the actor as an asyncio
        actor, whose synchronous methods (``run``) then block its one event loop, one item at a time."""
        assert self.squad is not None and self._portal is not None
        session: Any = self.squad.session  # one engine: an EngineSession (tests: a stand-in)
        return self._portal.call(functools.partial(session.death, error, settle=settle))

    def close(self) -> None:
        """Stop the engine (and the squad's MCP servers), then the event loop."""
        try:
            if self._squad_cm is not None:
                self._squad_cm.__exit__(None, None, None)
        finally:
            self._squad_cm = None
            if self._portal_cm is not None:
                self._portal_cm.__exit__(None, None, None)
                self._portal_cm = self._portal = None



"""The pool of a Ray run's workers, as the dispatcher's workers (:class:`_Pool`, :class:`_Handle`),
and :class:`_ClusterSquad`, what a recipe's flow runs on under Ray. Rules: :mod:`squad.cluster.ray`."""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import anyio

from squad.cluster.dispatch import Served, WorkerLost, dispatch
from squad.cluster.relay import _clock_offsets, _Feed, _fetch
from squad.cluster.worker import WorkerInfo, _Worker
from squad.engine.provider import EngineProvider
from squad.engine.session import EngineSpec
from squad.errors import AgentRunError, EngineError, SquadError
from squad.events import ClusterConnected, Event, EventSink, ItemLost, WorkerFailed, WorkerStarted, emit_to
from squad.recipes.model import Recipe
from squad.runtime.blocks import Policy
from squad.runtime.outcome import Outcome
from squad.runtime.results import AgentResult, RunResult
from squad.runtime.squad import Squad

__all__ = ["CLOSE_TIMEOUT"]

CLOSE_TIMEOUT = 60.0
"""Seconds a worker gets to stop its engine before its actor is killed (which kills the engine too)."""


class _Pool:
    """The workers of one run, as :class:`squad.cluster.dispatch.Worker` s the dispatcher calls."""

    def __init__(self, ray: Any, retries: int, on_item: Callable[[AgentResult], None] | None,
                 sinks: Sequence[EventSink] = (), feeds: Any = None) -> None:
        self.ray = ray
        self.retries = retries
        self.on_item = on_item
        self.sinks = list(sinks)
        self.feeds = feeds  # the task group the workers' event fetchers run in
        self.workers: list[_Handle] = []
        self.actors: list[Any] = []
        self.feed: dict[str, _Feed] = {}  # worker id -> its events' way to the sinks

    async def start(self, recipe: Recipe, spec: EngineSpec, *, address: str | None, per_node: int, share: float,
                    notes: list[str], engine: EngineProvider | None = None) -> None:
        """Start ``per_node`` workers on each alive node of the cluster at ``address`` (None: a
        local one), all at once, each planning for ``share`` of its node's KV memory; each one's
        events flow to the sinks from its first (the engine's plan and load). A worker that does
        not start is said in ``notes``; raises :class:`SquadError` when none starts. ``engine``: the provider
        each worker opens instead of launching from ``spec`` (``RayFanout.worker_engine``)."""
        ray = self.ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        nodes = [n for n in ray.nodes() if n.get("Alive")]
        emit_to(self.sinks, ClusterConnected(address=address, nodes=len(nodes), workers=len(nodes) * per_node))
        remote = ray.remote(_Worker)
        pending: list[tuple[str, Any]] = []
        for node in nodes:
            for _ in range(per_node):
                wid = f"w{len(pending)}@{node['NodeManagerAddress']}"
                actor = remote.options(
                    num_cpus=0, max_concurrency=64, max_restarts=0, name=None,
                    scheduling_strategy=NodeAffinitySchedulingStrategy(node["NodeID"], soft=False),
                ).remote(recipe, spec, wid, share, per_node, engine, node["NodeID"])
                self.actors.append(actor)
                pending.append((wid, actor))
        started: dict[str, _Handle] = {}

        async def start_one(wid: str, actor: Any) -> None:
            if (handle := await self.start_worker(wid, actor, notes)) is not None:
                started[wid] = handle

        async with anyio.create_task_group() as tg:
            for wid, actor in pending:
                tg.start_soon(start_one, wid, actor)
        self.workers = [started[wid] for wid, _ in pending if wid in started]
        if not self.workers:
            raise SquadError("no Ray worker started: " + "; ".join(notes))

    async def start_worker(self, wid: str, actor: Any, notes: list[str]) -> _Handle | None:
        """Start worker ``wid`` (its ``actor``: line up its clocks, fetch its events, launch its
        engine); None when it did not start (the reason added to ``notes`` and emitted)."""
        try:
            feed = self.feed[wid] = _Feed(wid, self.sinks, await _clock_offsets(actor))
            self.feeds.start_soon(_fetch, actor, feed)
            info, seq = await actor.start.remote()
            await feed.reached(seq)
        except Exception as exc:  # noqa: BLE001 - one worker that cannot start does not end the run
            notes.append(f"worker {wid} did not start: {_reason(exc)}")
            emit_to(self.sinks, WorkerFailed(worker=wid, reason=_reason(exc)))
            return None
        emit_to(self.sinks, WorkerStarted(worker=wid, engine=info.engine, node=info.node, slots=info.slots,
                                          n_ctx=info.n_ctx, pool=info.pool, memory=info.memory))
        return _Handle(actor, info, feed)

    async def map(self, name: str, prompts: Sequence[str], *, max_concurrency: int | None,
                  fail_on: Collection[Any], output_type: Any,
                  on_result: Callable[[int, AgentResult], None] | None = None,
                  shared: Sequence[str | None] | None = None) -> list[AgentResult]:
        call = dict(fail_on=frozenset(fail_on), output_type=output_type)
        each = list(shared) if shared is not None else [None] * len(prompts)
        items = [(name, prompt, {**call, "shared": s} if s else call) for prompt, s in zip(prompts, each)]
        results: dict[int, AgentResult] = {}

        def lost(index: int, worker: str, reason: str, retry: bool) -> None:
            feed = self.feed.get(worker)
            if feed is not None:
                feed.lost.add(index)  # what the lost attempt still sends is dropped
            emit_to(self.sinks, ItemLost(agent=name, worker=worker, engine=feed.engine if feed else None,
                                         item=index, reason=reason, retry=retry))

        def done(s: Served[AgentResult]) -> None:
            result = s.result if s.result is not None else AgentResult(
                agent=name, error=AgentRunError(s.error or "not run", agent=name), item=s.index)
            result.retried = "; ".join(s.lost) or None
            results[s.index] = result
            if self.on_item is not None:
                self.on_item(result)
            if on_result is not None:
                on_result(s.index, result)

        await dispatch(items, self.workers, retries=self.retries, limit=max_concurrency, on_done=done, on_lost=lost)
        return [results[i] for i in range(len(items))]

    async def close(self) -> None:
        """Ask every worker to stop its engine (up to :data:`CLOSE_TIMEOUT` seconds), then
        kill every actor: an engine whose worker is killed dies with it."""
        ray = self.ray
        refs = []
        for actor in self.actors:
            try:
                refs.append(actor.close.remote())
            except Exception:  # noqa: BLE001 - a dead actor: nothing to close
                pass
        if refs:
            await anyio.to_thread.run_sync(lambda: ray.wait(refs, num_returns=len(refs), timeout=CLOSE_TIMEOUT))
        for actor in self.actors:
            try:
                ray.kill(actor, no_restart=True)
            except Exception:  # noqa: BLE001 - already gone
                pass


@dataclass
class _Handle:
    """A started worker as the dispatcher sees it (:class:`squad.cluster.dispatch.Worker`)."""

    actor: Any
    info: WorkerInfo
    feed: _Feed

    @property
    def id(self) -> str:
        return self.info.id

    @property
    def capacity(self) -> int:
        return self.info.slots

    async def run(self, index: int, item: tuple[str, str, dict[str, Any]]) -> AgentResult:
        name, prompt, call = item
        try:
            result, seq = await self.actor.run.remote(index, name, prompt, **call)
        except Exception as exc:  # noqa: BLE001 - sorted: the worker is lost, or its error is raised
            raise _failure(exc) from None
        await self.feed.reached(seq)  # the item's events before its result
        return result


def _failure(exc: Exception) -> BaseException:
    """What a failed call to a worker means (Ray is imported only here, once it failed):
    :class:`WorkerLost` when the actor, its node or its engine died; else the worker's own error."""
    from ray.exceptions import RayError, RayTaskError

    if isinstance(exc, RayTaskError):  # the worker raised: its engine is gone for good, or a bug
        cause = getattr(exc, "cause", None)
        if isinstance(cause, EngineError):
            return WorkerLost(f"its engine failed: {cause}")
        return cause if isinstance(cause, BaseException) else exc
    if isinstance(exc, RayError):  # the actor died (killed, crashed, its node gone), or the object store failed
        return WorkerLost(_reason(exc))
    return exc



def _reason(exc: BaseException) -> str:
    """The first line of a Ray error (they run to pages), or its type."""
    cause = getattr(exc, "cause", None)
    if isinstance(cause, BaseException) and not isinstance(cause, type(exc)):
        exc = cause
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:300]}" if text else type(exc).__name__



class _ClusterSquad:
    """What :func:`squad.recipes.run.execute_flow` runs a flow on under Ray (a
    :class:`~squad.runtime.ops.SquadOps`): ``map`` of a sub-agent goes to the workers; ``run``,
    ``run_agent``, ``parallel`` to the ``local`` squad (None when the recipe has no step for it,
    :func:`squad.cluster.ray.needs_local`)."""

    def __init__(self, pool: _Pool, local: Squad | None, sinks: list[EventSink]) -> None:
        self._pool, self._local, self._sinks = pool, local, sinks

    @property
    def local(self) -> Squad:
        assert self._local is not None, "a step that runs in the driver, in a recipe needs_local() said has none"
        return self._local

    @property
    def shared_input(self) -> str:
        return self._local.shared_input if self._local is not None else "prefix"

    async def map(self, name: str, inputs: Iterable[str], *, max_concurrency: int | None = None,
                  fail_on: Collection[Outcome | str] = (), output_type: Any = None,
                  item_ids: Sequence[int] | None = None,
                  on_result: Callable[[int, AgentResult], None] | None = None,
                  shared: str | Sequence[str | None] | None = None) -> list[AgentResult]:
        prompts = list(inputs)
        each = [shared] * len(prompts) if shared is None or isinstance(shared, str) else list(shared)
        results = await self._pool.map(name, prompts, max_concurrency=max_concurrency, fail_on=fail_on,
                                       output_type=output_type, on_result=on_result, shared=each)
        for i, result in enumerate(results):  # the workers number them from 0: the resumed map's own ids
            if item_ids is not None:
                result.item = item_ids[i]
        return results

    async def run(self, text: str, *, output_type: Any = None) -> RunResult:
        return await self.local.run(text, output_type=output_type)

    async def run_agent(self, name: str, prompt: str, *, output_type: Any = None,
                        shared: str | None = None) -> AgentResult:
        return await self.local.run_agent(name, prompt, output_type=output_type, shared=shared)

    async def parallel(self, calls: Iterable[tuple[str, str]], *, policy: Policy = "collect", check: bool = False,
                       fail_on: Collection[Outcome | str] = (), output_type: Any = None,
                       on_result: Callable[[int, AgentResult], None] | None = None,
                       shared: str | Sequence[str | None] | None = None) -> list[AgentResult]:
        return await self.local.parallel(calls, policy=policy, check=check, fail_on=fail_on, output_type=output_type,
                                         on_result=on_result, shared=shared)

    def emit(self, event: Event) -> None:
        emit_to(self._sinks, event)

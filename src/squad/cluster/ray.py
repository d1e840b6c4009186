"""Cluster fan-out on Ray: a recipe's ``map`` steps over llama-servers on many machines.

``squad run RECIPE --ray [ADDRESS]`` or ``run_recipe(recipe, ray=RayFanout(...))`` (extra
``squad[ray]``). Each node runs ``workers_per_node`` actors, each with its own engine planned
against its memory share (default ``1 / workers_per_node`` of the node's KV memory); map items
of sub-agents are dispatched over them (:func:`squad.cluster.dispatch.dispatch`), the items of a
lost worker run once more elsewhere; every other step runs in the driver on a local engine.
Workers' events reach the driver's sinks with ids prefixed by the worker (``w0:c17``) and
times on the driver's clocks. Every engine and a local cluster squad started are stopped at
the end. Errors: :class:`~squad.errors.ClusterError`.

Design: docs/design/ray.md
"""

from __future__ import annotations

import contextvars
import functools
import os
import sys
import threading
import time
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, AsyncIterator, Callable, Collection, Iterable, Sequence

import anyio

from squad.errors import AgentRunError, ClusterError, EngineError, EngineGone, SquadError, UserError
from squad.events import (
    AgentStarted,
    ClusterConnected,
    ClusterStarting,
    Event,
    ItemLost,
    WorkerFailed,
    WorkerStarted,
    emit_to,
)
from squad.cluster.dispatch import RETRIES, Served, WorkerLost, dispatch
from squad.cluster.local import LocalCluster, check_address, connect
from squad.runtime.results import AgentResult

if TYPE_CHECKING:
    from squad.events import EventSink
    from squad.recipes.model import Recipe
    from squad.recipes.run import RecipeRun
    from squad.runtime.squad import Squad
    from squad.engine.session import EngineSpec

__all__ = ["RayFanout", "WorkerInfo", "run_on_ray", "check_launch", "needs_local", "require_ray", "INSTALL_HINT"]

INSTALL_HINT = "pip install 'squad[ray]'"
CLOSE_TIMEOUT = 60.0
"""Seconds a worker gets to stop its engine before its actor is killed (which kills the engine too)."""
POLL_S = 0.5
"""Longest a worker's events call waits for an event before it answers with none (seconds)."""
START_WAIT = 60.0
"""Longest a run interrupted while its local cluster starts waits for ``ray.init`` to return
before it stops the cluster anyway (seconds; it takes a few)."""
FLUSH_TIMEOUT = 10.0
"""Longest the driver waits for an item's last events after its result came (seconds)."""

CONNECT_TIMEOUT = 30.0
"""Seconds squad waits for ``ray.init`` to connect to an existing cluster (``--ray ADDRESS``). A
port that accepts connections but is not a Ray GCS makes Ray retry without end; past this squad
gives up with :class:`~squad.errors.ClusterError` (the connecting thread is a daemon: it never
holds up the exit)."""


def require_ray() -> None:
    """Check that Ray is installed, without importing it (a local cluster must set its
    environment first, :meth:`RayFanout._connect`). Raises :class:`UserError` saying how to
    install it."""
    import importlib.util

    if importlib.util.find_spec("ray") is None:
        raise UserError(f"--ray needs Ray, which is not installed: {INSTALL_HINT}")


@dataclass(frozen=True)
class WorkerInfo:
    """One worker as it started: ``id`` (``w<k>@<node ip>``), ``node`` (its node's IP),
    ``engine`` (its llama-server's base URL on that node), ``engine_pid``, ``slots``, ``n_ctx``
    and ``pool`` (tokens, read back from the engine), ``memory`` (bytes it planned the KV cache against),
    ``share`` (its fraction of the node's memory) and ``pid`` (the worker's process on its node)."""

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

    def as_dict(self) -> dict[str, Any]:
        return dict(vars(self))


@dataclass
class RayFanout:
    """How to fan a recipe's maps out over Ray (see the module docstring for the rules).

    - ``address``: an existing cluster (``"auto"``, ``"ray://host:10001"``, ``"host:6379"``);
      None starts a local one-node cluster on 127.0.0.1 for the run (``num_cpus``, default
      ``workers_per_node``; Ray's logs and sockets under ``temp_dir``, kept; default a new
      temp dir, removed after the run);
    - ``workers_per_node``: workers (each with its engine) per node, at least 1;
    - ``memory_share``: the fraction of a node's KV memory each worker plans for, in (0, 1]
      (None: ``1 / workers_per_node``);
    - ``retries``: how often an item whose worker was lost is sent elsewhere (default 1);
    - ``on_item``: called in the driver with each map item's
      :class:`~squad.runtime.results.AgentResult` as it ends (progress; any order).

    After a run, ``workers`` lists the :class:`WorkerInfo` of each worker that started and
    ``notes`` what went wrong on the way (a worker that did not start). Raises
    :class:`UserError` for a bad value.
    """

    address: str | None = None
    workers_per_node: int = 1
    memory_share: float | None = None
    num_cpus: int | None = None
    temp_dir: str | Path | None = None
    retries: int = RETRIES
    on_item: Callable[[AgentResult], None] | None = None
    workers: list[WorkerInfo] = field(default_factory=list, init=False)
    notes: list[str] = field(default_factory=list, init=False)

    def __post_init__(self) -> None:
        if isinstance(self.workers_per_node, bool) or not isinstance(self.workers_per_node, int) \
                or self.workers_per_node < 1:
            raise UserError(f"workers_per_node must be a whole number of at least 1, got {self.workers_per_node!r}")
        share = self.memory_share
        if share is not None and (isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 < share <= 1):
            raise UserError(f"memory_share must be a fraction in (0, 1], got {share!r}")
        if isinstance(self.retries, bool) or not isinstance(self.retries, int) or self.retries < 0:
            raise UserError(f"retries must be a whole number of at least 0, got {self.retries!r}")

    @property
    def share(self) -> float:
        """Each worker's fraction of its node's KV memory."""
        return self.memory_share if self.memory_share is not None else 1 / self.workers_per_node

    @asynccontextmanager
    async def pool(self, recipe: "Recipe", spec: "EngineSpec",
                   sinks: "Sequence[EventSink]" = ()) -> AsyncIterator["_Pool"]:
        """Connect (or start a local cluster), start the workers for ``recipe`` with ``spec``
        (a launched engine: a ``url`` is an error), yield them; the workers' events, and the
        start's, go to ``sinks``. On exit stop every worker and its engine, and a local cluster
        this started, every process of it (:class:`squad.cluster.local.LocalCluster`; also when
        cancelled while the cluster starts). Raises :class:`UserError` (no Ray, a ``url``, a
        malformed address), :class:`~squad.errors.ClusterError` (the cluster does not answer or
        did not start), :class:`SquadError` when no worker starts (with the first one's reason)."""
        if spec.url is not None:
            raise UserError("--ray launches an engine on each node: drop --url (or drop --ray to use that engine)")
        check_address(self.address)
        sinks = list(sinks)
        emit_to(sinks, ClusterStarting(address=self.address))
        cluster = None if self.address is not None else LocalCluster(
            None if self.temp_dir is None else str(self.temp_dir), self.num_cpus or self.workers_per_node)
        failure: BaseException | None = None
        connected = threading.Event()

        def connect() -> Any:
            try:
                return self._connect(cluster)
            finally:
                connected.set()

        try:
            ray = await (anyio.to_thread.run_sync(connect) if cluster is not None else self._connect_existing())
            async with anyio.create_task_group() as feeds:  # one task per worker fetching its events
                pool = _Pool(ray, self.retries, self.on_item, sinks, feeds)
                try:
                    await pool.start(recipe, spec, self)
                    self.workers = [w.info for w in pool.workers]
                    if cluster is not None:
                        cluster.collect()  # the workers and their engines
                    yield pool
                except BaseException as exc:  # noqa: BLE001 - raised below, as itself, not in a task group's group
                    failure = exc
                finally:
                    with anyio.CancelScope(shield=True):
                        await pool.close()
                    feeds.cancel_scope.cancel()
            if failure is not None:
                raise failure
        finally:
            if cluster is not None:
                with anyio.CancelScope(shield=True):
                    # asyncio's Ctrl-C handler cancels natively, which does not wait for the thread: a cluster
                    # still starting is let finish (seconds), so that ray.shutdown() knows all of it
                    await anyio.to_thread.run_sync(connected.wait, START_WAIT)
                    await anyio.to_thread.run_sync(cluster.stop)

    async def _connect_existing(self) -> Any:
        """:meth:`_connect` to the cluster at ``address`` in a daemon thread, given up after
        :data:`CONNECT_TIMEOUT` seconds or when cancelled (Ctrl-C) without waiting for Ray."""
        box: dict[str, Any] = {}
        done = threading.Event()

        def target() -> None:
            try:
                box["ray"] = self._connect(None)
            except BaseException as exc:  # noqa: BLE001 - raised in the caller's task
                box["error"] = exc
            finally:
                done.set()

        threading.Thread(target=target, name="squad-ray-connect", daemon=True).start()
        with anyio.move_on_after(CONNECT_TIMEOUT):
            while not done.is_set():
                await anyio.sleep(0.05)
        if not done.is_set():
            raise ClusterError(f"no Ray cluster answered at {self.address!r} within {CONNECT_TIMEOUT:.0f} s: something "
                               "accepts connections there, but not as a Ray cluster; give its GCS address (port "
                               "6379 by default, `ray status` on a node shows it), or 'local' for one on this machine")
        if "error" in box:
            raise box["error"]
        return box["ray"]

    def _connect(self, cluster: LocalCluster | None) -> Any:
        """``ray`` connected to the cluster (blocking): ``cluster`` started, else the one at
        ``address`` (:func:`squad.cluster.local.connect`), unless this process is connected already."""
        # Ray's own SIGTERM handler prints a stack dump before squad's (stop the engines, exit 143)
        os.environ.setdefault("RAY_DISABLE_FAILURE_SIGNAL_HANDLER", "1")
        require_ray()
        ray = sys.modules.get("ray")
        if ray is not None and ray.is_initialized():  # the caller connected this process: its cluster, not ours
            if cluster is not None:
                cluster.started = False
            return ray
        if cluster is not None:
            return cluster.start()
        assert self.address is not None
        return connect(self.address)


class _Pool:
    """The workers of one run, as :class:`squad.cluster.dispatch.Worker` s the dispatcher calls."""

    def __init__(self, ray: Any, retries: int, on_item: Callable[[AgentResult], None] | None,
                 sinks: "Sequence[EventSink]" = (), feeds: Any = None) -> None:
        self.ray = ray
        self.retries = retries
        self.on_item = on_item
        self.sinks = list(sinks)
        self.feeds = feeds  # the task group the workers' event fetchers run in
        self.workers: list[_Handle] = []
        self.actors: list[Any] = []
        self.feed: dict[str, _Feed] = {}  # worker id -> its events' way to the sinks

    async def start(self, recipe: "Recipe", spec: "EngineSpec", fanout: RayFanout) -> None:
        """Start ``fanout.workers_per_node`` workers on each alive node, all at once; each one's
        events flow to the sinks from its first (the engine's plan and load)."""
        ray = self.ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        nodes = [n for n in ray.nodes() if n.get("Alive")]
        emit_to(self.sinks, ClusterConnected(address=fanout.address, nodes=len(nodes),
                                             workers=len(nodes) * fanout.workers_per_node))
        remote = ray.remote(_Worker)
        pending = []
        for node in nodes:
            for _ in range(fanout.workers_per_node):
                wid = f"w{len(pending)}@{node['NodeManagerAddress']}"
                actor = remote.options(
                    num_cpus=0, max_concurrency=64, max_restarts=0, name=None,
                    scheduling_strategy=NodeAffinitySchedulingStrategy(node["NodeID"], soft=False),
                ).remote(recipe, spec, wid, fanout.share)
                self.actors.append(actor)
                pending.append((wid, actor))
        started: dict[str, _Handle] = {}

        async def start_one(wid: str, actor: Any) -> None:
            if (handle := await self.start_worker(wid, actor, fanout.notes)) is not None:
                started[wid] = handle

        async with anyio.create_task_group() as tg:
            for wid, actor in pending:
                tg.start_soon(start_one, wid, actor)
        self.workers = [started[wid] for wid, _ in pending if wid in started]
        if not self.workers:
            raise SquadError("no Ray worker started: " + "; ".join(fanout.notes))

    async def start_worker(self, wid: str, actor: Any, notes: list[str]) -> "_Handle | None":
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
                  fail_on: Collection[Any], output_type: Any) -> list[AgentResult]:
        call = dict(fail_on=frozenset(fail_on), output_type=output_type)
        items = [(name, prompt, call) for prompt in prompts]
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
    feed: "_Feed"

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


class _Feed:
    """The driver's end of one worker's events: :meth:`forward` gives each fetched event to the
    sinks on the driver's clocks (``offsets``: the worker's ``time.monotonic()`` and
    ``time.time()`` minus the driver's, :func:`_clock_offsets`), except those of an item in
    ``lost`` (its worker was lost, the item went elsewhere); :meth:`reached` waits until a
    number of the worker's events have come."""

    def __init__(self, worker: str, sinks: "Sequence[EventSink]", offsets: tuple[float, float] = (0.0, 0.0)) -> None:
        self.worker, self.sinks, self.offsets = worker, list(sinks), offsets
        self.engine: str | None = None
        self.received = 0
        self.lost: set[int] = set()
        self.closed = False
        self._arrived = anyio.Event()

    def forward(self, batch: Sequence[tuple[int | None, Event]]) -> None:
        """Emit ``batch`` (``(item, event)`` pairs as :class:`_Outbox` hands them out)."""
        mono, wall = self.offsets
        for item, event in batch:
            self.engine = self.engine or event.engine
            if item is None or item not in self.lost:
                emit_to(self.sinks, replace(event, t=event.t - mono, wall=event.wall - wall))
        self.received += len(batch)
        self._arrived.set()
        self._arrived = anyio.Event()

    def close(self) -> None:
        """No more events will come (the worker is gone): nobody waits for them."""
        self.closed = True
        self._arrived.set()

    async def reached(self, count: int) -> None:
        """Return once ``count`` events of the worker have been forwarded (or none can come any
        more, or :data:`FLUSH_TIMEOUT` passed: a result is never held back for its events)."""
        with anyio.move_on_after(FLUSH_TIMEOUT):
            while self.received < count and not self.closed:
                await self._arrived.wait()


async def _fetch(actor: Any, feed: _Feed) -> None:
    """Fetch ``actor``'s events into ``feed`` until the actor is gone (or this is cancelled)."""
    try:
        while True:
            feed.forward(await actor.events.remote(POLL_S))
    except Exception:  # noqa: BLE001 - the actor died or was closed: its run() says why
        feed.close()


async def _clock_offsets(actor: Any, rounds: int = 3) -> tuple[float, float]:
    """How far ``actor``'s clocks are ahead of the driver's, in seconds: ``(monotonic, wall)``,
    from the round trip with the least delay of ``rounds`` (error at most half of it)."""
    best: tuple[float, float, float] | None = None
    for _ in range(rounds):
        m0, w0 = time.monotonic(), time.time()
        mono, wall = await actor.clock.remote()
        m1, w1 = time.monotonic(), time.time()
        if best is None or m1 - m0 < best[0]:
            best = (m1 - m0, mono - (m0 + m1) / 2, wall - (w0 + w1) / 2)
    assert best is not None
    return best[1], best[2]


_ITEM: contextvars.ContextVar[int | None] = contextvars.ContextVar("squad_ray_item", default=None)
"""In a worker: the driver's index of the map item the running task works on."""


class _Outbox:
    """A worker's events on their way to the driver: the worker's squad emits into it (its event
    loop's thread), Ray's threads :meth:`take` them. Each event is placed for the driver:
    ``worker`` set, ``engine`` the worker's engine when it had none, conversation and call ids
    prefixed with the worker's short id, an ``agent.started`` of a map item carrying the driver's
    index; each is handed out with the driver's index of its item (None: not an item's)."""

    def __init__(self, worker: str) -> None:
        self.worker = worker
        self.prefix = worker.partition("@")[0] + ":"
        self.engine: str | None = None
        self.count = 0
        """Events put in so far."""
        self._events: list[tuple[int | None, Event]] = []
        self._items: dict[str, int] = {}  # the worker's conversation id -> the driver's item index
        self._cond = threading.Condition()

    def __call__(self, event: Event) -> None:
        item = _ITEM.get()
        if isinstance(event, AgentStarted) and item is not None and event.conversation:
            self._items[event.conversation] = item  # the item's conversation, or one it started
        item = self._items.get(event.conversation or "")
        named = {k: self.prefix + v for k in ("conversation", "parent", "call") if (v := getattr(event, k))}
        if isinstance(event, AgentStarted) and event.item is not None and item is not None:
            named["item"] = item  # the driver's index (the worker's map numbers it so too: first_item)
        placed = replace(event, worker=self.worker, engine=event.engine or self.engine, **named)
        with self._cond:
            self._events.append((item, placed))
            self.count += 1
            self._cond.notify_all()

    def take(self, timeout: float) -> list[tuple[int | None, Event]]:
        """Every event not taken yet, waiting up to ``timeout`` seconds for the first."""
        with self._cond:
            if not self._events:
                self._cond.wait(timeout)
            taken, self._events = self._events, []
            return taken


def _reason(exc: BaseException) -> str:
    """The first line of a Ray error (they run to pages), or its type."""
    cause = getattr(exc, "cause", None)
    if isinstance(cause, BaseException) and not isinstance(cause, type(exc)):
        exc = cause
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:300]}" if text else type(exc).__name__


class _Worker:
    """The Ray actor (``ray.remote(_Worker)``): one :class:`~squad.runtime.squad.Squad` with the
    recipe's agents and its own launched engine, on an event loop of its own (an anyio
    blocking portal: the engine is spawned from that loop's thread, which lives as long as the
    actor). Ray calls its methods from up to 64 threads at once; the dispatcher sends at most
    the engine's slots."""

    def __init__(self, recipe: "Recipe", spec: "EngineSpec", worker_id: str, share: float) -> None:
        self.id, self.recipe, self.spec, self.share = worker_id, recipe, spec, share
        self._portal_cm: Any = None
        self._portal: Any = None
        self._squad_cm: Any = None
        self.squad: "Squad | None" = None
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
        events were emitted so far. Raises the planner's and launcher's errors."""
        from anyio.from_thread import start_blocking_portal

        from squad.runtime.squad import Squad

        memory = self._share_memory()
        self._portal_cm = start_blocking_portal()
        portal = self._portal = self._portal_cm.__enter__()
        recipe = self.recipe
        squad = Squad(list(recipe.agents.values()), main=recipe.main, engine=self.spec, workload=recipe.workload(),
                      variables={"params": recipe.params}, mcp_servers=recipe.mcp_servers, on_event=self.outbox)
        squad.session.restart_on_death = False  # a worker whose engine dies is taken out, not restarted (module docstring)
        self._squad_cm = portal.wrap_async_context_manager(squad)
        self.squad = self._squad_cm.__enter__()
        info = self.squad.info
        self.outbox.engine = info.base_url
        launcher = self.squad.session.launcher
        node = self.id.partition("@")[2]
        return WorkerInfo(id=self.id, node=node, pid=os.getpid(), engine=info.base_url,
                          engine_pid=launcher.pid if launcher else None, slots=info.slots, n_ctx=info.n_ctx,
                          memory=memory, share=self.share, pool=info.pool), self.outbox.count

    def _share_memory(self) -> int:
        """Set ``SQUAD_KV_MEMORY`` in this actor's process to its share of the node's KV memory
        (the planner and a replan read it); returns it in bytes."""
        from squad.engine.facts import read_model_facts
        from squad.engine.registry import resolve_model
        from squad.sched.memory import ENV_VAR, kv_memory

        model = resolve_model(self.spec.model)
        whole = kv_memory(model, n_layer=read_model_facts(model).n_layer, gpu_layers=self.spec.gpu_layers)
        os.environ[ENV_VAR] = str(int(whole.bytes * self.share))
        return int(whole.bytes * self.share)

    def run(self, index: int, name: str, prompt: str, *, fail_on: frozenset[Any],
            output_type: Any) -> tuple[AgentResult, int]:
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
            [result] = await squad.map(name, [prompt], fail_on=fail_on, output_type=output_type, first_item=index)
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
        return self._portal.call(functools.partial(self.squad.session.death, error, settle=settle))

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


class _ClusterSquad:
    """What :func:`squad.recipes.run.execute_flow` runs a flow on under Ray: ``map`` of a
    sub-agent goes to the workers; ``run``, ``run_agent``, ``parallel`` to the ``local`` squad
    (None when the recipe has no step for it, :func:`needs_local`)."""

    def __init__(self, pool: _Pool, local: "Squad | None", sinks: list["EventSink"]) -> None:
        self._pool, self._local, self._sinks = pool, local, sinks

    @property
    def local(self) -> "Squad":
        assert self._local is not None, "a step that runs in the driver, in a recipe needs_local() said has none"
        return self._local

    async def map(self, name: str, inputs: Iterable[str], *, max_concurrency: int | None = None,
                  fail_on: Collection[Any] = (), output_type: Any = None) -> list[AgentResult]:
        return await self._pool.map(name, list(inputs), max_concurrency=max_concurrency, fail_on=fail_on,
                                    output_type=output_type)

    async def run(self, *args: Any, **kwargs: Any) -> Any:
        return await self.local.run(*args, **kwargs)

    async def run_agent(self, *args: Any, **kwargs: Any) -> Any:
        return await self.local.run_agent(*args, **kwargs)

    async def parallel(self, *args: Any, **kwargs: Any) -> Any:
        return await self.local.parallel(*args, **kwargs)

    def emit(self, event: Any) -> None:
        from squad.events import emit_to

        emit_to(self._sinks, event)


def needs_local(recipe: "Recipe") -> bool:
    """True when some step of ``recipe`` runs in the driver under Ray: a call, or a map whose
    agent is the main agent (anything but a map of a sub-agent, inside blocks too)."""
    def local(steps: Iterable[Any]) -> bool:
        return any(local(s.steps) if s.kind == "parallel" else not (s.kind == "map" and s.agent != recipe.main)
                   for s in steps)

    return local(recipe.flow)


def check_launch(recipe: "Recipe", spec: "EngineSpec", fanout: RayFanout) -> None:
    """Check in the driver, before any cluster starts or is connected to, what the workers'
    planner would reject (blocking). Every node must have the model: a name squad's registry
    knows is pulled on each node that lacks it; a file must be at that path on each node.

    - a local cluster (this machine is its only node): the whole plan of one worker, for its
      share of this machine's memory (:func:`squad.engine.session.plan_engine`: the model, the pins,
      the budgets); a known model not here yet is pulled now, once, not by each worker;
    - an existing cluster: the model only, as this machine resolves it without pulling: a name
      that neither the registry nor any store knows (nor a file) fails here; a path or store
      reference not found here is left to the nodes, and so are the other settings, which
      depend on each node's memory.

    Raises :class:`~squad.errors.UnknownModel`, :class:`~squad.errors.PlanError`,
    :class:`~squad.errors.ModelError`, :class:`UserError` (exit 2 from the CLI)."""
    from squad.engine.registry import is_reference, resolve_model
    from squad.errors import ModelError, UnknownModel
    from squad.engine.session import plan_engine

    if fanout.address is None:
        plan_engine(spec, recipe.workload(), share=fanout.share)
        return
    model = spec.model
    try:
        resolve_model(model, pull=False)
    except UnknownModel:
        name = str(model)
        if is_reference(name) or "/" in name or name.endswith(".gguf"):
            return  # may be on the nodes
        raise
    except ModelError:
        return  # a known model not pulled here: each node pulls it


async def run_on_ray(recipe: "Recipe", fanout: RayFanout, *, engine: "EngineSpec",
                     on_event: "EventSink | list[EventSink] | None" = None,
                     record: "RecipeRun | None" = None) -> "RecipeRun":
    """Run ``recipe``'s flow with its maps on Ray workers (rules in the module docstring);
    ``engine`` is the spec each worker launches (and the local engine, if a step needs one).
    Returns the :class:`~squad.recipes.run.RecipeRun` (``workers``: each worker's
    :meth:`WorkerInfo.as_dict` and ``items``, the number of items it served). Checks the
    address and the launch settings first (:func:`squad.cluster.local.check_address`,
    :func:`check_launch`). Raises as :func:`squad.recipes.run.run_recipe`, :class:`UserError`
    without Ray or for a bad address or launch setting, :class:`~squad.errors.ClusterError`
    when the cluster does not answer."""
    from squad.recipes.run import execute_flow, recipe_mcp
    from squad.runtime.squad import Squad

    from squad.engine.session import EngineSpec

    require_ray()
    if not isinstance(engine, EngineSpec):
        raise UserError("a Ray run launches an engine on each worker: give engine as an EngineSpec (a model and pins)")
    check_address(fanout.address)
    await anyio.to_thread.run_sync(check_launch, recipe, engine, fanout)
    sinks = [] if on_event is None else list(on_event) if isinstance(on_event, list) else [on_event]
    async with recipe_mcp(recipe) as servers, fanout.pool(recipe, engine, sinks) as pool, AsyncExitStack() as stack:
        local = None
        if needs_local(recipe):
            local = await stack.enter_async_context(Squad(
                list(recipe.agents.values()), main=recipe.main, engine=engine, workload=recipe.workload(),
                on_event=sinks or None, variables={"params": recipe.params}, mcp_servers=servers))
        run = await execute_flow(recipe, _ClusterSquad(pool, local, sinks), record)  # type: ignore[arg-type]
        if local is not None:
            run.plan, run.info = local.session.plan, local.info
    served: dict[str, int] = {}
    for _, result in run.results:
        if result.worker is not None:
            served[result.worker] = served.get(result.worker, 0) + 1
    run.workers = [{**w.as_dict(), "items": served.get(w.id, 0)} for w in fanout.workers]
    return run

"""Cluster fan-out on Ray: a recipe's ``map`` steps over llama-servers on many machines.

``squad run RECIPE --ray [ADDRESS]`` or ``run_recipe(recipe, ray=RayFanout(...))`` (extra
``squad[ray]``). Each node runs ``workers_per_node`` actors, each with its own engine planned
against its memory share (default ``1 / workers_per_node`` of the node's KV memory) and, unless the spec pins
``threads``, the node's cores divided among them (:func:`squad.cluster.worker.node_threads`); map items
of sub-agents are dispatched over them (:func:`squad.cluster.dispatch.dispatch`), the items of a
lost worker run once more elsewhere; every other step runs in the driver on a local engine.
Workers' events reach the driver's sinks with ids prefixed by the worker (``w0:c17``) and
times on the driver's clocks. Every engine and a local cluster squad started are stopped at
the end. Errors: :class:`~squad.errors.ClusterError`.

Design: docs/design/ray.md
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio

from squad.cluster.dispatch import RETRIES
from squad.cluster.local import LocalCluster, check_address, connect

# the pool, the worker and the relay as their earlier home named them (tests import them from here)
from squad.cluster.pool import CLOSE_TIMEOUT, _ClusterSquad, _failure, _Handle, _Pool, _reason  # noqa: F401
from squad.cluster.relay import _ITEM, FLUSH_TIMEOUT, POLL_S, _clock_offsets, _Feed, _fetch, _Outbox  # noqa: F401
from squad.cluster.worker import (
    WorkerInfo,
    _Worker,  # noqa: F401
)
from squad.engine.provider import EngineProvider
from squad.engine.registry import is_reference, resolve_model
from squad.engine.session import EngineSpec, plan_engine
from squad.errors import ClusterError, ModelError, UnknownModel, UserError
from squad.events import ClusterStarting, EventSink, emit_to
from squad.recipes.model import Recipe
from squad.recipes.run import RecipeRun, execute_flow, recipe_mcp
from squad.runtime.results import AgentResult
from squad.runtime.squad import Squad

__all__ = ["RayFanout", "WorkerInfo", "run_on_ray", "check_launch", "needs_local", "require_ray", "INSTALL_HINT"]

INSTALL_HINT = "pip install 'squad[ray]'"
START_WAIT = 60.0
"""Longest a run interrupted while its local cluster starts waits for ``ray.init`` to return
before it stops the cluster anyway (seconds; it takes a few)."""

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
      :class:`~squad.runtime.results.AgentResult` as it ends (progress; any order);
    - ``worker_engine``: an :class:`~squad.engine.provider.EngineProvider` (picklable) each worker opens on its
      node instead of launching llama-server from the spec (``squad.testing.FakeNodeEngine``: a fake engine per
      node, for tests and benches); the launch checks are then skipped.

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
    worker_engine: EngineProvider | None = None
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

    async def run(self, recipe: Recipe, *, engine: EngineSpec, on_event: EventSink | list[EventSink] | None = None,
                  record: RecipeRun | None = None) -> RecipeRun:
        """Run ``recipe``'s flow with its maps on Ray workers: :func:`run_on_ray` (how
        :func:`squad.recipes.run.run_recipe` fans out, without importing this module)."""
        return await run_on_ray(recipe, self, engine=engine, on_event=on_event, record=record)

    @asynccontextmanager
    async def pool(self, recipe: Recipe, spec: EngineSpec,
                   sinks: Sequence[EventSink] = ()) -> AsyncIterator[_Pool]:
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
                    await pool.start(recipe, spec, address=self.address, per_node=self.workers_per_node,
                                     share=self.share, notes=self.notes, engine=self.worker_engine)
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


def needs_local(recipe: Recipe) -> bool:
    """True when some step of ``recipe`` runs in the driver under Ray: a call, or a map whose
    agent is the main agent (anything but a map of a sub-agent, inside blocks too)."""
    def local(steps: Iterable[Any]) -> bool:
        return any(local(s.steps) if s.kind == "parallel" else not (s.kind == "map" and s.agent != recipe.main)
                   for s in steps)

    return local(recipe.flow)


def check_launch(recipe: Recipe, spec: EngineSpec, fanout: RayFanout) -> None:
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


async def run_on_ray(recipe: Recipe, fanout: RayFanout, *, engine: EngineSpec,
                     on_event: EventSink | list[EventSink] | None = None,
                     record: RecipeRun | None = None) -> RecipeRun:
    """Run ``recipe``'s flow with its maps on Ray workers (rules in the module docstring);
    ``engine`` is the spec each worker launches (and the local engine, if a step needs one).
    Returns the :class:`~squad.recipes.run.RecipeRun` (``workers``: each worker's
    :meth:`WorkerInfo.as_dict` and ``items``, the number of items it served). Checks the
    address and the launch settings first (:func:`squad.cluster.local.check_address`,
    :func:`check_launch`). Raises as :func:`squad.recipes.run.run_recipe`, :class:`UserError`
    without Ray or for a bad address or launch setting, :class:`~squad.errors.ClusterError`
    when the cluster does not answer."""
    require_ray()
    if not isinstance(engine, EngineSpec):
        raise UserError("a Ray run launches an engine on each worker: give engine as an EngineSpec (a model and pins)")
    check_address(fanout.address)
    if fanout.worker_engine is None:
        await anyio.to_thread.run_sync(check_launch, recipe, engine, fanout)
    sinks = [] if on_event is None else list(on_event) if isinstance(on_event, list) else [on_event]
    async with recipe_mcp(recipe) as servers, fanout.pool(recipe, engine, sinks) as pool, AsyncExitStack() as stack:
        local = None
        if needs_local(recipe):
            local = await stack.enter_async_context(Squad(
                list(recipe.agents.values()), main=recipe.main, engine=engine, workload=recipe.workload(),
                on_event=sinks or None, variables={"params": recipe.params}, mcp_servers=servers))
        run = await execute_flow(recipe, _ClusterSquad(pool, local, sinks), record)
        if local is not None:
            run.plan, run.info = local.session.plan, local.info
    served: dict[str, int] = {}
    for _, result in run.results:
        if result.worker is not None:
            served[result.worker] = served.get(result.worker, 0) + 1
    run.workers = [{**w.as_dict(), "items": served.get(w.id, 0)} for w in fanout.workers]
    return run


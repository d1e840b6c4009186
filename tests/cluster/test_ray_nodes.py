"""A map over several Ray nodes (issue 31): Ray's own multi-node test cluster (``ray.cluster_utils.Cluster``: a
head and a worker node on 127.0.0.1, each with its own custom resource and a small object store), one fake engine
per node (``squad.testing.FakeNodeEngine``, in its worker's process): the map spreads over the nodes, results stay
in input order, and a node killed mid-map has the items it held run once more on the other node, exactly once."""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import tempfile
import threading
from collections import Counter
from pathlib import Path

import anyio
import pytest

from squad.events import AgentStarted, CallFinished, ItemLost, WorkerStarted
from squad.recipes import load_recipe, run_recipe
from squad.testing.fake_node import FakeNodeEngine

pytestmark = [pytest.mark.ray, pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="needs squad[ray]")]

N = 60
OBJECT_STORE = 80 * 2**20  # Ray's smallest is 75 MiB; the machine is shared
WORDS = ", ".join(f"w{i:02d}" for i in range(N))
RECIPE = f"""\
name: nodes
params:
  items: {{type: list, default: [{WORDS}]}}
agents:
  echo: {{instructions: Repeat., max_tokens: 8}}
  boss: {{instructions: Be brief., max_tokens: 8}}
main: boss
flow:
  - id: words
    map: params.items
    agent: echo
    prompt: "Say {{{{ item }}}}"
"""


def node_args(k: int, temp: str | None = None) -> dict:
    """Node ``k`` of the test cluster: 1 CPU, its own resource ``squad-node-<k>``, a small object store."""
    args: dict = dict(num_cpus=1, resources={f"squad-node-{k}": 1}, object_store_memory=OBJECT_STORE,
                      node_ip_address="127.0.0.1")
    if temp is not None:  # the head's: where every node's sockets and logs go; quick node-death detection
        args.update(temp_dir=temp, include_dashboard=False,
                    _system_config={"health_check_period_ms": 500, "health_check_failure_threshold": 3})
    return args


@pytest.fixture
def cluster(monkeypatch):
    """A head and one worker node on 127.0.0.1, this process connected as the driver; all stopped after. Ray's
    files (and the cluster's address, which Ray writes for `ray.init()` to find) go to a temp dir of the test's,
    never /tmp/ray, which other users' clusters on this machine may use."""
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    os.environ.setdefault("RAY_DISABLE_FAILURE_SIGNAL_HANDLER", "1")
    temp = tempfile.mkdtemp(prefix="sqnodes-")
    os.mkdir(os.path.join(temp, "ray"))
    monkeypatch.setenv("RAY_TMPDIR", temp)
    import ray
    from ray.cluster_utils import Cluster

    made = None
    try:
        made = Cluster(initialize_head=True, head_node_args=node_args(0, temp))
        made.add_node(**node_args(1))
        made.wait_for_nodes()
        ray.init(address=made.address, logging_level=logging.ERROR, log_to_driver=False)
        yield made
    finally:
        ray.shutdown()
        if made is not None:
            made.shutdown()
        shutil.rmtree(temp, ignore_errors=True)


def _recipe(tmp_path: Path):
    path = tmp_path / "nodes.yaml"
    path.write_text(RECIPE)
    return load_recipe(path, {})


def _node_resources() -> dict[str, str]:
    """Node id -> its ``squad-node-<k>`` resource."""
    import ray

    return {n["NodeID"]: next(r for r in n["Resources"] if r.startswith("squad-node-"))
            for n in ray.nodes() if n.get("Alive")}


def _run(tmp_path: Path, cluster, fanout) -> tuple:
    from squad.cluster.ray import RayFanout

    assert isinstance(fanout, RayFanout)
    recipe = _recipe(tmp_path)
    events: list = []
    run = anyio.run(lambda: run_recipe(recipe, engine=recipe.engine_spec(), ray=fanout, on_event=events.append))
    results = [r for sid, r in run.results if sid == "words"]
    assert [r.item for r in results] == list(range(N))  # input order, one result per item
    for i, r in enumerate(results):
        assert r.error is None, r.error
        assert r.history and f"w{i:02d}" in r.history[0]["content"]  # the answer to this item's prompt
    return run, results, events


def test_a_map_spreads_over_the_nodes_in_input_order(tmp_path: Path, cluster) -> None:
    from squad.cluster.ray import RayFanout

    nodes = _node_resources()
    assert sorted(nodes.values()) == ["squad-node-0", "squad-node-1"]
    fanout = RayFanout(address=cluster.address, worker_engine=FakeNodeEngine(slots=2, token_delay=0.005))
    run, results, events = _run(tmp_path, cluster, fanout)
    assert len(fanout.workers) == 2 and fanout.notes == []
    assert {nodes[w.node_id] for w in fanout.workers} == {"squad-node-0", "squad-node-1"}  # one worker per node
    assert len({w.engine for w in fanout.workers}) == 2  # each with its own engine
    served = Counter(r.worker for r in results)
    assert set(served) == {w.id for w in fanout.workers} and all(n > 0 for n in served.values())
    engines = {w.id: w.engine for w in fanout.workers}
    assert all(r.engine == engines[r.worker] and r.retried is None for r in results)
    assert {(e.worker, e.engine) for e in events if isinstance(e, WorkerStarted)} == set(engines.items())
    assert sum(w["items"] for w in run.workers) == N


def test_a_node_killed_mid_map_has_its_items_run_once_elsewhere(tmp_path: Path, cluster) -> None:
    from squad.cluster.ray import RayFanout

    nodes = _node_resources()
    [victim_node] = [n for n in cluster.worker_nodes]  # the head holds the driver: the worker node dies
    victim_id = next(i for i, r in nodes.items() if r == "squad-node-1")
    killed: list[str] = []
    done: list = []

    def on_item(result) -> None:  # kill node 1 (raylet, its worker, its engine) once its worker served 3 items
        done.append(result)
        victim = next((w for w in fanout.workers if w.node_id == victim_id), None)
        if victim is not None and not killed and sum(r.worker == victim.id for r in done) >= 3:
            killed.append(victim.id)
            threading.Thread(target=cluster.remove_node, args=(victim_node, False), daemon=True).start()

    fanout = RayFanout(address=cluster.address, worker_engine=FakeNodeEngine(slots=2, token_delay=0.02),
                       on_item=on_item)
    run, results, events = _run(tmp_path, cluster, fanout)
    [victim] = [w for w in fanout.workers if w.id == killed[0]]
    [survivor] = [w for w in fanout.workers if w.id != victim.id]
    retried = [r for r in results if r.retried]
    assert retried, "the killed node's worker held items in flight: they must run again"
    assert len(retried) <= victim.slots  # only what it held, never items sent ahead
    assert all(r.worker == survivor.id and f"worker {victim.id} lost" in r.retried for r in retried)
    lost = [e for e in events if isinstance(e, ItemLost)]
    assert sorted(e.item for e in lost) == sorted(r.item for r in retried)  # one loss per retried item
    assert all(e.worker == victim.id and e.retry for e in lost)
    # exactly once: every item finished on one worker; the survivor started each of its items once
    by = Counter(r.worker for r in results)
    assert by[victim.id] >= 3 and by[victim.id] + by[survivor.id] == N
    item_of = {e.conversation: e.item for e in events if isinstance(e, AgentStarted) and e.worker == survivor.id}
    started = Counter(item_of.values())
    assert all(n == 1 for n in started.values()) and len(started) == by[survivor.id]
    calls = Counter(item_of[e.conversation] for e in events if isinstance(e, CallFinished)
                    and e.conversation in item_of)
    assert sorted(calls) == sorted(started) and all(n == 1 for n in calls.values())  # one call each, on it

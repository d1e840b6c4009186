"""Cluster fan-out on Ray (squad.cluster.ray) with the real engine: a local Ray cluster on 127.0.0.1
started by the test, two workers on this machine (1 thread each, 2 slots, small context), a
32-item map; and the same with one worker's process killed mid-run."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import tempfile
import time
from pathlib import Path

import anyio
import psutil
import pytest

from squad.cluster.ray import RayFanout
from squad.events import AgentStarted, CallFinished, EngineLoaded, ItemLost, WorkerStarted
from squad.events.jsonl import JsonlTrace, load_trace
from squad.events.summary import summarize
from squad.recipes import load_recipe, run_recipe

# not imported here: a local cluster sets its environment before Ray is imported (squad.cluster.ray)
pytestmark = [pytest.mark.engine, pytest.mark.ray,
              pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="needs squad[ray]")]

WORDS = [f"w{n:02d}" for n in range(32)]
RECIPE = f"""\
name: ray-fanout
model: default
params:
  items:
    type: list
    default: {json.dumps(WORDS)}
agents:
  echo:
    instructions: Repeat the word.
    max_tokens: 8
  boss:
    instructions: Be brief.
    max_tokens: 8
main: boss
flow:
  - id: words
    map: params.items
    agent: echo
    prompt: "Say {{{{ item }}}}"
"""


def _recipe(tmp_path: Path):
    path = tmp_path / "fanout.yaml"
    path.write_text(RECIPE)
    return load_recipe(path, {})


def _spec(recipe):
    return recipe.engine_spec().but(threads=1, slots=2, ctx=512)


def _ray_processes() -> list[str]:
    found = []
    for p in psutil.process_iter(["name", "cmdline"]):
        try:
            cmd = " ".join(p.info["cmdline"] or [])
        except psutil.Error:
            continue
        if p.info["name"] in ("raylet", "gcs_server") or cmd.startswith("ray::") or "ray/_private/workers" in cmd:
            found.append(f"{p.pid} {cmd[:100]}")
    return found


def _gone(pids: list[int], timeout: float = 15.0) -> list[int]:
    """The pids still alive after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        alive = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.2)


@pytest.fixture
def ray_dir():
    """A short temp dir for Ray's sockets and logs (unix socket paths are limited to 107 bytes)."""
    path = tempfile.mkdtemp(prefix="sqray-")
    before = set(_ray_processes())  # another user's cluster on this machine is not this test's
    yield path
    leftover = []
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and (leftover := [p for p in _ray_processes() if p not in before]):
        time.sleep(0.3)
    shutil.rmtree(path, ignore_errors=True)
    assert not leftover, f"Ray processes left after the test: {leftover}"


def _check_items(run, fanout) -> list:
    results = [r for sid, r in run.results if sid == "words"]
    assert [r.item for r in results] == list(range(32))  # input order, each item once
    for r, word in zip(results, WORDS):
        assert r.error is None, r.error
        assert r.history and word in r.history[0]["content"]  # the answer is to this item's prompt
        assert r.worker is not None and r.engine is not None
    engines = {w.id: w.engine for w in fanout.workers}
    assert all(engines[r.worker] == r.engine for r in results)  # each served by its worker's own engine
    assert len(run.steps["words"]["outputs"]) == 32
    return results


def _check_events(events: list, fanout) -> None:
    """The workers' events reached the driver: per item one call.finished on the engine of the
    worker that served it, one engine.loaded and worker.started per worker, each item counted once."""
    engines = {w.id: w.engine for w in fanout.workers}
    lost = {(e.worker, e.item) for e in events if isinstance(e, ItemLost)}
    items = {e.conversation: (e.item, e.worker) for e in events if isinstance(e, AgentStarted)
             and e.item is not None and (e.worker, e.item) not in lost}
    finished = [e for e in events if isinstance(e, CallFinished) and e.conversation in items]
    assert sorted(items[e.conversation][0] for e in finished) == list(range(32))
    assert all(e.engine == engines[e.worker] == engines[items[e.conversation][1]] for e in finished)
    assert len({e.engine for e in finished}) == 2
    assert {(e.worker, e.engine) for e in events if isinstance(e, WorkerStarted)} == set(engines.items())
    assert sorted(e.worker for e in events if isinstance(e, EngineLoaded)) == sorted(engines)
    summary = summarize(events)
    rows = {n: a for n, a in summary.agents.items() if n.startswith("echo[")}
    assert len(rows) == 32 and all(a.status != "running" and a.calls == 1 for a in rows.values()), rows


def test_32_items_over_two_workers_in_input_order(tmp_path: Path, ray_dir: str) -> None:
    recipe = _recipe(tmp_path)
    fanout = RayFanout(workers_per_node=2, temp_dir=ray_dir)
    with JsonlTrace(tmp_path / "run.jsonl") as trace:
        run = anyio.run(lambda: run_recipe(recipe, engine=_spec(recipe), ray=fanout, on_event=trace))
    _check_events(load_trace(tmp_path / "run.jsonl"), fanout)
    results = _check_items(run, fanout)
    assert len(fanout.workers) == 2 and fanout.notes == []
    assert {r.worker for r in results} == {w.id for w in fanout.workers}  # both used
    assert all(r.retried is None for r in results)
    assert all(w.share == 0.5 and w.slots == 2 and w.node == "127.0.0.1" for w in fanout.workers)
    assert {w.engine for w in fanout.workers} and len({w.engine for w in fanout.workers}) == 2
    assert sorted(w["items"] for w in run.workers) and sum(w["items"] for w in run.workers) == 32
    assert run.info is None  # a map-only recipe launches no local engine
    assert _gone([w.engine_pid for w in fanout.workers if w.engine_pid]) == []


def test_a_killed_worker_s_items_finish_on_the_other(tmp_path: Path, ray_dir: str) -> None:
    recipe = _recipe(tmp_path)
    killed: list[str] = []

    def on_item(result) -> None:  # kill w1's process once it has served 3 items (2 more are in flight)
        served = [r for r in done if r.worker == victim.id] if (victim := _victim()) else []
        done.append(result)
        if victim is not None and len(served) >= 3 and not killed:
            os.kill(victim.pid, signal.SIGKILL)
            killed.append(victim.id)

    def _victim():
        return fanout.workers[1] if len(fanout.workers) == 2 else None

    done: list = []
    events: list = []
    fanout = RayFanout(workers_per_node=2, temp_dir=ray_dir, on_item=on_item)
    run = anyio.run(lambda: run_recipe(recipe, engine=_spec(recipe), ray=fanout, on_event=events.append))
    assert killed == [fanout.workers[1].id]
    _check_events(events, fanout)
    results = _check_items(run, fanout)
    survivor, victim = fanout.workers
    retried = [r for r in results if r.retried]
    assert retried, "the killed worker held items in flight; they must be retried"
    assert len(retried) <= victim.slots
    for r in retried:
        assert r.worker == survivor.id and f"worker {victim.id} lost" in r.retried
    lost = [e for e in events if isinstance(e, ItemLost)]  # each retry is in the trace
    assert sorted(e.item for e in lost) == sorted(r.item for r in retried)
    assert all(e.worker == victim.id and e.retry for e in lost)
    by_victim = [r for r in results if r.worker == victim.id]
    assert len(by_victim) >= 3
    assert len(by_victim) + len([r for r in results if r.worker == survivor.id]) == 32  # none twice
    assert _gone([victim.engine_pid]) == []  # its engine died with it
    assert _gone([w.engine_pid for w in fanout.workers if w.engine_pid]) == []


def test_a_killed_engine_s_items_finish_on_the_other_worker(tmp_path: Path, ray_dir: str) -> None:
    """SIGKILL one worker's llama-server (not the worker) mid-run: the items it was answering
    count as lost with their worker, run once more on the other, and the retries are stated."""
    recipe = _recipe(tmp_path)
    killed: list[int] = []

    def on_item(result) -> None:  # kill w1's engine once w1 has served 3 items (2 more are in flight)
        done.append(result)
        victim = fanout.workers[1] if len(fanout.workers) == 2 else None
        if victim is not None and not killed and len([r for r in done if r.worker == victim.id]) >= 3:
            os.kill(victim.engine_pid, signal.SIGKILL)
            killed.append(victim.engine_pid)

    done: list = []
    events: list = []
    fanout = RayFanout(workers_per_node=2, temp_dir=ray_dir, on_item=on_item)
    run = anyio.run(lambda: run_recipe(recipe, engine=_spec(recipe), ray=fanout, on_event=events.append))
    survivor, victim = fanout.workers
    assert killed == [victim.engine_pid]
    results = _check_items(run, fanout)  # every item answered, in input order, once
    retried = [r for r in results if r.retried]
    assert retried and all(r.worker == survivor.id and f"worker {victim.id} lost" in r.retried
                           and "engine" in r.retried for r in retried), [r.retried for r in retried]
    lost = [e for e in events if isinstance(e, ItemLost)]
    assert sorted(e.item for e in lost) == sorted(r.item for r in retried)
    assert all(e.worker == victim.id and e.retry for e in lost)
    by_victim = [r for r in results if r.worker == victim.id]
    assert len(by_victim) >= 3 and len(by_victim) + len([r for r in results if r.worker == survivor.id]) == 32
    assert _gone([w.engine_pid for w in fanout.workers if w.engine_pid]) == []


def _descendants(proc: psutil.Popen) -> set[psutil.Process]:
    try:
        return set(psutil.Process(proc.pid).children(recursive=True))
    except psutil.Error:
        return set()


@pytest.mark.parametrize("delay", [1.5, 4.0])  # the cluster starting; the workers and their engines starting
def test_ctrl_c_while_a_local_cluster_starts_leaves_no_process(tmp_path: Path, delay: float,
                                                               llama_server_path: Path,
                                                               default_model_path: Path) -> None:
    """`squad run --ray local` gets SIGINT while its cluster (or its workers) start: it exits 130
    and every process it started (gcs_server, raylet, the ray:: agents and workers, their
    llama-servers) is gone within a few seconds."""
    import subprocess
    import sys

    path = tmp_path / "fanout.yaml"
    path.write_text(RECIPE)
    env = {**os.environ, "SQUAD_STATE_DIR": str(tmp_path / "state")}
    proc = psutil.Popen([sys.executable, "-m", "squad", "run", str(path), "--ray", "local", "--ray-workers", "2",
                         "--threads", "1", "--slots", "1", "--ctx", "512", "--model", str(default_model_path),
                         "--llama-server", str(llama_server_path), "-q"],
                        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    seen: set[psutil.Process] = set()
    deadline = time.monotonic() + delay
    while time.monotonic() < deadline:  # every process of the run, as it appears
        seen |= _descendants(proc)
        time.sleep(0.1)
    seen |= _descendants(proc)
    proc.send_signal(signal.SIGINT)
    while proc.poll() is None:
        seen |= _descendants(proc)
        time.sleep(0.1)
    err = proc.stderr.read().decode()
    assert proc.returncode == 130, err
    assert "Traceback" not in err, err
    names = {p.pid: p.name() for p in seen if p.is_running()}
    left = _gone([p.pid for p in seen], timeout=5.0)
    assert left == [], f"left after Ctrl-C: {[names.get(p) for p in left]}"

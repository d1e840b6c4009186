"""squad.cluster.ray without Ray: options, which steps run where, how map items come back (fake
workers behind the real dispatcher), and the CLI's --ray errors. The real cluster is in
test_ray_real.py."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

import anyio
import pytest

from cli_support import squad, state  # noqa: F401
from squad.cluster.dispatch import WorkerLost
from squad.cluster.ray import INSTALL_HINT, RayFanout, _ClusterSquad, _Pool, needs_local
from squad.errors import UserError
from squad.recipes import load_recipe, run_recipe, step_table
from squad.recipes.run import execute_flow
from squad.runtime.mention import unmark
from squad.runtime.results import AgentResult
from squad.runtime.squad import Squad
from squad.testing import ScriptedEngine

RECIPE = """\
name: mixed
params:
  items: {{type: list, default: [a, b, c, d, e]}}
agents:
  echo: {{instructions: Repeat., max_tokens: 8}}
  boss: {{instructions: Be brief., max_tokens: 8}}
main: boss
flow:
{flow}
"""
MAP = """  - id: words
    map: params.items
    agent: echo
    prompt: "Say {{ item }}"
"""
CALL = """  - id: last
    agent: boss
    prompt: "Sum up {{ steps.words.output }}"
"""


def _recipe(tmp_path: Path, *steps: str):
    path = tmp_path / "r.yaml"
    path.write_text(RECIPE.format(flow="".join(steps)))
    return load_recipe(path, {})


@dataclass
class FakeWorker:
    """A worker as the pool sees it: answers ``<id>:<prompt>``; dies at item ``die_at``;
    ``bad`` prompts fail for their own reason."""

    id: str
    capacity: int = 2
    die_at: int | None = None
    bad: str = "Say c"

    async def run(self, index: int, item: tuple) -> AgentResult:
        name, prompt, call = item
        prompt = unmark(prompt)  # as Squad.map on a worker takes it
        await anyio.sleep(0.001 * index)
        if index == self.die_at:
            raise WorkerLost("the actor died")
        if prompt == self.bad:
            from squad.errors import InvalidOutput

            return AgentResult(agent=name, error=InvalidOutput("not JSON", agent=name), item=index,
                               worker=self.id, engine=f"http://127.0.0.1/{self.id}")
        return AgentResult(agent=name, output=f"{self.id}:{prompt}", item=index, finish_reason="stop",
                           worker=self.id, engine=f"http://127.0.0.1/{self.id}")


def _pool(*workers: FakeWorker, on_item=None) -> _Pool:
    pool = _Pool(ray=None, retries=1, on_item=on_item)
    pool.workers = list(workers)  # type: ignore[list-item]
    return pool


def test_options_are_checked() -> None:
    assert RayFanout(workers_per_node=4).share == 0.25
    assert RayFanout(workers_per_node=4, memory_share=0.5).share == 0.5
    for bad in (dict(workers_per_node=0), dict(memory_share=0), dict(memory_share=1.5), dict(retries=-1)):
        with pytest.raises(UserError):
            RayFanout(**bad)


def test_which_steps_need_a_local_engine(tmp_path: Path) -> None:
    assert not needs_local(_recipe(tmp_path, MAP))
    assert needs_local(_recipe(tmp_path, MAP, CALL))
    main_map = MAP.replace("agent: echo", "agent: boss")
    assert needs_local(_recipe(tmp_path, main_map))


def test_maps_go_to_the_workers_and_calls_to_the_local_squad(tmp_path: Path) -> None:
    recipe = _recipe(tmp_path, MAP, CALL)
    seen: list[AgentResult] = []
    pool = _pool(FakeWorker("w0"), FakeWorker("w1", die_at=1), on_item=seen.append)
    local = ScriptedEngine(responder=lambda request: "summed")

    async def main():
        async with Squad(list(recipe.agents.values()), main=recipe.main, engine=local) as sq:
            return await execute_flow(recipe, _ClusterSquad(pool, sq, []), None)

    run = anyio.run(main)
    words = [r for sid, r in run.results if sid == "words"]
    assert [r.item for r in words] == [0, 1, 2, 3, 4] and len(seen) == 5
    assert words[1].worker == "w0" and "worker w1 lost: the actor died" in words[1].retried
    assert words[1].output == "w0:Say b"
    # an item that failed for its own reason: reported, not retried
    assert words[2].error is not None and words[2].retried is None and "not JSON" in str(words[2].error)
    assert run.steps["words"]["outputs"][0].endswith(":Say a") and "[failed" in run.steps["words"]["outputs"][2]
    assert [sid for sid, _ in run.errors] == ["words[2]"]
    assert run.steps["last"]["output"] == "summed" and len(local.requests) == 1  # only the call ran locally
    rows = step_table(run)
    assert rows[1]["worker"] == "w0" and rows[1]["engine"] == "http://127.0.0.1/w0" and rows[1]["retried"]
    assert "worker" not in rows[-1]  # the local call


def test_items_no_worker_could_run_are_failures_saying_why(tmp_path: Path) -> None:
    recipe = _recipe(tmp_path, MAP)
    pool = _pool(FakeWorker("w0", capacity=1, die_at=0))

    async def main():
        return await execute_flow(recipe, _ClusterSquad(pool, None, []), None)

    run = anyio.run(main)
    assert run.steps["words"]["error"].startswith("all 5 items failed")
    assert all("no worker left" in message for _, message in run.errors)


def test_a_ray_run_needs_a_spec_to_launch(tmp_path: Path) -> None:
    recipe = _recipe(tmp_path, MAP)
    with pytest.raises(UserError, match="EngineSpec"):
        anyio.run(lambda: run_recipe(recipe, engine=ScriptedEngine(), ray=RayFanout()))


def test_cli_without_ray_says_how_to_install(tmp_path: Path, capsys, state, monkeypatch) -> None:
    recipe = tmp_path / "r.yaml"
    recipe.write_text(RECIPE.format(flow=MAP))
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "ray" else real(name, *a))
    code, out, err = squad(capsys, "run", recipe, "--ray", "local")
    assert code == 2 and INSTALL_HINT in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("argv, says", [
    (["--ray-workers", "2"], "--ray-workers sets the workers per node"),
    (["--ray", "local", "--url", "http://127.0.0.1:9"], "drop --url"),
])
def test_cli_ray_option_errors(tmp_path: Path, capsys, state, argv, says) -> None:
    recipe = tmp_path / "r.yaml"
    recipe.write_text(RECIPE.format(flow=MAP))
    code, out, err = squad(capsys, "run", recipe, *argv)
    assert code == 2 and says in " ".join(err.split()), err


def test_cli_help_states_where_steps_run(capsys) -> None:
    code, out, err = squad(capsys, "run", "--help")
    text = " ".join(out.replace("│", " ").split())
    assert "--ray" in text and "--ray-workers" in text and "local engine" in text


@pytest.mark.parametrize("argv, expect", [
    (["run", "r.yaml", "--ray"], ["run", "r.yaml", "--ray", "default"]),
    (["run", "r.yaml", "--ray", "--quiet"], ["run", "r.yaml", "--ray", "default", "--quiet"]),
    (["run", "--ray", "r.yaml"], ["run", "--ray", "default", "r.yaml"]),
    (["run", "r.yaml", "--ray", "auto"], ["run", "r.yaml", "--ray", "auto"]),
    (["run", "r.yaml", "--ray", "ray://h:10001"], ["run", "r.yaml", "--ray", "ray://h:10001"]),
])
def test_ray_address_may_be_left_out(argv, expect) -> None:
    from squad.cli._app import _optional_values

    assert _optional_values(argv) == expect


@pytest.mark.parametrize("env, address", [(None, None), ("10.0.0.9:6379", "10.0.0.9:6379")])
def test_a_bare_ray_uses_ray_address_else_a_local_cluster(monkeypatch, env, address) -> None:
    from squad.cli.run import _ray_fanout

    if env is None:
        monkeypatch.delenv("RAY_ADDRESS", raising=False)
    else:
        monkeypatch.setenv("RAY_ADDRESS", env)
    assert _ray_fanout("default", None, None).address == address


# -- the --ray address, checked before anything starts (squad.cluster.local) --------------------------

@pytest.mark.parametrize("address, parsed", [
    (None, None), ("local", None), ("auto", None),
    ("127.0.0.1:6379", ("gcs", "127.0.0.1", 6379)), ("head-node.lan:6379", ("gcs", "head-node.lan", 6379)),
    ("[::1]:6379", ("gcs", "::1", 6379)),
])
def test_ray_address_forms(address, parsed) -> None:
    from squad.cluster.local import check_address

    assert check_address(address) == parsed


@pytest.mark.parametrize("address", ["bogus:addr", "http://x", "127.0.0.1", "127.0.0.1:0", "10.0.0.1:99999",
                                     "ray://", "ray://h", "h:1:2", "", "ray://h:x"])
def test_malformed_ray_addresses_say_what_is_accepted(address) -> None:
    from squad.cluster.local import ADDRESS_FORMS, check_address

    with pytest.raises(UserError, match="is not a Ray address") as caught:
        check_address(address)
    assert ADDRESS_FORMS in str(caught.value)


def test_ray_client_without_its_extra_says_how_to_install(monkeypatch) -> None:
    from squad.cluster.local import CLIENT_HINT, check_address

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "grpc" else real(name, *a))
    with pytest.raises(UserError, match="Ray Client") as caught:
        check_address("ray://127.0.0.1:10001")
    assert CLIENT_HINT in str(caught.value)


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_cluster_address_must_answer_before_ray_init() -> None:
    import socket

    from squad.cluster.local import probe
    from squad.errors import ClusterError

    port = _closed_port()
    with pytest.raises(ClusterError, match=f"no Ray cluster .* answers at 127.0.0.1:{port}"):
        probe(f"127.0.0.1:{port}", timeout=1.0)
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        probe(f"127.0.0.1:{listening.getsockname()[1]}", timeout=1.0)  # answers: no error
    probe("auto")  # nothing to probe: Ray finds it


def test_ray_s_own_connection_errors_become_one_line_cluster_errors(monkeypatch) -> None:
    import sys
    import types

    from squad.cluster.local import connect
    from squad.errors import ClusterError

    def init(**kwargs):
        raise ConnectionError("Could not find any running Ray instance.\n(more lines)")

    monkeypatch.setitem(sys.modules, "ray", types.SimpleNamespace(init=init))
    with pytest.raises(ClusterError, match="could not connect to the Ray cluster at 'auto'") as caught:
        connect("auto")
    assert "\n" not in str(caught.value) and "ray start --head" in str(caught.value)


@pytest.mark.parametrize("argv, code, says", [
    (["--ray", "bogus:addr"], 2, "is not a Ray address"),
    (["--ray", "http://x"], 2, "is not a Ray address"),
    (["--ray", f"127.0.0.1:{_closed_port()}"], 1, "no Ray cluster (its GCS) answers"),
])
def test_cli_bad_ray_addresses_are_one_line_errors(tmp_path: Path, capsys, state, argv, code,
                                                   says) -> None:
    recipe = tmp_path / "r.yaml"
    recipe.write_text(RECIPE.format(flow=MAP))
    got, out, err = squad(capsys, "run", recipe, "--quiet", *argv)
    assert got == code and says in err and "Traceback" not in err, err
    assert len(err.strip().splitlines()) == 1, err


# -- the launch settings, checked in the driver before the cluster (check_launch) ---------------------

def test_an_unknown_model_fails_before_a_local_cluster_starts(tmp_path: Path, capsys, state,
                                                              monkeypatch) -> None:
    from squad.cluster.local import LocalCluster

    def start(self):
        raise AssertionError("the cluster started")

    monkeypatch.setattr(LocalCluster, "start", start)
    recipe = tmp_path / "r.yaml"
    recipe.write_text(RECIPE.format(flow=MAP))
    code, out, err = squad(capsys, "run", recipe, "--ray", "local", "--model", "nosuch")
    assert code == 2 and "no model 'nosuch'" in err and "Traceback" not in err, err


def test_check_launch_on_an_existing_cluster_checks_only_the_model(tmp_path: Path) -> None:
    from squad.cluster.ray import check_launch
    from squad.errors import UnknownModel

    recipe = _recipe(tmp_path, MAP)
    fanout = RayFanout(address="10.0.0.5:6379")
    with pytest.raises(UnknownModel):  # no node resolves a bare name nothing knows
        check_launch(recipe, recipe.engine_spec().but(model="nosuch"), fanout)
    check_launch(recipe, recipe.engine_spec().but(model="/on/the/nodes/only.gguf"), fanout)  # left to the nodes
    check_launch(recipe, recipe.engine_spec().but(model="hf:org/repo"), fanout)


# -- a worker whose engine died (the actor's side, without Ray) --------------------------------------

class _Session:
    launcher = None

    def __init__(self) -> None:
        self.dead: str | None = None
        self.chat = self

    def exited(self) -> str | None:
        return self.dead

    async def engine_up(self) -> bool:
        return self.dead is None

    async def death(self, error, *, settle: float = 0.5) -> str | None:
        """EngineSession.death's rule over this fake's state."""
        from squad.errors import TruncatedStream

        if self.exited() is not None:
            return self.exited()
        if isinstance(error, TruncatedStream) and not await self.engine_up():
            return f"not answering after a stream it served was cut ({error})"
        return None


class _FakeSquad:
    """What _Worker.run uses of a squad: map, session, info."""

    def __init__(self, error=None) -> None:
        self.session, self.error = _Session(), error
        self.info = type("Info", (), {"base_url": "http://127.0.0.1:1"})()

    async def map(self, name, prompts, **kwargs):
        return [AgentResult(agent=name, output="" if self.error else "ok", error=self.error, item=0)]


@pytest.mark.parametrize("error_name", ["TruncatedStream", "CallTimeout"])
def test_an_item_that_failed_because_the_engine_died_is_lost_with_its_worker(tmp_path: Path, error_name) -> None:
    from anyio.from_thread import start_blocking_portal

    import squad.errors as errors
    from squad.cluster.ray import _Worker
    from squad.errors import EngineGone

    recipe = _recipe(tmp_path, MAP)
    worker = _Worker(recipe, recipe.engine_spec(), "w0@127.0.0.1", 1.0)
    error = getattr(errors, error_name)("connection to the engine dropped mid-answer", agent="echo")
    with start_blocking_portal() as portal:
        worker._portal, worker.squad = portal, _FakeSquad(error)  # type: ignore[assignment]
        result, _ = worker.run(0, "echo", "Say a", fail_on=frozenset(), output_type=None)
        assert result.error is error and worker.engine_lost is None  # the engine serves: the item's own failure
        worker.squad.session.dead = "engine exited (signal 9 SIGKILL), log: x.log"
        with pytest.raises(EngineGone, match="engine exited .signal 9 SIGKILL"):
            worker.run(1, "echo", "Say b", fail_on=frozenset(), output_type=None)
        worker.squad.error = None  # out of service: even an item that would succeed is sent elsewhere
        with pytest.raises(EngineGone, match="its engine is gone"):
            worker.run(2, "echo", "Say c", fail_on=frozenset(), output_type=None)


def test_a_cut_stream_with_the_engine_not_answering_is_a_death(tmp_path: Path) -> None:
    from anyio.from_thread import start_blocking_portal

    from squad.cluster.ray import _Worker
    from squad.errors import EngineGone, TruncatedStream

    recipe = _recipe(tmp_path, MAP)
    worker = _Worker(recipe, recipe.engine_spec(), "w0@127.0.0.1", 1.0)
    fake = _FakeSquad(TruncatedStream("stream cut", agent="echo"))

    async def down() -> bool:
        return False

    fake.session.engine_up = down  # type: ignore[method-assign]  # process alive, /health down (hung)
    with start_blocking_portal() as portal:
        worker._portal, worker.squad = portal, fake  # type: ignore[assignment]
        with pytest.raises(EngineGone, match="not answering after a stream it served was cut"):
            worker.run(0, "echo", "Say a", fail_on=frozenset(), output_type=None)


def test_the_worker_actor_has_no_async_method() -> None:
    """One ``async def`` method makes Ray run an actor as an asyncio actor, whose synchronous
    methods then block its event loop: a worker would serve one item at a time, whatever its slots."""
    import inspect

    from squad.cluster.ray import _Worker

    assert not [n for n, f in inspect.getmembers(_Worker, inspect.isfunction) if inspect.iscoroutinefunction(f)]


def test_a_cluster_that_never_answers_is_given_up_and_ctrl_c_does_not_wait(monkeypatch) -> None:
    """``--ray HOST:PORT`` where something accepts connections but is not Ray: Ray retries
    without end; squad gives up after CONNECT_TIMEOUT, and a cancel (Ctrl-C) does not wait."""
    import threading
    import time

    import squad.cluster.ray as squad_ray
    from squad.errors import ClusterError

    forever = threading.Event()
    monkeypatch.setattr(squad_ray.RayFanout, "_connect", lambda self, cluster: forever.wait(60))
    monkeypatch.setattr(squad_ray, "CONNECT_TIMEOUT", 0.3)
    fanout = RayFanout(address="127.0.0.1:6379")
    with pytest.raises(ClusterError, match="no Ray cluster answered at '127.0.0.1:6379' within 0 s"):
        anyio.run(fanout._connect_existing)
    monkeypatch.setattr(squad_ray, "CONNECT_TIMEOUT", 60)

    async def cancelled() -> float:
        start = time.monotonic()
        with anyio.move_on_after(0.2):
            await fanout._connect_existing()
        return time.monotonic() - start

    assert anyio.run(cancelled) < 5
    forever.set()


def test_workers_on_one_node_share_its_cores(tmp_path: Path, monkeypatch) -> None:
    """Each of a node's workers starts its engine with the node's cores divided among them (two engines of -t 2 on
    2 cores ran 2.49x slower than two of -t 1: bench/threads.py); a spec that pins threads keeps them."""
    import os

    from squad.cluster.ray import _Worker
    from squad.cluster.worker import node_threads

    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: set(range(8)), raising=False)
    assert [node_threads(n) for n in (1, 2, 3, 8, 16)] == [8, 4, 2, 1, 1]
    recipe = _recipe(tmp_path, MAP)
    spec = recipe.engine_spec()
    assert _Worker(recipe, spec, "w0", 0.5, per_node=2).provider().spec.threads == 4  # type: ignore[attr-defined]
    assert _Worker(recipe, spec, "w0", 1.0).provider().spec.threads is None  # alone: llama-server's own default
    pinned = spec.but(threads=3)
    assert _Worker(recipe, pinned, "w0", 0.5, per_node=2).provider().spec.threads == 3  # type: ignore[attr-defined]

"""One way from a recipe to the engine: ``squad plan`` and ``squad run`` share EngineSpec and
plan_engine, so they produce the same llama-server argv (the recipe's cache_type included);
every KV cache type is accepted or refused the same way everywhere."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from launch_support import THREADS
from squad.engine.llama import CACHE_TYPES, KV_TYPE_BYTES, server_args
from squad.engine.session import EngineSpec, plan_engine
from squad.errors import PlanError, RecipeError, UserError
from squad.recipes import load_recipe
from squad.sched.planner import plan

RECIPE = """\
name: quantized
model: {model}
engine: {{slots: auto, ctx: auto, cache_type: {cache_type}}}
agents:
  a: {{instructions: You answer in one word., budget: 512, max_tokens: 8}}
  b: {{instructions: You answer in one word., budget: 512, max_tokens: 8}}
main: a
flow:
  - id: both
    parallel:
      - {{id: one, agent: a, prompt: Say yes.}}
      - {{id: two, agent: b, prompt: Say no.}}
"""


def write_recipe(tmp_path: Path, model: Path | str, cache_type: str = "q8_0") -> Path:
    path = tmp_path / "quantized.yaml"
    path.write_text(RECIPE.format(model=model, cache_type=cache_type))
    return path


@pytest.fixture
def fixed_memory(monkeypatch):
    monkeypatch.setenv("SQUAD_KV_MEMORY", "4GiB")


def test_recipe_engine_spec_carries_the_cache_type(tmp_path, default_model_path, fixed_memory):
    recipe = load_recipe(write_recipe(tmp_path, default_model_path))
    spec = recipe.engine_spec()
    assert spec.kv_types == ("q8_0", "q8_0")
    the_plan = plan_engine(spec, recipe.workload())
    args = the_plan.server_args()
    assert args[args.index("-ctk") + 1] == "q8_0" and args[args.index("-ctv") + 1] == "q8_0"
    assert the_plan.slots == 2 and the_plan.n_ctx == 1024
    # the KV estimate is made at q8_0 too (12,240 bytes per token for SmolLM2-135M, not 23,040)
    assert the_plan.kv_bytes == 1024 * 12_240


def test_command_line_overrides_keep_the_rest_of_the_recipe(tmp_path, default_model_path):
    from squad.cli._app import engine_spec

    base = load_recipe(write_recipe(tmp_path, default_model_path)).engine_spec()
    spec = engine_spec(base, slots=3, threads=2, model=None, ctx=None)
    assert (spec.slots, spec.threads, spec.kv_types) == (3, 2, ("q8_0", "q8_0"))
    # with --url, --slots is a capacity pin for the attached server (issue 14), --threads still sizes a launch
    assert engine_spec(base, url="http://127.0.0.1:1", slots=3).slots == 3
    with pytest.raises(UserError, match="--threads sizes or starts an engine squad launches, but --url attaches"):
        engine_spec(base, url="http://127.0.0.1:1", threads=2)
    assert engine_spec(base, url="http://127.0.0.1:1").url == "http://127.0.0.1:1"


@pytest.mark.parametrize("cache_type", CACHE_TYPES)
def test_every_cache_type_works_everywhere(cache_type, tmp_path, default_model_path, fixed_memory):
    recipe = load_recipe(write_recipe(tmp_path, default_model_path, cache_type))
    spec = recipe.engine_spec()
    the_plan = plan_engine(spec, recipe.workload())  # planner + GGUF memory estimate
    assert the_plan.cache_type_k == the_plan.cache_type_v == cache_type
    assert the_plan.kv_bytes and the_plan.kv_bytes > 0
    args = server_args("m.gguf", n_ctx=1024, slots=2, kv_unified=True, cache_type_k=cache_type, cache_type_v=cache_type)
    assert ("-ctk" in args) == (cache_type != "f16")


@pytest.mark.parametrize("bad", ["q9", "iq4_xs", "F16", "q8"])
def test_an_unknown_cache_type_is_refused_everywhere_with_the_same_list(bad, tmp_path, default_model_path):
    listed = ", ".join(CACHE_TYPES)
    with pytest.raises(RecipeError, match="cache_type"):
        load_recipe(write_recipe(tmp_path, default_model_path, bad))
    with pytest.raises(UserError, match=listed):
        EngineSpec(cache_type_k=bad)
    with pytest.raises(PlanError, match=listed):
        plan(None, model=Path("m.gguf"), cache_type_k=bad)
    with pytest.raises(PlanError, match=listed):
        server_args("m.gguf", n_ctx=1024, slots=1, kv_unified=False, cache_type_k=bad)
    from squad.engine.facts import read_model_facts

    with pytest.raises(PlanError, match=listed):
        read_model_facts(default_model_path).kv_bytes_per_token(bad, bad)


def test_one_table_of_cache_types():
    assert tuple(KV_TYPE_BYTES) == CACHE_TYPES and "iq4_nl" in CACHE_TYPES


@pytest.mark.engine
def test_plan_and_run_start_the_engine_with_the_same_argv(tmp_path, llama_server_path, default_model_path):
    """The bug this pins: a recipe's cache_type was honoured by `squad plan` and dropped by
    `squad run`. A wrapper records the argv `squad run` really starts llama-server with."""
    recipe = write_recipe(tmp_path, default_model_path)
    argv_log = tmp_path / "argv.txt"
    wrapper = tmp_path / "llama-server-wrapper.sh"
    wrapper.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > "{argv_log}"\nexec "{llama_server_path}" "$@"\n')
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    env = {**os.environ, "SQUAD_KV_MEMORY": "4GiB"}
    squad = [sys.executable, "-m", "squad"]
    planned = subprocess.run([*squad, "plan", str(recipe), "--json"], capture_output=True, text=True, env=env,
                             timeout=120)
    assert planned.returncode == 0, planned.stderr
    server_args_planned = json.loads(planned.stdout)["server_args"]
    ran = subprocess.run([*squad, "run", str(recipe), "--llama-server", str(wrapper), "-t", str(THREADS), "-q",
                          "--trace", str(tmp_path / "t.jsonl")], capture_output=True, text=True, env=env, timeout=300)
    assert ran.returncode == 0, ran.stderr
    started = argv_log.read_text().splitlines()
    assert started[:len(server_args_planned)] == server_args_planned
    assert "-ctk" in started and started[started.index("-ctk") + 1] == "q8_0"


@pytest.mark.anyio
async def test_an_engine_that_admits_on_its_own_gets_no_reservations():
    """A proxy in front of llama-server (admits=True): squad sends without reserving; the
    engine's own queue (here the fake's deferral) holds the rest."""
    from squad import Agent, Squad
    from squad.testing import FakeEngine

    seen = []
    async with FakeEngine(slots=2, token_delay=0.01) as fe:
        async with Squad([Agent(name="w", budget=512, max_tokens=8)],
                         engine=EngineSpec(url=fe.base_url, admits=True), on_event=seen.append) as sq:
            assert sq.session.admission is None
            results = await sq.map("w", [f"item {i}" for i in range(4)])
    assert all(r.ok for r in results)
    assert not [e for e in seen if e.kind in ("call.queued", "call.admitted")]
    assert len([e for e in seen if e.kind == "call.finished"]) == 4
    with pytest.raises(UserError, match="admits=True"):
        EngineSpec(admits=True)


@pytest.mark.parametrize("kwargs, message", [
    (dict(slots="2"), "slots must be a whole number"),
    (dict(ctx=0), "ctx must be a whole number"),
    (dict(threads=True), "threads must be a whole number"),
    (dict(request_timeout=0), "request_timeout must be a positive number"),
    (dict(url="127.0.0.1:8080"), "with its scheme, http://HOST:PORT, e.g. http://127.0.0.1:8080"),
    (dict(url="http://127.0.0.1:1", cache_type_k="q8_0", threads=2), "threads, cache_type_k size or start"),
    (dict(url="http://127.0.0.1:1", model="x.gguf"), "model size or start"),
])
def test_engine_spec_refuses_what_cannot_work_before_anything_starts(kwargs, message):
    with pytest.raises(UserError, match=message):
        EngineSpec(**kwargs)


def test_params_that_are_not_utf8_are_a_clear_error():
    from squad.cli._app import collect_params

    value = b"caf\xe9".decode("utf-8", "surrogateescape")  # what argv gives for latin-1 bytes
    with pytest.raises(UserError, match="-p topic=...: the value has bytes that are not UTF-8"):
        collect_params([f"topic={value}"])


def test_renamed_squad_arguments_say_where_they_went():
    from squad import Agent, Squad

    with pytest.raises(UserError, match=r"engine=EngineSpec\(binary=\.\.\., request_timeout=\.\.\."):
        Squad([Agent(name="a")], binary="/x", request_timeout=5)
    with pytest.raises(AttributeError, match="Squad.plan moved: use Squad.session.plan"):
        Squad([Agent(name="a")]).plan  # noqa: B018

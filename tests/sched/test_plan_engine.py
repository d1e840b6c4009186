"""Integration: recipe → plan → launch → ``/props`` read-back equals the plan, and a re-plan
reloads the real engine to the bigger plan."""

from __future__ import annotations

import textwrap

import anyio
import pytest

from launch_support import THREADS
from squad.engine.facts import read_model_facts
from squad.engine.launcher import Launcher
from squad.sched.planner import plan, plan_for_replan
from squad.sched.workload import Call

RECIPE = textwrap.dedent("""\
    name: small-review
    params:
      diff: {type: string, required: true}
    agents:
      lead: {budget: 1024, instructions: "Lead.", agents: [security, style]}
      security: {budget: 1000, instructions: "Security."}
      style: {budget: 512, instructions: "Style."}
    main: lead
    flow:
      - id: review
        prompt: "@security @style review {{ params.diff }}"
    """)


@pytest.mark.engine
def test_recipe_plan_launches_exactly_and_replans(llama_server_path, default_model_path, tmp_path):
    from squad.recipes import load_recipe

    path = tmp_path / "small.yaml"
    path.write_text(RECIPE)
    recipe = load_recipe(path, {"diff": "x"})
    facts = read_model_facts(default_model_path)
    the_plan = plan(recipe.workload(), model=default_model_path, n_ctx_train=facts.n_ctx_train,
                    kv_bytes_per_token=facts.kv_bytes_per_token(), memory_for_kv=2**30)
    assert (the_plan.slots, the_plan.n_ctx, the_plan.requested_ctx) == (3, 2560, 2536)

    async def go():
        async with Launcher(the_plan, binary=llama_server_path, threads=THREADS, log_dir=tmp_path) as engine:
            info = engine.info
            assert (info.slots, info.n_ctx) == (the_plan.slots, the_plan.n_ctx)
            bigger = plan_for_replan(the_plan, [Call(n, 1024) for n in ("lead", "a", "b", "c")])
            assert bigger is not None and (bigger.slots, bigger.n_ctx) == (4, 4096)
            assert await engine.reload(bigger) is True
            assert (engine.info.slots, engine.info.n_ctx) == (4, 4096)
            assert plan_for_replan(bigger, [Call("a", 1024)] * 4) is None
            assert await engine.reload(bigger) is False

    anyio.run(go)

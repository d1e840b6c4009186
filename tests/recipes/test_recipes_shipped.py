"""Every shipped recipe validates cleanly and runs on the REAL engine with the default model."""

from pathlib import Path

import anyio
import pytest

from launch_support import THREADS
from squad.cli import main as squad_main
from squad.recipes import load_recipe, run_recipe, validate_recipe

RECIPES = sorted((Path(__file__).resolve().parents[2] / "recipes").glob("*.yaml"))


def test_there_are_at_least_three_recipes():
    assert len(RECIPES) >= 3


@pytest.mark.parametrize("path", RECIPES, ids=[p.name for p in RECIPES])
def test_shipped_recipe_validates_without_warnings(path):
    assert validate_recipe(path) == []


def test_cli_validate_is_clean(capsys):
    with pytest.raises(SystemExit) as info:
        squad_main(["recipes", "validate", *map(str, RECIPES)])
    assert info.value.code in (0, None)
    assert capsys.readouterr().out.count("OK ") == len(RECIPES)


def test_cli_validate_exit_2_on_errors(capsys):
    bad = Path(__file__).resolve().parents[1] / "recipes_bad" / "unknown_agent.yaml"
    with pytest.raises(SystemExit) as info:
        squad_main(["recipes", "validate", str(bad)])
    assert info.value.code == 2
    assert "unknown agent 'reviwer'; did you mean 'reviewer'?" in capsys.readouterr().err


@pytest.mark.engine
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("path", RECIPES, ids=[p.name for p in RECIPES])
def test_shipped_recipe_runs_on_real_engine(path, llama_server_path, default_model_path):
    recipe = load_recipe(path)

    async def main():
        return await run_recipe(recipe, engine=recipe.engine_spec().but(binary=str(llama_server_path), threads=THREADS))

    run = anyio.run(main)
    assert run.output.strip(), "the final step produced no text"
    assert not run.errors
    agents = {r.agent for _, r in run.results}
    assert agents >= set(recipe.agents) - {a for a in recipe.agents if a not in _used(recipe)}
    assert all(r.ok and r.usage.completion_tokens > 0 for _, r in run.results)
    # the engine was sized by the plan and read back
    assert run.info.slots == run.plan.slots and run.info.n_ctx >= run.plan.n_ctx


def _used(recipe):
    used = set()
    for step in recipe.steps_by_id().values():
        if step.agent:
            used.add(step.agent)
        used.update(step.mentions)
    return used

"""YAML recipes: a file declaring a model, engine pins, typed parameters, agents and a flow.

One way through (format in ``docs/recipes.md``):

- :mod:`~squad.recipes.spec`: the file format as pydantic models (``extra="forbid"``).
- :mod:`~squad.recipes.load`: strict YAML reading, every node with its line and column.
- :mod:`~squad.recipes.check`: every check before any model call; builds the
  :class:`Recipe` (:func:`load_recipe`, :func:`validate_recipe`, :func:`load_agents`).
- :mod:`~squad.recipes.budgets`: budgets against the model file when it is on disk (training
  context; fixed prompts counted with the model's tokenizer).
- :mod:`~squad.recipes.model`: the checked :class:`Recipe` and :class:`Step`: its engine
  spec, its workload for the planner, its templates rendered at run time.
- :mod:`~squad.recipes.run`: running the flow on a :class:`squad.runtime.squad.Squad`
  (:func:`run_recipe`); its MCP servers started, checked and counted (:func:`recipe_mcp`).

Every problem in a file is a :class:`~squad.errors.RecipeError` naming file, line, column
and field.
"""

from squad.recipes.check import load_agents, load_recipe, validate_recipe
from squad.recipes.model import EngineSettings, Recipe, RecipeWarning, Step
from squad.recipes.run import RecipeRun, execute_flow, recipe_mcp, run_recipe, step_table

__all__ = [
    "load_recipe", "validate_recipe", "load_agents",
    "Recipe", "Step", "EngineSettings", "RecipeWarning",
    "run_recipe", "execute_flow", "RecipeRun", "step_table", "recipe_mcp",
]

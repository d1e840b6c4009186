"""YAML recipes: a file declaring a model, engine pins, typed parameters, agents and a flow.

One way through (format in ``docs/recipes.md``):

- :mod:`~squad.recipes.spec`: the file format as pydantic models (``extra="forbid"``).
- :mod:`~squad.recipes.load`: strict YAML reading, every node with its line and column.
- :mod:`~squad.recipes.check`: every check before any model call; builds the
  :class:`Recipe` (:func:`load_recipe`, :func:`validate_recipe`, :func:`load_agents`), with
  :mod:`~squad.recipes.check_agents` (agents, includes, MCP servers),
  :mod:`~squad.recipes.check_flow` (steps, templates, @mentions) and
  :mod:`~squad.recipes.params` (parameter values).
- :mod:`~squad.recipes.model`: the checked :class:`Recipe` and :class:`Step`, pure data: its
  engine spec, its workload for the planner, its templates rendered at run time; what it
  counts with is injected (:attr:`Recipe.text_counter`).
- :mod:`~squad.recipes.modelfile`: the only reads of the model file (on disk only: training
  context, tokenizer); :mod:`~squad.recipes.fixed_prompts` and :mod:`~squad.recipes.budgets`
  count prompts with it (fixed budgets checked, ``auto`` budgets planned);
  :mod:`~squad.recipes.chunks` cuts text for ``split: chunks``.
- :mod:`~squad.recipes.run`: running the flow on a :class:`squad.runtime.squad.Squad`
  (:func:`run_recipe`, steps in :mod:`~squad.recipes.steps`, records in
  :mod:`~squad.recipes.record`); its MCP servers started, checked and counted (:func:`recipe_mcp`).

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

"""The public API is small and deliberate: pin it."""

import squad

EXPECTED = {
    "__version__",
    "Agent", "Sampling", "Squad", "run_sync", "AgentResult", "RunResult", "Outcome", "Tool", "tool",
    "Call", "Map", "EnginePlan", "plan", "EngineInfo", "Launcher", "attach", "load_recipe", "parse_mentions", "Event",
    "EngineSpec", "EngineSession", "plan_engine", "ChatEngine", "ChatRequest", "ChatResult",
    "SquadError", "UserError", "RecipeError", "MentionError", "PlanError",
    "EngineError", "EngineNotFound", "EngineBuildError", "EngineStartError", "EngineLoadTimeout",
    "PlanMismatch", "EngineGone", "EngineLost", "MCPServerError", "ClusterError", "ModelError", "UnknownModel",
            "BadModelFile", "MCPServer",
    "AgentRunError", "AdmissionError", "ToolResultTooLarge", "ContextExceeded", "PromptTooLong", "TruncatedStream",
    "ReasoningBudgetExhausted", "CallTimeout", "IncompleteAnswer", "InvalidOutput", "AgentCancelled",
}


def test_public_names_are_pinned():
    extra = set(squad.__all__) - EXPECTED
    assert not extra, f"new public names need a decision: {extra}"
    missing = EXPECTED - set(squad.__all__)
    assert not missing


def test_every_public_name_resolves():
    for name in squad.__all__:
        assert getattr(squad, name) is not None, name


def test_type_checkers_see_every_lazy_name():
    """The TYPE_CHECKING block names exactly the lazily imported public names."""
    import ast
    from pathlib import Path

    tree = ast.parse(Path(squad.__file__).read_text())
    guarded = {alias.asname or alias.name for node in ast.walk(tree) if isinstance(node, ast.If)
               and getattr(node.test, "id", None) == "TYPE_CHECKING"
               for stmt in node.body if isinstance(stmt, ast.ImportFrom) for alias in stmt.names}
    assert guarded == set(squad._LAZY)


def test_recipes_package_exports_one_way_through():
    import squad.recipes

    assert set(squad.recipes.__all__) == {
        "load_recipe", "validate_recipe", "load_agents", "Recipe", "Step", "EngineSettings", "RecipeWarning",
        "run_recipe", "execute_flow", "RecipeRun", "step_table", "recipe_mcp",
    }
    assert all(getattr(squad.recipes, name) is not None for name in squad.recipes.__all__)
    assert squad.load_recipe is squad.recipes.load_recipe

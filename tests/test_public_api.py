"""The public API is small and deliberate: pin it."""

import squad

EXPECTED = {
    "__version__",
    "Agent", "Sampling", "Squad", "run_sync", "AgentResult", "RunResult", "Tool", "tool",
    "EnginePlan", "plan", "EngineInfo", "Launcher", "attach", "load_recipe", "parse_mentions", "Event",
    "SquadError", "UserError", "RecipeError", "MentionError", "PlanError",
    "EngineError", "EngineNotFound", "EngineBuildError", "EngineStartError", "EngineLoadTimeout",
    "PlanMismatch", "EngineGone", "ModelError",
    "AgentRunError", "AdmissionError", "ContextExceeded", "PromptTooLong", "TruncatedStream",
    "ReasoningBudgetExhausted", "CallTimeout", "AgentCancelled",
}


def test_public_names_are_pinned():
    extra = set(squad.__all__) - EXPECTED
    assert not extra, f"new public names need a decision: {extra}"
    missing = EXPECTED - set(squad.__all__)
    assert not missing


def test_every_public_name_resolves():
    for name in squad.__all__:
        assert getattr(squad, name) is not None, name

"""The broken-recipe corpus: each file gives one exact file:line:col, field and message."""

from pathlib import Path

import pytest

from squad.errors import RecipeError
from squad.recipes import load_recipe, validate_recipe

BAD = Path(__file__).resolve().parents[1] / "recipes_bad"

CASES = [
    ("bad_indent.yaml", 5, 4, None, "YAML syntax: expected <block end>, but found '<block mapping start>'"),
    ("unknown_key.yaml", 5, 5, "agents.a.max_tokns", "unknown key 'max_tokns'; did you mean 'max_tokens'?"),
    ("unknown_top_key.yaml", 5, 1, "flwo", "unknown key 'flwo'; did you mean 'flow'?"),
    ("duplicate_key.yaml", 4, 3, "agents.a", "duplicate key 'a' (first defined on line 3); keep one of them"),
    ("wrong_type.yaml", 4, 13, "agents.a.budget", "expected auto or a whole number of tokens, got 'lots'"),
    ("unknown_agent.yaml", 6, 12, "flow[0].agent", "unknown agent 'reviwer'; did you mean 'reviewer'?"),
    ("unknown_mention.yaml", 7, 13, "flow[0].prompt", "unknown agent '@reviwer'; did you mean 'reviewer'?"),
    ("undefined_variable.yaml", 8, 13, "flow[0].prompt",
     "undefined template variable 'params.topc'; did you mean 'topic'? (declared parameters: topic)"),
    ("unknown_step.yaml", 8, 13, "flow[1].prompt", "unknown step id 'drfat' in steps.drfat; did you mean 'draft'?"),
    ("later_step.yaml", 7, 13, "flow[0].prompt",
     "step 'second' has not finished at this point; a step may use only steps before it"),
    ("template_syntax.yaml", 6, 13, "flow[0].prompt", "template syntax error: unexpected end of template"),
    ("bad_map.yaml", 6, 10, "flow[0].map", "undefined template variable 'params.items' (declared parameters: none)"),
    ("alias_bomb.yaml", 6, 4, "e", "the YAML expands to more than 20000 nodes (an alias bomb?)"),
    ("python_tag.yaml", 6, 13, "flow[0].prompt",
     "YAML tag 'tag:yaml.org,2002:python/object/apply:os.system' is not allowed"),
    ("yaml11.yaml", 1, 1, None, "recipes are read as YAML 1.2; remove the '%YAML 1.1' directive"),
    ("engine_and_engines.yaml", 4, 1, "engines",
     "give either engine: (one engine) or engines: (several), not both; move its settings into each item of engines:"),
    ("engines_url_with_model.yaml", 3, 5, "engines[0]", "model sizes or starts an engine squad launches"),
]


@pytest.mark.parametrize(("name", "line", "column", "field", "message"), CASES, ids=[c[0] for c in CASES])
def test_broken_recipe(name, line, column, field, message):
    with pytest.raises(RecipeError) as info:
        validate_recipe(BAD / name)
    err = info.value
    assert err.file == str(BAD / name)
    if line is not None:
        assert (err.line, err.column) == (line, column)
    assert err.field == field
    assert err.problem.startswith(message)


def test_include_cycle_names_the_cycle_where_it_closes():
    with pytest.raises(RecipeError) as info:
        validate_recipe(BAD / "include_cycle.yaml")
    err = info.value
    assert err.file == str(BAD / "cycle_b.yaml")
    assert (err.line, err.column, err.field) == (2, 5, "include[0]")
    assert err.problem == "include cycle: cycle_a.yaml -> cycle_b.yaml -> cycle_a.yaml; remove one of these includes"


def test_missing_required_param_is_an_error_at_run_but_not_at_validate():
    assert validate_recipe(BAD / "missing_param.yaml") == []
    with pytest.raises(RecipeError) as info:
        load_recipe(BAD / "missing_param.yaml")
    assert (info.value.line, info.value.field) == (3, "params.topic")
    assert info.value.problem == "missing required parameter 'topic' (what to write about); pass -p topic=VALUE"


def test_bad_int_param_value_names_the_param():
    with pytest.raises(RecipeError) as info:
        load_recipe(BAD / "int_param.yaml", {"n": "abc"})
    assert info.value.field == "params.n"
    assert info.value.problem == "parameter 'n' expects a whole number, got 'abc' (from -p n=...)"
    assert load_recipe(BAD / "int_param.yaml", {"n": "7"}).params == {"n": 7}


def test_unknown_param_gets_a_suggestion():
    with pytest.raises(RecipeError, match=r"unknown parameter 'nn'; did you mean 'n'\?"):
        load_recipe(BAD / "int_param.yaml", {"nn": "1"})


def test_budget_above_training_context(default_model_path):
    with pytest.raises(RecipeError) as info:
        validate_recipe(BAD / "budget_too_big.yaml")
    assert (info.value.line, info.value.field) == (3, "agents.a.budget")
    assert "above the model's training context (8192)" in info.value.problem


def test_bom_file_and_plain_no_stays_a_string():
    recipe = load_recipe(BAD / "ok_bom.yaml")
    assert recipe.name == "bom-recipe"
    assert recipe.params == {"answer": "no"}
    assert recipe.flow[0].prompt == "café {{ params.answer }}"


def test_not_utf8(tmp_path):
    path = tmp_path / "latin1.yaml"
    path.write_bytes(b"name: x\ndescription: caf\xe9\n")
    with pytest.raises(RecipeError, match="not UTF-8") as info:
        validate_recipe(path)
    assert info.value.line == 2


def test_engines_items_are_urls_or_launch_settings():
    """An ``engines:`` list (several engines): a plain string attaches to that URL, a mapping
    attaches (url) or launches (model defaults to the recipe's)."""
    from squad.recipes import load_recipe as load

    recipe = Path(__file__).resolve().parents[1] / "data" / "engines_recipe.yaml"
    specs = load(recipe).engine_specs()
    assert [(s.url, s.slots, s.model, s.threads) for s in specs] == [
        ("http://127.0.0.1:8080", None, None, None), ("http://127.0.0.1:8081", 16, None, None),
        (None, 2, "smollm2-135m", 1)]


@pytest.mark.parametrize("include, line, says", [
    ("[b.yaml]", 1, "include cycle: a.yaml -> b.yaml -> a.yaml"),
    ("[nope.yaml]", 1, "included file not found"),
    ("\n  - sub", 2, "is a directory"),
])
def test_an_agents_file_s_include_errors_name_their_line(tmp_path, include, line, says):
    """Issue 19: include cycles, missing files and directories are errors at the include entry,
    for a recipe and for an agents file (`squad chat --agent-file`) alike."""
    from squad.recipes import load_agents

    (tmp_path / "sub").mkdir()
    (tmp_path / "a.yaml").write_text(f"include: {include}\nagents:\n  x: {{instructions: hi}}\n")
    (tmp_path / "b.yaml").write_text("include: [a.yaml]\nagents:\n  y: {instructions: hi}\n")
    with pytest.raises(RecipeError) as info:
        load_agents(tmp_path / "a.yaml")
    err = info.value
    where = "b.yaml" if "cycle" in says else "a.yaml"
    assert Path(err.file).name == where and err.line == line and err.field == "include[0]", str(err)
    assert says in err.problem and any(w in err.problem for w in ("remove", "fix the path",
                                                                  "give the path of an agents file"))

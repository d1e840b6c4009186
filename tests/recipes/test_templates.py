"""The sandboxed template environment (field case F10)."""

import pytest

from squad.errors import RecipeError
from squad.templates import check_template, render_template, template_paths, template_variables


def test_literal_braces_stay_as_written():
    text = 'Answer as JSON like {"a": {"b": [1, 2]}} or {#x} for {{ params.topic }}.'
    out = render_template(text, {"params": {"topic": "cats"}})
    assert out == 'Answer as JSON like {"a": {"b": [1, 2]}} or {#x} for cats.'


def test_text_without_template_syntax_is_returned_unchanged():
    text = "line one\n  {not: a template}\n"
    assert render_template(text, {}) is text


def test_multiline_value_is_rendered_intact():
    value = 'first line\n  indented: {"k": 1}\n'
    assert render_template("<{{ params.v }}>", {"params": {"v": value}}) == f"<{value}>"


def test_undefined_variable_names_field_and_variable():
    with pytest.raises(RecipeError) as info:
        render_template(
            "{{ params.topc }}",
            {"params": {"topic": "x"}},
            where="flow[0].prompt",
            loc={"file": "r.yaml", "line": 7, "column": 13},
        )
    assert str(info.value) == (
        "r.yaml:7:13: flow[0].prompt: undefined template variable 'params.topc'; "
        "did you mean 'topic'? (params has: topic)"
    )


def test_undefined_top_level_name():
    with pytest.raises(RecipeError, match="undefined template variable 'topic'"):
        render_template("{{ topic }}", {"params": {"topic": "x"}}, where="p")


def test_syntax_error_names_where():
    with pytest.raises(RecipeError, match=r"^agents.a.instructions: template syntax error"):
        render_template("hello {{ oops ", {}, where="agents.a.instructions")


def test_sandbox_refuses_dunder_access():
    with pytest.raises(RecipeError, match="sandbox"):
        render_template("{{ x.__class__.__mro__ }}", {"x": 1}, where="p")


def test_static_variables_and_paths():
    src = "{{ steps.review.output }} {{ params['topic'] }} {% for x in params.items %}{{ x }}{% endfor %}{{ item }}"
    assert template_variables(src) == {"steps", "params", "item"}
    assert template_paths(src) == {
        ("steps", "review", "output"),
        ("params", "topic"),
        ("params", "items"),
        ("item",),
    }


@pytest.mark.parametrize(
    "source, problem",
    [
        ("{{ params.topic | nosuchfilter }}", "unknown filter 'nosuchfilter'"),
        ("{{ params.topic | uper }}", "unknown filter 'uper'; did you mean 'upper'?"),
        ("{% if params.topic is nosuchtest %}x{% endif %}", "unknown test 'nosuchtest'"),
        ("{{ 'x' if params.topic is nosuchtest else 'y' }}", "unknown test 'nosuchtest'"),
    ],
)
def test_unknown_filter_or_test_is_a_compile_error_with_location(source, problem):
    loc = {"file": "r.yaml", "line": 4, "column": 9}
    for check in (check_template, template_paths, template_variables):
        with pytest.raises(RecipeError) as info:
            check(source, where="flow[1].prompt", loc=loc)
        assert str(info.value) == f"r.yaml:4:9: flow[1].prompt: template error: {problem}"
    with pytest.raises(RecipeError, match=problem.replace("?", r"\?")):
        render_template(source, {"params": {"topic": "x"}}, where="flow[1].prompt", loc=loc)


def test_unknown_filter_on_a_later_template_line_names_that_line():
    with pytest.raises(RecipeError, match=r"template error \(template line 3\): unknown filter 'nope'"):
        check_template("one\ntwo\n{{ x | nope }}", where="p")


@pytest.mark.parametrize(
    "source, variables, problem",
    [
        ("{{ 10 / params.n }}", {"params": {"n": 0}}, "template error: division by zero (ZeroDivisionError)"),
        ("{{ params.topic + 1 }}", {"params": {"topic": "x"}}, "template error: can only concatenate str"),
        ("{{ range(10**9)|list|length }}", {}, "template error: range() of 1,000,000,000 items is more than the "
                                                "100,000 a template may loop over; loop over less"),
        ("{{ params.topic | round }}", {"params": {"topic": "x"}}, "template error: "),
    ],
)
def test_any_error_while_rendering_is_a_recipe_error_naming_where(source, variables, problem):
    with pytest.raises(RecipeError) as info:
        render_template(source, variables, where="flow[1].prompt", loc={"file": "r.yaml", "line": 9})
    assert str(info.value).startswith(f"r.yaml:9: flow[1].prompt: {problem}")


def test_check_template_does_not_render():
    check_template("{{ 10 / 0 }} {{ undefined_name }}", where="p")  # compiles fine; fails only when rendered


def _recipe(tmp_path, instructions, prompt, n_default=3):
    path = tmp_path / "r.yaml"
    path.write_text(
        "name: t\n"
        "params:\n"
        f"  n: {{type: int, default: {n_default}}}\n"
        "agents:\n"
        f"  a: {{budget: 512, max_tokens: 32, instructions: {instructions!r}}}\n"
        "main: a\n"
        "flow:\n"
        "  - prompt: hi {{ params.n }}\n"
        f"  - prompt: {prompt!r}\n"
    )
    return path


@pytest.mark.parametrize(
    "instructions, prompt, line, field, problem",
    [
        ("You {{ params.n | nosuchfilter }}", "ok", 5, "agents.a.instructions", "unknown filter 'nosuchfilter'"),
        ("You {% if params.n is nosuchtest %}x{% endif %}", "ok", 5, "agents.a.instructions",
         "unknown test 'nosuchtest'"),
        ("You", "{{ params.n | nosuchfilter }}", 9, "flow[1].prompt", "unknown filter 'nosuchfilter'"),
    ],
)
def test_validate_recipe_compiles_every_template_field(tmp_path, instructions, prompt, line, field, problem):
    from squad.recipes import validate_recipe

    path = _recipe(tmp_path, instructions, prompt)
    with pytest.raises(RecipeError) as info:
        validate_recipe(path)
    err = info.value
    assert (err.file, err.line, err.field) == (str(path), line, field)
    assert err.problem == f"template error: {problem}"


def test_recipe_prompt_runtime_error_names_file_and_field(tmp_path):
    from squad.recipes import load_recipe

    with pytest.raises(RecipeError) as info:  # found while loading, before anything runs (F19)
        load_recipe(_recipe(tmp_path, "You", "{{ 10 / params.n }}"), {"n": "0"})
    err = info.value
    assert (err.line, err.field) == (9, "flow[1].prompt")
    assert err.problem == "template error: division by zero (ZeroDivisionError); fix this expression"

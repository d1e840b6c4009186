"""The sandboxed template environment (field case F10)."""

import pytest

from squad.errors import RecipeError
from squad.templates import render_template, template_paths, template_variables


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

"""The bounded template sandbox (field case F18): templates cannot exhaust CPU or memory.

Every bomb must end in a RecipeError naming the field; each test has a time limit
(pytest-timeout), never a speed assertion. Ordinary templates must render as before.
"""

from __future__ import annotations

import pytest

from squad.errors import RecipeError
from squad.templates import render_template
from squad.templates.sandbox import MAX_STEPS, MAX_VALUE, flat_size

BOMBS = [
    # arithmetic that builds huge integers
    ("{{ 10 ** (10 ** 8) }}", "would have about 100,000,000 digits"),
    ("{{ 2 ** 100000 }}", "digits"),
    ("{{ (10 ** 4000) * (10 ** 4000) }}", "the product would have more than 4,300 digits"),
    # repetition of text and lists, from either side
    ("{{ 'x' * 100000000 }}", "'*' repeating 1 characters or items 100,000,000 times"),
    ("{{ 100000000 * 'ab' }}", "'*' repeating 2 characters"),
    ("{{ [1, 2] * 100000000 }}", "'*' repeating 2 characters or items"),
    ("{{ (params.topic * 100000) * 100000 }}", "'*' repeating"),
    # joining and concatenating
    ("{{ 'x' * 900000 + 'y' * 900000 }}", "'+' joining two values"),
    ("{{ 'x' * 900000 ~ 'y' * 900000 }}", "'~' would build"),
    ("{{ range(100000) | join('-' * 100) }}", "'join' would build"),
    ("{{ '-'.join(['x' * 100000] * 100) }}", "'join' would build"),
    ("{{ (['x' * 900000] * 1000) | join }}", "'join' would build"),
    ("{{ (['x' * 900000] * 1000) | sum(start=[]) }}", "the 'sum' filter would build"),
    # widths and padding
    ("{{ 'x' | center(1000000000) }}", "the 'center' filter (width 1,000,000,000)"),
    ("{{ 'a\nb' | indent(1000000000) }}", "the 'indent' filter"),
    ("{{ '%0999999999d' | format(1) }}", "the 'format' filter would build"),
    ("{{ '%0999999999d' % 1 }}", "'%' formatting would build"),
    ("{{ '%(a)s' * 1000 % {'a': 'x' * 100000} }}", "'%' formatting would build"),
    ("{{ '{:>999999999}'.format(1) }}", "'format()' would build"),
    ("{{ '{0}{0}{0}{0}'.format('x' * 400000) }}", "'format()' would build"),
    ("{{ 'x'.ljust(10 ** 9) }}", "'ljust()' padding to width 1,000,000,000"),
    ("{{ 'x'.rjust(10 ** 9) }}", "'rjust()' padding"),
    ("{{ 'x'.zfill(10 ** 9) }}", "'zfill()' padding"),
    ("{{ ('\t' * 1000).expandtabs(10 ** 7) }}", "'expandtabs()' with tab size 10,000,000"),
    ("{{ ('x' * 100000).replace('x', 'y' * 100000) }}", "'replace()' would build"),
    ("{{ ('x' * 1000000) | replace('x', 'yy') }}", "the 'replace' filter would build"),
    ("{{ 'x' | wordwrap(1, wrapstring='y' * 1000000) }}", "the 'wordwrap' filter would build"),
    ("{{ [1] | batch(10 ** 9, 'x') | list }}", "the 'batch' filter (1,000,000,000 items per batch)"),
    ("{{ [1] | slice(10 ** 9) | list }}", "the 'slice' filter (1,000,000,000 slices)"),
    # doubling through variables
    ("{% set ns = namespace(x='ab') %}{% for i in range(60) %}{% set ns.x = ns.x ~ ns.x %}{% endfor %}{{ ns.x }}",
     "'~' would build"),
    ("{% set a = 'x' * 600000 %}{% set b = a ~ a %}{{ b }}", "'~' would build"),
    # steps: loops and recursion
    ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", "steps"),
    ("{% for i in range(100000) %}{% for j in range(100000) %}{{ '' }}{% endfor %}{% endfor %}", "steps"),
    ("{% macro f(n) %}{% if n %}{{ f(n - 1) }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(40) }}", "steps"),
    ("{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}", "macros call themselves too deeply"),
    ("{{ range(100000) | map('string') | map('string') | map('string') | list | join | length }}", "steps"),
    ("{% for x in range(100000) | list %}{% for y in range(100000) | list %}{% endfor %}{% endfor %}", "steps"),
    # output, also where it is captured
    ("{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}", "renders more than"),
    ("{% for i in range(100000) %}" + "y" * 200 + "{% endfor %}", "renders more than"),
    ("{% set x %}{% for i in range(100000) %}" + "z" * 100 + "{% endfor %}{% endset %}{{ x | length }}",
     "renders more than"),
    ("{% macro m() %}{% for i in range(100000) %}{{ 'q' * 100 }}{% endfor %}{% endmacro %}{{ m() | length }}",
     "renders more than"),
    ("{% filter upper %}{% for i in range(100000) %}{{ 'q' * 100 }}{% endfor %}{% endfilter %}", "renders more than"),
    ("{{ ['x' * 900000] * 1000 }}", "renders more than"),
    # work repeated on every pass of a loop: all that a render builds, and a time backstop
    ("{% set b = 'x' * 900000 %}{% for i in range(100000) %}{{ b.upper() | length }}{% endfor %}",
     "the template builds more than"),
    ("{% for i in range(100000) %}{% set y = 'x' * 900000 %}{% endfor %}", "the template builds more than"),
    ("{{ (['x' * 900000] * 1000) | map('upper') | list | length }}", "the template builds more than"),
    ("{% set b = 'x' * 900000 %}{% for i in range(100000) %}{% if b.count('x') %}{% endif %}{% endfor %}",
     "the template still renders after 2 s"),
    # ranges
    ("{{ range(10 ** 9) | list }}", "range() of 1,000,000,000 items is more than the 100,000"),
    ("{% for i in range(0, 10 ** 12, 2) %}{% endfor %}", "range() of"),
]


@pytest.mark.timeout(20)
@pytest.mark.parametrize(("source", "problem"), BOMBS, ids=[f"bomb{i}" for i in range(len(BOMBS))])
def test_a_template_that_would_exhaust_cpu_or_memory_is_refused(source, problem):
    with pytest.raises(RecipeError) as info:
        render_template(source, {"params": {"topic": "cats"}}, where="flow[0].prompt",
                        loc={"file": "r.yaml", "line": 7, "column": 13})
    err = info.value
    assert (err.file, err.line, err.field) == ("r.yaml", 7, "flow[0].prompt")
    assert problem in err.problem
    assert "template error" in err.problem


@pytest.mark.parametrize(("source", "expected"), [
    ("{{ 'ab' * 3 }}|{{ 2 ** 10 }}|{{ [1, 2] * 2 }}", "ababab|1024|[1, 2, 1, 2]"),
    ("{{ 'x' | center(7) }}|{{ '%05d' | format(42) }}|{{ '{:>4}'.format(7) }}", "   x   |00042|   7"),
    ("{% for x in params.xs %}{{ loop.index }}. {{ x | upper }}\n{% endfor %}", "1. A\n2. B\n"),
    ("{{ params.xs | join(', ') }}|{{ ', '.join(params.xs) }}|{{ params.xs | map('upper') | list }}",
     'a, b|a, b|["A", "B"]'),
    ("{% set ns = namespace(n=0) %}{% for x in range(10) %}{% set ns.n = ns.n + x %}{% endfor %}{{ ns.n }}", "45"),
    ("{{ 'a\nb' | indent(2, first=True) }}|{{ 'a-b'.replace('-', '+') }}|{{ 'x'.ljust(3) }}.", "  a\n  b|a+b|x  ."),
    ("{% macro item(x) %}<{{ x }}>{% endmacro %}{{ item(1) }}{{ item(2) }}", "<1><2>"),
    ("{{ params.xs | sum(start=[]) }}|{{ [[1], [2]] | sum(start=[]) }}", "[]|[1, 2]"),
])
def test_ordinary_templates_render_as_before(source, expected):
    variables = {"params": {"xs": ["a", "b"]}} if "sum" not in source else {"params": {"xs": []}}
    assert render_template(source, variables) == expected


def test_big_given_data_can_be_used_but_not_multiplied():
    """The limit is on what the template builds beyond its input: a 3 MB parameter can be
    printed, trimmed and have text added; doubling it is refused."""
    big = "line of code\n" * 250_000
    assert len(render_template("{{ params.code }}", {"params": {"code": big}})) == len(big)
    assert render_template("{{ (params.code ~ 'end') | length }}", {"params": {"code": big}}) == str(len(big) + 3)
    with pytest.raises(RecipeError, match="would build"):
        render_template("{{ params.code ~ params.code ~ params.code }}", {"params": {"code": big}})


def test_the_output_cap_is_the_callers():
    with pytest.raises(RecipeError) as info:
        render_template("{% for i in range(100) %}word {% endfor %}", {}, where="p", max_chars=100,
                        why=" (agent 'a' has a budget of 12 tokens)")
    assert info.value.problem == ("template error: the template renders more than 100 characters (agent 'a' has a "
                                  "budget of 12 tokens); shorten the text it renders")
    assert render_template("{% for i in range(20) %}word {% endfor %}", {}, max_chars=100) == "word " * 20


@pytest.mark.parametrize("source", [
    "{{ params.items.append('x') }}", "{{ params.items.extend(params.items) }}", "{{ params.d.update({'a': 1}) }}",
    "{{ params.d.clear() }}", "{{ lipsum(10 ** 6) }}", "{{ ''.__class__.__mro__ }}", "{{ params.items.pop() }}",
])
def test_changing_values_and_internals_are_refused(source):
    with pytest.raises(RecipeError):
        render_template(source, {"params": {"items": ["a"], "d": {}}})


def test_limits_are_far_above_what_a_prompt_needs():
    lines = "\n".join(f"line {i}" for i in range(10_000))
    src = "{% for line in params.code.splitlines() %}{{ loop.index }}: {{ line }}\n{% endfor %}"
    out = render_template(src, {"params": {"code": lines}})
    assert out.count("\n") == 10_000
    assert MAX_STEPS >= 100_000 and MAX_VALUE >= 1_000_000


def test_flat_size_never_walks_past_its_cap():
    shared = "x" * 1000
    huge = [shared] * 1_000_000  # a million references to one string: 1e9 characters as text
    assert flat_size(huge, 10_000) > 10_000
    assert flat_size({"a": [1, 2], "b": "xyz"}, 10**6) < 40

"""Recipes with names in any language (issue 32 item 2), and the parameter and template kinds of item 4.

- A recipe whose agents, step ids and parameters are Korean and Japanese loads, plans, dispatches ``@리뷰어`` and
  ``@レビュー``, maps over ``params.문서``, and its trace holds every name exactly as written (the fake engine).
- hypothesis: any valid name round-trips through recipe load -> plan (the workload) -> mention dispatch; a
  name with a character the rule refuses is refused at the recipe, naming the character.
- ``params.items`` / ``params.keys`` / ``params.get`` reach the parameters of those names (any name that
  shadows a mapping method); ``{{ params }}`` and ``{{ dict(a=1) }}`` render JSON, never a Python repr;
  a JSON object given to a list parameter and blank list items are clear errors before any call.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from names_support import names
from squad.errors import RecipeError
from squad.events.jsonl import JsonlTrace, load_trace
from squad.recipes import load_recipe, run_recipe
from squad.runtime.mention import parse_mentions
from squad.sched.workload import Call, Delegate, Map, Parallel, Sequence
from squad.templates import render_template
from squad.testing import FakeEngine, Reply

FAST = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                         HealthCheck.filter_too_much,
                                                                         HealthCheck.function_scoped_fixture])

KOREAN = """\
name: 검토
agents:
  총괄: {instructions: "You are 총괄.", budget: 1024, max_tokens: 32, agents: [리뷰어, レビュー],
        sub_agent_tools: false}
  리뷰어: {instructions: "You are 리뷰어.", budget: 512, max_tokens: 32}
  レビュー: {instructions: "You are レビュー.", budget: 512, max_tokens: 32}
main: 총괄
params:
  문서: {type: list, default: [첫째 문단, 第二段落, mixed 세 번째]}
flow:
  - id: 요약
    map: params.문서
    agent: 리뷰어
    prompt: "요약: {{ item }}"
  - id: 결론
    prompt: "@리뷰어 @レビュー {{ steps.요약.outputs | length }}개의 요약을 확인해 주세요。"
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "r.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def who(body: dict) -> str:
    return body["messages"][0]["content"].removeprefix("You are ").rstrip(".")


def test_a_korean_recipe_loads_and_plans(tmp_path):
    recipe = load_recipe(write(tmp_path, KOREAN))
    assert recipe.params["문서"] == ["첫째 문단", "第二段落", "mixed 세 번째"]
    assert recipe.workload() == Sequence((
        Map(Call("리뷰어", 512), count=3, label="요약"),
        Delegate(Call("총괄", 1024), Parallel((Call("리뷰어", 512), Call("レビュー", 512))), "결론"),
    ), label="검토")


@pytest.mark.anyio
async def test_a_korean_recipe_runs_dispatches_and_traces_every_name_exactly(tmp_path):
    recipe = load_recipe(write(tmp_path, KOREAN))
    trace = JsonlTrace(tmp_path / "trace.jsonl")
    async with FakeEngine(slots=4, n_ctx=4096) as fe:
        fe.responder = lambda body: Reply(content=f"{who(body)}:{body['messages'][-1]['content'][:12]}")
        run = await run_recipe(recipe, engine=fe.info, on_event=trace)
    trace.close()
    assert run.steps["요약"]["outputs"] == ["리뷰어:요약: 첫째 문단", "리뷰어:요약: 第二段落", "리뷰어:요약: mixed 세"]
    assert [r.agent for sid, r in run.results if sid == "결론"] == ["리뷰어", "レビュー", "총괄"]
    sub = sorted(b["messages"][-1]["content"] for b in fe.requests if who(b) in ("리뷰어", "レビュー")
                 and "확인" in b["messages"][-1]["content"])
    assert sub == ["3개의 요약을 확인해 주세요。"] * 2  # mention tokens stripped, the rest as written
    events = load_trace(tmp_path / "trace.jsonl")
    agents = {getattr(e, "agent", None) for e in events} | {getattr(getattr(e, "origin", None), "agent", None)
                                                             for e in events}
    assert {"리뷰어", "レビュー", "총괄"} <= agents
    assert "\\u" not in (tmp_path / "trace.jsonl").read_text(encoding="utf-8")  # names as written, not escaped


def test_the_valid_unicode_recipe_of_the_corpus_validates():
    from squad.recipes import validate_recipe

    validate_recipe(Path(__file__).resolve().parents[1] / "recipes_bad" / "unicode_names_ok.yaml")


def _recipe_for(agent: str, param: str, step: str) -> str:
    """A recipe (as JSON, which YAML reads, so a name such as 'null' stays text) with ``agent`` as a sub-agent,
    ``param`` a list parameter mapped over and ``step`` a step id, the final prompt mentioning the agent."""
    ref = f"params.{param}" if "-" not in param else None
    return json.dumps({
        "name": step, "main": "main",
        "agents": {"main": {"instructions": "m", "budget": 1024, "max_tokens": 16, "agents": [agent],
                            "sub_agent_tools": False},
                   agent: {"instructions": "s", "budget": 512, "max_tokens": 16}},
        "params": {param: {"type": "list", "default": ["x", "y"]}},
        "flow": [{"id": step, "map": ref or f"params.{param}", "agent": agent, "prompt": "{{ item }}"},
                 {"prompt": f"@{agent} check {{{{ steps['{step}'].outputs | length }}}}"}],
    }, ensure_ascii=False)


@FAST
@given(st.data())
def test_any_valid_name_round_trips_through_load_plan_and_dispatch(tmp_path_factory, data):
    agent, param, step = data.draw(names()), data.draw(names()), data.draw(names())
    if agent.casefold() == "main".casefold():
        agent = agent + "_"
    path = tmp_path_factory.mktemp("r") / "r.yaml"
    path.write_text(_recipe_for(agent, param, step), encoding="utf-8")
    recipe = load_recipe(path)
    assert recipe.params[param] == ["x", "y"] and recipe.name == step
    plan = recipe.workload()
    assert plan.items[0] == Map(Call(agent, 512), count=2, label=step)
    assert plan.items[1].subs == Call(agent, 512)  # the final step delegates to the agent it mentions
    prompt = recipe.render_prompt(recipe.flow[1], {step: {"output": "", "outputs": ["a", "b"]}})
    assert parse_mentions(prompt, [agent, "main"]).agents == [agent]


@pytest.mark.parametrize("where, name, char", [
    ("agent", "리뷰어!", "U+0021 EXCLAMATION MARK"), ("param", "문 서", "U+0020 SPACE"),
    ("step", "요약.1", "U+002E FULL STOP"), ("agent", "レビュー・一", "U+30FB KATAKANA MIDDLE DOT"),
    ("param", "1번", "U+0031 DIGIT ONE")])
def test_a_name_with_a_refused_character_is_refused_at_the_recipe(tmp_path, where, name, char):
    agent, param, step = ("리뷰어", "문서", "요약")
    agent, param, step = (name if where == "agent" else agent, name if where == "param" else param,
                          name if where == "step" else step)
    path = write(tmp_path, _recipe_for(agent, param, step).replace('"name": "' + step + '"', '"name": "r"'))
    with pytest.raises(RecipeError) as caught:
        load_recipe(path)
    assert char in str(caught.value) and "not a name" in str(caught.value)


# --- item 4: parameters and templates -----------------------------------------------------------------------

METHODS = """\
name: methods
agents:
  a: {instructions: "You are a.", budget: 1024, max_tokens: 16}
main: a
params:
  items: {type: list, default: [i1, i2]}
  keys: {type: list, default: [k1]}
  get: {type: string, default: g}
  values: {type: list, default: [v1]}
flow:
  - id: each
    map: params.items
    prompt: "{{ item }} {{ params.keys | join(',') }} {{ params.get }} {{ params.values[0] }}"
  - prompt: "{{ params }} | {{ dict(a=1, b=[true, none]) }} | {{ params.items }}"
"""


def test_parameters_named_like_mapping_methods_reach_their_values(tmp_path):
    recipe = load_recipe(write(tmp_path, METHODS))
    assert recipe.workload().items[0] == Map(Call("a", 1024), count=2, label="each")
    assert recipe.render_prompt(recipe.flow[0], {}, item="i1", index=0) == "i1 k1 g v1"
    final = recipe.render_prompt(recipe.flow[1], {"each": {"output": "", "outputs": []}})
    assert final == ('{"items": ["i1", "i2"], "keys": ["k1"], "get": "g", "values": ["v1"]} | '
                     '{"a": 1, "b": [true, null]} | ["i1", "i2"]')


@st.composite
def data_values(draw: st.DrawFn) -> object:
    scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | \
        st.text(max_size=8)
    return draw(st.recursive(scalars, lambda inner: st.lists(inner, max_size=3) | st.tuples(inner, inner) |
                             st.dictionaries(st.text(max_size=5) | st.integers(), inner, max_size=3), max_leaves=8))


@settings(max_examples=60, deadline=None)
@given(data_values(), st.sampled_from(["{{ v }}", "{{ 'x' ~ v }}", "{{ '%s' % (v,) }}", "{{ '{}'.format(v) }}",
                                       "{{ [v] | join(',') }}", "{{ v | string }}", "{{ {'k': v} }}",
                                       "{{ '%s' | format(v) }}", "{{ [v] | first }}"]))
def test_no_python_repr_ever_reaches_a_prompt(value, template):
    """Whatever data a template prints, and however it turns it into text, a list or mapping is JSON and so are
    a boolean and None, alone or inside (``true``, ``null``): the text never holds a Python repr's marks (quotes
    around keys as 'k', True/None anywhere)."""
    out = render_template(template, {"v": value})
    body = out[1:] if out.startswith("x") else out
    if isinstance(value, (list, tuple, dict)):
        json.loads(body)  # the container's text is JSON
        assert "'" not in out.replace(json.dumps(value, ensure_ascii=False, default=str), "") or "'" in str(value)
    if (value is None or isinstance(value, bool)) and "'k'" not in template:
        assert body == json.dumps(value)  # true, false, null: as YAML and JSON write them
    if not _has_text(value):
        assert not any(word in out for word in ("True", "False", "None"))


def _has_text(value: object) -> bool:
    if isinstance(value, str):
        return True
    if isinstance(value, dict):
        return any(_has_text(k) or _has_text(v) for k, v in value.items())
    return isinstance(value, (list, tuple)) and any(_has_text(v) for v in value)


@pytest.mark.parametrize("template, out", [
    ("{{ params.strict }} {{ params.notes }}", "true null"),
    ("strict: {{ params.strict ~ '' }}; notes: {{ '%s' % params.notes }}", "strict: true; notes: null"),
    ("{{ steps.check.value.ok }}", "false"),
])
def test_true_false_and_none_reach_a_prompt_as_the_recipe_writes_them(template, out):
    """A bool parameter, an optional parameter left unset and a schema answer's boolean print as YAML/JSON
    write them (``true``, ``null``, ``false``), not as Python's ``True``/``None``."""
    variables = {"params": {"strict": True, "notes": None}, "steps": {"check": {"value": {"ok": False}}}}
    assert render_template(template, variables) == out


@pytest.mark.parametrize("given, message", [
    ('{"a": 1}', "expects a list, got a JSON object"),
    ('["", " "]', "has 2 blank items (at index 0, 1 of 2)"),
    ('["x", "  "]', "has 1 blank item (at index 1 of 2)"),
    ("[1, null]", "has 1 blank item"),
    ('["\\u200b", "x"]', "has 1 blank item (at index 0 of 2)"),  # a zero-width space shows nothing
    ('["\\ufeff\\u2060", "x", "\\u200c\\u3000"]', "has 2 blank items (at index 0, 2 of 3)"),  # BOM, joiners
])
def test_a_list_parameter_refuses_objects_and_blank_items_before_any_call(tmp_path, given, message):
    path = write(tmp_path, METHODS)
    with pytest.raises(RecipeError, match="parameter 'items'") as caught:
        load_recipe(path, {"items": given})
    assert message in str(caught.value) and "-p items" in str(caught.value)


# --- counts and chunking stay exact with Korean, Japanese and mixed text ---------------------------------------

WRITTEN = "리뷰어의 요약을 확인해 주세요。レビューを見てください、日本語の文章 mixed text समीक्षक 🙂\n@-_"
MIXED = st.text(alphabet=st.sampled_from(list(WRITTEN)), min_size=1, max_size=400)


@settings(max_examples=25, deadline=None)
@given(MIXED, st.integers(8, 64), st.integers(0, 7))
def test_chunks_of_korean_japanese_and_mixed_text_fit_by_the_models_own_count(default_model_path, text, size,
                                                                               overlap):
    """Every piece of a ``split: chunks`` map is at most ``chunk_tokens`` by the model's own tokenizer (what the
    engine counts), and the pieces without their overlap give the text back."""
    from squad.engine.tokens import counter_for_model
    from squad.recipes.chunks import split_chunks

    counter = counter_for_model(default_model_path)
    assert counter is not None
    overlap = min(overlap, size - 1)
    chunks = split_chunks(text, size, counter.count_text, overlap=overlap)
    assert all(counter.count_text(c) <= size for c in chunks)
    if not overlap:
        assert "".join(chunks) == (text if text.strip() else "")


@pytest.mark.parametrize("template, text", [
    ("{{ v | tojson }}", '["리뷰어", "a<b & c\'s"]'),
    ("{{ {'이름': v[0]} | tojson }}", '{"이름": "리뷰어"}'),
    ("{{ v[1] | tojson }}", '"a<b & c\'s"'),
])
def test_tojson_writes_text_as_it_is_not_as_escapes(template, text):
    """``| tojson`` in a prompt is JSON the model reads: Korean stays Korean (not ``\\ub9ac``, six
    characters and several tokens each) and ``< > & '`` stay as written (not jinja's HTML-safe
    ``\\u003c``), like every other container squad prints."""
    assert render_template(template, {"v": ["리뷰어", "a<b & c's"]}) == text

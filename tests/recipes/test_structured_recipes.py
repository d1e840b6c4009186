"""Structured output in recipes (field case F12 and its kind), on the fake engine over HTTP:
``output.schema`` and a step's ``schema`` are SENT as ``response_format`` (through the openai
SDK), answers are validated and asked once more, ``steps.ID.value`` reaches later prompts, and
a miss keeps the raw text (printed, written to --out, exit 1). The real engine:
tests/chat/test_structured_real.py."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import anyio
import pytest

from cli_support import engine, squad, state  # noqa: F401 - fixtures
from squad.errors import InvalidOutput, RecipeError
from squad.recipes import load_recipe, run_recipe, validate_recipe
from squad.testing import Reply

CITY = "{type: object, properties: {city: {type: string}, country: {type: string}}, required: [city, country]}"

FINAL = textwrap.dedent(f"""\
    name: f12
    main: geo
    agents:
      geo: {{instructions: "Answer with the city and its country.", max_tokens: 48}}
    flow:
      - id: ask
        prompt: "Which city is the Eiffel Tower in?"
    output:
      schema: {CITY}
    """)

STEPS = textwrap.dedent(f"""\
    name: steps
    main: lead
    agents:
      lead: {{instructions: "You write.", max_tokens: 48}}
      geo: {{instructions: "You know places.", max_tokens: 48}}
    params:
      places: {{type: list, default: [Eiffel Tower, Colosseum]}}
    flow:
      - id: where
        agent: geo
        map: params.places
        prompt: "Where is the {{{{ item }}}}?"
        schema: {CITY}
      - id: first
        agent: geo
        prompt: "Where is Big Ben?"
        schema: {CITY}
      - id: note
        prompt: "Write one line about {{{{ steps.first.value.city }}}} in {{{{ steps.first.value.country }}}}."
    """)


def _write(tmp_path: Path, text: str, name: str = "r.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def _schema_sent(body: dict) -> dict | None:
    fmt = body.get("response_format")
    return fmt["json_schema"]["schema"] if fmt else None


# --- F12: the final output schema is sent, validated, and a miss keeps the text --------------


def test_the_output_schema_is_sent_with_the_last_call_and_the_value_returned(tmp_path, engine):
    engine.script(Reply(content='{"city": "Paris", "country": "France"}'))
    run = anyio.run(lambda: run_recipe(load_recipe(_write(tmp_path, FINAL)), engine=engine.info))
    [body] = engine.requests
    assert body["response_format"]["type"] == "json_schema"
    assert _schema_sent(body)["required"] == ["city", "country"]
    assert run.value == {"city": "Paris", "country": "France"}
    assert json.loads(run.output) == run.value


def test_a_miss_is_asked_again_once_then_the_run_exits_1_keeping_the_raw_text(capsys, tmp_path, state, engine):
    engine.script(Reply(content="Paris, in France."), Reply(content="It is Paris."))
    out_file = tmp_path / "out.txt"
    code, out, err = squad(capsys, "run", _write(tmp_path, FINAL), "--url", engine.base_url, "-q",
                           "--out", out_file)
    assert code == 1, err
    assert "Traceback" not in err and "does not match its output schema" in err and "not JSON" in err
    assert "It is Paris." in out and "It is Paris." in out_file.read_text()
    assert "## step ask (invalid, the failing step)" in out
    retry = engine.requests[1]["messages"]
    assert retry[-2] == {"role": "assistant", "content": "Paris, in France."}
    assert "did not match the required JSON schema" in retry[-1]["content"]
    assert len(engine.requests) == 2


def test_the_check_after_a_map_keeps_the_raw_output_and_exits_1(capsys, tmp_path, state, engine):
    text = FINAL.replace("""  - id: ask
    prompt: "Which city is the Eiffel Tower in?"
""", """  - id: ask
    map: params.xs
    prompt: "{{ item }}"
params:
  xs: {type: list, default: [one]}
""")
    engine.script(Reply(content="prose, not JSON"))
    code, out, err = squad(capsys, "run", _write(tmp_path, text), "--url", engine.base_url, "-q", "--json")
    assert code == 1 and "Traceback" not in err
    assert "response_format" not in engine.requests[0]  # a map's joined output is checked after, not sent
    data = json.loads(out)
    assert data["finished"]["ask"]["output"] == "prose, not JSON" and "output schema" in data["failed"]


# --- a step's schema, values in later prompts -------------------------------------------------


def test_step_schemas_are_sent_per_call_and_values_reach_later_prompts(tmp_path, engine):
    def reply(body: dict) -> Reply:
        last = body["messages"][-1]["content"]
        if "Eiffel" in last:
            return Reply(content='{"city": "Paris", "country": "France"}')
        if "Colosseum" in last:
            return Reply(content='{"city": "Rome", "country": "Italy"}')
        if "Big Ben" in last:
            return Reply(content='{"city": "London", "country": "UK"}')
        return Reply(content="a line")

    engine.responder = reply
    run = anyio.run(lambda: run_recipe(load_recipe(_write(tmp_path, STEPS)), engine=engine.info))
    assert run.steps["where"]["value"] == [{"city": "Paris", "country": "France"}, {"city": "Rome", "country": "Italy"}]
    assert run.steps["first"]["value"] == {"city": "London", "country": "UK"}
    note = next(b for b in engine.requests if "one line" in b["messages"][-1]["content"])
    assert "about London in UK." in note["messages"][-1]["content"]
    assert _schema_sent(note) is None  # the note step has no schema
    assert all(_schema_sent(b) for b in engine.requests if b is not note)
    assert run.value is None


def test_value_of_a_step_without_a_schema_is_a_recipe_error_at_its_line(tmp_path):
    text = STEPS.replace('    prompt: "Where is Big Ben?"\n    schema: ' + CITY + "\n",
                         '    prompt: "Where is Big Ben?"\n')
    with pytest.raises(RecipeError, match=r"steps\.first\.value: .*give that step a schema") as caught:
        validate_recipe(_write(tmp_path, text))
    assert caught.value.line == 18


@pytest.mark.parametrize(("schema", "message"), [
    ("{type: nope}", "not a valid JSON schema"),
    ("{type: object, properties: {a: {type: 7}}}", "not a valid JSON schema"),
    ("[1, 2]", "schema"),
])
def test_a_bad_step_schema_is_an_error_at_its_line(tmp_path, schema, message):
    text = FINAL.replace('    prompt: "Which city is the Eiffel Tower in?"\n',
                         f'    prompt: "Which city is the Eiffel Tower in?"\n    schema: {schema}\n')
    with pytest.raises(RecipeError, match=message) as caught:
        validate_recipe(_write(tmp_path, text))
    assert caught.value.line == 8


def test_a_schema_on_a_parallel_block_says_to_move_it_into_its_steps(tmp_path):
    block = "  - id: both\n    schema: {type: object}\n    parallel:\n      - {id: p1, agent: geo, prompt: x}\n"
    text = STEPS.replace("  - id: first\n", block + "  - id: first\n")
    with pytest.raises(RecipeError, match="move schema into its steps"):
        validate_recipe(_write(tmp_path, text))


def test_a_structured_step_keeps_room_to_be_asked_again_in_its_auto_budget(tmp_path, default_model_path):
    plain = load_recipe(_write(tmp_path, FINAL.replace("output:\n  schema: " + CITY + "\n", ""), "plain.yaml"))
    held = load_recipe(_write(tmp_path, FINAL))
    [before] = [r.budget for r in plain.budgets if r.agent == "geo"]
    [after] = [r.budget for r in held.budgets if r.agent == "geo"]
    assert after > before and held.agents["geo"].budget == after


def test_invalid_output_is_an_agent_run_error_with_exit_1_semantics():
    exc = InvalidOutput("x", agent="geo", raw="raw text")
    assert exc.raw == "raw text" and exc.agent == "geo"


def _with_note(prompt: str) -> str:
    return STEPS.replace('"Write one line about {{ steps.first.value.city }} in {{ steps.first.value.country }}."',
                         json.dumps(prompt))


@pytest.mark.parametrize(("prompt", "message"), [
    ("{{ steps.first.value.cty }}", r"steps.first.value has no key 'cty': the step's schema declares city, country"),
    ("{{ steps.where.value[0].town }}", r"steps.where.value has no key 'town'"),
    ("{{ steps.where.values }}", r"steps.where.values: a step has output \(text\) and outputs \(list\), and value"),
    ("{{ steps.first.value.city.x }}", None),  # below a string: the schema says nothing more
])
def test_value_keys_are_checked_against_the_schema_at_validate_time(tmp_path, prompt, message):
    path = _write(tmp_path, _with_note(prompt))
    if message is None:
        validate_recipe(path)
        return
    with pytest.raises(RecipeError, match=message) as caught:
        validate_recipe(path)
    assert caught.value.line == 19


def test_a_map_value_is_a_list_for_loops_and_indexes(tmp_path, engine):
    text = _with_note("{% for v in steps.where.value %}{{ v.city }};{% endfor %} {{ steps.where.value[1].country }}")
    engine.responder = lambda body: Reply(content='{"city": "Oslo", "country": "Norway"}' if "Where" in
                                          body["messages"][-1]["content"] else "ok")
    run = anyio.run(lambda: run_recipe(load_recipe(_write(tmp_path, text)), engine=engine.info))
    note = engine.requests[-1]["messages"][-1]["content"]
    assert "Oslo;Oslo; Norway" in note and run.steps["where"]["value"][0] == {"city": "Oslo", "country": "Norway"}


@pytest.mark.parametrize("value", ['"__import__(\'os\').system(\'touch {marker}\') or int"', "City", "[1, 2]", "3"])
def test_output_type_in_a_recipe_is_a_json_schema_never_code(tmp_path, value):
    marker = tmp_path / "PWNED"
    text = FINAL.replace('  geo: {instructions: "Answer with the city and its country.", max_tokens: 48}',
                         f'  geo: {{instructions: "x", max_tokens: 48, output_type: {value.format(marker=marker)}}}')
    assert "output_type" in text
    with pytest.raises(RecipeError, match="output_type must be a pydantic model class, a type such as list"):
        validate_recipe(_write(tmp_path, text))
    assert not marker.exists()

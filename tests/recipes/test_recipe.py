"""Recipes: workload shapes, templating (F10), parameters, and the flow on the fake engine."""

from pathlib import Path

import pytest

from squad.errors import InvalidOutput, RecipeError
from squad.recipes import load_recipe, run_recipe, validate_recipe
from squad.sched.workload import Call, Delegate, Map, Parallel, Sequence
from squad.testing import FakeEngine, Reply

RECIPES = Path(__file__).resolve().parents[2] / "recipes"


def write(tmp_path: Path, text: str, name: str = "r.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


BASE = """\
name: t
agents:
  lead: {instructions: "You are lead.", budget: 1024, max_tokens: 32, agents: [a, b], sub_agent_tools: false}
  a: {instructions: "You are a.", budget: 512, max_tokens: 32}
  b: {instructions: "You are b.", budget: 512, max_tokens: 32}
main: lead
"""


def test_shipped_workloads(default_model_path):  # auto budgets: counted with the model on disk
    review = load_recipe(RECIPES / "review.yaml").workload()
    assert review == Sequence((
        Parallel(tuple(Map(Call(name, 256), count=1, limit=1, label=name) for name in ("security", "style", "tests")),
                 label="reviews"),  # a small file is one chunk per reviewer
        Call("lead", 1024),  # its counted prompt + max_tokens 384 + headroom
    ), label="parallel-review")
    summary = load_recipe(RECIPES / "summarize.yaml").workload()
    assert summary.items[0] == Map(Call("summarizer", 256), count=3, limit=3, label="summaries")
    debate = load_recipe(RECIPES / "mentions.yaml").workload()
    assert debate.items == (Delegate(Call("host", 512), Parallel((Call("optimist", 256), Call("skeptic", 256))),
                                     "debate"),)


def test_map_count_follows_the_list_param_and_step_output_is_unknown(tmp_path):
    path = write(tmp_path, BASE + """\
params:
  xs: {type: list, default: [one, two]}
flow:
  - id: ideas
    agent: a
    prompt: list ideas
  - map: steps.ideas.output
    agent: b
    prompt: "{{ item }}"
  - map: params.xs
    concurrency: 2
    agent: b
    prompt: "{{ index }}: {{ item }}"
""")
    items = load_recipe(path, {"xs": "[\"p\", \"q\", \"r\"]"}).workload().items
    assert items[1] == Map(Call("b", 512), count=None, limit=None, label="step-2")
    assert items[2] == Map(Call("b", 512), count=3, limit=2, label="step-3")


def test_multiline_param_with_json_braces_renders_intact(tmp_path):
    path = write(tmp_path, BASE + """\
params:
  example: {type: string, required: true}
flow:
  - agent: a
    prompt: |
      Answer like this {"ok": true}:
      {{ params.example }}
      done
""")
    value = 'line one\n  {"a": {"b": [1, 2]}}\n{{ not a template }}\n'
    recipe = load_recipe(path, {"example": value})
    rendered = recipe.render_prompt(recipe.flow[0], {})
    assert rendered == 'Answer like this {"ok": true}:\n' + value + "\ndone\n"


def test_unused_param_is_a_warning(tmp_path):
    path = write(tmp_path, BASE + "params:\n  spare: {type: int, default: 1}\nflow:\n  - agent: a\n    prompt: hi\n")
    warnings = validate_recipe(path)
    assert [str(w) for w in warnings] == [
        f"{path}:8:3: params.spare: parameter 'spare' is declared but no template uses it; "
        "use {{ params.spare }} or remove it"
    ]


@pytest.mark.parametrize(("kind", "given", "expected"), [
    ("bool", "no", False), ("bool", "yes", True), ("number", "2.5", 2.5),
    ("list", "a, b", ["a", "b"]), ("list", "x\ny", ["x", "y"]), ("list", ["p", "q"], ["p", "q"]),
])
def test_param_types(tmp_path, kind, given, expected):
    path = write(tmp_path,
                 BASE + f"params:\n  v: {{type: {kind}}}\nflow:\n  - agent: a\n    prompt: '{{{{ params.v }}}}'\n")
    assert load_recipe(path, {"v": given}).params["v"] == expected


def test_enum_and_file_params(tmp_path):
    (tmp_path / "notes.txt").write_text("hello {braces}", encoding="utf-8")
    path = write(tmp_path, BASE + """\
params:
  tone: {type: enum, choices: [calm, loud]}
  notes: {type: file, default: notes.txt}
flow:
  - agent: a
    prompt: "{{ params.tone }} {{ params.notes }}"
""")
    recipe = load_recipe(path, {"tone": "calm"})
    assert recipe.params == {"tone": "calm", "notes": "hello {braces}"}
    with pytest.raises(RecipeError, match=r"must be one of calm, loud, got 'clam'; did you mean 'calm'\?"):
        load_recipe(path, {"tone": "clam"})


def test_yaml_no_stays_a_string_and_strings_are_not_coerced(tmp_path):
    path = write(tmp_path, BASE + "description: no\nflow:\n  - agent: a\n    prompt: off\n")
    recipe = load_recipe(path)
    assert recipe.description == "no" and recipe.flow[0].prompt == "off"
    bad = write(tmp_path, BASE + "description: true\nflow:\n  - agent: a\n    prompt: hi\n", "bad.yaml")
    with pytest.raises(RecipeError, match="expected text, got True"):
        validate_recipe(bad)


def test_mentions_only_from_main_agent_prompts(tmp_path):
    path = write(tmp_path, BASE + "flow:\n  - agent: a\n    prompt: ask @b\n")
    with pytest.raises(RecipeError, match="only prompts to the main agent .'lead'. can @mention"):
        validate_recipe(path)


def test_instructions_may_use_params_only(tmp_path):
    text = BASE.replace('"You are a."', '"You are {{ params.who }} {{ steps.x }}."')
    path = write(tmp_path, text + "params:\n  who: {default: me}\nflow:\n  - agent: a\n    prompt: hi\n")
    with pytest.raises(RecipeError, match=r"agents.a.instructions: undefined template variable 'steps'"):
        validate_recipe(path)


def test_output_schema_checked(tmp_path):
    path = write(tmp_path, BASE + """\
flow:
  - agent: a
    prompt: hi
output:
  schema: {type: object, required: [score], properties: {score: {type: integer}}}
""")
    recipe = load_recipe(path)
    assert recipe.check_output('```json\n{"score": 3}\n```') == {"score": 3}
    with pytest.raises(InvalidOutput, match="does not match the recipe's output schema") as caught:
        recipe.check_output('{"score": "high"}')
    assert caught.value.raw == '{"score": "high"}'


def test_include_of_shared_agents_and_duplicate_name(tmp_path):
    write(tmp_path, "agents:\n  a: {budget: 512, max_tokens: 32}\n", "shared.yaml")
    path = write(tmp_path, BASE + "include: [shared.yaml]\nflow:\n  - agent: a\n    prompt: hi\n")
    with pytest.raises(RecipeError, match=r"agent 'a' is already defined in .*shared.yaml:2; rename one"):
        validate_recipe(path)


# --- the flow on the fake engine ----------------------------------------------------------

def who(body: dict) -> str:
    return body["messages"][0]["content"].removeprefix("You are ").rstrip(".")


@pytest.mark.anyio
async def test_flow_runs_parallel_map_and_mentions_on_fake_engine(tmp_path):
    path = write(tmp_path, BASE + """\
params:
  xs: {type: list, default: [x1, x2, x3]}
flow:
  - id: both
    parallel:
      - {id: pa, agent: a, prompt: "pa {{ params.xs[0] }}"}
      - {id: pb, agent: b, prompt: "pb"}
  - id: each
    map: params.xs
    concurrency: 2
    agent: a
    prompt: "item {{ item }}"
  - id: final
    prompt: "@a @b merge {{ steps.pa.output }} / {{ steps.each.outputs | length }}"
""")
    recipe = load_recipe(path)
    async with FakeEngine(slots=4, n_ctx=4096, token_delay=0.01) as fe:
        fe.responder = lambda body: Reply(content=f"{who(body)}:{body['messages'][-1]['content'][:12]}")
        run = await run_recipe(recipe, engine=fe.info)
    assert run.steps["pa"]["output"] == "a:pa x1"
    assert run.steps["both"]["outputs"] == ["a:pa x1", "b:pb"]
    assert run.steps["each"]["outputs"] == ["a:item x1", "a:item x2", "a:item x3"]
    assert run.output.startswith("lead:")
    sub_prompts = sorted(b["messages"][-1]["content"] for b in fe.requests if who(b) in "ab")
    assert "merge a:pa x1 / 3" in sub_prompts  # mention tokens stripped, templates rendered
    assert [r.agent for sid, r in run.results if sid == "final"] == ["a", "b", "lead"]


COLLECT = BASE + """\
flow:
  - id: both
    parallel:
      - {id: pa, agent: a, prompt: "pa"}
      - {id: pb, agent: b, prompt: "pb"}
  - id: final
    agent: lead
    prompt: "{{ FIELD }}"
"""


@pytest.mark.anyio
@pytest.mark.parametrize("field, fails, runs_final", [
    ("steps.pa.output", ["a"], False),        # an input that failed: the step fails too
    ("steps.both.output", ["a"], True),       # the block: what succeeded is enough
    ("steps.both.output", ["a", "b"], False), # every step of the block failed
])
async def test_collect_never_runs_a_step_on_a_failed_output(tmp_path, field, fails, runs_final):
    from squad.errors import AgentRunError

    recipe = load_recipe(write(tmp_path, COLLECT.replace("FIELD", field)))
    async with FakeEngine(slots=4, n_ctx=4096) as fe:
        fe.responder = lambda body: (Reply(content="half", truncate_after=1) if who(body) in fails
                                     else Reply(content=f"ok from {who(body)}"))
        if runs_final:
            run = await run_recipe(recipe, engine=fe.info)
            assert run.output == "ok from lead" and [sid for sid, _ in run.errors] == ["pa"]
        else:
            with pytest.raises(AgentRunError, match="step 'final' uses the output of step '(pa|both)', which failed"):
                await run_recipe(recipe, engine=fe.info)
    assert runs_final == any(who(b) == "lead" for b in fe.requests)

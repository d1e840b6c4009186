"""Everything that can be checked is checked before the engine starts (issue 11, kind 3; F19,
F21, F10): templates rendered with typed stand-ins, strict types, string parameters kept as
written, map needs items, model files that are not complete GGUFs, what could not be checked
said plainly, and `squad plan` naming the files a recipe reads."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from pydantic import ValidationError

import gguf_support
from squad.cli import main as squad_main
from squad.engine.gguf import check_gguf
from squad.errors import AgentRunError, ModelError, RecipeError, UserError
from squad.recipes import load_recipe, validate_recipe
from squad.runtime.agent import Agent
from squad.runtime.mention import unmark
from squad.runtime.squad import Squad
from squad.testing import FakeEngine

BAD = Path(__file__).resolve().parents[1] / "recipes_bad"


def write(tmp_path: Path, text: str, name: str = "r.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def line_of(path: Path, needle: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if needle in line)


def recipe(params: str = "", agents: str = "  a: {max_tokens: 32}\n", flow: str = "  - prompt: hi\n",
           extra: str = "") -> str:
    return f"name: r\n{extra}params:\n{params or '  {}'}\nagents:\n{agents}main: a\nflow:\n{flow}"


# --- F19: rendering finds what only rendering can ----------------------------------------------


@pytest.mark.parametrize(("template", "problem"), [
    ("{{ ''.__class__.__mro__ }}", "template not allowed by the sandbox"),
    ("{{ 1 / 0 }}", "division by zero"),
    ("{% for i in range(10 ** 6) %}{% endfor %}", "range() of 1,000,000 items"),
    ("{{ params.topic.nosuch }}", "'str object' has no attribute 'nosuch'"),
    ("{{ params.n + 'x' }}", "unsupported operand"),
    ("{{ 'x' * 10 ** 9 }}", "would build 1,000,000,000"),
    ("{% if params.flag %}{{ [] | first | upper }}{% endif %}", "fix this expression"),
])
def test_validate_renders_every_prompt_with_the_parameters(tmp_path, template, problem):
    params = ("  topic: {type: string, default: cats}\n  n: {type: int, required: true}\n"
              "  flag: {type: bool, required: true}\n")
    path = write(tmp_path, recipe(params=params, flow=f"  - id: x\n    prompt: \"{template} {{{{ params.n }}}} "
                                                       f"{{{{ params.flag }}}} {{{{ params.topic }}}}\"\n"))
    with pytest.raises(RecipeError) as info:
        validate_recipe(path)
    assert (info.value.line, info.value.field) == (line_of(path, "prompt:"), "flow[0].prompt")
    assert problem in info.value.problem


def test_required_parameters_get_stand_ins_of_their_declared_type(tmp_path):
    """Without a value, a required int is 1, a list ['1'], an enum its first choice."""
    params = ("  n: {type: int, required: true}\n  xs: {type: list, required: true}\n"
              "  tone: {type: enum, choices: [calm, loud], required: true}\n  p: {type: number, required: true}\n")
    ok = "{{ 10 // params.n }} {{ params.xs | join(',') }} {{ params.tone.upper() }} {{ params.p * 2 }}"
    assert validate_recipe(write(tmp_path, recipe(params=params, flow=f"  - prompt: \"{ok}\"\n"))) == []
    for bad, problem in [("{{ params.n.upper() }}", "'int object' has no attribute 'upper'"),
                         ("{{ params.xs.strip() }}", "'list object' has no attribute 'strip'")]:
        with pytest.raises(RecipeError, match=problem):
            validate_recipe(write(tmp_path, recipe(params=params, flow=f"  - prompt: \"{bad}\"\n")))


def test_instructions_and_later_steps_are_rendered_too(tmp_path):
    agents = "  a:\n    max_tokens: 32\n    instructions: \"You have {{ 10 // params.n }} points.\"\n"
    path = write(tmp_path, recipe(params="  n: {type: int, default: 0}\n", agents=agents))
    with pytest.raises(RecipeError) as info:
        validate_recipe(path)
    assert (info.value.line, info.value.field) == (line_of(path, "instructions:"), "agents.a.instructions")
    flow = ("  - id: facts\n    prompt: hi\n  - parallel:\n      - id: one\n        prompt: \"{{ "
            "steps.facts.output }}\"\n"
            "      - id: two\n        prompt: \"{{ steps.facts.output | int }} {{ 1 / 0 }}\"\n"
            "  - prompt: \"{{ steps.one.output }} {{ steps.two.outputs | length }}\"\n")
    path = write(tmp_path, recipe(flow=flow))
    with pytest.raises(RecipeError) as info:
        validate_recipe(path)
    assert (info.value.line, info.value.field) == (line_of(path, "1 / 0"), "flow[1].parallel[1].prompt")


def test_squad_run_fails_before_launching_anything(capsys, tmp_path):
    """The run's first phase is the same check: the sandbox error, not a missing engine."""
    with pytest.raises(SystemExit) as info:
        squad_main(["run", str(BAD / "sandbox_mro.yaml"), "--llama-server", str(tmp_path / "no-such-llama-server")])
    assert info.value.code == 2
    err = capsys.readouterr().err.replace("\n", "")
    assert "sandbox_mro.yaml:6:13: flow[0].prompt: template not allowed by the sandbox" in err
    assert "llama-server" not in err and "Traceback" not in err


def test_a_prompt_at_run_time_is_capped_by_the_agents_budget(tmp_path):
    """Step outputs are known only while running: before a prompt goes anywhere its text is
    capped at 8 characters per token of the agent's budget (F18)."""
    flow = "  - id: first\n    prompt: hi\n  - id: second\n    prompt: \"Notes: {{ steps.first.output }}\"\n"
    loaded = load_recipe(write(tmp_path, recipe(agents="  a: {budget: 512, max_tokens: 32}\n", flow=flow)))
    second = loaded.flow[1]
    fine = loaded.render_prompt(second, {"first": {"output": "x" * 100}}, as_sent=True)
    assert unmark(fine) == "Notes: " + "x" * 100
    with pytest.raises(RecipeError) as info:
        loaded.render_prompt(second, {"first": {"output": "x" * 100_000}}, as_sent=True)
    assert info.value.field == "flow[1].prompt"
    assert info.value.problem == ("template error: the template renders more than 4,096 characters (agent 'a' has a "
                                  "budget of 512 tokens, at most 8 characters per token); shorten the text it renders")


@pytest.mark.anyio
async def test_an_oversized_prompt_is_never_counted_or_sent(tmp_path):
    """The client refuses text no budget can hold before counting it (counting 100 MB would hang)."""
    async with FakeEngine(slots=1, n_ctx=2048) as fe:
        async with Squad([Agent(name="a", budget=512, max_tokens=32)], engine=fe.info) as sq:
            with pytest.raises(AgentRunError, match="neither counted nor sent"):
                await sq.run("word " * 2_000_000)
        assert fe.count_requests == 0 and fe.requests == []


# --- F21: strict types; string parameters keep their text ------------------------------------------


def test_a_string_parameter_keeps_the_text_as_written(tmp_path):
    params = ("  version: {type: string, default: 1.10}\n  big: {default: 1e3}\n  yes_text: {default: true}\n"
              "  tone: {type: enum, choices: [1.10, 1.2], default: 1.10}\n  xs: {type: list, default: [1.10, 2.0]}\n"
              "  n: {type: number, default: 1.10}\n")
    flow = ("  - prompt: \"{{ params.version }} {{ params.big }} {{ params.yes_text }} {{ params.tone }} "
            "{{ params.xs }} {{ params.n }}\"\n")
    loaded = load_recipe(write(tmp_path, recipe(params=params, flow=flow)))
    assert loaded.params == {"version": "1.10", "big": "1e3", "yes_text": "true", "tone": "1.10",
                             "xs": ["1.10", "2.0"], "n": 1.1}
    assert loaded.render_prompt(loaded.flow[0], {}) == '1.10 1e3 true 1.10 ["1.10", "2.0"] 1.1'  # a list as JSON
    given = load_recipe(write(tmp_path, recipe(params=params, flow=flow)), {"version": "2.10", "tone": "1.2"})
    assert (given.params["version"], given.params["tone"]) == ("2.10", "1.2")


@pytest.mark.parametrize(("field", "value"), [
    ("max_tokens", True), ("max_tokens", "64"), ("max_tokens", 64.0), ("budget", True), ("budget", False),
])
def test_booleans_and_text_are_not_numbers_in_python_either(field, value):
    with pytest.raises(ValidationError):
        Agent(name="a", **{field: value})
    with pytest.raises(UserError):
        Agent.build(name="a", **{field: value})


@pytest.mark.parametrize(("yaml", "field"), [
    ("engine: {slots: true}\n", "engine.slots"), ("engine: {ctx: false}\n", "engine.ctx"),
    ("engine: {slots: 2.0}\n", "engine.slots"),
])
def test_engine_pins_are_whole_numbers(tmp_path, yaml, field):
    with pytest.raises(RecipeError) as info:
        validate_recipe(write(tmp_path, recipe(extra=yaml)))
    assert info.value.field == field and "must be auto or a whole number" in info.value.problem


# --- map needs items ---------------------------------------------------------------------------


def test_map_over_a_text_parameter_cuts_it_as_told(tmp_path):
    for split, value, items in [("lines", "a\\nb\\n\\nc", ["a", "b", "c"]), ("json", '[\\"x\\", 2]', ["x", "2"])]:
        params = f'  notes: {{type: string, default: "{value}"}}\n'
        flow = f"  - map: params.notes\n    split: {split}\n    prompt: \"{{{{ item }}}}\"\n"
        loaded = load_recipe(write(tmp_path, recipe(params=params, flow=flow)))
        assert loaded.items(loaded.flow[0], {}) == items
    with pytest.raises(RecipeError, match="is not a JSON list"):
        flow = "  - map: params.notes\n    split: json\n    prompt: \"{{ item }}\"\n"
        load_recipe(write(tmp_path, recipe(params="  notes: {type: string, default: x}\n", flow=flow)))


@pytest.mark.parametrize(("kind", "split", "problem"), [
    ("string", None, "needs split: lines, json or chunks"),
    ("file", None, "needs split: lines, json or chunks"),
    ("int", "lines", "a parameter of type int has no items"),
    ("bool", None, "a parameter of type bool has no items"),
    ("enum", "lines", "a parameter of type enum has no items"),
])
def test_map_over_a_parameter_without_items_is_an_error(tmp_path, kind, split, problem):
    write(tmp_path, "x\n", "f.txt")
    default = {"string": "x", "file": "f.txt", "int": "1", "bool": "true", "enum": "a"}[kind]
    choices = ", choices: [a]" if kind == "enum" else ""
    flow = f"  - map: params.p\n{f'    split: {split}' + chr(10) if split else ''}    prompt: \"{{{{ item }}}}\"\n"
    with pytest.raises(RecipeError) as info:
        validate_recipe(write(tmp_path,
                              recipe(params=f"  p: {{type: {kind}, default: {default}{choices}}}\n", flow=flow)))
    assert info.value.field == "flow[0].map" and problem in info.value.problem


# --- model files ----------------------------------------------------------------------------------


def tiny(path: Path) -> Path:
    return gguf_support.tiny_gguf(path, template=None)


@pytest.mark.parametrize(("make", "problem"), [
    (lambda p, raw: p.mkdir(), "is a directory, not a model file"),
    (lambda p, raw: p.write_bytes(b""), "is empty (0 bytes)"),
    (lambda p, raw: p.write_bytes(b"\x7fELF" + raw[4:]), "is not a GGUF file: it starts with b'\\x7fELF'"),
    (lambda p, raw: p.write_bytes(raw[:6]), "is truncated: it ends at byte 6, inside its header"),
    (lambda p, raw: p.write_bytes(raw[:100]), "is truncated: it ends at byte 100, inside "),
    (lambda p, raw: p.write_bytes(raw[:-40]), "is truncated: its tensors need"),
    (lambda p, raw: p.write_bytes(raw[:4] + b"\x01\x00\x00\x00" + raw[8:]), "GGUF version 1 is not supported"),
])
def test_a_model_file_that_is_not_a_complete_gguf_is_found_at_validate(tmp_path, make, problem):
    raw = tiny(tmp_path / "ok.gguf").read_bytes()
    bad = tmp_path / "bad.gguf"
    make(bad, raw)
    with pytest.raises(ModelError, match=re.escape(problem)):
        check_gguf(bad)
    path = write(tmp_path, recipe(extra="model: bad.gguf\n"))
    with pytest.raises(RecipeError) as info:
        validate_recipe(path)
    assert (info.value.line, info.value.field) == (line_of(path, "model:"), "model")
    assert str(bad) in info.value.problem and problem in info.value.problem
    check_gguf(tmp_path / "ok.gguf")  # the complete file passes


@pytest.mark.parametrize("make", [
    lambda p, raw: p.mkdir(),
    lambda p, raw: p.write_bytes(b""),
    lambda p, raw: p.write_bytes(b"PK\x03\x04" + raw[4:]),
    lambda p, raw: p.write_bytes(raw[:100]),
    lambda p, raw: p.write_bytes(raw[:-40]),
], ids=["directory", "empty", "not-gguf", "cut-in-metadata", "cut-in-tensors"])
def test_a_broken_model_file_is_bad_input_from_a_recipe_and_from_dash_m(tmp_path, make, capsys, monkeypatch):
    """Issue 19: a corrupt model is the user's input whichever way it is named: exit 2, one line,
    before any engine starts, from a recipe's model: and from -m on run, plan and models info."""
    from cli_support import squad

    monkeypatch.setenv("SQUAD_LLAMA_SERVER", "/nonexistent/llama-server")  # nothing may start
    raw = tiny(tmp_path / "ok.gguf").read_bytes()
    make(tmp_path / "bad.gguf", raw)
    by_recipe = write(tmp_path, recipe(extra="model: bad.gguf\n"))
    plain = write(tmp_path, recipe(), name="plain.yaml")
    for argv in (["run", by_recipe], ["run", plain, "-m", tmp_path / "bad.gguf"],
                 ["plan", plain, "-m", tmp_path / "bad.gguf"], ["models", "info", tmp_path / "bad.gguf"]):
        code, _, err = squad(capsys, *argv)
        assert code == 2, (argv, err)
        assert "bad.gguf" in err and "Traceback" not in err and "llama-server" not in err.split("error:")[0]


def test_the_real_model_file_is_complete_and_a_cut_copy_is_not(default_model_path, tmp_path):
    check_gguf(default_model_path)
    cut = tmp_path / "cut.gguf"
    with default_model_path.open("rb") as f:
        cut.write_bytes(f.read(40_000_000))
    with pytest.raises(ModelError, match=r"is truncated: its tensors need 98,362,432 bytes, the file has 40,000,000"):
        check_gguf(cut)


def test_validate_gives_the_same_verdict_without_the_model(default_model_path, monkeypatch, capsys):
    """Every broken recipe of the corpus fails at the same place whether or not the model file
    is on this machine; without it, validate says what it could not check."""
    from test_recipe_corpus import CORPUS

    def verdicts() -> list[tuple[int | None, str | None]]:
        out = []
        for name, *_ in CORPUS:
            with pytest.raises(RecipeError) as info:
                validate_recipe(BAD / name)
            out.append((info.value.line, info.value.field))
        return out

    with_model = verdicts()
    monkeypatch.setenv("SQUAD_CACHE_DIR", "/nonexistent/squad-cache")
    assert verdicts() == with_model
    shipped = Path(__file__).resolve().parents[2] / "recipes" / "review.yaml"
    with pytest.raises(SystemExit) as info:
        squad_main(["recipes", "validate", str(shipped)])
    assert info.value.code in (0, None)
    captured = capsys.readouterr()
    assert "OK" in captured.out
    assert "not checked" in captured.err and "is not on this machine" in captured.err.replace("\n", " ")


# --- sub-agent cycles -----------------------------------------------------------------------------


def test_the_python_api_still_refuses_cycles():
    from squad.runtime.agent import check_squad

    with pytest.raises(UserError, match="cycle: a -> b -> a"):
        check_squad([Agent(name="a", agents=("b",)), Agent(name="b", agents=("a",))])


# --- type: file parameters: squad plan says which files a recipe reads ----------------------------


def test_plan_names_the_files_a_recipe_reads(tmp_path, capsys):
    (tmp_path / "agents.yaml").write_text("agents:\n  helper: {max_tokens: 32}\n")
    write(tmp_path, "secret\n", "notes.txt")
    write(tmp_path, "other\n", "given.txt")
    params = "  notes: {type: file, default: notes.txt}\n  more: {type: file, required: true}\n"
    flow = "  - prompt: \"{{ params.notes }} {{ params.more }}\"\n"
    path = write(tmp_path, recipe(params=params, flow=flow, extra="include: [agents.yaml]\n"))
    loaded = load_recipe(path, {"more": str(tmp_path / "given.txt")})
    assert [(Path(p).name, why) for p, why in loaded.reads] == [
        ("agents.yaml", "agents included by r.yaml"),
        ("notes.txt", "parameter 'notes' (type: file, its default)"),
        ("given.txt", "parameter 'more' (type: file, from -p)"),
    ]
    with pytest.raises(SystemExit) as info:
        squad_main(["plan", str(path), "-p", f"more={tmp_path / 'given.txt'}", "--json"])
    assert info.value.code in (0, None)
    reads = json.loads(capsys.readouterr().out)["reads"]
    assert [Path(r["path"]).name for r in reads] == ["agents.yaml", "notes.txt", "given.txt"]
    with pytest.raises(SystemExit):
        squad_main(["plan", str(path), "-p", f"more={tmp_path / 'given.txt'}"])
    out = capsys.readouterr().out.replace("\n", " ")
    squashed = "".join(out.split())  # a long temporary path (an xdist worker's) wraps inside a table cell
    assert "files this recipe reads" in out and "notes.txt" in squashed and "type: file, its default" in out

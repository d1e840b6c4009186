"""The CLI speaks one language (issue 11, kind 8).

- Every option of every command is in the table of allowed names (``OPTION_NAMES``) with its
  one short form, and an option name has one type and range wherever it appears.
- Help is prose the terminal wraps (no line breaks inside a sentence), at 80 and 200 columns,
  and the defaults it states belong to the command it is in.
- Bad input a new user gives (a file that is not a trace, a bad URL, an unknown model, an
  unwritable image path) is a one-line error, exit 2, no traceback.
- ``squad plan`` labels every step with its id.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.core import TyperOption

from cli_support import squad
from squad.cli import app
from squad.cli.options import OPTION_NAMES

ROOT = Path(__file__).resolve().parents[2]


def commands() -> list[tuple[str, Any]]:
    """Every leaf command as (``"engine start"``, its click command)."""
    found: list[tuple[str, Any]] = []

    def walk(prefix: str, cmd: Any) -> None:
        if hasattr(cmd, "commands"):
            for name, sub in cmd.commands.items():
                walk(f"{prefix} {name}".strip(), sub)
        else:
            found.append((prefix, cmd))

    walk("", typer.main.get_command(app))
    return found


def groups() -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []

    def walk(prefix: str, cmd: Any) -> None:
        if hasattr(cmd, "commands"):
            out.append((prefix, cmd))
            for name, sub in cmd.commands.items():
                walk(f"{prefix} {name}".strip(), sub)

    walk("", typer.main.get_command(app))
    return out


def options(cmd: Any) -> list[TyperOption]:
    return [p for p in cmd.params if isinstance(p, TyperOption)]


def one_line_error(code: int, err: str) -> None:
    assert code == 2, err
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err


# --- names and short forms ----------------------------------------------------------------------


def test_every_command_is_found():
    names = {name for name, _ in commands()}
    assert {"run", "chat", "plan", "verify", "engine start", "engine status", "trace plot", "trace show",
            "models pull", "recipes validate"} <= names


def test_every_option_name_and_short_form_is_in_the_table():
    bad = []
    for name, cmd in commands():
        for opt in options(cmd):
            longs = [o for o in opt.opts + opt.secondary_opts if o.startswith("--")]
            shorts = sorted(o for o in opt.opts + opt.secondary_opts if not o.startswith("--"))
            if len(longs) != 1:
                bad.append(f"squad {name}: {opt.opts} should have exactly one long name")
                continue
            (long,) = longs
            if long not in OPTION_NAMES:
                bad.append(f"squad {name}: {long} is not in OPTION_NAMES (add it, or reuse a name that means this)")
            elif shorts != ([OPTION_NAMES[long]] if OPTION_NAMES[long] else []):
                bad.append(f"squad {name}: {long} has short form(s) {shorts}, the table says {OPTION_NAMES[long]}")
    assert not bad, "\n".join(bad)


def test_short_forms_are_unique_in_the_table():
    shorts = [s for s in OPTION_NAMES.values() if s]
    assert len(shorts) == len(set(shorts))


def test_an_option_name_has_one_type_and_range_everywhere():
    """A repeatable option (``squad run --url A --url B``) counts as its item's type."""
    seen: dict[str, tuple[str, str]] = {}
    bad = []
    for name, cmd in commands():
        for opt in options(cmd):
            long = next(o for o in opt.opts if o.startswith("--"))
            annotation = opt.type_descriptor.annotation
            item = str if annotation == list[str] else annotation
            kind = (f"{item} min={opt.min} max={opt.max}", str(opt.is_flag))
            if long in seen and seen[long][0] != kind:
                bad.append(f"{long}: {kind} in squad {name}, {seen[long][0]} in squad {seen[long][1]}")
            seen.setdefault(long, (kind, name))  # type: ignore[arg-type]
    assert not bad, "\n".join(bad)


ENGINE = {"--model", "--slots", "--ctx", "--llama-server", "--threads"}


@pytest.mark.parametrize("name, expected", [
    ("run", ENGINE | {"--ctk", "--ctv", "--url", "--api-key", "--param", "--out", "--trace", "--json"}),
    ("chat", ENGINE | {"--ctk", "--ctv", "--url", "--api-key", "--param"}),
    ("verify", ENGINE | {"--json"}),
    ("engine start", ENGINE | {"--port"}),
    ("plan", {"--model", "--slots", "--ctx", "--ctk", "--ctv", "--url", "--api-key", "--param", "--json"}),
    ("trace plot", {"--out"}),
])
def test_commands_that_size_or_start_an_engine_take_the_same_options(name, expected):
    cmd = dict(commands())[name]
    have = {o for opt in options(cmd) for o in opt.opts if o.startswith("--")}
    assert expected <= have, f"squad {name} lacks {sorted(expected - have)}"


def test_verify_pins_slots_like_every_other_command(capsys, monkeypatch, tmp_path):
    seen = {}

    async def fake_verify(**kwargs):
        seen.update(kwargs)
        raise typer.Exit(0)

    monkeypatch.setenv("SQUAD_STATE_DIR", str(tmp_path))
    monkeypatch.setattr("squad.engine.verify.run_verify", fake_verify)
    squad(capsys, "verify", "--slots", "3", "-c", "2048")
    assert seen["parallel"] == 3 and seen["ctx"] == 2048
    code, out, err = squad(capsys, "verify", "--parallel", "3")
    assert code == 2 and "No such option" in err


# --- help text ------------------------------------------------------------------------------------


def _help(capsys, monkeypatch, columns: int, *argv: str) -> str:
    monkeypatch.setenv("COLUMNS", str(columns))
    code, out, err = squad(capsys, *argv, "--help")
    assert code == 0, err
    return out


@pytest.mark.parametrize("columns", [80, 200])
def test_help_is_prose_the_terminal_wraps(capsys, monkeypatch, columns):
    for name, cmd in commands():
        text = _help(capsys, monkeypatch, columns, *name.split())
        assert cmd.help, f"squad {name} has no help"
        for paragraph in cmd.help.split("\n\n"):
            assert "\n" not in paragraph, f"squad {name}: a line break inside a paragraph: {paragraph!r}"
            if columns == 200 and len(paragraph) < 190:  # fits one line: must be shown on one line
                lines = [line.strip(" │") for line in text.splitlines()]
                assert paragraph in lines, f"squad {name} --help at 200 columns breaks {paragraph!r}"
        for opt in options(cmd):
            assert "\n" not in (opt.help or ""), f"squad {name} {opt.opts[0]}: a line break in its help"


def test_group_help_lists_each_command_in_one_line_at_200_columns(capsys, monkeypatch):
    for name, group in groups():
        text = _help(capsys, monkeypatch, 200, *name.split())
        for sub, cmd in group.commands.items():
            first = (cmd.help or "").split("\n\n")[0]
            if len(first) < 150:
                assert any(line.strip(" │").endswith(first) for line in text.splitlines()), (name, sub, first)


@pytest.mark.parametrize("name, option, words", [
    ("run", "--model", "the recipe's"),
    ("chat", "--model", "the recipe's model, else smollm2-135m"),
    ("plan", "--model", "the recipe's"),
    ("verify", "--model", "smollm2-135m"),
    ("engine start", "--model", "smollm2-135m"),
    ("run", "--slots", "planned"),
    ("plan", "--ctx", "planned"),
    ("run", "--trace", "SQUAD_STATE_DIR"),
])
def test_defaults_in_help_describe_the_command_they_are_in(name, option, words):
    cmd = dict(commands())[name]
    opt = next(o for o in options(cmd) if option in o.opts)
    assert words in (opt.help or ""), f"squad {name} {option}: {opt.help!r}"


def test_help_states_no_default_the_command_does_not_have():
    """A default given in words is not shown a second time by typer, and a run's trace is a new
    file (not "the newest file")."""
    run = dict(commands())["run"]
    assert "newest" not in (run.help or "")
    for name, cmd in commands():
        for opt in options(cmd):
            shown = opt.show_default and not opt.is_flag and opt.default is not None  # what typer prints
            assert not ("(default:" in (opt.help or "") and shown), f"squad {name} {opt.opts[0]}: two defaults"


# --- bad input: one line, exit 2 ------------------------------------------------------------------


def test_trace_show_on_a_file_that_is_not_a_trace_is_an_error(capsys, tmp_path):
    cases = {
        "empty.jsonl": "",
        "text.txt": "hello\n",
        "other.jsonl": json.dumps({"kind": "something.else", "t": 0}) + "\n",
        "object.jsonl": json.dumps({"a": 1}) + "\n",
        "list.jsonl": "[1, 2]\n",
    }
    for file, text in cases.items():
        (tmp_path / file).write_text(text)
        for command in ("show", "plot"):
            code, out, err = squad(capsys, "trace", command, tmp_path / file)
            one_line_error(code, err)
            assert "trace" in err
    code, out, err = squad(capsys, "trace", "show", tmp_path)
    one_line_error(code, err)


@pytest.mark.parametrize("argv", [
    ["run", "RECIPE"], ["chat"], ["plan", "RECIPE", "--backend", "attached"], ["engine", "status"],
])
@pytest.mark.parametrize("url", ["nope", "localhost:8080", "ftp://127.0.0.1:8080", "http://127.0.0.1:port"])
def test_a_url_that_is_not_an_engine_url_is_refused_at_once(capsys, tmp_path, argv, url):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("name: r\nagents: {a: {instructions: hi}}\nmain: a\nflow: [{id: s, agent: a, prompt: hi}]\n")
    code, out, err = squad(capsys, *[str(recipe) if a == "RECIPE" else a for a in argv], "--url", url)
    assert code == 2 and "--url" in err and "http://HOST:PORT" in " ".join(err.split()), err


def test_models_pull_suggests_only_what_pull_accepts(capsys, tmp_path):
    code, out, err = squad(capsys, "models", "pull", "no-such-model")
    one_line_error(code, err)
    assert "smollm2-135m" in err and "path" not in err and ".gguf" not in err
    gguf = tmp_path / "mine.gguf"
    gguf.write_bytes(b"GGUF" + b"\0" * 60)
    code, out, err = squad(capsys, "models", "pull", gguf)
    one_line_error(code, err)
    assert "needs no pull" in err and f"--model {gguf}" in err


def test_an_unknown_model_is_bad_input_everywhere(capsys):
    for argv in (["models", "info", "no-such-model"], ["plan", "--agents", "a:100", "-m", "no-such-model"]):
        code, out, err = squad(capsys, *argv)
        one_line_error(code, err)
        assert "no-such-model" in err


def test_chat_params_without_a_recipe_are_refused(capsys):
    code, out, err = squad(capsys, "chat", "-p", "topic=cats")
    one_line_error(code, err)
    assert "--recipe" in err


def test_a_long_error_stays_on_one_line(capsys, tmp_path):
    deep = tmp_path.joinpath(*["a-rather-long-directory-name"] * 6, "out.txt")
    code, out, err = squad(capsys, "trace", "plot", "--out", deep)
    one_line_error(code, err)
    assert str(deep) in err


# --- plan labels steps by their id ------------------------------------------------------------------


def test_plan_labels_every_step_by_its_id(capsys, monkeypatch, tmp_path, default_model_path):
    monkeypatch.setenv("SQUAD_KV_MEMORY", "4GiB")
    recipe = tmp_path / "steps.yaml"
    recipe.write_text(textwrap.dedent("""\
        name: steps
        agents:
          a: {instructions: You write., max_tokens: 16}
          b: {instructions: You check., max_tokens: 16}
        main: a
        flow:
          - id: first
            agent: a
            prompt: Write.
          - id: both
            parallel:
              - {id: left, agent: b, prompt: Check left.}
              - {id: right, agent: b, prompt: Check right.}
          - id: last
            agent: a
            prompt: "Finish: {{ steps.both.output }}"
        """))
    code, out, err = squad(capsys, "plan", recipe, "-m", default_model_path, "--json")
    assert code == 0, err
    labels = [stage["label"] for stage in json.loads(out)["timeline"]]
    assert labels == ["step 1 (first)", "step 2 (both)", "step 3 (last)"], labels


def test_short_forms_work_as_the_long_names(capsys, monkeypatch, default_model_path):
    monkeypatch.setenv("SQUAD_KV_MEMORY", "4GiB")
    code, out, err = squad(capsys, "plan", "--agents", "a:100,b:100", "--parallel", "-m", default_model_path,
                           "-np", "3", "-c", "1024", "--json")
    assert code == 0, err
    data = json.loads(out)
    assert (data["slots"], data["n_ctx"]) == (3, 1024)

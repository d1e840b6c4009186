"""No work is lost to a path (field case F14, issue 11 kind 5).

Every path a command writes (``--out``, ``--trace``, ``trace plot --out``, squad's state
directory with its logs, pid files and traces) is checked before the engine starts: a
one-line error, exit 2, no traceback, no engine call. A write that still fails at the end
prints the answer first; a run that fails keeps the outputs of the steps that finished.

Unwritable places are made so that they stay unwritable for root too (CI runs as root,
who ignores permission bits): a path under a regular file, and /proc.
"""

from __future__ import annotations

import json
import shutil
import textwrap
from pathlib import Path

import pytest

from cli_support import engine, squad, state  # noqa: F401 - fixtures
from squad.dirs import check_output_file, check_state_dirs
from squad.errors import UserError
from squad.testing import Reply

TWO_STEPS = textwrap.dedent("""\
    name: two-steps
    model: default
    agents:
      writer:
        instructions: You write.
        max_tokens: 8
      editor:
        instructions: You edit.
        max_tokens: 8
    main: writer
    flow:
      - id: draft
        agent: writer
        prompt: "Write about cats."
      - id: edit
        agent: editor
        prompt: "Edit: {{ steps.draft.output }}"
    """)


@pytest.fixture
def recipe(tmp_path) -> Path:
    path = tmp_path / "two.yaml"
    path.write_text(TWO_STEPS)
    return path


def a_file(tmp_path: Path) -> Path:
    path = tmp_path / "plain.txt"
    path.write_text("not a directory\n")
    return path


def unwritable(tmp_path: Path) -> list[tuple[Path, str]]:
    """Places no one can write, root included, and a word the error must contain."""
    return [
        (tmp_path / "no" / "such" / "dir" / "out.txt", "does not exist"),
        (a_file(tmp_path) / "sub" / "out.txt", "is a file, not a directory"),
        (tmp_path, "is a directory"),
        (Path("/proc/squad-out.txt"), "cannot create or write"),
    ]


# --- the checks themselves ----------------------------------------------------------------------


def test_check_output_file_refuses_each_unwritable_place_and_leaves_nothing(tmp_path):
    for path, words in unwritable(tmp_path):
        with pytest.raises(UserError, match=words) as caught:
            check_output_file(path, "--out")
        assert str(caught.value).startswith(f"--out {path}")
    fresh = tmp_path / "fresh.txt"
    assert check_output_file(fresh, "--out") == fresh and not fresh.exists()  # probed, not left behind
    kept = tmp_path / "kept.txt"
    kept.write_text("old")
    check_output_file(kept, "--out")
    assert kept.read_text() == "old"  # an existing file is not truncated by the check


def test_state_dir_that_cannot_be_made_or_written_is_a_user_error(tmp_path, monkeypatch):
    for bad in (a_file(tmp_path) / "state", Path("/proc/squad-state")):
        monkeypatch.setenv("SQUAD_STATE_DIR", str(bad))
        with pytest.raises(UserError, match="SQUAD_STATE_DIR"):
            check_state_dirs("logs", "engines")
    monkeypatch.setenv("SQUAD_STATE_DIR", str(tmp_path / "ok"))
    assert check_state_dirs("logs", "engines", "traces") == tmp_path / "ok"
    assert {p.name for p in (tmp_path / "ok").iterdir()} == {"logs", "engines", "traces"}
    assert not any((tmp_path / "ok" / "logs").iterdir())  # the probe file is gone


# --- every command that writes checks before it starts -----------------------------------------


@pytest.mark.parametrize("option", ["--out", "--trace"])
def test_run_refuses_an_unwritable_path_before_the_engine_is_called(capsys, tmp_path, state, engine, recipe,
                                                                     option):
    for path, words in unwritable(tmp_path):
        code, out, err = squad(capsys, "run", recipe, "--url", engine.base_url, "-q", option, path)
        assert code == 2, err
        assert words in err and f"{option} {path}" in err
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert engine.requests == [] and engine.count_requests == 0  # nothing reached the engine


def test_run_refuses_an_unwritable_state_dir_before_launching(capsys, tmp_path, monkeypatch, recipe):
    monkeypatch.setenv("SQUAD_STATE_DIR", str(a_file(tmp_path) / "state"))
    code, out, err = squad(capsys, "run", recipe, "-q", "--llama-server", "/bin/false")
    assert code == 2 and "SQUAD_STATE_DIR" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("argv", [
    ["chat", "--llama-server", "/bin/false"],
    ["verify", "--llama-server", "/bin/false"],
    ["engine", "start", "--llama-server", "/bin/false"],
])
def test_every_command_that_launches_checks_the_state_dir_first(capsys, tmp_path, monkeypatch, argv):
    monkeypatch.setenv("SQUAD_STATE_DIR", str(a_file(tmp_path) / "state"))
    code, out, err = squad(capsys, *argv)
    assert code == 2, err
    assert "state directory" in err and "SQUAD_STATE_DIR" in err and "Traceback" not in err


def test_trace_plot_refuses_a_bad_path_before_drawing(capsys, tmp_path):
    trace = tmp_path / "run.jsonl"
    trace.write_text(json.dumps({"kind": "agent.started", "t": 0.0, "agent": "a"}) + "\n")
    for path, words in unwritable(tmp_path):
        code, out, err = squad(capsys, "trace", "plot", trace, "--out", path)
        assert code == 2 and words in err and "Traceback" not in err, err
    code, out, err = squad(capsys, "trace", "plot", trace, "-o", tmp_path / "timeline.txt")
    assert code == 2 and ".png" in err and "Traceback" not in err


# --- nothing is lost at the end -----------------------------------------------------------------


def test_run_writes_the_output_and_prints_it(capsys, tmp_path, state, engine, recipe):
    engine.script(Reply(content="a draft"), Reply(content="the edit"))
    out_file = tmp_path / "result.txt"
    code, out, err = squad(capsys, "run", recipe, "--url", engine.base_url, "-q", "-o", out_file)
    assert code == 0, err
    assert out.strip() == "the edit" and out_file.read_text() == "the edit\n"


def test_output_is_printed_when_writing_it_fails_at_the_end(capsys, tmp_path, state, engine, recipe):
    folder = tmp_path / "results"
    folder.mkdir()

    def remove_the_folder(body: dict) -> Reply:  # the directory disappears mid-run
        shutil.rmtree(folder, ignore_errors=True)
        return Reply(content="the answer")

    engine.responder = remove_the_folder
    code, out, err = squad(capsys, "run", recipe, "--url", engine.base_url, "-q", "--out", folder / "out.txt")
    assert code == 1
    assert out.strip() == "the answer"  # printed first, not lost
    assert f"could not write the output to --out {folder / 'out.txt'}" in err and "printed above" in err
    assert "Traceback" not in err


def test_a_failed_step_keeps_what_finished_on_stdout_and_in_out(capsys, tmp_path, state, engine, recipe):
    engine.script(Reply(content="the finished draft"), Reply(status=400, error_message="bad request"))
    out_file = tmp_path / "out.txt"
    code, out, err = squad(capsys, "run", recipe, "--url", engine.base_url, "-q", "--out", out_file)
    assert code != 0 and "Traceback" not in err
    assert "the finished draft" in out and "## step draft" in out
    kept = out_file.read_text()
    assert kept.startswith("# the run did not finish: ") and "the finished draft" in kept
    assert "edit" not in kept.split("\n", 1)[1].replace("## step draft", "")  # the failed step is not shown as done


def test_a_failed_step_keeps_what_finished_in_json(capsys, tmp_path, state, engine, recipe):
    engine.script(Reply(content="the finished draft"), Reply(status=400, error_message="bad request"))
    code, out, err = squad(capsys, "run", recipe, "--url", engine.base_url, "-q", "--json")
    assert code != 0
    data = json.loads(out)
    assert data["output"] is None and data["failed"]
    assert data["finished"]["draft"]["output"] == "the finished draft" and "edit" not in data["finished"]


def test_run_never_writes_over_its_recipe_or_a_file_that_is_not_a_trace(capsys, tmp_path, state, engine, recipe):
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes\n")
    same = tmp_path / "same.txt"
    for argv, words in [
        (["--out", recipe], "is the recipe itself"),
        (["--trace", recipe], "is the recipe itself"),
        (["--out", same, "--trace", same], "both name"),
        (["--trace", notes], "is not a squad trace"),
    ]:
        code, out, err = squad(capsys, "run", recipe, "--url", engine.base_url, "-q", *argv)
        assert code == 2 and words in err and "Traceback" not in err, err
    assert notes.read_text() == "my notes\n" and "two-steps" in recipe.read_text()
    assert engine.requests == []


def test_a_cut_answer_the_recipe_fails_on_is_still_shown(capsys, tmp_path, state, engine):
    """``non_answers: {truncated: fail}`` on the first step: the run fails (exit 1), and the
    cut text is printed and written to --out, marked as the failing step's, not lost."""
    path = tmp_path / "cut.yaml"
    path.write_text(TWO_STEPS.replace("main: writer\n", "main: writer\nnon_answers: {truncated: fail}\n"))
    engine.script(Reply(content="a draft about cats that was cut", finish_reason="length"))
    out_file = tmp_path / "out.txt"
    code, out, err = squad(capsys, "run", path, "--url", engine.base_url, "-q", "--out", out_file)
    assert code == 1 and "Traceback" not in err
    assert "a draft about cats that was cut" in out and "(cut, the failing step)" in out
    assert "a draft about cats that was cut" in out_file.read_text()

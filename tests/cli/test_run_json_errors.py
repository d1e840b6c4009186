"""Issue 19: ``squad run --json`` is for scripts, so a run that fails prints one JSON document
on stdout too: ``{"ok": false, "error": {"message", "type", "exit_code", ...}}`` with what
finished, the exit code unchanged and the error line still on stderr. Every way a run can
fail: a bad recipe (file:line in the object), a bad parameter or option value, an engine that
is not there, a step that fails after another finished, a non-answer made a failure. The fake
engine proves it (the JSON is squad's own)."""

from __future__ import annotations

import json

import anyio
import pytest

from cli_support import squad, state  # noqa: F401
from squad.testing import FakeEngine, Reply

RECIPE = """\
name: two
agents:
  a: {instructions: "You are a.", budget: 1024, max_tokens: 16}
main: a
flow:
  - id: first
    prompt: "one"
  - id: second
    prompt: "two {{ steps.first.output }}"
"""


def _doc(out: str) -> dict:
    data = json.loads(out)  # exactly one JSON document on stdout
    assert isinstance(data, dict)
    return data


def test_a_bad_recipe_gives_a_json_error_with_its_line(tmp_path, capsys, state):
    path = tmp_path / "r.yaml"
    path.write_text(RECIPE.replace("{{ steps.first.output }}", "{{ steps.frist.output }}"))
    code, out, err = squad(capsys, "run", path, "--json")
    assert code == 2 and "error:" in err
    data = _doc(out)
    assert data["ok"] is False and data["output"] is None
    assert data["error"]["exit_code"] == 2 and data["error"]["type"] == "RecipeError"
    assert data["error"]["line"] == 9 and data["error"]["field"] == "flow[1].prompt"
    assert "unknown step id 'frist'" in data["error"]["message"]


@pytest.mark.parametrize("argv, kind", [
    (["-p", "nosuch=1"], "RecipeError"),
    (["--url", "http://127.0.0.1:9"], "EngineGone"),
    (["--out", "/no/such/dir/out.txt"], "UserError"),
])
def test_other_failures_before_the_run_give_a_json_error(tmp_path, capsys, state, argv, kind):
    path = tmp_path / "r.yaml"
    path.write_text(RECIPE)
    code, out, err = squad(capsys, "run", path, "--json", *argv)
    assert code in (1, 2) and err.strip()
    data = _doc(out)
    assert data["ok"] is False and data["error"]["exit_code"] == code
    assert data["error"]["message"] and data["error"]["type"] == kind


def test_a_step_that_fails_after_another_finished_keeps_it_in_the_one_document(tmp_path, capsys, state):
    path = tmp_path / "r.yaml"
    path.write_text(RECIPE.replace("max_tokens: 16}", "max_tokens: 16}\nnon_answers: {truncated: fail}"))

    async def main():
        async with FakeEngine(slots=2, n_ctx=4096) as fe:
            fe.responder = lambda body: (Reply(content="first answer") if body["messages"][-1]["content"] == "one"
                                         else Reply(content="cut " * 40))
            return await anyio.to_thread.run_sync(lambda: squad(capsys, "run", path, "--json", "--url", fe.base_url))

    code, out, err = anyio.run(main)
    assert code == 1, err
    data = _doc(out)
    assert data["ok"] is False and data["error"]["exit_code"] == 1 and data["error"]["type"] == "IncompleteAnswer"
    assert data["finished"]["first"]["output"] == "first answer" and data["recipe"] == "two"


def test_a_run_that_succeeds_says_ok(tmp_path, capsys, state):
    path = tmp_path / "r.yaml"
    path.write_text(RECIPE)

    async def main():
        async with FakeEngine(slots=2, n_ctx=4096) as fe:
            fe.responder = lambda body: Reply(content="fine")
            return await anyio.to_thread.run_sync(lambda: squad(capsys, "run", path, "--json", "--url", fe.base_url))

    code, out, err = anyio.run(main)
    assert code == 0, err
    assert _doc(out)["ok"] is True

"""Issue 19 item 5: a map over nothing is an empty answer (:mod:`squad.runtime.outcome`), never blank
text passed on. Every way a map can have no items (an empty list parameter given as ``[]`` or
``""``, an empty file cut in chunks, text of blank lines, an earlier step's output with no
lines) is shown in the run table as ``empty``, warned about with the fix and passed on as the
``non_answers.empty`` setting says (``mark`` by default, ``fail``, ``accept``); ``squad plan``
and ``squad recipes validate`` say so when the input is known before the run.

The fake engine proves it: no model call is made for an empty map, so the real engine has
nothing to add (the next step's prompt is what is checked)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import anyio
import pytest

from squad.errors import IncompleteAnswer
from squad.events import StepWarning
from squad.recipes import load_recipe, run_recipe, step_table, validate_recipe
from squad.recipes.model import EmptyMapWarning
from squad.testing import FakeEngine, Reply, ScriptedEngine

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


RECIPE = """\
name: empty-map
params:
  items: {type: list, default: [a, b]}
  code: {type: string, default: "x = 1"}
  notes: {type: file, default: notes.txt}
SETTING
agents:
  summarizer: {instructions: "You are summarizer.", budget: 1024, max_tokens: 16}
  writer: {instructions: "You are writer.", budget: 1024, max_tokens: 16}
main: writer
flow:
  - id: summaries
    agent: summarizer
    map: MAP
    SPLIT
    prompt: "Summarize: {{ item }}"
  - id: combine
    agent: writer
    prompt: "Facts:\\n{{ steps.summaries.output }}\\nWrite."
"""


def write(tmp_path: Path, *, over: str = "params.items", split: str = "", setting: str = "") -> Path:
    (tmp_path / "notes.txt").write_text("one\ntwo\n", encoding="utf-8")
    path = tmp_path / "r.yaml"
    chunking = "    chunk_tokens: 200\n" if split == "chunks" else ""
    path.write_text(RECIPE.replace("MAP", over).replace("    SPLIT\n",
                                                        f"    split: {split}\n{chunking}" if split else "")
                    .replace("SETTING\n", f"{setting}\n" if setting else ""), encoding="utf-8")
    return path


def who(request) -> str:
    return request.messages[0]["content"].removeprefix("You are ").rstrip(".")


def engine() -> ScriptedEngine:
    return ScriptedEngine(responder=lambda r: "news" if who(r) == "writer" else "a fact", slots=2, n_ctx=4096)


def writer_prompt(e: ScriptedEngine) -> str | None:
    return next((r.messages[-1]["content"] for r in e.requests if who(r) == "writer"), None)


EMPTY_INPUTS = [
    pytest.param("params.items", "", {"items": "[]"}, "parameter 'items' is an empty list", id="list-json-[]"),
    pytest.param("params.items", "", {"items": ""}, "parameter 'items' is an empty list", id="list-empty-text"),
    pytest.param("params.code", "chunks", {"code": ""}, "parameter 'code' is empty text", id="chunks-empty"),
    pytest.param("params.code", "lines", {"code": "\n  \n"}, "parameter 'code' is empty text", id="lines-blank"),
    pytest.param("params.notes", "chunks", {"notes": "EMPTY_FILE"}, "the file given for parameter 'notes' is empty",
                 id="file-0-bytes-chunks"),
    pytest.param("params.code", "json", {"code": "[]"}, "parameter 'code' gives no items (split: json)",
                 id="json-empty-list"),
]


def given(tmp_path: Path, params: dict[str, str]) -> dict[str, str]:
    if params.get("notes") == "EMPTY_FILE":
        (tmp_path / "empty.txt").write_bytes(b"")
        return {"notes": str(tmp_path / "empty.txt")}
    return params


@pytest.mark.parametrize(("over", "split", "params", "why"), EMPTY_INPUTS)
async def test_an_empty_map_is_an_empty_answer_marked_and_warned(tmp_path, over, split, params, why):
    recipe = load_recipe(write(tmp_path, over=over, split=split), given(tmp_path, params))
    e, events = engine(), []
    run = await run_recipe(recipe, engine=e, on_event=events.append)
    assert [who(r) for r in e.requests] == ["writer"]  # no item ran, the writer did
    assert writer_prompt(e) == "Facts:\n[empty answer]\nWrite."  # marked, not blank
    assert run.steps["summaries"]["outcome"] == "empty" and run.steps["summaries"]["outputs"] == []
    [(sid, warning)] = run.warnings
    assert sid == "summaries" and why in warning and "no items" in warning
    assert "non_answers.empty: mark" in warning and "pass items with -p" in warning
    assert [ev.step for ev in events if isinstance(ev, StepWarning)] == ["summaries"]
    rows = [r for r in step_table(run) if r["step"] == "summaries"]
    assert [(r["agent"], r["state"], r["outcome"]) for r in rows] == [("summarizer", "empty", "empty")]
    assert any(isinstance(w, EmptyMapWarning) and why in str(w) for w in recipe.warnings)  # known before the run


async def test_fail_stops_the_run_before_the_next_step(tmp_path):
    recipe = load_recipe(write(tmp_path, setting="non_answers: {empty: fail}"), {"items": "[]"})
    e = engine()
    with pytest.raises(IncompleteAnswer, match="map step 'summaries' over params.items has no items") as info:
        await run_recipe(recipe, engine=e)
    assert info.value.outcome == "empty" and not e.requests


async def test_accept_passes_empty_text_without_a_warning(tmp_path):
    recipe = load_recipe(write(tmp_path, setting="non_answers: {empty: accept}"), {"items": "[]"})
    e = engine()
    run = await run_recipe(recipe, engine=e)
    assert writer_prompt(e) == "Facts:\n\nWrite." and not run.warnings
    assert [r["state"] for r in step_table(run) if r["step"] == "summaries"] == ["empty"]  # still shown as what it is


async def test_a_map_over_an_earlier_steps_empty_output(tmp_path):
    text = RECIPE.replace("flow:\n", "flow:\n  - id: listing\n    agent: writer\n"
                          "    prompt: \"List {{ params.code }}\"\n    non_answers: {empty: accept}\n")
    path = tmp_path / "r.yaml"
    path.write_text(text.replace("MAP", "steps.listing.output").replace("    SPLIT\n", "").replace("SETTING\n", ""),
                    encoding="utf-8")
    (tmp_path / "notes.txt").write_text("x", encoding="utf-8")
    calls = []

    def respond(r):
        calls.append(r.messages[-1]["content"])
        return "" if len(calls) == 1 else "news"
    e = ScriptedEngine(responder=respond, slots=2, n_ctx=4096)
    run = await run_recipe(load_recipe(path), engine=e)
    assert calls[-1] == "Facts:\n[empty answer]\nWrite."
    [(sid, warning)] = run.warnings
    assert sid == "summaries" and "step 'listing''s output gives no items" in warning
    assert "check step 'listing'" in warning


async def test_an_empty_map_in_a_collect_block_fails_only_itself_under_fail(tmp_path):
    text = """\
name: block
params:
  items: {type: list, default: []}
non_answers: {empty: fail}
agents:
  a: {instructions: "You are a.", budget: 512, max_tokens: 8}
main: a
flow:
  - id: both
    parallel:
      - id: none
        map: params.items
        prompt: "{{ item }}"
      - id: one
        prompt: "hello"
"""
    path = tmp_path / "r.yaml"
    path.write_text(text, encoding="utf-8")
    run = await run_recipe(load_recipe(path), engine=ScriptedEngine(responder=lambda r: "hi", slots=2, n_ctx=4096))
    assert run.steps["none"]["outcome"] == "empty" and "no items" in run.steps["none"]["error"]
    assert run.steps["one"]["output"] == "hi"


def test_validate_warns_of_an_empty_default_and_not_of_a_required_param(tmp_path):
    path = write(tmp_path)
    path.write_text(path.read_text().replace("default: [a, b]", "default: []"), encoding="utf-8")
    [warning] = [w for w in validate_recipe(path) if isinstance(w, EmptyMapWarning)]
    assert warning.line == 13 and warning.field == "flow[0].map" and "its default" in str(warning)
    path.write_text(path.read_text().replace("{type: list, default: []}", "{type: list, required: true}"),
                    encoding="utf-8")
    assert not [w for w in validate_recipe(path) if isinstance(w, EmptyMapWarning)]  # unknown until -p
    assert not [w for w in load_recipe(path, {"items": "a"}).warnings if isinstance(w, EmptyMapWarning)]


async def test_squad_plan_and_run_say_so(tmp_path):
    path = write(tmp_path)
    cmd = [sys.executable, "-m", "squad"]
    plan = await anyio.run_process([*cmd, "plan", str(path), "-p", "items=[]", "--json"], check=False)
    assert plan.returncode == 0, plan.stderr.decode()
    warnings = json.loads(plan.stdout)["warnings"]
    assert any("map step 'summaries' has no items to run" in w for w in warnings)
    async with FakeEngine(slots=2, n_ctx=4096) as fe:
        fe.responder = lambda body: Reply(content="news")
        run = await anyio.run_process([*cmd, "run", str(path), "-p", "items=", "--url", fe.base_url,
                                       "--trace", str(tmp_path / "t.jsonl")], check=False)
        as_json = await anyio.run_process([*cmd, "run", str(path), "-p", "items=[]", "--url", fe.base_url, "--json",
                                           "--trace", str(tmp_path / "t2.jsonl")], check=False)
    err = run.stderr.decode().replace("\n", " ")
    assert run.returncode == 0, err
    assert "map step 'summaries' over params.items has no items" in err
    row = next(ln for ln in run.stderr.decode().splitlines() if ln.lstrip().startswith("summaries"))
    assert "empty" in row
    data = json.loads(as_json.stdout)
    assert data["steps"]["summaries"]["outcome"] == "empty"
    assert [a["state"] for a in data["agents"]][0] == "empty"

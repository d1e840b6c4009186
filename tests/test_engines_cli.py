"""Several engines from the command line and in a recipe (``squad run --url A --url B``, a
recipe's ``engines:`` list), on fake engines; the trace and the plain live view say which engine
served each call, and show a lost engine and the calls moved off it."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest
from rich.console import Console

from squad.events import CallAdmitted, CallMoved, EngineLoaded, EngineLost
from squad.testing import FakeEngine
from squad.view import LiveView

from cli_support import squad, state  # noqa: F401  (fixture)

RECIPE = """\
name: fan
agents:
  w: {{instructions: "You work.", budget: 512, max_tokens: 8}}
main: w
{engines}flow:
  - id: each
    map: params.items
    agent: w
    prompt: "do {{{{ item }}}}"
params:
  items: {{type: list, default: [a, b, c, d, e, f]}}
"""


@pytest.fixture
def two():
    engines = [FakeEngine(slots=2, n_ctx=4096, token_delay=0.01) for _ in range(2)]
    for fe in engines:
        anyio.run(fe.start)
    yield engines
    for fe in engines:
        anyio.run(fe.stop)


def write(tmp_path: Path, engines: str = "") -> Path:
    path = tmp_path / "fan.yaml"
    path.write_text(RECIPE.format(engines=engines), encoding="utf-8")
    return path


def test_run_with_two_urls_spreads_the_map_and_the_trace_names_each_engine(capsys, tmp_path, state, two):  # noqa: F811
    trace = tmp_path / "t.jsonl"
    a, b = two
    code, out, err = squad(capsys, "run", write(tmp_path), "--url", a.base_url, "--url", b.base_url, "-q",
                           "--trace", trace)
    assert code == 0, err
    assert a.requests and b.requests and len(a.requests) + len(b.requests) == 6
    records = [json.loads(line) for line in trace.read_text().splitlines()]
    assert {r["engine"] for r in records if r["kind"] == "call.finished"} == {a.base_url, b.base_url}
    code, out, err = squad(capsys, "trace", "show", trace, "--calls")
    assert code == 0, err
    assert "engine" in out and a.base_url.split("://")[1] in out and b.base_url.split("://")[1] in out


def test_a_recipe_engines_list_attaches_to_each(capsys, tmp_path, state, two):  # noqa: F811
    a, b = two
    path = write(tmp_path, f"engines:\n  - {a.base_url}\n  - url: {b.base_url}\n")
    code, out, err = squad(capsys, "run", path, "--json")
    assert code == 0, err
    assert a.requests and b.requests
    assert json.loads(out)["engine"]["base_url"] == f"{a.base_url}, {b.base_url}"


def test_url_with_launch_options_is_refused_for_every_url(capsys, tmp_path, state, two):  # noqa: F811
    a, b = two
    code, out, err = squad(capsys, "run", write(tmp_path), "--url", a.base_url, "--url", b.base_url, "--threads", "1")
    assert code == 2 and "--threads" in err and "Traceback" not in err
    assert not a.requests and not b.requests


def test_the_plain_view_shows_each_engine_a_loss_and_a_moved_call() -> None:
    console = Console(record=True, width=200)
    view = LiveView(console=console, live=False)
    with view:
        for url in ("http://127.0.0.1:1", "http://127.0.0.1:2"):
            view(EngineLoaded(slots=2, n_ctx=1024, pool=2048, base_url=url, engine=url))
        view(CallAdmitted(agent="w", conversation="w#1", call="c1", engine="http://127.0.0.1:1", tokens=40, slot=0,
                          in_flight=1))
        view(EngineLost(engine="http://127.0.0.1:1", reason="engine exited (signal 9 SIGKILL)", remaining=1))
        view(CallMoved(agent="w", conversation="w#1", call="c1", engine="http://127.0.0.1:1",
                       to_engine="http://127.0.0.1:2", rerun=True))
    text = console.export_text()
    assert "admitted on 127.0.0.1:1" in text
    assert "engine 127.0.0.1:1 lost: engine exited (signal 9 SIGKILL); 1 engine(s) left" in text
    assert "call c1 re-run from its start on 127.0.0.1:2: engine 127.0.0.1:1 was lost" in text
    state = view.state
    assert state.several and state.slots == 2 and "127.0.0.1:1 lost" in state.status_line()

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
        view(CallMoved(agent="w", conversation="w#2", call="c2", engine="http://127.0.0.1:1",
                       to_engine="http://127.0.0.1:2", rerun=False))
    text = console.export_text()
    assert "admitted on 127.0.0.1:1" in text
    assert "engine 127.0.0.1:1 lost: engine exited (signal 9 SIGKILL); 1 engine(s) left" in text
    assert "call c1 moved to 127.0.0.1:2 and re-run from its start (from 127.0.0.1:1, which was lost)" in text
    assert "call c2 moved to 127.0.0.1:2 (from 127.0.0.1:1, which was lost)" in text
    state = view.state
    assert state.several and state.slots == 2 and "127.0.0.1:1 lost" in state.status_line()


def test_one_engine_given_twice_is_refused_on_the_command_line_and_in_a_recipe(capsys, tmp_path, state, two):  # noqa: F811
    a, _ = two
    port = a.base_url.rsplit(":", 1)[1]
    for second in (a.base_url, f"http://localhost:{port}/", f"http://127.0.0.1:{port}/v1"):
        code, out, err = squad(capsys, "run", write(tmp_path), "--url", a.base_url, "--url", second)
        assert code == 2 and "engine URL given twice: " in err and "Traceback" not in err, err
        assert not a.requests
    path = write(tmp_path, f"engines:\n  - {a.base_url}\n  - url: http://localhost:{port}\n")
    for command in (["recipes", "validate"], ["run"], ["plan"]):
        code, out, err = squad(capsys, *command, path)
        assert code == 2 and f"{path}:7:5" in "".join(err.split()) and "(first on line 6)" in err, err
    assert not a.requests


@pytest.mark.parametrize(("option", "key"), [
    (["--slots", "2"], "slots"), (["--ctx", "4096"], "ctx"), (["--threads", "1"], "threads"),
    (["--ctk", "q8_0"], "cache_type"), (["--gpu-layers", "0"], "gpu_layers"),
])
def test_an_option_each_engine_of_an_engines_list_sets_for_itself_is_refused(capsys, tmp_path, state, two, option, key):  # noqa: F811
    a, b = two
    path = write(tmp_path, f"engines:\n  - {a.base_url}\n  - {{threads: 1}}\n")
    for command in ("run", "plan") if option[0] != "--threads" else ("run",):  # squad plan has no --threads
        code, out, err = squad(capsys, command, path, *option)
        assert code == 2 and "Traceback" not in err, err
        assert f"{option[0]}: the recipe lists its engines" in err and f"set {key} per engine" in err
    assert not a.requests


def test_model_and_launch_options_with_an_engines_list(capsys, tmp_path, state, two):  # noqa: F811
    from squad.cli._app import recipe_engine_specs
    from squad.recipes import load_recipe

    a, b = two
    urls = write(tmp_path, f"engines:\n  - {a.base_url}\n  - {b.base_url}\n")
    for option in (["--model", "smollm2-135m"], ["--load-timeout", "5"], ["--llama-server", tmp_path / "ls"]):
        code, out, err = squad(capsys, "run", urls, *option)
        assert code == 2 and "every engine in the recipe's engines: list is at a URL" in err, err
    named = write(tmp_path, f"engines:\n  - {a.base_url}\n  - {{model: smollm2-135m}}\n")
    code, out, err = squad(capsys, "run", named, "--model", "smollm2-135m")
    assert code == 2 and "item 2 of the recipe's engines: list names its own model" in err, err
    assert not a.requests and not b.requests
    mixed = load_recipe(write(tmp_path, f"engines:\n  - {a.base_url}\n  - {{threads: 1}}\n  - {{slots: 2}}\n"),
                        model="smollm2-135m")
    specs = recipe_engine_specs(mixed, model="smollm2-135m", binary=tmp_path / "ls", load_timeout=5.0,
                                slots=None, ctx=None)
    assert specs[0].url == a.base_url and specs[0].binary is None and specs[0].load_timeout != 5.0
    assert [(s.model, s.binary, s.load_timeout) for s in specs[1:]] == [("smollm2-135m", str(tmp_path / "ls"), 5.0)] * 2
    assert (specs[1].threads, specs[2].slots) == (1, 2)  # each item's own settings kept

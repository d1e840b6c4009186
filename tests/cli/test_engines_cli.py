"""Several engines from the command line and in a recipe (``squad run --url A --url B``, a
recipe's ``engines:`` list), on fake engines; the trace and the plain live view say which engine
served each call, and show a lost engine and the calls moved off it."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest
from rich.console import Console

from cli_support import squad, state  # noqa: F401  (fixture)
from squad.events import CallAdmitted, CallMoved, EngineLoaded, EngineLost
from squad.events.view import LiveView
from squad.testing import FakeEngine

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


def test_run_with_two_urls_spreads_the_map_and_the_trace_names_each_engine(capsys, tmp_path, state, two):
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


def test_a_recipe_engines_list_attaches_to_each(capsys, tmp_path, state, two):
    a, b = two
    path = write(tmp_path, f"engines:\n  - {a.base_url}\n  - url: {b.base_url}\n")
    code, out, err = squad(capsys, "run", path, "--json")
    assert code == 0, err
    assert a.requests and b.requests
    assert json.loads(out)["engine"]["base_url"] == f"{a.base_url}, {b.base_url}"


def test_url_with_launch_options_is_refused_for_every_url(capsys, tmp_path, state, two):
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


def test_one_engine_given_twice_is_refused_on_the_command_line_and_in_a_recipe(capsys, tmp_path, state, two):
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
def test_an_option_each_engine_of_an_engines_list_sets_for_itself_is_refused(capsys, tmp_path, state, two, option, key):
    a, b = two
    path = write(tmp_path, f"engines:\n  - {a.base_url}\n  - {{threads: 1}}\n")
    for command in ("run", "plan") if option[0] != "--threads" else ("run",):  # squad plan has no --threads
        code, out, err = squad(capsys, command, path, *option)
        assert code == 2 and "Traceback" not in err, err
        assert f"{option[0]}: the recipe lists its engines" in err and f"set {key} per engine" in err
    assert not a.requests


def test_model_and_launch_options_with_an_engines_list(capsys, tmp_path, state, two):
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


def run_losing_one(capsys, tmp_path: Path, *options: object) -> tuple[int, str, str, FakeEngine, FakeEngine]:
    """``squad run`` of the fan recipe on two fake engines; the first is stopped while it streams."""
    import threading
    import time

    a, b = FakeEngine(slots=1, n_ctx=4096, token_delay=0.05), FakeEngine(slots=1, n_ctx=4096, token_delay=0.01)
    for fe in (a, b):
        anyio.run(fe.start)

    def stop_a_while_it_streams() -> None:
        deadline = time.monotonic() + 20
        while not a.processing and time.monotonic() < deadline:
            time.sleep(0.005)
        time.sleep(0.1)
        anyio.run(a.stop)

    stopper = threading.Thread(target=stop_a_while_it_streams)
    stopper.start()
    try:
        code, out, err = squad(capsys, "run", write(tmp_path), "--url", a.base_url, "--url", b.base_url, *options)
    finally:
        stopper.join()
        anyio.run(b.stop)
    return code, out, err, a, b


def test_the_run_summary_says_which_engine_was_lost_and_which_served_each_agent(capsys, tmp_path, state):
    code, out, err, a, b = run_losing_one(capsys, tmp_path)
    assert code == 0, err
    text = " ".join(err.split())
    assert f"engine {a.base_url} lost at " in text and "s: " in text
    assert f"engine {b.base_url} (the one left): 1 slots" in text
    port_a, port_b = a.base_url.rsplit(":", 1)[1], b.base_url.rsplit(":", 1)[1]
    rows = [line for line in err.splitlines() if line.startswith(" each ")]
    assert len(rows) == 6 and all(f":{port_b}" in line or f":{port_a}" in line for line in rows)


def test_the_run_json_lists_the_engines_lost_and_each_rows_engine(capsys, tmp_path, state):
    code, out, err, a, b = run_losing_one(capsys, tmp_path, "--json")
    assert code == 0, err
    data = json.loads(out)
    [lost] = data["engines_lost"]
    assert lost["engine"] == a.base_url and lost["t"] > 0 and lost["reason"]
    assert {row["engine"] for row in data["agents"]} <= {a.base_url, b.base_url}
    assert len(data["agents"]) == 6 and all(row["outcome"] in ("ok", "truncated") for row in data["agents"])


@pytest.mark.parametrize(("urls", "labels"), [
    (["http://127.0.0.1:18401", "http://127.0.0.1:18402"], [":18401", ":18402"]),
    (["http://10.0.0.5:18401", "http://10.0.0.6:18401"], ["e1", "e2"]),
    (["http://127.0.0.1:18401", "https://127.0.0.1:18402"], ["e1", "e2"]),
    (["http://127.0.0.1:18401/a", "http://127.0.0.1:18402/b"], ["e1", "e2"]),
])
def test_engine_labels_are_ports_on_one_host_else_numbered(urls, labels) -> None:
    from squad.events.summary import engine_labels, engine_legend

    assert list(engine_labels([*urls, urls[0], None]).values()) == labels
    legend = engine_legend(engine_labels(urls))
    assert (legend is None) == labels[0].startswith(":")
    if legend:
        assert legend == f"engines: e1 = {urls[0].split('://')[1]}, e2 = {urls[1].split('://')[1]}"


@pytest.mark.parametrize("host", ["127.0.0.1", "10.0.0.5"])
def test_trace_show_at_80_columns_never_cuts_an_engine(capsys, tmp_path, monkeypatch, host):
    """The engine column shows ``:PORT`` (one host) or ``e1``/``e2`` with a legend, whole."""
    from squad.cli._app import console
    from squad.events import AgentFinished, AgentStarted, CallFinished
    from squad.events.jsonl import JsonlTrace

    monkeypatch.setattr(console, "_width", 80)  # restored to None after (setting .width would stay)
    a, b = f"http://{host}:18401", f"http://{host.replace('5', '6')}:18402"
    path = tmp_path / "t.jsonl"
    with JsonlTrace(path) as trace:
        for url in (a, b):
            trace(EngineLoaded(slots=2, n_ctx=1024, pool=2048, base_url=url, engine=url))
        for i, url in enumerate((a, b, b)):
            ids = dict(agent=f"worker-with-a-long-name-{i}", conversation=f"c#{i}")
            trace(AgentStarted(**ids))
            trace(CallAdmitted(**ids, call=f"c{i}", engine=url, tokens=40, slot=0, in_flight=1))
            trace(CallFinished(**ids, call=f"c{i}", engine=url, finish_reason="stop", prompt_tokens=30,
                               completion_tokens=10, slot=0))
            trace(AgentFinished(**ids))
    code, out, err = squad(capsys, "trace", "show", path, "--calls")
    assert code == 0, err
    rows = [line for line in out.splitlines() if "c#" in line or "worker-" in line]
    want = {a: ":18401", b: ":18402"} if host == "127.0.0.1" else {a: "e1", b: "e2"}
    assert len(rows) == 6 and all(want[a] in r or want[b] in r for r in rows), out
    if host != "127.0.0.1":
        assert "engines: e1 = 10.0.0.5:18401, e2 = 10.0.0.6:18402" in out

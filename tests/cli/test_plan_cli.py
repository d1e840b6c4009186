"""``squad plan`` end to end on the real default model's GGUF facts (no engine started)."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from cli_support import squad
from launch_support import THREADS
from squad.engine.process import stop_pid

RECIPE = textwrap.dedent("""\
    name: code-review
    params:
      diff: {type: string, required: true}
      files: {type: list, default: [a.py, b.py, c.py, d.py, e.py]}
    agents:
      lead: {budget: 4096, instructions: "You lead the review.", agents: [security, style, tests]}
      security: {budget: 4096, instructions: "Security review."}
      style: {budget: 4096, instructions: "Style review."}
      tests: {budget: 4096, instructions: "Test review."}
      fixer: {budget: 2048, instructions: "Fix."}
    main: lead
    flow:
      - id: review
        prompt: "@security @style @tests review {{ params.diff }}"
      - id: fixes
        map: params.files
        agent: fixer
        concurrency: 3
        prompt: "fix {{ item }}"
    """)


@pytest.fixture
def model(default_model_path):
    return str(default_model_path)


@pytest.fixture(autouse=True)
def _memory(monkeypatch):
    monkeypatch.setenv("SQUAD_KV_MEMORY", "4GiB")


run = squad  # the in-process CLI runner (tests/cli_support.py)


def run_json(capsys, *argv: str) -> dict:
    code, out, err = run(capsys, *argv, "--json")
    assert code == 0, err
    return json.loads(out)


def test_quick_agents_four_at_once(capsys, model):
    data = run_json(capsys, "plan", "--agents", "lead:4096,security:4096,style:4096,tests:4096", "--parallel",
                    "--model", model)
    assert (data["slots"], data["n_ctx"], data["kv_unified"]) == (4, 16384, True)
    assert data["kv_bytes"] == 16384 * 23040 and data["n_ctx_train"] == 8192
    assert data["memory_for_kv"] == 4 * 2**30
    assert "-c 16384 -np 4 --kv-unified" in data["command"]


def test_quick_agents_sequence_needs_one_slot(capsys, model):
    data = run_json(capsys, "plan", "--agents", "a:1000,b:3000", "--model", model)
    assert (data["slots"], data["n_ctx"]) == (1, 3072)


def test_memory_too_small_cuts_and_warns(capsys, model, monkeypatch):
    monkeypatch.setenv("SQUAD_KV_MEMORY", "200MiB")
    data = run_json(capsys, "plan", "--agents", "a:4096,b:4096,c:4096,d:4096", "--parallel", "--model", model)
    assert (data["slots"], data["n_ctx"]) == (2, 8960)
    assert "-ctk q8_0 -ctv q8_0" in data["warnings"][0]


def test_pins_ctx_rounding_and_cache_type(capsys, model):
    data = run_json(capsys, "plan", "--agents", "a:500", "--model", model, "--slots", "1", "--ctx", "1000", "--ctk",
                    "q8_0")
    assert (data["slots"], data["n_ctx"], data["requested_ctx"]) == (1, 1024, 1000)
    at = data["server_args"].index("-ctk")
    assert data["server_args"][at:at + 4] == ["-ctk", "q8_0", "-ctv", "q8_0"]
    assert data["kv_bytes"] == 1024 * 12240 and data["warnings"] == []


def test_recipe_plan_text(capsys, model, tmp_path):
    path = tmp_path / "review.yaml"
    path.write_text(RECIPE)
    code, out, err = run(capsys, "plan", str(path), "-p", "diff=x", "--model", model)
    assert code == 0, err
    assert "lead waiting" in out and "×3" in out
    peak = "slots 4 = peak concurrency at step 1 (review) › lead waiting: lead, security, style, tests"
    assert peak in " ".join(out.split())
    assert "--kv-unified" in out and "<PORT>" in out


def test_recipe_plan_json_and_engine_pins(capsys, model, tmp_path):
    path = tmp_path / "review.yaml"
    path.write_text(RECIPE)
    data = run_json(capsys, "plan", str(path), "-p", "diff=x", "--model", model)
    assert (data["slots"], data["n_ctx"]) == (4, 16384)
    assert [len(s["agents"]) for s in data["timeline"]] == [1, 4, 1, 3]
    path.write_text(RECIPE.replace("main: lead", "main: lead\nengine: {slots: 1}"))
    data = run_json(capsys, "plan", str(path), "-p", "diff=x", "--model", model)
    assert data["slots"] == 1 and any("serialized" in w for w in data["warnings"])
    data = run_json(capsys, "plan", str(path), "-p", "diff=x", "--model", model, "--slots", "3")
    assert data["slots"] == 3  # the command line wins over the recipe


@pytest.mark.parametrize("argv, text", [
    (["--agents", "a:4096", "RECIPE"], "not both"),
    ([], "give a recipe file"),
    (["--agents", "a:lots"], "NAME:BUDGET"),
    (["--agents", "a:40000"], "above the model's training context"),
    (["--agents", "a:100", "--slots", "9"], "9 is not in 1..8 (or auto)"),
    (["--agents", "a:100", "--ctk", "q9"], "q9"),
    (["--agents", "a:100", "--backend", "gpu"], "--backend"),
    (["RECIPE", "-p", "novalue"], "NAME=VALUE"),
])
def test_user_mistakes_exit_2_without_traceback(capsys, model, tmp_path, argv, text):
    path = tmp_path / "review.yaml"
    path.write_text(RECIPE)
    argv = [str(path) if a == "RECIPE" else a for a in argv]
    code, out, err = run(capsys, "plan", *argv, "--model", model)
    assert code == 2
    assert text in " ".join(err.split()) and "Traceback" not in err


RECIPES = Path(__file__).resolve().parents[2] / "recipes"
SHIPPED = {  # the plans the shipped recipes document in their header comments
    "summarize.yaml": (3, 768),
    "review.yaml": (3, 1024),
    "mentions.yaml": (3, 1024),
}


@pytest.mark.parametrize("name", sorted(p.name for p in RECIPES.glob("*.yaml")))
def test_every_shipped_recipe_plans(capsys, model, name):
    data = run_json(capsys, "plan", str(RECIPES / name), "--model", model)
    peak = max(len(s["agents"]) for s in data["timeline"])
    assert data["slots"] == min(peak, 8) and data["n_ctx"] % 256 == 0
    if name in SHIPPED:
        assert (data["slots"], data["n_ctx"]) == SHIPPED[name]


@pytest.mark.engine
def test_attached_engine_smaller_than_the_plan_warns(capsys, model, llama_server_path, tmp_path):
    import socket
    import subprocess
    import time

    import httpx

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = (tmp_path / "engine.log").open("w")
    proc = subprocess.Popen([str(llama_server_path), "-m", model, "-c", "2048", "-np", "2", "--kv-unified",
                             "--host", "127.0.0.1", "--port", str(port), "-t", str(THREADS)], stdout=log,
                            stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        data = run_json(capsys, "plan", str(RECIPES / "review.yaml"), "--model", model,
                        "--backend", "attached", "--url", f"http://127.0.0.1:{port}")
    finally:
        stop_pid(proc.pid, grace=20)
        proc.wait()
        log.close()
    assert (data["slots"], data["n_ctx"], data["command"]) == (3, 1024, None)
    assert any("2 slot(s)" in w for w in data["warnings"])


def test_plan_of_a_recipe_with_several_engines_shows_each_with_its_memory_share(capsys, tmp_path, model):
    """squad.chat.routing' rule: each launched engine planned for the whole workload with 1/N of the KV memory."""
    path = tmp_path / "two.yaml"
    path.write_text(RECIPE.replace("main: lead\n", f"main: lead\nmodel: {model}\nengines:\n"
                                   "  - http://127.0.0.1:9\n  - {threads: 1}\n  - {threads: 1, slots: 2}\n"))
    code, out, err = squad(capsys, "plan", path, "-p", "diff=x", "--json")
    assert code == 0, err
    engines = json.loads(out)["engines"]
    assert [e.get("url") for e in engines] == ["http://127.0.0.1:9", None, None]
    assert [e.get("share") for e in engines[1:]] == [0.5, 0.5] and engines[2]["slots"] == 2
    code, out, err = squad(capsys, "plan", path, "-p", "diff=x")
    assert code == 0, err
    assert "engine 2 of 3: launched" in out and "50% of" in out


def test_a_call_that_can_never_fit_says_so_and_what_to_change(capsys, model, tmp_path):
    """Issue 19: a step whose counted prompt + max_tokens is above what one request may hold
    is not "some wait"; a max_tokens that fills the recipe's own pinned ctx is a recipe error."""
    path = tmp_path / "r.yaml"
    path.write_text("name: r\nagents:\n  a: {instructions: You write., max_tokens: 250}\nmain: a\n"
                    "flow:\n  - id: story\n    prompt: Write a long story about a river and a town.\n")
    data = run_json(capsys, "plan", str(path), "--model", model, "--ctx", "256")
    [step] = [w for w in data["warnings"] if w.startswith("step 'story'")]
    assert "can never fit" in step and "lower max_tokens of agent 'a'" in step and "--ctx" in step
    assert not any("some wait" in w for w in data["warnings"])
    path.write_text(path.read_text().replace("main: a\n", "main: a\nengine: {ctx: 256}\n").replace("250", "300"))
    code, _, err = run(capsys, "plan", str(path), "--model", model)
    assert code == 2 and "r.yaml:3" in err and "no call of agent 'a' can ever fit" in err
    data = run_json(capsys, "plan", str(path), "--model", model, "--ctx", "1024")  # --ctx replaces the pin
    assert data["n_ctx"] == 1024

"""Showing a plan: the rich view and the JSON view carry the same facts."""

import json
from pathlib import Path

from rich.console import Console

from squad.cli.planview import command_line, plan_json, render_plan
from squad.sched.planner import plan
from squad.sched.workload import Call, Map, Parallel, Sequence

MODEL = Path("/models/my model.gguf")
REVIEW = Sequence((
    Call("lead", 4096),
    Parallel((Call("lead", 4096), Call("security", 4096), Call("style", 4096), Call("tests", 4096)), label="review"),
    Map(Call("fix", 2048), count=5, limit=3),
))


def show(p, width=200) -> str:
    console = Console(width=width, record=True, color_system=None)
    render_plan(p, console)
    return console.export_text()


def test_render_shows_timeline_numbers_reasons_and_command():
    p = plan(REVIEW, model=MODEL, n_ctx_train=8192, kv_bytes_per_token=23040, memory_for_kv=1 << 30)
    out = show(p)
    assert "step 2 (review)" in out and "lead, security, style, tests" in out
    assert "step 3 › ×3" in out and "fix, fix, fix" in out
    assert "slots        4" in out and "16,384 tokens" in out
    assert "360.0 MiB at f16/f16 of 1,024.0 MiB available (35%)" in out
    assert "host prompt cache (--cache-ram) 664 MiB more" in out  # what the 1,024 MiB leave beside the pool
    assert "slots 4 = peak concurrency at step 2 (review): lead, security, style, tests" in out
    assert ("LLAMA_API_KEY=<KEY> llama-server -m '/models/my model.gguf' -c 16384 -np 4 --kv-unified "
            "--cache-ram 664 --host 127.0.0.1 --port <PORT> --metrics") in out


def test_render_rounding_and_warnings():
    p = plan(Parallel((Call("a", 1000), Call("b", 400))), model=MODEL, pin_slots=1)
    out = show(p)
    assert "1,024 tokens (requested 1,000, rounded up to a multiple of 256)" in out
    assert "warnings" in out and "serialized" in out
    assert "size unknown" in out


def test_render_nothing_to_plan():
    out = show(plan(None, model=MODEL))
    assert "nothing to plan" in out and "8,192 tokens" in out


def test_mlx_and_attached_have_no_command():
    assert command_line(plan(Call("a", 100), model=MODEL, backend="mlx")) is None
    assert "engine command" not in show(plan(Call("a", 100), model=MODEL, backend="attached"))


def test_json_round_trips_and_matches():
    p = plan(REVIEW, model=MODEL, n_ctx_train=8192, kv_bytes_per_token=23040, memory_for_kv=200 << 20)
    data = json.loads(json.dumps(plan_json(p)))
    assert (data["slots"], data["n_ctx"], data["requested_ctx"]) == (p.slots, p.n_ctx, 16384)
    assert data["kv_bytes"] == p.n_ctx * 23040 and data["memory_for_kv"] == 200 << 20
    assert [s["label"] for s in data["timeline"]] == ["step 1", "step 2 (review)", "step 3 › ×3"]
    assert data["timeline"][1]["budget"] == 16384
    assert data["server_args"] == p.server_args()
    assert data["warnings"] and "--port <PORT>" in data["command"]


def test_json_unbounded_stage():
    data = plan_json(plan(Map(Call("item", 1000)), model=MODEL))
    assert data["peak"] == -1 and data["slots"] == 8
    assert data["timeline"][0]["unbounded"] == [{"agent": "item", "budget": 1000}]

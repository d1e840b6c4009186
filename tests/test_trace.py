"""Traces: JSONL writing (JSON-safe, flushed per line), loading, summarizing, the CLI."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from typer.testing import CliRunner

from squad.cli import app
from squad.errors import ContextExceeded, UserError
from squad.trace import Event, JsonlTrace, default_trace_path, jsonable, load_trace, summarize


@dataclass
class Timings:
    queued_s: float
    ttft_s: float
    total_s: float
    tokens_per_s: float


def run_events(t0: float = 100.0) -> list[Event]:
    """Three agents on a 2-slot engine: a and b run, b fails mid-stream, c waits for a slot."""
    e = lambda kind, agent=None, t=0.0, **data: Event(kind, agent, data, t=t0 + t)  # noqa: E731
    return [
        e("engine.loaded", info={"slots": 2, "n_ctx": 4096, "pool": 4096, "model_path": Path("/m.gguf")}),
        e("agent.started", "a", 0.1), e("call.queued", "a", 0.1, tokens=300, position=1),
        e("agent.started", "b", 0.1), e("call.queued", "b", 0.1, tokens=300, position=2),
        e("agent.started", "c", 0.1), e("call.queued", "c", 0.1, tokens=300, position=3),
        e("call.admitted", "a", 0.1, reserved=300, in_flight=1, pool_used=300),
        e("call.admitted", "b", 0.1, reserved=300, in_flight=2, pool_used=600),
        e("call.first_token", "a", 0.5), e("call.first_token", "b", 0.6),
        e("call.finished", "a", 1.0, usage={"prompt_tokens": 20, "completion_tokens": 40},
          timings=Timings(0.0, 0.4, 0.9, 80.0)),
        e("agent.finished", "a", 1.0),
        e("call.admitted", "c", 1.0, reserved=300, in_flight=2, pool_used=600),
        e("call.failed", "b", 1.2, error=ContextExceeded("Context size has been exceeded.", agent="b"), retry=False),
        e("agent.failed", "b", 1.2, error="Context size has been exceeded."),
        e("call.first_token", "c", 1.3),
        e("call.finished", "c", 2.0, usage={"prompt_tokens": 20, "completion_tokens": 60}),
        e("agent.finished", "c", 2.0),
    ]


def write(path: Path, events: list[Event]) -> Path:
    with JsonlTrace(path) as sink:
        for event in events:
            sink(event)
    return path


def test_jsonable_makes_errors_dataclasses_paths_safe():
    out = jsonable({"e": ValueError("bad"), "d": Timings(1, 2, 3, float("nan")), "p": Path("/x"), 1: (1, 2)})
    assert out == {"e": "ValueError: bad", "d": {"queued_s": 1, "ttft_s": 2, "total_s": 3, "tokens_per_s": None},
                   "p": "/x", "1": [1, 2]}
    json.dumps(out)


def test_jsonl_trace_writes_one_flushed_line_per_event(tmp_path):
    path = tmp_path / "sub" / "run.jsonl"
    sink = JsonlTrace(path)
    events = run_events()
    sink(events[0])
    sink(events[1])
    # not closed yet: both lines are already on disk (a crash leaves a readable file)
    lines = path.read_text().splitlines()
    assert len(lines) == 2
    first, second = (json.loads(line) for line in lines)
    assert first["kind"] == "engine.loaded" and first["t"] == 0.0
    assert first["data"]["info"]["model_path"] == "/m.gguf"
    assert second == {"kind": "agent.started", "agent": "a", "t": pytest.approx(0.1), "wall": events[1].wall, "data": {}}
    sink.close()
    sink(events[2])  # after close: dropped, no error
    assert len(path.read_text().splitlines()) == 2


def test_load_trace_round_trip_and_torn_last_line(tmp_path):
    path = write(tmp_path / "run.jsonl", run_events())
    with path.open("a") as f:
        f.write('{"kind": "call.fin')  # the run crashed mid-write
    events = load_trace(path)
    assert len(events) == len(run_events())
    failed = next(e for e in events if e.kind == "call.failed")
    assert failed.data["error"] == "ContextExceeded: Context size has been exceeded."
    assert failed.t == pytest.approx(1.2)


def test_load_trace_bad_input_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="no such trace file"):
        load_trace(tmp_path / "missing.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_text("not json\n{\"kind\": \"x\", \"t\": 0}\n")
    with pytest.raises(UserError, match=r"bad.jsonl:1: not a squad trace event"):
        load_trace(bad)


def test_summarize_agents_calls_slots_and_peak():
    s = summarize(run_events())
    assert list(s.agents) == ["a", "b", "c"]
    a, b, c = s.agents["a"], s.agents["b"], s.agents["c"]
    assert (a.status, b.status, c.status) == ("done", "failed", "done")
    assert c.queued_s == pytest.approx(0.9)
    assert a.ttft_s == pytest.approx(0.4) and a.first_token == pytest.approx(0.5)
    assert (a.prompt_tokens, a.completion_tokens, c.completion_tokens) == (20, 40, 60)
    assert b.errors == ["ContextExceeded: Context size has been exceeded."]
    # c takes the lane a freed, not b's
    assert (a.slots, b.slots, c.slots) == ([0], [1], [0])
    assert s.max_in_flight == 2
    assert s.duration_s == pytest.approx(2.0)
    load = s.engine_loads[0]
    assert (load.slots, load.n_ctx, load.pool) == (2, 4096, 4096)
    json.dumps(s.to_dict())


def test_summarize_matches_concurrent_calls_of_one_agent_by_call_id():
    e = lambda kind, t, call, **d: Event(kind, "map", {"call": call, **d}, t=t)  # noqa: E731
    events = [
        e("call.admitted", 0.0, 1, slot=3), e("call.admitted", 0.1, 2, slot=5),
        e("call.finished", 0.5, 2), e("call.failed", 0.9, 1, error="boom", retry=True),
        e("call.admitted", 1.0, 3), e("call.finished", 1.5, 3),
    ]
    s = summarize(events)
    spans = {span.call: span for span in s.calls}
    assert spans["1"].end == pytest.approx(0.9) and spans["1"].error == "boom" and spans["1"].slot == 3
    assert spans["2"].end == pytest.approx(0.5) and spans["2"].slot == 5
    assert s.agents["map"].calls == 3
    assert s.agents["map"].errors == []  # a retried failure is not the agent's error
    assert s.max_in_flight == 2


def test_summarize_empty_and_unfinished():
    assert summarize([]).agents == {}
    s = summarize([Event("agent.started", "x", t=1.0), Event("call.admitted", "x", {"reserved": 10}, t=1.5)])
    assert s.agents["x"].status == "running"
    assert s.max_in_flight == 1


def test_default_trace_path_is_in_state_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("SQUAD_STATE_DIR", str(tmp_path))
    path = default_trace_path()
    assert path.parent == tmp_path / "traces" and path.parent.is_dir() and path.suffix == ".jsonl"
    assert default_trace_path() != path


runner = CliRunner()


def test_cli_trace_show_table_and_json(tmp_path):
    path = write(tmp_path / "run.jsonl", run_events())
    result = runner.invoke(app, ["trace", "show", str(path)], env={"COLUMNS": "100"})
    assert result.exit_code == 0, result.output
    assert "engine loaded at 0.00s: 2 slots, n_ctx 4096" in result.output
    assert "max calls in flight: 2" in result.output
    assert "b: ContextExceeded: Context size has been exceeded." in result.output
    result = runner.invoke(app, ["trace", "show", str(path), "--json"])
    assert result.exit_code == 0
    data = json.loads(result.output)
    assert data["agents"]["c"]["queued_s"] == pytest.approx(0.9)


def test_cli_trace_show_defaults_to_newest(tmp_path, monkeypatch):
    monkeypatch.setenv("SQUAD_STATE_DIR", str(tmp_path))
    result = runner.invoke(app, ["trace", "show"])
    assert result.exit_code != 0 and "no traces in" in str(result.exception)
    write(tmp_path / "traces" / "run-1.jsonl", run_events())
    result = runner.invoke(app, ["trace", "show"])
    assert result.exit_code == 0 and "run-1.jsonl" in result.output


def test_cli_trace_plot_writes_png(tmp_path):
    pytest.importorskip("matplotlib")
    path = write(tmp_path / "run.jsonl", run_events())
    out = tmp_path / "timeline.png"
    result = runner.invoke(app, ["trace", "plot", str(path), "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_trace_plot_without_matplotlib_says_how_to_install(tmp_path, monkeypatch):
    path = write(tmp_path / "run.jsonl", run_events())
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    result = runner.invoke(app, ["trace", "plot", str(path), "-o", str(tmp_path / "x.png")])
    assert isinstance(result.exception, UserError)
    assert "pip install 'squad[plot]'" in str(result.exception)


def squad_events() -> list[Event]:
    """The shapes the runtime, client and admission really emit: map of one agent over 3
    inputs on 2 slots; the second call dies (no call.finished, only call.released)."""
    e = lambda kind, agent=None, t=0.0, **data: Event(kind, agent, data, t=50.0 + t)  # noqa: E731
    return [
        e("engine.planned", slots=2, n_ctx=2048),
        e("squad.ready", slots=2, pool=2048, base_url="http://127.0.0.1:1", main="w"),
        e("agent.started", "w", 0.0, priority=0), e("agent.started", "w", 0.0), e("agent.started", "w", 0.0),
        e("call.admitted", "w", 0.0, tokens=300, slot=0, queued_s=0.0, in_flight=1, pool_used=300),
        e("call.admitted", "w", 0.0, tokens=300, slot=1, queued_s=0.0, in_flight=2, pool_used=600),
        e("call.queued", "w", 0.0, tokens=300, position=0, in_flight=2, pool_used=600),
        e("call.first_token", "w", 0.3, ttft_s=0.3, slot=1),
        e("call.first_token", "w", 0.4, ttft_s=0.4, slot=0),
        e("call.released", "w", 0.6, tokens=300, slot=1, in_flight=1, pool_used=300),
        e("agent.failed", "w", 0.6, error="TruncatedStream: stream ended without finish_reason"),
        e("call.admitted", "w", 0.6, tokens=300, slot=1, queued_s=0.6, in_flight=2, pool_used=600),
        e("call.finished", "w", 1.0, usage={"prompt_tokens": 10, "completion_tokens": 30}, slot=0),
        e("call.released", "w", 1.0, tokens=300, slot=0, in_flight=1, pool_used=300),
        e("agent.finished", "w", 1.0),
        e("call.first_token", "w", 1.1, slot=1),
        e("call.released", "w", 1.5, tokens=300, slot=1, in_flight=0, pool_used=0),  # the client's real order
        e("call.finished", "w", 1.5, usage={"prompt_tokens": 10, "completion_tokens": 20}, slot=1),
        e("agent.finished", "w", 1.5),
    ]


def test_summarize_real_event_shapes_match_calls_by_slot():
    s = summarize(squad_events())
    assert [(l.slots, l.pool) for l in s.engine_loads] == [(2, 2048)]
    first, second, third = sorted(s.calls, key=lambda c: (c.admitted, c.slot))
    assert (first.slot, first.first_token, first.end, first.error) == (0, pytest.approx(0.4), pytest.approx(1.0), None)
    assert (second.slot, second.end) == (1, pytest.approx(0.6))
    assert second.error == "TruncatedStream: stream ended without finish_reason"
    assert (third.slot, third.queued, third.admitted, third.end) == (1, 0.0, pytest.approx(0.6), pytest.approx(1.5))
    assert third.error is None and third.completion_tokens == 20
    assert third.wait_s == pytest.approx(0.6)
    w = s.agents["w"]
    assert (w.calls, w.completion_tokens, s.max_in_flight) == (3, 50, 2)
    assert w.errors == ["TruncatedStream: stream ended without finish_reason"]


def test_summarize_finished_after_the_freed_slot_was_taken_again():
    """released(slot 1) -> the next call is admitted to slot 1 -> the first call's finished."""
    e = lambda kind, t, **d: Event(kind, "w", d, t=t)  # noqa: E731
    s = summarize([
        e("call.admitted", 0.0, slot=1, tokens=5), e("call.queued", 0.05, tokens=5), e("call.first_token", 0.1, slot=1),
        e("call.released", 1.0, slot=1), e("call.admitted", 1.0, slot=1, tokens=5),
        e("call.finished", 1.0, slot=1, usage={"completion_tokens": 3}),
        e("call.first_token", 1.2, slot=1), e("call.released", 2.0, slot=1),
        e("call.finished", 2.0, slot=1, usage={"completion_tokens": 4}),
    ])
    assert [(c.admitted, c.end, c.error, c.completion_tokens) for c in s.calls] == [
        (0.0, 1.0, None, 3), (1.0, 2.0, None, 4)]

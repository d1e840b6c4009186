"""Traces: JSONL writing (JSON-safe, flushed per line), loading, summarizing by call id, the CLI."""

from __future__ import annotations

import dataclasses
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from typer.testing import CliRunner

from squad.cli import app
from squad.errors import UserError
from squad.events import (
    AgentCancelled,
    AgentFailed,
    AgentFinished,
    AgentStarted,
    CallAdmitted,
    CallFailed,
    CallFinished,
    CallFirstToken,
    CallQueued,
    CallReleased,
    CallRetried,
    EngineLoaded,
    EnginePlanned,
    Event,
    MentionDispatched,
)
from squad.events.jsonl import JsonlTrace, default_trace_path, jsonable, load_trace
from squad.events.summary import summarize

URL = "http://127.0.0.1:8080"
T0 = 100.0
WALL = 1_700_000_000.0
approx = pytest.approx


@dataclass
class Timings:
    queued_s: float
    ttft_s: float
    total_s: float
    tokens_per_s: float


def ev(cls, t, agent=None, call=None, conversation=None, parent=None, **fields):
    """A ``cls`` event at ``T0 + t``, placed as the runtime places it: agent events carry the
    agent and its conversation (``agent#1`` unless given), call and engine events the engine."""
    engine = URL if cls.__name__.startswith(("Call", "Engine")) else None
    if conversation is None and agent is not None:
        conversation = f"{agent}#1"
    return cls(agent=agent, conversation=conversation, parent=parent, call=call, engine=engine,
               t=T0 + t, wall=WALL + t, **fields)


def run_events() -> list[Event]:
    """The lead's @mention runs a, b, c on a 2-slot engine: a and b run, b fails mid-stream,
    c waits for the slot a frees. In the order admission and the client really emit them
    (a call's slot is released just before its call.finished / call.failed)."""
    sub = dict(parent="lead#1")
    return [
        ev(EngineLoaded, 0.0, slots=2, n_ctx=2048, pool=4096, base_url=URL),
        ev(MentionDispatched, 0.05, "lead", agents=["a", "b", "c"]),
        ev(AgentStarted, 0.1, "a", **sub),
        ev(CallAdmitted, 0.1, "a", "c1", **sub, tokens=300, slot=0, in_flight=1, pool_used=300),
        ev(AgentStarted, 0.1, "b", **sub),
        ev(CallAdmitted, 0.1, "b", "c2", **sub, tokens=300, slot=1, in_flight=2, pool_used=600),
        ev(AgentStarted, 0.1, "c", **sub),
        ev(CallQueued, 0.1, "c", "c3", **sub, tokens=300, position=0, in_flight=2, pool_used=600),
        ev(CallFirstToken, 0.5, "a", "c1", **sub, ttft_s=0.4, slot=0),
        ev(CallFirstToken, 0.6, "b", "c2", **sub, ttft_s=0.5, slot=1),
        ev(CallReleased, 1.0, "a", "c1", **sub, tokens=300, slot=0, held_s=0.9, in_flight=1, pool_used=300),
        ev(CallAdmitted, 1.0, "c", "c3", **sub, tokens=300, slot=0, queued_s=0.9, in_flight=2, pool_used=600),
        ev(CallFinished, 1.0, "a", "c1", **sub, finish_reason="stop", prompt_tokens=20, completion_tokens=40,
           ttft_s=0.4, total_s=0.9, tokens_per_s=80.0, slot=0),
        ev(AgentFinished, 1.0, "a", **sub, summary="a: 40 tokens"),
        ev(CallReleased, 1.2, "b", "c2", **sub, tokens=300, slot=1, held_s=1.1, in_flight=1, pool_used=300),
        ev(CallFailed, 1.2, "b", "c2", **sub, error="ContextExceeded", message="Context size has been exceeded."),
        ev(AgentFailed, 1.2, "b", **sub, error="ContextExceeded: Context size has been exceeded."),
        ev(CallFirstToken, 1.3, "c", "c3", **sub, ttft_s=0.3, slot=0),
        ev(CallReleased, 2.0, "c", "c3", **sub, tokens=300, slot=0, held_s=1.0, in_flight=0, pool_used=0),
        ev(CallFinished, 2.0, "c", "c3", **sub, finish_reason="stop", prompt_tokens=20, completion_tokens=60,
           queued_s=0.9, slot=0),
        ev(AgentFinished, 2.0, "c", **sub),
    ]


def write(path: Path, events: list[Event]) -> Path:
    with JsonlTrace(path) as sink:
        for event in events:
            sink(event)
    return path


def relative(event: Event) -> Event:
    """``event`` as load_trace gives it back: ``t`` relative to the first event (T0)."""
    return dataclasses.replace(event, t=round(event.t - T0, 6))


def test_jsonable_makes_errors_dataclasses_paths_safe():
    out = jsonable({"e": ValueError("bad"), "d": Timings(1, 2, 3, float("nan")), "p": Path("/x"), 1: (1, 2)})
    assert out == {"e": "ValueError: bad", "d": {"queued_s": 1, "ttft_s": 2, "total_s": 3, "tokens_per_s": None},
                   "p": "/x", "1": [1, 2]}
    json.dumps(out)


def test_jsonl_trace_writes_one_flushed_line_per_event_with_its_ids(tmp_path):
    path = tmp_path / "sub" / "run.jsonl"
    sink = JsonlTrace(path)
    events = run_events()
    sink(events[0])
    sink(events[3])
    # not closed yet: both lines are already on disk (a crash leaves a readable file)
    lines = path.read_text().splitlines()
    assert len(lines) == 2 and sink.count == 2
    first, second = (json.loads(line) for line in lines)
    assert first == {"kind": "engine.loaded", "t": 0.0, "wall": WALL, "agent": None, "conversation": None,
                     "parent": None, "call": None, "engine": URL, "worker": None,
                     "data": {"slots": 2, "n_ctx": 2048, "pool": 4096, "base_url": URL, "reason": "launched"}}
    assert second == {"kind": "call.admitted", "t": pytest.approx(0.1), "wall": WALL + 0.1, "agent": "a",
                      "conversation": "a#1", "parent": "lead#1", "call": "c1", "engine": URL, "worker": None,
                      "data": {"tokens": 300, "slot": 0, "queued_s": 0.0, "in_flight": 1, "pool_used": 300}}
    sink.close()
    sink(events[4])  # after close: dropped, no error
    assert len(path.read_text().splitlines()) == 2


def test_load_trace_round_trip_unknown_kinds_and_torn_last_line(tmp_path):
    events = run_events()
    path = write(tmp_path / "run.jsonl", events)
    lines = path.read_text().splitlines(keepends=True)
    # a line from another squad version, mid-file: skipped, not an error
    lines.insert(4, json.dumps({"kind": "call.progress", "t": 0.2, "agent": "a", "call": "c1",
                                "data": {"completion_tokens": 3}}) + "\n")
    path.write_text("".join(lines))
    with path.open("a") as f:
        f.write('{"kind": "call.fin')  # the run crashed mid-write
    loaded = load_trace(path)
    assert loaded == [relative(e) for e in events]  # same types, ids, fields, wall; t from the start
    failed = next(e for e in loaded if isinstance(e, CallFailed))
    assert (failed.call, failed.conversation, failed.parent, failed.engine) == ("c2", "b#1", "lead#1", URL)
    assert (failed.error, failed.message, failed.t) == ("ContextExceeded", "Context size has been exceeded.", 1.2)


def test_load_trace_drops_fields_it_does_not_know(tmp_path):
    path = tmp_path / "newer.jsonl"
    path.write_text(json.dumps({"kind": "engine.loaded", "t": 0, "wall": WALL, "engine": URL,
                                "data": {"slots": 2, "n_ctx": 2048, "pool": 4096, "model_path": "/m.gguf"}}) + "\n")
    (event,) = load_trace(path)
    assert event == EngineLoaded(engine=URL, slots=2, n_ctx=2048, pool=4096, t=0.0, wall=WALL)


def test_load_trace_bad_input_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="no such trace file"):
        load_trace(tmp_path / "missing.jsonl")
    with pytest.raises(UserError, match="not a squad trace"):
        load_trace(tmp_path)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('not json\n{"kind": "x", "t": 0}\n')
    with pytest.raises(UserError, match=r"bad.jsonl:1: not a squad trace event"):
        load_trace(bad)
    # a known kind without its fields, or without "t", is not an event either (when not the last line)
    ok = json.dumps({"kind": "agent.started", "t": 0, "agent": "a"})
    bad.write_text(ok + "\n" + json.dumps({"kind": "call.admitted", "t": 1, "data": {}}) + "\n" + ok + "\n")
    with pytest.raises(UserError, match=r"bad.jsonl:2: not a squad trace event"):
        load_trace(bad)
    bad.write_text(ok + "\n" + json.dumps({"kind": "agent.started", "agent": "b"}) + "\n" + ok + "\n")
    with pytest.raises(UserError, match=r"bad.jsonl:2: not a squad trace event"):
        load_trace(bad)


def test_summarize_agents_calls_slots_and_peak():
    s = summarize(run_events())
    assert list(s.agents) == ["a", "b", "c"]  # the lead only dispatched: no row of its own
    a, b, c = s.agents["a"], s.agents["b"], s.agents["c"]
    assert (a.status, b.status, c.status) == ("done", "failed", "done")
    assert (a.ended, b.ended, c.ended) == (pytest.approx(1.0), pytest.approx(1.2), pytest.approx(2.0))
    assert c.queued_s == pytest.approx(0.9) and a.queued_s == 0.0
    assert a.ttft_s == pytest.approx(0.4) and a.first_token == pytest.approx(0.5)
    assert c.ttft_s == pytest.approx(1.2)  # from entering the queue at 0.1 to its first token at 1.3
    assert (a.prompt_tokens, a.completion_tokens, c.completion_tokens, b.completion_tokens) == (20, 40, 60, 0)
    assert b.errors == ["ContextExceeded: Context size has been exceeded."] and a.errors == c.errors == []
    assert (a.slots, b.slots, c.slots) == ([0], [1], [0])  # c got the slot a freed
    spans = {span.call: span for span in s.calls}
    assert set(spans) == {"c1", "c2", "c3"}
    assert (spans["c2"].conversation, spans["c2"].parent, spans["c2"].end) == ("b#1", "lead#1", pytest.approx(1.2))
    assert spans["c2"].error == "ContextExceeded: Context size has been exceeded."
    assert (spans["c3"].queued, spans["c3"].admitted, spans["c3"].wait_s) == (
        pytest.approx(0.1), pytest.approx(1.0), pytest.approx(0.9))
    assert s.max_in_flight == 2
    assert s.duration_s == pytest.approx(2.0)
    assert s.events == len(run_events())
    load = s.engine_loads[0]
    assert (load.slots, load.n_ctx, load.pool, load.reason, load.engine) == (2, 2048, 4096, "launched", URL)
    json.dumps(s.to_dict())


def test_summarize_matches_calls_by_id_two_calls_back_to_back_on_one_slot():
    """One agent's two calls in a row on slot 0: two spans, each with its own times and tokens,
    however the events of the hand-over interleave (the next call is admitted to the freed slot
    before the first call's call.finished arrives)."""
    events = [
        ev(AgentStarted, 0.0, "w"),
        ev(CallAdmitted, 0.0, "w", "c1", tokens=500, slot=0, in_flight=1, pool_used=500),
        ev(CallFirstToken, 0.2, "w", "c1", ttft_s=0.2, slot=0),
        ev(CallQueued, 0.5, "w", "c2", tokens=700, position=0, in_flight=1, pool_used=500),
        ev(CallReleased, 1.0, "w", "c1", tokens=500, slot=0, in_flight=0, pool_used=0),
        ev(CallAdmitted, 1.0, "w", "c2", tokens=700, slot=0, queued_s=0.5, in_flight=1, pool_used=700),
        ev(CallFinished, 1.0, "w", "c1", finish_reason="tool_calls", prompt_tokens=10, completion_tokens=30, slot=0),
        ev(CallFirstToken, 1.25, "w", "c2", ttft_s=0.25, slot=0),
        ev(CallReleased, 2.0, "w", "c2", tokens=700, slot=0, in_flight=0, pool_used=0),
        ev(CallFinished, 2.0, "w", "c2", finish_reason="stop", prompt_tokens=15, completion_tokens=40, slot=0),
        ev(AgentFinished, 2.0, "w"),
    ]
    s = summarize(events)
    first, second = s.calls
    assert (first.call, first.slot, first.admitted, first.first_token, first.end) == approx(("c1", 0, 0.0, 0.2, 1.0))
    assert (first.prompt_tokens, first.completion_tokens, first.reserved, first.error) == (10, 30, 500, None)
    assert (second.call, second.slot, second.queued, second.admitted, second.first_token, second.end) == approx((
        "c2", 0, 0.5, 1.0, 1.25, 2.0))
    assert (second.prompt_tokens, second.completion_tokens, second.reserved, second.error) == (15, 40, 700, None)
    assert second.wait_s == pytest.approx(0.5)
    w = s.agents["w"]
    assert (w.calls, w.prompt_tokens, w.completion_tokens, w.slots, w.status, w.errors) == (2, 25, 70, [0], "done", [])
    assert (w.first_token, w.ttft_s, w.queued_s) == approx((0.2, 0.2, 0.5))
    assert s.max_in_flight == 1


def test_summarize_concurrent_calls_of_one_agent_and_a_retried_call_is_one_span():
    events = [
        ev(CallAdmitted, 0.0, "map", "c1", tokens=100, slot=3, in_flight=1, pool_used=100),
        ev(CallAdmitted, 0.1, "map", "c2", tokens=100, slot=5, in_flight=2, pool_used=200),
        # c1: the engine was still loading (503); the same call is sent again
        ev(CallReleased, 0.2, "map", "c1", tokens=100, slot=3, in_flight=1, pool_used=100),
        ev(CallRetried, 0.2, "map", "c1", reason="engine loading (503)", attempt=1, error="503"),
        ev(CallReleased, 0.5, "map", "c2", tokens=100, slot=5, in_flight=0, pool_used=0),
        ev(CallFinished, 0.5, "map", "c2", finish_reason="stop", completion_tokens=7),
        ev(CallAdmitted, 0.7, "map", "c1", tokens=100, slot=3, in_flight=1, pool_used=100),
        ev(CallFirstToken, 0.8, "map", "c1", ttft_s=0.1, slot=3),
        ev(CallReleased, 0.9, "map", "c1", tokens=100, slot=3, in_flight=0, pool_used=0),
        ev(CallFinished, 0.9, "map", "c1", finish_reason="stop", attempts=2, completion_tokens=5),
    ]
    s = summarize(events)
    spans = {span.call: span for span in s.calls}
    assert list(spans) == ["c1", "c2"]
    assert (spans["c1"].admitted, spans["c1"].end, spans["c1"].slot, spans["c1"].retried) == approx((0.7, 0.9, 3, True))
    assert (spans["c1"].error, spans["c1"].completion_tokens) == (None, 5)
    assert (spans["c2"].end, spans["c2"].slot, spans["c2"].retried,
            spans["c2"].completion_tokens) == approx((0.5, 5, False, 7))
    m = s.agents["map"]
    assert (m.calls, m.completion_tokens, m.slots, m.errors, m.status) == (2, 12, [3, 5], [], "done")
    assert s.max_in_flight == 2


def test_a_call_released_without_finishing_fails_with_its_conversations_agent_error():
    """A map over 3 inputs: conversation w#1's call dies (no call.finished, only call.released)
    and w#1 fails; w#2's call is released at the same moment and only then reports its end;
    v is cancelled while its call holds a slot. Each error lands on the call of its conversation."""
    error = "TruncatedStream: stream ended without finish_reason"
    events = [
        ev(EnginePlanned, 0.0, slots=3, n_ctx=1024),
        ev(EngineLoaded, 0.0, slots=3, n_ctx=1024, pool=3072, base_url=URL),
        *(ev(AgentStarted, 0.0, "w", conversation=f"w#{i}") for i in (1, 2)),
        ev(AgentStarted, 0.0, "v"),
        ev(CallAdmitted, 0.0, "w", "c1", conversation="w#1", tokens=300, slot=0, in_flight=1, pool_used=300),
        ev(CallAdmitted, 0.0, "w", "c2", conversation="w#2", tokens=300, slot=1, in_flight=2, pool_used=600),
        ev(CallAdmitted, 0.0, "v", "c3", tokens=300, slot=2, in_flight=3, pool_used=900),
        ev(CallFirstToken, 0.3, "w", "c1", conversation="w#1", ttft_s=0.3, slot=0),
        ev(CallFirstToken, 0.4, "w", "c2", conversation="w#2", ttft_s=0.4, slot=1),
        ev(CallReleased, 0.6, "w", "c1", conversation="w#1", tokens=300, slot=0, in_flight=2, pool_used=600),
        ev(CallReleased, 0.6, "w", "c2", conversation="w#2", tokens=300, slot=1, in_flight=1, pool_used=300),
        ev(AgentFailed, 0.6, "w", conversation="w#1", error=error),
        ev(CallFinished, 0.6, "w", "c2", conversation="w#2", finish_reason="stop", completion_tokens=20, slot=1),
        ev(AgentFinished, 0.6, "w", conversation="w#2"),
        ev(CallReleased, 0.8, "v", "c3", tokens=300, slot=2, in_flight=0, pool_used=0),
        ev(AgentCancelled, 0.8, "v", reason="sibling 'w' failed"),
    ]
    s = summarize(events)
    spans = {span.call: span for span in s.calls}
    assert (spans["c1"].end, spans["c1"].error) == approx((0.6, error))
    assert (spans["c2"].end, spans["c2"].error, spans["c2"].completion_tokens) == approx((0.6, None, 20))
    assert (spans["c3"].end, spans["c3"].error) == approx((0.8, "cancelled: sibling 'w' failed"))
    w, v = s.agents["w"], s.agents["v"]
    assert (w.calls, w.completion_tokens, w.errors) == (2, 20, [error])
    assert (v.status, v.reason, v.ended) == approx(("cancelled", "sibling 'w' failed", 0.8))
    assert s.max_in_flight == 3


def test_summarize_empty_and_unfinished():
    assert summarize([]).agents == {}
    s = summarize([ev(AgentStarted, 1.0, "x"),
                   ev(CallAdmitted, 1.5, "x", "c1", tokens=10, slot=0, in_flight=1, pool_used=10)])
    assert s.agents["x"].status == "running" and s.agents["x"].ended is None
    assert s.calls[0].end is None and s.calls[0].error is None
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
    assert f"{len(run_events())} events over 2.00s" in result.output
    assert "engine loaded at 0.00s: 2 slots, n_ctx 2048, pool 4096 tokens" in result.output
    assert "max calls in flight: 2" in result.output
    assert "b: ContextExceeded: Context size has been exceeded." in result.output
    result = runner.invoke(app, ["trace", "show", str(path), "--json"])
    assert result.exit_code == 0
    data = json.loads(result.output)
    assert data["agents"]["c"]["queued_s"] == pytest.approx(0.9)
    assert [(c["call"], c["conversation"], c["parent"]) for c in data["calls"]] == [
        ("c1", "a#1", "lead#1"), ("c2", "b#1", "lead#1"), ("c3", "c#1", "lead#1")]
    result = runner.invoke(app, ["trace", "show", str(path), "--calls"], env={"COLUMNS": "160"})
    assert result.exit_code == 0, result.output
    rows = [line.split() for line in result.output.splitlines() if line.strip().startswith(("c1 ", "c2 ", "c3 "))]
    assert [(r[0], r[1], r[2], r[3]) for r in rows] == [
        ("c1", "a", "a#1", "lead#1"), ("c2", "b", "b#1", "lead#1"), ("c3", "c", "c#1", "lead#1")]


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


def test_a_retried_call_that_still_fails_keeps_its_error_and_its_last_end():
    events = [
        ev(AgentStarted, 0.0, "a"),
        ev(CallAdmitted, 0.0, "a", "c1", tokens=100, slot=0, in_flight=1, pool_used=100),
        ev(CallReleased, 0.1, "a", "c1", tokens=100, slot=0),
        ev(CallRetried, 0.1, "a", "c1", reason="engine loading (503)", attempt=1),
        ev(CallAdmitted, 0.6, "a", "c1", tokens=100, slot=0, in_flight=1, pool_used=100),
        ev(CallReleased, 2.0, "a", "c1", tokens=100, slot=0),
        ev(CallFailed, 2.0, "a", "c1", error="EngineLoadTimeout", message="still loading"),
    ]
    s = summarize(events)
    (span,) = s.calls
    assert span.retried and (span.admitted, span.end) == (approx(0.6), approx(2.0))
    assert s.agents["a"].errors == ["EngineLoadTimeout: still loading"] and s.agents["a"].status == "failed"


def test_one_failed_conversation_of_an_agent_stays_visible():
    events = [ev(AgentStarted, 0.0, "w", conversation="w#1"), ev(AgentStarted, 0.0, "w", conversation="w#2"),
              ev(AgentFailed, 0.5, "w", conversation="w#1", error="boom"),
              ev(AgentFinished, 1.0, "w", conversation="w#2")]
    assert summarize(events).agents["w"].status == "failed"


def test_a_one_line_file_that_is_not_a_trace_is_an_error(tmp_path):
    path = tmp_path / "one.jsonl"
    path.write_text("this is not json\n")
    with pytest.raises(UserError, match="not a squad trace event"):
        load_trace(path)

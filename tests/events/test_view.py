"""The live view: a pure ViewState driven by typed events; plain lines off a terminal; quiet."""

from __future__ import annotations

import io

from rich.console import Console

from squad.events import (
    AgentCancelled,
    AgentFailed,
    AgentFinished,
    AgentStarted,
    AnswerCut,
    CallAdmitted,
    CallFailed,
    CallFinished,
    CallFirstToken,
    CallQueued,
    CallReleased,
    CallRetried,
    EngineLoaded,
    EnginePlanned,
    EngineReplanning,
    EngineWarning,
    Event,
    MentionDispatched,
    ToolCalled,
)
from squad.events.view import LiveView, ViewState, live_view

URL = "http://127.0.0.1:8080"
T0 = 1000.0


def ev(cls, t=0.0, agent=None, call=None, **fields):
    """A ``cls`` event at ``T0 + t``, placed as the runtime places it: agent events carry the
    agent and its conversation, call events also the call id and the engine."""
    engine = URL if cls.__name__.startswith(("Call", "Engine")) else None
    conversation = f"{agent}#1" if agent else None
    return cls(agent=agent, conversation=conversation, call=call, engine=engine, t=T0 + t,
               wall=1.7e9 + t, **fields)


def loaded(slots=2, pool=2048, t=0.0):
    return ev(EngineLoaded, t, slots=slots, n_ctx=pool // slots, pool=pool, base_url=URL)


def test_agent_walks_through_every_state():
    s = ViewState()
    s.apply(loaded(2, 2048))
    assert (s.slots, s.pool) == (2, 2048)
    s.apply(ev(AgentStarted, 0.1, "a"))
    row = s.agents["a"]
    assert row.state == "started"
    s.apply(ev(CallQueued, 0.1, "a", "c1", tokens=500, position=1, in_flight=2, pool_used=1800))
    assert row.state == "waiting" and s.waiting == 1
    assert s.describe(row, T0 + 0.6) == "waiting for a slot #1 0.5s"
    s.apply(ev(CallAdmitted, 0.7, "a", "c1", tokens=500, slot=0, queued_s=0.6, in_flight=1, pool_used=500))
    assert (row.state, s.waiting, s.busy, s.pool_used, row.reserved, row.calls) == ("prefill", 0, 1, 500, 500, 1)
    assert row.queue_position is None
    s.apply(ev(CallFirstToken, 0.9, "a", "c1", ttft_s=0.2, slot=0))
    assert row.state == "generating" and row.ttft_s == 0.2
    assert s.describe(row, T0 + 1.4) == "generating 0.5s"
    # the client's real order: admission releases the slot, then the client reports the end
    s.apply(ev(CallReleased, 1.9, "a", "c1", tokens=500, slot=0, held_s=1.2, in_flight=0, pool_used=0))
    assert (s.busy, s.pool_used, row.reserved, row.in_flight) == (0, 0, 0, 0)
    s.apply(ev(CallFinished, 1.9, "a", "c1", finish_reason="stop", prompt_tokens=20, completion_tokens=50,
               tokens_per_s=50.0, slot=0))
    assert (row.state, row.completion_tokens, row.tokens_per_s) == ("idle", 50, 50.0)
    s.apply(ev(AgentFinished, 2.0, "a", summary="ok"))
    assert row.state == "done"
    assert s.describe(row, T0 + 5000.0) == "done in 1.9s, 50 tok/s"


def test_failures_cancellations_and_retries_show_their_reason():
    s = ViewState()
    s.apply(loaded(4, 4096))
    for i, name in enumerate(("a", "b", "c"), start=1):
        s.apply(ev(AgentStarted, 0.0, name))
        s.apply(ev(CallAdmitted, 0.0, name, f"c{i}", tokens=100, slot=i - 1, in_flight=i, pool_used=100 * i))
    assert (s.busy, s.pool_used) == (3, 300)

    # a: the engine vanished before the first token; the same call is sent again
    s.apply(ev(CallReleased, 1.0, "a", "c1", tokens=100, slot=0, in_flight=2, pool_used=200))
    retried = ev(CallRetried, 1.0, "a", "c1", reason="engine gone before the first token", attempt=1,
                 error="engine at http://127.0.0.1:8080 is not answering")
    s.apply(retried)
    assert s.agents["a"].state == "retrying"
    assert s.line(retried) == "[   1.00s] a              retrying: engine gone before the first token"
    s.apply(ev(CallAdmitted, 1.1, "a", "c1", tokens=100, slot=0, in_flight=3, pool_used=300))
    assert s.agents["a"].state == "prefill" and s.agents["a"].held == {"c1": 100}

    # b: the stream broke; the call and then the agent fail
    s.apply(ev(CallReleased, 1.2, "b", "c2", tokens=100, slot=1, in_flight=2, pool_used=200))
    failed = ev(CallFailed, 1.2, "b", "c2", error="TruncatedStream", message="no finish_reason")
    s.apply(failed)
    assert s.agents["b"].state == "failed"
    assert s.line(failed).endswith("b              call failed: TruncatedStream: no finish_reason")
    s.apply(ev(AgentFailed, 1.2, "b", error="TruncatedStream: no finish_reason"))

    # c: cancelled while its call held a slot: admission releases it, no call.failed
    s.apply(ev(CallReleased, 1.3, "c", "c3", tokens=100, slot=2, in_flight=1, pool_used=100))
    s.apply(ev(AgentCancelled, 1.3, "c", reason="sibling 'b' failed"))

    assert s.describe(s.agents["b"], T0 + 2.0) == "failed: TruncatedStream: no finish_reason"
    assert s.describe(s.agents["c"], T0 + 2.0) == "cancelled: sibling 'b' failed"
    assert (s.agents["b"].in_flight, s.agents["c"].in_flight) == (0, 0)
    s.apply(ev(CallReleased, 1.5, "a", "c1", tokens=100, slot=0, in_flight=0, pool_used=0))
    assert s.busy == 0 and s.pool_used == 0


def test_reported_pool_used_wins_and_status_line():
    s = ViewState()
    s.apply(loaded(4, 4096))
    s.apply(ev(CallAdmitted, 0.0, "a", "c1", tokens=600, slot=0, in_flight=1, pool_used=1024))
    s.apply(ev(CallQueued, 0.1, "b", "c2", tokens=600, position=0, in_flight=1, pool_used=1024))
    assert s.agents["a"].reserved == 600  # its own reservation; the pool figure is admission's
    assert s.status_line() == "slots 1/4 busy ▮▯▯▯ · 1 waiting · pool 1024/4096 tokens reserved (25%)"


def test_calls_of_one_agent_are_held_by_call_id():
    """A map over 3 inputs on 2 slots: each call frees its own reservation, exactly once."""
    s = ViewState()
    s.apply(loaded(2, 2048))
    s.apply(ev(AgentStarted, 0.0, "w"))
    s.apply(ev(CallAdmitted, 0.0, "w", "c1", tokens=300, slot=0, in_flight=1, pool_used=300))
    s.apply(ev(CallAdmitted, 0.0, "w", "c2", tokens=250, slot=1, in_flight=2, pool_used=550))
    s.apply(ev(CallQueued, 0.0, "w", "c3", tokens=200, position=0, in_flight=2, pool_used=550))
    w = s.agents["w"]
    assert (s.busy, s.waiting, s.pool_used, w.reserved, w.state) == (2, 1, 550, 550, "waiting")
    s.apply(ev(CallReleased, 1.0, "w", "c1", tokens=300, slot=0, in_flight=1, pool_used=250))
    s.apply(ev(CallFinished, 1.0, "w", "c1", finish_reason="stop", completion_tokens=30, tokens_per_s=60.0, slot=0))
    assert (s.busy, s.pool_used, w.held) == (1, 250, {"c2": 250})  # c2 untouched, c1 not freed twice
    s.apply(ev(CallAdmitted, 1.0, "w", "c3", tokens=200, slot=0, queued_s=1.0, in_flight=2, pool_used=450))
    assert (s.waiting, w.waiting, w.held) == (0, set(), {"c2": 250, "c3": 200})
    s.apply(ev(CallReleased, 1.1, "w", "c2", tokens=250, slot=1, in_flight=1, pool_used=200))  # died: no finished
    assert (s.busy, s.pool_used, w.held, w.in_flight, w.calls) == (1, 200, {"c3": 200}, 1, 3)
    assert w.completion_tokens == 30


def test_events_the_view_does_not_show_and_a_missing_engine_are_harmless():
    s = ViewState()
    for event in (ev(Event, 0.0, "x"), ev(MentionDispatched, 0.0, "lead", agents=["x"]),
                  ev(ToolCalled, 0.0, "x", tool="grep", ok=True),
                  ev(AnswerCut, 0.0, "x", omitted_tokens=10, room_tokens=5, main="lead"),
                  ev(EngineReplanning, 0.0, from_slots=1, to_slots=2, n_ctx=2048)):
        s.apply(event)
        assert s.line(event) is None
    assert s.slots is None and s.busy == 0
    s.apply(ev(CallAdmitted, 0.1, "x", "c1", tokens=10, slot=0, in_flight=1, pool_used=10))
    assert s.status_line() == "1 calls in flight · 0 waiting"
    Console(file=io.StringIO(), width=80).print(s.render())


def test_plain_lines_when_not_a_terminal():
    out = io.StringIO()
    console = Console(file=out, width=120)  # a StringIO is not a terminal
    with live_view(on=True, console=console) as sink:
        assert sink.live_mode is False
        sink(loaded(2, 2048))
        sink(ev(CallQueued, 0.25, "style", "c1", tokens=300, position=0))
        sink(ev(CallAdmitted, 0.5, "style", "c1", tokens=300, slot=0, in_flight=1, pool_used=300))
        sink(ev(ToolCalled, 0.6, "style", tool="read_file", ok=True))  # not logged
        sink(ev(CallReleased, 0.9, "style", "c1", tokens=300, slot=0, in_flight=0, pool_used=0))  # not logged
        sink(ev(CallFailed, 0.9, "style", "c1", error="CallTimeout", message="no answer"))
        sink(ev(AgentFailed, 1.0, "style", error="boom"))
    lines = out.getvalue().splitlines()
    assert lines[0] == "[   0.00s] -              engine launched: 2 slots, pool 2048 tokens"
    assert lines[1].startswith("[   0.25s] style          waiting for a slot (300 tokens) · ")
    assert "admitted (300 tokens reserved) · slots 1/2 busy" in lines[2]
    assert lines[3] == "[   0.90s] style          call failed: CallTimeout: no answer"
    assert lines[4] == "[   1.00s] style          failed: boom"
    assert len(lines) == 5


def test_quiet_prints_nothing_but_still_tracks_state():
    out = io.StringIO()
    with LiveView(on=False, console=Console(file=out, force_terminal=True)) as sink:
        sink(ev(EnginePlanned, 0.0, slots=1, n_ctx=1024, warnings=["serialized"]))
        sink(ev(EngineWarning, 0.0, warning="no tools section"))
        sink(ev(CallAdmitted, 0.1, "a", "c1", tokens=5, slot=0, in_flight=1, pool_used=5))
    assert out.getvalue() == ""
    assert sink.state.busy == 1 and sink.state.agents["a"].held == {"c1": 5}


def test_live_mode_on_a_terminal_draws_the_table():
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=100)
    with LiveView(on=True, console=console) as sink:
        assert sink.live_mode is True
        sink(loaded(2, 2048))
        sink(ev(CallAdmitted, 0.1, "security", "c1", tokens=300, slot=0, in_flight=1, pool_used=300))
    text = out.getvalue()
    assert "security" in text and "slots 1/2 busy" in text
    assert "[   0.10s]" not in text  # the table, not plain lines


def test_planned_engine_shows_until_it_reports():
    s = ViewState()
    s.apply(ev(EnginePlanned, 0.0, slots=3, n_ctx=3072))
    assert s.status_line() == "starting the engine: 3 slots, context 3072 tokens (planned)"
    s.apply(ev(EngineLoaded, 2.0, slots=3, n_ctx=1024, pool=3072, base_url=URL))
    assert s.status_line() == "slots 0/3 busy ▯▯▯ · 0 waiting · pool 0/3072 tokens reserved (0%)"


def test_planner_and_engine_warnings_are_shown_in_both_modes():
    for live in (False, True):
        out = io.StringIO()
        with LiveView(on=True, console=Console(file=out, width=120), live=live) as view:
            view(ev(EnginePlanned, 0.0, slots=1, n_ctx=1024,
                    warnings=["1 slot(s) but 3 agents run at once: serialized"]))
            view(ev(EngineWarning, 0.1, "a", warning="agent 'a' has tools but the template drops them"))
        text = out.getvalue()
        assert "warning: 1 slot(s) but 3 agents run at once: serialized" in text, live
        assert "warning: agent 'a' has tools but the template drops them" in text, live


def test_a_call_cancelled_or_failed_while_queued_stops_waiting():
    s = ViewState()
    s.apply(ev(EngineLoaded, 0.0, slots=1, n_ctx=1024, pool=1024))
    s.apply(ev(CallQueued, 0.1, "b", "c2", tokens=100, position=0))
    s.apply(ev(CallQueued, 0.1, "c", "c3", tokens=100, position=1))
    assert s.waiting == 2
    s.apply(ev(AgentCancelled, 0.2, "b", reason="sibling 'a' failed"))
    s.apply(ev(CallFailed, 0.2, "c", "c3", error="AdmissionError"))
    assert s.waiting == 0 and "0 waiting" in s.status_line()
    assert s.line(ev(CallFailed, 0.2, "c", "c3", error="AdmissionError")).endswith("call failed: AdmissionError")


def test_a_retried_call_counts_once():
    s = ViewState()
    for t in (0.0, 1.0):
        s.apply(ev(CallAdmitted, t, "a", "c1", tokens=10, slot=0, in_flight=1, pool_used=10))
        s.apply(ev(CallReleased, t + 0.1, "a", "c1", tokens=10, slot=0))
    assert s.agents["a"].calls == 1

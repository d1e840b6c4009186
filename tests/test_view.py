"""The live view: a pure ViewState driven by events; plain lines off a terminal; quiet."""

from __future__ import annotations

import io

from rich.console import Console

from squad.events import Event
from squad.view import LiveView, ViewState, live_view


def ev(kind, agent=None, t=0.0, **data):
    return Event(kind, agent, data, t=1000.0 + t)


def test_agent_walks_through_every_state():
    s = ViewState()
    s.apply(ev("engine.loaded", info={"slots": 2, "n_ctx": 2048, "pool": 2048}))
    assert (s.slots, s.pool) == (2, 2048)
    s.apply(ev("agent.started", "a", 0.1))
    assert s.agents["a"].state == "started"
    s.apply(ev("call.queued", "a", 0.1, tokens=500, position=1))
    assert s.agents["a"].state == "waiting" and s.waiting == 1
    assert s.describe(s.agents["a"], 1000.6) == "waiting for a slot #1 0.5s"
    s.apply(ev("call.admitted", "a", 0.7, reserved=500))
    row = s.agents["a"]
    assert (row.state, s.waiting, s.busy, s.pool_used, row.reserved) == ("prefill", 0, 1, 500, 500)
    s.apply(ev("call.first_token", "a", 0.9))
    assert row.state == "generating"
    assert row.ttft_s == 0.2 or abs(row.ttft_s - 0.2) < 1e-9
    s.apply(ev("call.finished", "a", 1.9, usage={"completion_tokens": 50}, timings={"tokens_per_s": 50.0}))
    assert (row.state, s.busy, s.pool_used, row.completion_tokens) == ("idle", 0, 0, 50)
    s.apply(ev("agent.finished", "a", 2.0))
    assert s.describe(row, 5000.0) == "done in 1.9s, 50 tok/s"


def test_failures_cancellations_and_retries_show_their_reason():
    s = ViewState()
    for name in ("a", "b", "c"):
        s.apply(ev("agent.started", name))
        s.apply(ev("call.admitted", name, reserved=100))
    s.apply(ev("call.failed", "a", 1.0, error="ContextExceeded: Context size has been exceeded.", retry=True))
    assert s.agents["a"].state == "retrying"
    s.apply(ev("call.failed", "b", 1.0, error="TruncatedStream: no finish_reason"))
    s.apply(ev("agent.failed", "b", 1.0, error="TruncatedStream: no finish_reason"))
    s.apply(ev("call.failed", "c", 1.1, error="AgentCancelled: cancelled: sibling 'b' failed"))
    s.apply(ev("agent.cancelled", "c", 1.1, reason="sibling 'b' failed"))
    assert s.describe(s.agents["b"], 2.0) == "failed: TruncatedStream: no finish_reason"
    assert s.describe(s.agents["c"], 2.0) == "cancelled: sibling 'b' failed"
    assert s.busy == 0 and s.pool_used == 0


def test_reported_pool_used_wins_and_status_line():
    s = ViewState()
    s.apply(ev("engine.loaded", slots=4, n_ctx=4096, pool=4096))
    s.apply(ev("call.queued", "a", tokens=600))
    s.apply(ev("call.admitted", "a", reserved=600, pool_used=1024))
    s.apply(ev("call.queued", "b", tokens=600))
    assert s.status_line() == "slots 1/4 busy ▮▯▯▯ · 1 waiting · pool 1024/4096 tokens reserved (25%)"


def test_unknown_events_and_missing_engine_are_harmless():
    s = ViewState()
    s.apply(ev("something.new", "x"))
    s.apply(ev("call.admitted", "x"))
    assert s.status_line() == "1 calls in flight · 0 waiting"
    Console(file=io.StringIO(), width=80).print(s.render())


def test_plain_lines_when_not_a_terminal():
    out = io.StringIO()
    console = Console(file=out, width=120)  # a StringIO is not a terminal
    with live_view(on=True, console=console) as sink:
        assert sink.live_mode is False
        sink(ev("engine.loaded", slots=2, n_ctx=2048, pool=2048))
        sink(ev("call.queued", "style", 0.25, tokens=300))
        sink(ev("call.admitted", "style", 0.5, reserved=300))
        sink(ev("call.progress", "style", 0.6, completion_tokens=3))  # not logged
        sink(ev("agent.failed", "style", 1.0, error="boom"))
    lines = out.getvalue().splitlines()
    assert lines[0] == "[   0.00s] -              engine loaded: 2 slots, pool 2048 tokens"
    assert lines[1].startswith("[   0.25s] style          waiting for a slot (300 tokens)")
    assert "admitted (300 tokens reserved) · slots 1/2 busy" in lines[2]
    assert lines[3] == "[   1.00s] style          failed: boom"
    assert len(lines) == 4


def test_quiet_prints_nothing_but_still_tracks_state():
    out = io.StringIO()
    with LiveView(on=False, console=Console(file=out, force_terminal=True)) as sink:
        sink(ev("call.admitted", "a", reserved=5))
    assert out.getvalue() == ""
    assert sink.state.busy == 1


def test_live_mode_on_a_terminal_draws_the_table():
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=100)
    with LiveView(on=True, console=console) as sink:
        assert sink.live_mode is True
        sink(ev("engine.loaded", slots=2, n_ctx=2048, pool=2048))
        sink(ev("call.admitted", "security", reserved=300))
    text = out.getvalue()
    assert "security" in text and "slots 1/2 busy" in text


def test_runtime_event_shapes_released_frees_the_slot_once():
    """As admission + client + runtime emit them: no call.failed, call.released ends the call."""
    s = ViewState()
    s.apply(ev("squad.ready", slots=2, pool=2048, base_url="http://127.0.0.1:1"))
    assert (s.slots, s.pool) == (2, 2048)
    s.apply(ev("agent.started", "w"))
    s.apply(ev("call.admitted", "w", tokens=300, slot=0, in_flight=1, pool_used=300))
    s.apply(ev("call.admitted", "w", tokens=300, slot=1, in_flight=2, pool_used=600))
    s.apply(ev("call.queued", "w", tokens=300, position=0, in_flight=2, pool_used=600))
    assert (s.busy, s.waiting, s.pool_used, s.agents["w"].reserved) == (2, 1, 600, 600)
    s.apply(ev("call.finished", "w", 1.0, usage={"completion_tokens": 30}, tokens_per_s=60.0, slot=0))
    assert (s.busy, s.pool_used) == (1, 300)
    s.apply(ev("call.released", "w", 1.0, tokens=300, slot=0, in_flight=1, pool_used=300))
    assert (s.busy, s.pool_used) == (1, 300)  # not freed twice
    s.apply(ev("call.released", "w", 1.1, tokens=300, slot=1, in_flight=0, pool_used=0))  # died: no finished
    s.apply(ev("call.admitted", "w", 1.1, tokens=300, slot=0, in_flight=1, pool_used=300))
    assert (s.busy, s.waiting, s.pool_used, s.agents["w"].in_flight) == (1, 0, 300, 1)
    s.apply(ev("call.retried", "w", 1.2, reason="engine loading (503)"))
    assert s.agents["w"].state == "retrying"
    assert s.line(ev("call.retried", "w", 1.2, reason="engine loading (503)")).endswith("retrying: engine loading (503)")


def test_planned_engine_shows_until_it_reports():
    s = ViewState()
    s.apply(ev("engine.planned", slots=3, n_ctx=3072, reasons=[]))
    assert s.status_line() == "starting the engine: 3 slots, context 3072 tokens (planned)"
    s.apply(ev("squad.ready", slots=3, pool=3072))
    assert s.status_line().startswith("slots 0/3 busy")


def test_planner_warnings_are_shown_in_both_modes():
    import io

    from rich.console import Console

    from squad.events import Event
    from squad.view import LiveView

    for live in (False, True):
        out = io.StringIO()
        view = LiveView(on=True, console=Console(file=out, width=120), live=live)
        view(Event("engine.planned", data={"slots": 1, "n_ctx": 1024,
                                           "warnings": ["1 slot(s) but 3 agents run at once: serialized"]}))
        assert "warning: 1 slot(s) but 3 agents run at once" in out.getvalue()

"""Deadlines from the work (issue 19 item 9): the numbers on a fake clock, then the rule end to
end against the fake engine with a slow prefill, slow tokens and a stall."""

from __future__ import annotations

import dataclasses

import anyio
import pytest

from squad.chat import ChatRequest, ChatResult
from squad.chat.client import EngineClient
from squad.chat.deadline import DEFAULT_PREFILL_TPS, Deadlines, EngineDeadlines, EngineSpeed
from squad.engine.launcher import build_args
from squad.engine.llama import LONGEST_CALL_S
from squad.errors import CallTimeout, UserError
from squad.events import Event, Origin
from squad.sched.planner import EnginePlan
from squad.testing import FakeEngine, Reply


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _engine(speed: EngineSpeed | None = None, **policy) -> tuple[EngineDeadlines, Clock]:
    clock = Clock()
    return EngineDeadlines(Deadlines(**policy), speed, clock=clock), clock


# --- the numbers ------------------------------------------------------------------------------


def test_speeds_start_conservative_then_follow_the_engines_timings():
    speed = EngineSpeed()
    assert speed.prefill == DEFAULT_PREFILL_TPS and speed.prefill_samples == 0
    speed.observe({"prompt_n": 3, "prompt_ms": 1.0, "predicted_n": 2, "predicted_ms": 1.0})  # a cached prompt
    assert (speed.prefill_samples, speed.decode_samples) == (0, 0)
    speed.observe({"prompt_n": 300, "prompt_ms": 20_000.0, "predicted_n": 40, "predicted_ms": 10_000.0})
    assert (speed.prefill, speed.decode) == (15.0, 4.0)  # the first sample replaces the default
    speed.observe({"prompt_n": 300, "prompt_ms": 10_000.0, "predicted_n": 40, "predicted_ms": 10_000.0})
    assert speed.prefill == pytest.approx(0.3 * 30 + 0.7 * 15)  # an EWMA of recent calls
    assert speed.prefill_samples == 2 and speed.source == "measured"


def test_speeds_seed_from_metrics_only_when_the_engine_has_served_and_nothing_was_measured():
    text = ("# HELP llamacpp:prompt_tokens_seconds Average prompt throughput in tokens/s.\n"
            "llamacpp:prompt_tokens_seconds 412.5\nllamacpp:predicted_tokens_seconds 31.25\n")
    fresh = EngineSpeed()
    assert fresh.seed(text) and (fresh.prefill, fresh.decode) == (412.5, 31.25)
    assert "/metrics" in fresh.describe(10, 10)
    assert not EngineSpeed().seed(text.replace("412.5", "0"))  # a fresh engine reports 0
    measured = EngineSpeed()
    measured.observe_prefill(100, 1.0)
    assert not measured.seed(text) and measured.prefill == 100


def test_overall_bound_is_margin_times_the_estimate_with_a_floor_and_a_cap():
    speed = EngineSpeed(prefill=15.0, decode=4.0, prefill_samples=1, decode_samples=1, source="measured")
    engine, clock = _engine(speed, floor=60, margin=3)
    watch = engine.watch(3478, 512)
    assert watch.estimate() == pytest.approx(3478 / 15 + 512 / 4)
    assert watch.overall() == pytest.approx(3 * (3478 / 15 + 512 / 4))  # > the old fixed 600 s
    assert engine.watch(10, 8).overall() == 60  # small work: the floor
    assert engine.watch(10_000_000, 8).overall() == LONGEST_CALL_S
    fixed, _ = _engine(speed, request_timeout=45)
    assert fixed.watch(3478, 512).overall() == 45 and fixed.watch(3478, 512).window() == float("inf")


@pytest.mark.anyio
async def test_no_progress_window_covers_one_batch_at_the_measured_speed():
    speed = EngineSpeed(prefill=15.0, decode=4.0, prefill_samples=1, decode_samples=1)
    engine, clock = _engine(speed, no_progress_floor=10, margin=3, n_batch=2048)
    big, small = engine.watch(3478, 512), engine.watch(100, 512)
    # an engine that has sent no progress chunk: the whole prompt may pass in silence
    assert big.window() == pytest.approx(3 * (3478 / 15 + 1 / 4))
    big.progress({"total": 3478, "cache": 0, "processed": 0, "time_ms": 0})
    # prefill: one batch (at most the prompt) and the first token
    assert big.window() == pytest.approx(3 * (2048 / 15 + 1 / 4))
    assert small.window() == pytest.approx(3 * (100 / 15 + 1 / 4))
    with big:  # another call in flight: its batches delay this one's tokens
        small.token()
        assert small.window() == pytest.approx(3 * (8 / 4 + 2048 / 15))
    assert small.window() == 10  # 3 x 8 tokens at 4 tok/s is below the floor


@pytest.mark.anyio
async def test_progress_extends_the_bound_and_the_error_says_what_was_measured():
    speed = EngineSpeed(prefill=1000.0, decode=100.0, prefill_samples=1, decode_samples=1, source="measured")
    engine, clock = _engine(speed, floor=20, no_progress_floor=120, margin=3)
    watch = engine.watch(3478, 64)
    with watch:
        assert watch.bound == clock.now + 20  # history says fast: the floor
        clock.now += 60
        watch.progress({"total": 3478, "cache": 0, "processed": 900, "time_ms": 60_000})  # 15 tok/s really
        assert watch.live_prefill == 15.0
        assert watch.bound == pytest.approx(clock.now + 3 * (2578 / 15 + 64 / 100))
        clock.now += 130
        watch.token()
        assert watch.processed == 3478 and watch.generated == 1
        clock.now += 121
    message = str(watch.error("reviewer"))
    assert "no progress from the engine for 121 s" in message
    assert "prefill at 1,000 tok/s: 3,478 prompt tokens need ~3 s" in message
    assert "this call's prompt ran at 15 tok/s" in message and "1 tokens generated" in message
    assert "not resent unchanged" in message


def test_a_window_is_never_tighter_than_a_gap_the_call_already_showed():
    """The last, smaller batch of a long prompt attends over more context, and a shared CPU slows unevenly: its window
    is at least margin x the longest batch this call has waited for (a CI run stopped a 478-token last batch at 9 s
    after 2,048-token batches of 12 s each). Between tokens likewise."""
    speed = EngineSpeed()
    speed.observe({"prompt_n": 4000, "prompt_ms": 16_000.0, "predicted_n": 40, "predicted_ms": 500.0})  # 250 / 80
    engine, clock = _engine(speed, no_progress_floor=0.01)
    watch = engine.watch(4597, 32)
    watch.started()
    clock.now += 12.5
    watch.progress({"total": 4597, "cache": 23, "processed": 2071, "time_ms": 12_500})
    assert watch.longest_prefill_gap == 0  # the first batch's wait includes the slot's start: not a batch's time
    clock.now += 12.5
    watch.progress({"total": 4597, "cache": 23, "processed": 4119, "time_ms": 25_000})
    assert watch.longest_prefill_gap == 12.5
    assert watch.window() == pytest.approx(3 * 12.5)  # not 3 x (478 / 164 + 1 / 80) = 9 s
    watch.token()
    assert watch.window() == pytest.approx(3 * 8 / 80)  # decoding: the tokens' own rate again
    clock.now += 2.0
    watch.token()
    clock.now += 0.1
    watch.token()
    assert watch.longest_decode_gap == 2.0 and watch.window() == pytest.approx(3 * 2.0)


def test_time_in_an_endpoints_own_queue_is_not_the_calls_work():
    """squad serve admits on its own: until it answers, only the longest-call cap applies."""
    engine, clock = _engine(floor=60, no_progress_floor=10)
    watch = engine.watch(100, 10, queued_upstream=True)
    assert watch.deadline() == clock.now + LONGEST_CALL_S
    clock.now += 900  # queued behind other clients
    watch.started()
    assert watch.sent == clock.now and watch.bound == clock.now + watch.overall()
    assert watch.deadline() == min(watch.bound, clock.now + watch.window())


def test_fixed_deadline_message_names_the_override():
    engine, clock = _engine(request_timeout=600)
    message = str(engine.watch(3478, 512).error("r"))
    assert "fixed 600 s (request_timeout)" in message and "leave it unset" in message
    assert "prefill at 8.0 tok/s: 3,478 prompt tokens need ~435 s" in message and "squad's default" in message


def test_bad_policies_are_user_errors():
    for bad in (dict(floor=0), dict(margin=0.5), dict(no_progress_floor=-1), dict(request_timeout=True)):
        with pytest.raises(UserError):
            Deadlines(**bad)


def test_engine_timeout_stays_above_every_deadline():
    """F04: llama-server's ``-to`` is above squad's longest call, derived or fixed."""
    plan = EnginePlan.simple("/m.gguf", slots=1, n_ctx=1024)
    derived = build_args(plan, port=1)
    assert int(derived[derived.index("-to") + 1]) > LONGEST_CALL_S
    fixed = build_args(plan, port=1, request_timeout=30)
    assert int(fixed[fixed.index("-to") + 1]) > 30


# --- end to end against the fake engine ---------------------------------------------------------

FAST = dict(prefill=5000.0, decode=5000.0, prefill_samples=1, decode_samples=1, source="measured")
"""Speeds as measured on calls before: far faster than the slow fake, so the estimate alone
would give only the floor."""


async def complete(client: EngineClient, *, agent: str, **request) -> ChatResult:
    return await client.complete(ChatRequest(origin=Origin(agent, f"{agent}#1"), **request))


def _user(words: int) -> list[dict]:
    return [{"role": "user", "content": " ".join(["line"] * words)}]


@pytest.mark.anyio
async def test_a_slow_prefill_that_reports_progress_is_not_killed():
    """~400 prompt tokens at 0.01 s each in batches of 20 (≥ 4 s in all, a batch every ≥ 0.2 s):
    a fixed 2 s deadline stops it; derived deadlines with a 2 s floor and a 2 s no-progress
    floor keep it alive, because each batch's progress arrives and re-estimates the bound."""
    async with FakeEngine(prompt_delay=0.01, n_batch=20) as fe:
        async with EngineClient(fe.info, request_timeout=2.0) as fixed:
            with pytest.raises(CallTimeout, match="fixed 2 s"):
                await complete(fixed, agent="r", messages=_user(390), max_tokens=4)
        policy = Deadlines(floor=2.0, no_progress_floor=2.0)
        async with EngineClient(fe.info, deadlines=policy) as client:
            client.deadlines.speed = EngineSpeed(**FAST)
            r = await complete(client, agent="r", messages=_user(390), max_tokens=4)
    assert r.finish_reason == "length" and r.usage is not None
    assert fe.requests[-1]["return_progress"] is True
    # the engine's timings of that call replaced part of the fast history
    assert client.deadlines.speed.prefill < FAST["prefill"] and client.deadlines.speed.prefill_samples == 2


@pytest.mark.anyio
async def test_slow_tokens_that_keep_arriving_are_not_killed():
    """40 tokens at ≥ 0.1 s each (≥ 4 s) against a 1 s floor: each token is progress and
    re-estimates the bound from this call's own speed."""
    policy = Deadlines(floor=1.0, no_progress_floor=2.0)
    async with FakeEngine(token_delay=0.1) as fe, EngineClient(fe.info, deadlines=policy) as client:
        client.deadlines.speed = EngineSpeed(**FAST)
        r = await complete(client, agent="w", messages=_user(5), max_tokens=40)
    assert r.usage is not None and r.usage.completion_tokens == 40


@pytest.mark.anyio
@pytest.mark.parametrize("stall_after", [0, 3])
async def test_a_stalled_call_is_stopped_once_and_not_resent(stall_after):
    """The engine goes silent (after the prompt, or after 3 tokens) but keeps the slot: the
    no-progress window stops the call, the stream is closed (the slot frees), nothing is resent,
    and the error says what was measured."""
    events: list[Event] = []
    policy = Deadlines(floor=600, no_progress_floor=0.5)
    async with FakeEngine(prompt_delay=0.001, n_batch=16) as fe, \
            EngineClient(fe.info, deadlines=policy, on_event=events.append) as client:
        client.deadlines.speed = EngineSpeed(**FAST)
        fe.script(Reply(stall_after=stall_after))
        with pytest.raises(CallTimeout) as err:
            await complete(client, agent="stuck", messages=_user(60), max_tokens=20)
        with anyio.fail_after(5):
            while fe.processing:
                await anyio.sleep(0.01)
    message = str(err.value)
    assert "no progress from the engine" in message and "not resent unchanged" in message
    assert "prefill at 5,000 tok/s" in message
    assert (f"{stall_after} tokens generated" if stall_after else "prompt tokens processed") in message
    assert len(fe.requests) == 1 and fe.disconnects == 1
    assert [e.data["error"] for e in events if e.kind == "call.failed"] == ["CallTimeout"]


@pytest.mark.anyio
async def test_other_kinds_are_not_asked_for_progress():
    async with FakeEngine() as fe:
        info = dataclasses.replace(fe.info, kind="openai-compatible")
        async with EngineClient(info) as client:
            await complete(client, agent="a", messages=_user(3), max_tokens=3)
    assert "return_progress" not in fe.requests[0]


@pytest.mark.anyio
async def test_a_stall_message_states_the_window_the_call_was_stopped_by():
    """Issue 32: a SIGSTOPped engine ended a run after 780 s while the message said "its window: 120 s". The window
    armed while other calls shared the engine (a whole batch at the default prefill speed) was long; by the time the
    message was written the speeds and the calls in flight had changed, and the window computed again was the
    floor. The message states the window the cancel scope held, and a stall is judged by that same window."""
    engine, clock = _engine(EngineSpeed(), no_progress_floor=120, margin=3, n_batch=2048)
    a, b, c = engine.watch(3000, 64), engine.watch(3000, 64), engine.watch(3000, 64)
    with a, b, c:
        a.progress({"total": 3000, "cache": 0, "processed": 0, "time_ms": 0})
        armed = a.armed_window
        assert armed == pytest.approx(3 * (2048 / DEFAULT_PREFILL_TPS + 1 / 2))  # shared, default speeds: ~770 s
        assert "while other calls share the engine" in a.armed_why
        engine.speed.observe({"prompt_n": 4000, "prompt_ms": 2000.0, "predicted_n": 40, "predicted_ms": 400.0})
        assert a.window() == 120  # what a window computed now would say
        clock.now = a.last + 121
        assert a._passed(clock.now) is None  # not stopped at the new, shorter window: the scope holds the armed one
        clock.now = a.last + armed
        assert a._passed(clock.now) == "stall"
        a.fired = "stall"
        message = str(a.error("reviewer", "the engine at http://127.0.0.1:9 (pid 4242, log /tmp/x.log)"))
    assert f"its window: {armed:,.0f} s, 3x the time of 2,048 prompt tokens" in message
    assert f"no progress from the engine at http://127.0.0.1:9 (pid 4242, log /tmp/x.log) for {armed:,.0f} s" \
        in message


def test_an_engine_is_named_by_url_pid_and_log_or_as_attached():
    from squad.engine.info import EngineInfo

    info = EngineInfo(base_url="http://127.0.0.1:8080", api_key=None, slots=1, n_ctx=512, kv_unified=True, pool=512)
    assert info.describe_process() == "the engine at http://127.0.0.1:8080 (attached: its process and log are not " \
                                      "squad's)"
    launched = dataclasses.replace(info, pid=12, log_path="/l/llama.log")
    assert launched.describe_process() == "the engine at http://127.0.0.1:8080 (pid 12, log /l/llama.log)"
    assert launched == info  # pid and log are not part of what the engine applied

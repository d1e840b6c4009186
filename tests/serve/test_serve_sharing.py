"""squad serve as the place local agents share one model (issue 30, the scheduling half), against the fake engine:
programs (:mod:`squad.serve.programs`), fair shares and caps between clients (:mod:`squad.serve.shares`), keep-alives
for every wait (queue and prefill, :mod:`squad.serve.early`, :mod:`squad.serve.progress`) and ``--max-queue-wait``.
The real engine: tests/serve/test_serve_sharing_real.py."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import anyio
import httpx
import openai
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from squad.engine.session import EngineSpec
from squad.errors import UserError
from squad.events import Origin
from squad.sched.policy import ProgramQueue
from squad.sched.room import Reservation, Room
from squad.serve import serving
from squad.serve.programs import Program, program_of, session_of
from squad.serve.progress import Progress
from squad.serve.shares import ClientLimit, ClientQueue, client_limits, parse_client_limit
from squad.testing import FakeEngine

pytestmark = pytest.mark.anyio

KEYS = {"flood": "flood-key-123456", "editor": "editor-key-123456"}


def spec(fe: FakeEngine) -> EngineSpec:
    return EngineSpec(url=fe.base_url, api_key=fe.api_key)


def scope(**headers: str) -> dict:
    return {"headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()]}


async def wait_for(condition, timeout: float = 20.0) -> None:
    with anyio.fail_after(timeout):
        while not condition():
            await anyio.sleep(0.02)


# -- programs -------------------------------------------------------------------------------------------------------

def test_a_program_is_named_by_header_then_what_the_client_sends_then_the_request_alone():
    body = {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "task"}]}
    assert program_of(scope(**{"X-Squad-Program": "p1"}), {**body, "user": "u"}, "c", "r1").program == "c/p1"
    cc = {**body, "metadata": {"user_id": "user_ab_account_cd_session_0f9e"}}
    assert program_of(scope(), cc, "c", "r1").program == "c/0f9e"
    assert session_of(json.dumps({"device_id": "d", "session_id": "s-42"})) == "s-42"
    assert program_of(scope(), {**body, "prompt_cache_key": "conv-7"}, "c", "r1").source == "prompt_cache_key"
    assert program_of(scope(), {**body, "user": "alice"}, "c", "r1").program == "c/alice"
    assert program_of(scope(**{"X-Squad-Client": "opencode"}), body, "c", "r1").source == "client"
    alone = program_of(scope(), body, "c", "r9")
    assert alone.program == alone.conversation == "c/r9" and alone.source == "request"
    # two clients that send the same user are two programs
    assert program_of(scope(), {**body, "user": "u"}, "a", "r").program != program_of(
        scope(), {**body, "user": "u"}, "b", "r").program


def test_a_programs_threads_are_told_apart_by_their_start_and_keep_it_turn_after_turn():
    main = [{"role": "system", "content": "you lead"}, {"role": "user", "content": "build it"}]
    sub = [{"role": "system", "content": "you search"}, {"role": "user", "content": "find x"}]
    head = scope(**{"X-Squad-Program": "s"})
    a1 = program_of(head, {"messages": main}, "c", "r1")
    a2 = program_of(head, {"messages": [*main, {"role": "assistant", "content": "ok"},
                                        {"role": "user", "content": "more"}]}, "c", "r2")
    b = program_of(scope(**{"X-Squad-Program": "s", "X-Squad-Agent": "sub"}), {"messages": sub}, "c", "r3")
    assert a1.conversation == a2.conversation != b.conversation
    assert a1.program == b.program and b.sub and not a1.sub
    assert a1.origin() == Origin("c", conversation=a1.conversation, parent="c/s")


@given(st.text(max_size=400), st.text(max_size=50))
def test_any_names_give_a_bounded_program(name, client):
    p = program_of(scope(), {"user": name, "messages": []}, client or "c", "r1")
    assert isinstance(p, Program) and len(p.program) <= len(client or "c") + 1 + 128


# -- shares ---------------------------------------------------------------------------------------------------------

def test_client_limits_parse_and_bad_ones_are_clear_errors():
    assert parse_client_limit("crawler=slots:2,pool:50%") == ("crawler", ClientLimit(slots=2, pool=0.5))
    assert parse_client_limit("*=pool:0.25") == ("*", ClientLimit(pool=0.25))
    for bad in ("crawler", "=slots:2", "x=slots:0", "x=pool:0%", "x=pool:120%", "x=cores:2", "x=slots:two"):
        with pytest.raises(UserError, match="--client-limit"):
            parse_client_limit(bad)
    with pytest.raises(UserError, match="twice"):
        client_limits(["a=slots:1", "a=slots:2"])


@dataclass
class W:
    reservation: Reservation
    seq: int


@dataclass
class Books:
    """Admission's books, kept by hand around a policy: slots, pool, running calls."""

    queue: ClientQueue
    slots: int
    pool: int
    running: list[W] = field(default_factory=list)
    seq: int = 0

    def ask(self, client: str, tokens: int, priority: int = 0, program: str = "p") -> W:
        w = W(Reservation(Origin(client, conversation=f"{client}/{program}/{self.seq}", parent=f"{client}/{program}"),
                          tokens=tokens, priority=priority), self.seq)
        self.seq += 1
        self.queue.add(w)
        return w

    def dispatch(self) -> list[W]:
        granted = []
        while len(self.running) < self.slots:
            reserved = sum(w.reservation.tokens for w in self.running)
            room = Room(lambda r, reserved=reserved: reserved + r.tokens <= self.pool, free=self.pool - reserved,
                        pool=self.pool, slots=self.slots, running=len(self.running))
            w = self.queue.pick(room)
            if w is None:
                break
            self.running.append(w)
            granted.append(w)
        return granted

    def release(self, w: W, held_s: float = 1.0) -> None:
        self.running.remove(w)
        self.queue.served(w.reservation, held_s)


def fair_queue(**kw) -> ClientQueue:
    return ClientQueue(lambda: ProgramQueue(hold_s=0.0), **kw)


@settings(max_examples=150, deadline=None)
@given(slots=st.integers(1, 4),
       flood=st.lists(st.tuples(st.integers(1, 500), st.integers(-1000, 1000), st.sampled_from("abc")),
                      min_size=1, max_size=40),
       mine=st.integers(1, 500), releases=st.lists(st.integers(0, 10**6), max_size=60))
def test_a_flood_delays_another_clients_first_request_by_at_most_one_running_requests_end(slots, flood, mine,
                                                                                           releases):
    """The stated bound: whatever the flood (priorities, programs, sizes), another client's first request goes at
    the first release after which it fits the free room; until then the flood passes it at most max_bypass times."""
    books = Books(fair_queue(), slots=slots, pool=1000)
    for tokens, priority, program in flood:
        books.ask("flood", tokens, priority, program)
    books.dispatch()
    me = books.ask("editor", mine)
    passed = 0
    for pick in [*releases, *range(len(flood) + 1)]:
        granted = books.dispatch()
        if me in granted:
            assert granted[0] is me  # nothing of the flood went before it in that round
            return
        passed += len(granted)
        assert passed <= books.queue.max_bypass
        reserved = sum(w.reservation.tokens for w in books.running)
        assert len(books.running) == slots or reserved + mine > 1000, "a free slot and room, yet not granted"
        books.release(books.running[pick % len(books.running)])
    raise AssertionError("never granted")


@settings(max_examples=100, deadline=None)
@given(steps=st.lists(st.tuples(st.sampled_from(["a", "b", "c", "release"]), st.integers(1, 400),
                                st.integers(0, 99)), max_size=80))
def test_caps_hold_and_every_call_is_granted_once(steps):
    limits = {"a": ClientLimit(slots=1), "b": ClientLimit(pool=0.3)}
    books = Books(fair_queue(limits=limits), slots=3, pool=1000)
    asked: list[W] = []
    granted: list[W] = []
    for who, tokens, pick in steps:
        if who == "release":
            if books.running:
                books.release(books.running[pick % len(books.running)])
        else:
            asked.append(books.ask(who, tokens))
        granted += books.dispatch()
        mine = {c: [w for w in books.running if w.reservation.agent == c] for c in "abc"}
        assert len(mine["a"]) <= 1
        assert sum(w.reservation.tokens for w in mine["b"]) <= 300
        assert sum(w.reservation.tokens for w in books.running) <= 1000
    while books.running or len(books.queue):
        if not books.running:  # only calls over their client's cap wait, and nothing runs: impossible
            assert all(w.reservation.agent == "b" and w.reservation.tokens > 300
                       for w in books.queue.ordered()), books.queue.ordered()
            break
        books.release(books.running[0])
        granted += books.dispatch()
    assert len({w.seq for w in granted}) == len(granted)


def test_a_head_that_does_not_fit_is_passed_at_most_max_bypass_times():
    books = Books(fair_queue(max_bypass=2), slots=4, pool=1000)
    big = [books.ask("flood", 400) for _ in range(2)]
    assert books.dispatch() == big  # 800 reserved
    me = books.ask("editor", 500)  # the editor has nothing running: first, but does not fit
    small = [books.ask("flood", 50) for _ in range(4)]
    assert books.dispatch() == small[:2]  # passed twice ...
    assert books.dispatch() == []  # ... then nothing passes it
    books.release(big[0])
    assert books.dispatch()[0] is me


# -- over HTTP: the adversarial client --------------------------------------------------------------------------------

async def test_an_adversarial_flood_cannot_keep_another_clients_main_request_waiting():
    """One client floods 12 sub-agent requests of one program, at the best priority it can ask; another client's
    one main request is the next to run when a slot frees (the bound of :mod:`squad.serve.shares`)."""
    async with FakeEngine(slots=2, n_ctx=8192, token_delay=0.01) as fe:
        async with serving(spec(fe), port=0, client_keys=KEYS) as served:
            def client(name: str) -> httpx.AsyncClient:
                return httpx.AsyncClient(base_url=served.url, timeout=60,
                                         headers={"Authorization": f"Bearer {KEYS[name]}"})

            async with client("flood") as flood, client("editor") as editor:
                async def sub(i: int) -> None:
                    r = await flood.post("/v1/chat/completions", headers={
                        "X-Squad-Program": "swarm", "X-Squad-Agent": "sub", "X-Squad-Priority": "-1000",
                        "X-Squad-Client": f"fake-name-{i}"},  # a key's label wins over a name it gives
                        json={"messages": [{"role": "user", "content": f"sub {i}"}], "max_tokens": 40})
                    assert r.status_code == 200

                got: dict = {}

                async def main() -> None:
                    r = await editor.post("/v1/chat/completions", headers={"X-Squad-Program": "session-1"},
                                          json={"messages": [{"role": "user", "content": "main"}], "max_tokens": 5})
                    got["queued_ms"] = int(r.headers["x-squad-queued-ms"])
                    got["passed"] = int(r.headers["x-squad-passed"])
                    assert r.status_code == 200 and r.headers["x-squad-program"] == "editor/session-1"

                async with anyio.create_task_group() as tg:
                    for i in range(12):
                        tg.start_soon(sub, i)
                    await wait_for(lambda: len(served.gateway.admission.queued) == 10)
                    status = served.gateway.status()
                    tg.start_soon(main)
                    await wait_for(lambda: len(served.gateway.admission.queued) == 11)
            order = [r["messages"][0]["content"] for r in fe.requests]
    assert order.index("main") == 2, order  # right after the two that were running when it asked
    assert got["passed"] == 0
    shares = {row["client"]: row for row in status["shares"]}
    assert shares["flood"]["running"] == 2 and shares["flood"]["queued"] == 10
    (program,) = [p for p in status["programs"] if p["client"] == "flood"]
    assert program["program"] == "flood/swarm" and program["source"] == "header" and program["requests"] == 12


async def test_a_client_cap_holds_over_http_and_the_others_use_the_rest():
    async with FakeEngine(slots=3, n_ctx=8192, token_delay=0.01) as fe:
        async with serving(spec(fe), port=0, client_keys=KEYS,
                           client_limits={"flood": ClientLimit(slots=1)}) as served:
            headers = {"Authorization": f"Bearer {KEYS['flood']}"}
            async with httpx.AsyncClient(base_url=served.url, timeout=60, headers=headers) as flood:
                most = 0

                async def one(i: int) -> None:
                    r = await flood.post("/v1/chat/completions",
                                         json={"messages": [{"role": "user", "content": f"x{i}"}], "max_tokens": 20})
                    assert r.status_code == 200

                async with anyio.create_task_group() as tg:
                    for i in range(5):
                        tg.start_soon(one, i)
                    for _ in range(100):
                        most = max(most, fe.processing)
                        await anyio.sleep(0.01)
    assert most == 1 and fe.completed == 5


# -- keep-alives and --max-queue-wait --------------------------------------------------------------------------------

async def test_a_streamed_request_whose_prefill_outlasts_the_clients_idle_timeout_completes_through_the_sdk():
    """Scaled down: the client's read (idle) timeout is 1 s, the engine reads the prompt for about 3 s; keep-alives
    every 0.3 s (and the engine's progress as comments) keep the stream alive; the same request without them
    times out (the control)."""
    words = " ".join(f"w{i}" for i in range(300))
    async with FakeEngine(slots=1, n_ctx=4096, prompt_delay=0.01, n_batch=128) as fe:
        async with serving(spec(fe), port=0) as served:
            served.gateway.early_after = served.gateway.keepalive_every = 0.3
            sdk = openai.AsyncOpenAI(base_url=served.base_url, api_key=served.api_key, max_retries=0,
                                     timeout=openai.Timeout(1.0, connect=5.0))
            for extra in ({}, {"return_progress": False}):  # progress comments; keep-alives alone
                stream = await sdk.chat.completions.create(
                    model="m", messages=[{"role": "user", "content": words}], max_tokens=5, stream=True,
                    extra_body=extra)
                text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
                assert text
            async with httpx.AsyncClient(base_url=served.url, timeout=30,
                                         headers={"Authorization": f"Bearer {served.api_key}"}) as raw:
                async with raw.stream("POST", "/v1/chat/completions", json={
                        "messages": [{"role": "user", "content": words}], "max_tokens": 5, "stream": True}) as r:
                    lines = [line async for line in r.aiter_lines()]
            # the control: straight to the engine, nothing keeps the stream alive
            direct = openai.AsyncOpenAI(base_url=fe.base_url + "/v1", api_key="x", max_retries=0,
                                        timeout=openai.Timeout(1.0, connect=5.0))
            with pytest.raises(openai.APITimeoutError):
                stream = await direct.chat.completions.create(
                    model="m", messages=[{"role": "user", "content": words}], max_tokens=5, stream=True)
                async for _ in stream:
                    pass
            await sdk.close()
            await direct.close()
    assert any(line.startswith(": prefill ") for line in lines), lines
    assert not any("prompt_progress" in line for line in lines)
    data = [json.loads(line[6:]) for line in lines if line.startswith("data: {")]
    assert data[0]["choices"][0]["delta"].get("role") == "assistant"


async def test_keep_alives_go_from_the_queue_through_the_prefill_and_the_messages_api_gets_pings():
    from squad.serve.early import EarlyStart

    sent: list[dict] = []

    async def send(message: dict) -> None:
        sent.append(message)

    early = EarlyStart(send, after=0.05, every=0.05, kind="messages")
    async with early.holding():
        await anyio.sleep(0.12)  # queued
        early.admitted()
        await early.send({"type": "http.response.start", "status": 200, "headers": []})  # dropped: started early
        await anyio.sleep(0.12)  # the engine reads the prompt
        await early.answering()
        await early.send({"type": "http.response.body", "body": b"event: message_start\n\n", "more_body": True})
        await anyio.sleep(0.12)
    bodies = [m["body"] for m in sent if m["type"] == "http.response.body"]
    assert [m["type"] for m in sent].count("http.response.start") == 1
    assert bodies[-1] == b"event: message_start\n\n"
    assert len(bodies) >= 4 and all(b == b'event: ping\ndata: {"type": "ping"}\n\n' for b in bodies[:-1])

    # the engine's status line first (it answers at once, then reads the prompt): keep-alives follow it
    sent.clear()
    early = EarlyStart(send, after=0.05, every=0.05, kind="chat")
    async with early.holding():
        early.admitted()
        await early.send({"type": "http.response.start", "status": 200, "headers": []})
        await anyio.sleep(0.15)
        await early.answering()
    assert [m["type"] for m in sent].count("http.response.start") == 1
    assert sent[0]["type"] == "http.response.start"
    assert sent[1]["body"].startswith(b": the engine reads the prompt")


def test_progress_chunks_become_comments_and_everything_else_passes_as_it_is():
    progress = {"choices": [{"delta": {"role": "assistant", "content": None}, "index": 0}],
                "prompt_progress": {"total": 900, "cache": 0, "processed": 512, "time_ms": 3}}
    first = {"choices": [{"delta": {"role": "assistant", "content": "Hi"}, "index": 0}]}
    stream = (b"data: " + json.dumps(progress).encode() + b"\n\n" + b"data: " + json.dumps(first).encode()
              + b"\n\ndata: [DONE]\n\n")
    for cut in range(0, len(stream), 7):  # cut anywhere
        p = Progress()
        comments, rest = b"", b""
        for piece in (stream[:cut], stream[cut:]):
            c, r = p.feed(piece)
            comments, rest = comments + c, rest + r
        rest += p.end()
        assert comments == b": prefill 512/900 tokens (cached 0)\n\n"
        assert rest == stream[stream.index(b"data: " + json.dumps(first).encode()):]


async def test_a_request_that_waits_longer_than_max_queue_wait_gets_503_with_retry_after_in_its_shape():
    async with FakeEngine(slots=1, n_ctx=4096, token_delay=0.2) as fe:
        async with serving(spec(fe), port=0, max_queue_wait=0.5) as served:
            async with httpx.AsyncClient(base_url=served.url, timeout=60,
                                         headers={"Authorization": f"Bearer {served.api_key}"}) as client:
                async def long() -> None:
                    await client.post("/v1/chat/completions",
                                      json={"messages": [{"role": "user", "content": "long"}], "max_tokens": 60})

                async with anyio.create_task_group() as tg:
                    tg.start_soon(long)
                    await wait_for(lambda: fe.processing == 1)
                    r = await client.post("/v1/chat/completions",
                                          json={"messages": [{"role": "user", "content": "late"}], "max_tokens": 5})
                    still = fe.processing  # the long one still runs: the late one did not wait for it
                    status = served.gateway.status()
                    tg.cancel_scope.cancel()
    assert r.status_code == 503 and r.headers["retry-after"] == "1"
    assert "--max-queue-wait" in r.json()["error"]["message"] and r.json()["error"]["code"] == 503
    assert still == 1 and status["admission"]["queued"] == 0

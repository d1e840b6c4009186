"""Retries never march in step (issue 11, kind 7; field case F20): every retry and poll in
squad waits a jittered time, and the overflow error states this process's own reservation."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import anyio
import pytest
from tenacity import RetryCallState

import squad
from squad.chat import ChatRequest
from squad.chat.call import Call
from squad.chat.client import EngineClient
from squad.chat.retrying import WAITS
from squad.chat.stream import InnocentOverflow, Loading
from squad.errors import ContextExceeded, EngineGone
from squad.events import Event, Origin
from squad.testing import CONTEXT_EXCEEDED, FakeEngine, Reply

SRC = Path(squad.__file__).parent
JITTERED = {"wait_random", "wait_random_exponential", "wait_exponential_jitter", "wait_full_jitter"}
RETRYING = {"AsyncRetrying", "Retrying", "retry"}


def _calls(tree: ast.AST) -> list[ast.Call]:
    return [n for n in ast.walk(tree) if isinstance(n, ast.Call)]


def _name(node: ast.AST) -> str:
    return node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""


def test_every_tenacity_wait_in_squad_has_jitter():
    """The kind, not one place: no fixed or plain exponential wait anywhere in the package, and
    every retry loop says how long it waits (tenacity's default is no wait at all)."""
    fixed, silent = [], []
    for path in SRC.rglob("*.py"):
        tree = ast.parse(path.read_text())
        from_tenacity = {a.asname or a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
                         and (n.module or "").startswith("tenacity") for a in n.names}
        for call in _calls(tree):
            name = _name(call.func)
            if name.startswith("wait_") and name in from_tenacity and name not in JITTERED:
                fixed.append(f"{path.name}:{call.lineno}: {name}")
            if name in RETRYING and not any(k.arg == "wait" for k in call.keywords):
                silent.append(f"{path.name}:{call.lineno}: {name}(...) without wait=")
    assert not fixed, "waits without jitter:\n" + "\n".join(fixed)
    assert not silent, "\n".join(silent)


def _state(attempt: int) -> RetryCallState:
    state = RetryCallState(retry_object=None, fn=None, args=(), kwargs={})  # type: ignore[arg-type]
    state.attempt_number = attempt
    return state


@pytest.mark.parametrize("kind", sorted(WAITS))
def test_each_client_wait_is_drawn_not_fixed(kind):
    draws = {round(WAITS[kind](_state(2)), 6) for _ in range(50)}
    assert len(draws) > 10  # two processes waiting "the same" wait do not wake together
    assert all(0 <= d <= 4.0 for d in draws)


def _retry_wait(client: EngineClient, exc: BaseException, **counts: int) -> float:
    """The wait the client's one retry policy picks after ``exc`` with these per-kind counts."""
    call = Call(ChatRequest(origin=Origin("a"), messages=[], max_tokens=1), "c0")
    for name, value in counts.items():
        setattr(call, name, value)
    state = _state(sum(counts.values()) + 1)
    state.outcome = type("Outcome", (), {"exception": lambda self: exc, "failed": True})()
    return client.retrying.policy(call).wait(state)  # type: ignore[misc]


@pytest.mark.anyio
async def test_the_call_retry_policy_jitters_every_kind():
    async with FakeEngine() as fe, EngineClient(fe.info) as client:
        loading = {_retry_wait(client, Loading("x")) for _ in range(40)}
        gone = {_retry_wait(client, EngineGone("x"), gone=1) for _ in range(40)}
        first = [_retry_wait(client, InnocentOverflow("x", agent="a", reserved=1), overflows=1) for _ in range(200)]
        later = [_retry_wait(client, InnocentOverflow("x", agent="a", reserved=1), overflows=5) for _ in range(200)]
    assert len(loading) > 10 and all(0.25 <= w <= 0.75 for w in loading)
    assert len(gone) > 10 and all(0.05 <= w <= 0.2 for w in gone)
    assert len(set(first)) > 50 and max(first) <= 0.25  # full jitter, from 0 up to the backoff
    assert max(later) > 0.5 and max(later) <= 4.0  # the backoff grows with the overflows of this call


@pytest.mark.anyio
async def test_the_overflow_error_states_this_process_reservation_not_the_pool():
    """Field case F20's message: it claimed 8,192 tokens reserved (the pool) when 4,529 were.
    Here this process holds a long call of its own while another call keeps overflowing."""
    events: list[Event] = []

    def respond(body: dict) -> Reply:
        if body["messages"][-1]["content"].startswith("long"):
            return Reply(content="x " * 30, token_delay=0.05)
        return Reply(status=500, error_message=CONTEXT_EXCEEDED)

    async with FakeEngine(slots=2, n_ctx=8192) as fe, EngineClient(fe.info, max_attempts=3,
                                                                    on_event=events.append) as client:
        fe.responder = respond

        async def long() -> None:
            await client.complete(ChatRequest(origin=Origin("holder", "holder#1"),
                                              messages=[{"role": "user", "content": "long " * 20}], max_tokens=300))

        async with anyio.create_task_group() as tg:
            tg.start_soon(long)
            await anyio.sleep(0.2)  # the holder is admitted and streaming
            with pytest.raises(ContextExceeded) as info:
                await client.complete(ChatRequest(origin=Origin("victim", "victim#1"),
                                                  messages=[{"role": "user", "content": "short"}], max_tokens=4000))
    admitted = {e.agent: e.data["tokens"] for e in events if e.kind == "call.admitted"}
    own, holder = admitted["victim"], admitted["holder"]
    message = str(info.value)
    held = int(re.search(r"at most (\d+) of the engine's 8192 tokens reserved", message).group(1))
    assert held == own + holder  # the sum of this process's reservations then, never the pool
    assert f"(this call {own}: prompt + max_tokens)" in message
    assert held < 8192 and "another client" in message

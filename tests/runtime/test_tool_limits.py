"""Tool calls that take too long or give back something that is not text (issue 32 item 4).

- ``@tool(timeout=...)`` and :data:`~squad.runtime.tools.DEFAULT_TOOL_TIMEOUT`: an async tool that sleeps past
  its timeout, and one that never returns, are cancelled; a sync one's thread is abandoned; the model reads that
  it timed out. The run goes on (the other calls of the turn are not held).
- A tool's non-text result (``bytes``, a dataclass, a set, an object) reaches the model as JSON or a
  description, never as a Python repr (hypothesis over nested values).
"""

from __future__ import annotations

import collections
import dataclasses
import datetime
import enum
import json
import threading
import time
import types
from types import SimpleNamespace

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from squad.errors import UserError
from squad.runtime.tools import DEFAULT_TOOL_TIMEOUT, Tool, run_tool_calls, tool, tool_text

pytestmark = pytest.mark.anyio


def test_the_default_timeout_and_a_bad_one():
    @tool
    def plain() -> str:
        return "x"

    def one() -> int:
        return 1

    assert plain.timeout == DEFAULT_TOOL_TIMEOUT and tool(timeout=None)(one).timeout is None
    for bad in (0, -1, True, "5", float("inf")):
        with pytest.raises(UserError, match="timeout must be a positive number"):
            tool(timeout=bad)(one)


async def test_an_async_tool_past_its_timeout_is_cancelled_and_the_model_reads_it_timed_out():
    ended = anyio.Event()

    @tool(timeout=0.2)
    async def slow() -> str:
        try:
            await anyio.sleep(3600)
        finally:
            ended.set()
        return "never"

    @tool(timeout=0.2)
    async def hangs() -> str:
        await anyio.Event().wait()  # never returns
        return "never"

    @tool
    async def quick() -> str:
        return "ok"

    calls = [SimpleNamespace(name=n, arguments="{}") for n in ("slow", "hangs", "quick")]
    with anyio.fail_after(30):  # a guard for the test, not a measure
        outcomes = await run_tool_calls({"slow": slow, "hangs": hangs, "quick": quick}, calls)
    assert ended.is_set()  # cancelled, not left running
    assert [o.ok for o in outcomes] == [False, False, True]
    for o in outcomes[:2]:
        assert o.text == f"error: {o.name} timed out: it did not finish within its timeout of 0.2 s and was " \
                         "stopped; no result"
    assert outcomes[2].text == "ok"


async def test_a_sync_tool_past_its_timeout_is_abandoned_and_the_model_reads_it_timed_out():
    release = threading.Event()

    @tool(timeout=0.2)
    def blocks() -> str:
        release.wait(60)  # a thread cannot be stopped: it finishes in the background
        return "late"

    try:
        with anyio.fail_after(30):
            outcome = await blocks.call("{}")
    finally:
        release.set()
    assert not outcome.ok and "timed out" in outcome.text and "0.2 s" in outcome.text


async def test_a_tool_within_its_timeout_gives_its_result():
    @tool(timeout=30)
    def fine(x: int) -> int:
        time.sleep(0.01)
        return x * 2

    assert (await fine.call('{"x": 21}')).text == "42"


class Colour(enum.Enum):
    RED = "red"


@dataclasses.dataclass
class Point:
    x: int
    y: bytes


@pytest.mark.parametrize("value, text", [
    (b"plain text", "plain text"),
    (bytearray("한국어".encode()), "한국어"),
    (b"\x89PNG\r\n\x1a\n\x00\x00", "[binary data, 10 bytes, not UTF-8 text; the tool should return text describing "
                                   "it]"),
    (b"a\x00b", "[binary data, 3 bytes, not printable text; the tool should return text describing it]"),
    ({"k": b"v", "s": {2, 1}}, '{"k": "v", "s": [1, 2]}'),
    (Point(1, b"\xff"), '{"x": 1, "y": "[binary data, 1 bytes, not UTF-8 text; the tool should return text '
                        'describing it]"}'),
    ([Colour.RED, datetime.date(2026, 1, 2)], '["red", "2026-01-02"]'),
    ({"obj": object()}, '{"obj": "[an object, not data]"}'),
    ("리뷰어", "리뷰어"),
    ({"이름": "리뷰어"}, '{"이름": "리뷰어"}'),
])
def test_a_non_text_result_is_described_never_a_repr(value, text):
    assert tool_text(value) == text


async def test_a_tool_returning_bytes_reaches_the_model_as_text():
    @tool
    def read() -> bytes:
        return b"file body"

    assert (await read.call("{}")).text == "file body"


WORDS = st.text(alphabet="abc 한국語", max_size=6)  # no quote or '<': any in the result would come from a repr
VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | WORDS | st.binary(max_size=8).filter(lambda b: not set(b"'<") & set(b))
    |
    st.builds(object) | st.frozensets(st.integers(), max_size=3),
    lambda inner: st.lists(inner, max_size=3) | st.tuples(inner) | st.dictionaries(WORDS, inner, max_size=3),
    max_leaves=10)


@settings(max_examples=200, deadline=None)
@given(VALUES)
def test_no_value_a_tool_returns_reaches_the_model_as_a_python_repr(value):
    text = tool_text(value)
    assert isinstance(text, str)
    if isinstance(value, str):
        assert text == value
        return
    assert "'" not in text and "<" not in text  # no b'..', no <object at 0x..>, no {'k': ..}
    if not isinstance(value, bytes):
        json.loads(text)  # anything but text is JSON


def test_a_sub_agent_tool_has_no_tool_timeout():
    from squad.runtime.agent import Agent
    from squad.runtime.turn import _ask_tool

    async def ask(sub: Agent, task: str) -> str:
        return task

    made: Tool = _ask_tool(Agent(name="리뷰어"), ask)
    assert made.name == "ask_리뷰어" and made.timeout is None


class _StrRaises:
    def __str__(self) -> str:
        raise RuntimeError("no text for you")


class _ExcStrRaises(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no text for this error either")


def _nested(depth: int) -> list:
    value: list = []
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize("value, text", [
    (types.MappingProxyType({"k": "한"}), '{"k": "한"}'),  # a read-only mapping: its data, no repr
    (collections.deque([1, "é"]), '[1, "é"]'),
    (collections.UserDict({"a": b"x"}), '{"a": "x"}'),
    (collections.UserList([1]), "[1]"),
])
def test_mappings_and_sequences_of_other_types_are_their_data(value, text):
    assert tool_text(value) == text


@pytest.mark.parametrize("make", [lambda: _StrRaises(), lambda: {"a": _StrRaises()}, lambda: _nested(100_000)],
                         ids=["str-raises", "str-raises-inside", "nested-too-deep"])
async def test_a_result_that_cannot_be_written_is_a_tool_error_never_a_crash(make):
    @tool
    def odd() -> str:
        return make()

    outcome = await odd.call("{}")  # Tool.call never raises for what the function did
    assert not outcome.ok and "odd" in outcome.text and "return text" in outcome.text


async def test_an_exception_whose_text_raises_is_still_a_tool_error():
    @tool
    def fails() -> str:
        raise _ExcStrRaises()

    outcome = await fails.call("{}")
    assert not outcome.ok and "_ExcStrRaises" in outcome.text

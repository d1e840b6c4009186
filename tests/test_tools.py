"""Function tools: schemas from type hints via pydantic, errors as results, concurrency."""

from __future__ import annotations

import json
import threading
from types import SimpleNamespace

import anyio
import pytest

from squad.errors import UserError
from squad.tools import Tool, run_tool_calls, tool

pytestmark = pytest.mark.anyio


@tool
def add(a: int, b: int = 2) -> int:
    """Add two integers.

    Args:
        a: the first number
        b: the second number
    """
    return a + b


@tool(name="shout")
async def loud(text: str, times: int = 1) -> str:
    """Upper-case a text."""
    return " ".join([text.upper()] * times)


def call(name: str, arguments: str, id: str = "c") -> SimpleNamespace:
    return SimpleNamespace(id=id, name=name, arguments=arguments)


def test_schema_from_hints_and_docstring() -> None:
    spec = add.spec()
    assert spec["type"] == "function"
    fn = spec["function"]
    assert fn["name"] == "add" and fn["description"] == "Add two integers."
    assert fn["parameters"] == {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "a": {"type": "integer", "description": "the first number"},
            "b": {"type": "integer", "default": 2, "description": "the second number"},
        },
        "required": ["a"],
    }
    assert loud.name == "shout" and add(1, 2) == 3  # the decorated function is still callable


def test_var_args_and_bad_names_are_refused() -> None:
    def splat(*args: int) -> int:
        return 0

    with pytest.raises(UserError, match=r"\*args"):
        Tool.from_function(splat)
    with pytest.raises(UserError, match="tool name"):
        Tool.from_function(add.fn, name="has space")


async def test_sync_and_async_tools_run_and_errors_become_results() -> None:
    @tool
    def boom(x: str) -> str:
        """Fails."""
        raise RuntimeError(f"cannot {x}")

    tools = {t.name: t for t in (add, loud, boom)}
    out = await run_tool_calls(tools, [
        call("add", '{"a": 40}'),
        call("shout", '{"text": "hi", "times": 2}'),
        call("add", '{"a": "forty"}'),
        call("add", "{not json"),
        call("boom", '{"x": "fly"}'),
        call("nope", "{}"),
    ])
    assert [o.ok for o in out] == [True, True, False, False, False, False]
    assert out[0].text == "42" and out[1].text == "HI HI"
    assert "bad arguments for add: a:" in out[2].text
    assert "bad arguments for add" in out[3].text and "Invalid JSON" in out[3].text
    assert out[4].text == "error: boom raised RuntimeError: cannot fly"
    assert "no tool named 'nope'" in out[5].text and "add, boom, shout" in out[5].text


async def test_tool_calls_of_one_turn_run_concurrently() -> None:
    running = {"now": 0, "max": 0}

    @tool
    async def wait_async(s: float) -> str:
        """Sleep."""
        running["now"] += 1
        running["max"] = max(running["max"], running["now"])
        await anyio.sleep(s)
        running["now"] -= 1
        return "ok"

    barrier = threading.Barrier(2, timeout=10)

    @tool
    def meet(who: str) -> dict:
        """Wait in a worker thread until the other sync call arrives (proves they overlap)."""
        barrier.wait()
        return {"met": who}

    tools = {"wait_async": wait_async, "meet": meet}
    calls = [call("wait_async", '{"s": 0.2}')] * 3 + [call("meet", '{"who": "a"}'), call("meet", '{"who": "b"}')]
    out = await run_tool_calls(tools, calls)
    assert running["max"] == 3
    assert [json.loads(o.text) for o in out[3:]] == [{"met": "a"}, {"met": "b"}]

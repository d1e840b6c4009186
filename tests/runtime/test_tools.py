"""Function tools: schemas from type hints via pydantic, errors as results, concurrency."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from enum import Enum
from types import SimpleNamespace
from typing import Annotated, Literal, Optional

import anyio
import pytest
from pydantic import BaseModel, Field, conlist, constr

from squad.errors import UserError
from squad.runtime.tools import Tool, run_tool_calls, tool

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


# --- pydantic constraints: in the schema the engine gets, and checked before the function ------------------------


class Colour(str, Enum):
    RED = "red"
    BLUE = "blue"


class Point(BaseModel):
    x: int = Field(ge=0, description="column")
    y: int = Field(ge=0)


REACHED: list[dict] = []


@tool
def constrained(
    names: Annotated[list[str], Field(min_length=2, max_length=4)],
    ids: conlist(int, min_length=1),  # type: ignore[valid-type]
    code: constr(pattern=r"^[A-Z]{3}$"),  # type: ignore[valid-type]
    stars: int = Field(ge=1, le=5),
    tags: list[str] = Field(min_length=2),
    short: str = Field("abc", max_length=3),
    ratio: Annotated[float, Field(gt=0, lt=1)] = 0.5,
    colour: Colour = Colour.RED,
    mode: Literal["fast", "slow"] = "fast",
    where: Point | None = None,
    note: Optional[str] = None,  # noqa: UP045 - the Optional spelling is one of the kinds
    explained: Annotated[int, Field(description="said in Field")] = 0,
) -> str:
    """Take constrained arguments.

    Args:
        names: two to four names
        stars: a rating
        explained: said in the docstring (the Field's own description wins)
        note: a free note
    """
    REACHED.append(dict(names=names, ids=ids, code=code, stars=stars, tags=tags, short=short, ratio=ratio,
                        colour=colour, mode=mode, where=where, note=note, explained=explained))
    return "ok"


def test_every_pydantic_constraint_is_in_the_schema() -> None:
    schema = constrained.parameters()
    props = schema["properties"]
    assert schema["required"] == ["names", "ids", "code", "stars", "tags"]  # a Field() default without one is required
    assert props["names"] == {"type": "array", "items": {"type": "string"}, "minItems": 2, "maxItems": 4,
                              "description": "two to four names"}
    assert props["ids"]["minItems"] == 1 and props["code"]["pattern"] == "^[A-Z]{3}$"
    assert props["stars"] == {"type": "integer", "minimum": 1, "maximum": 5, "description": "a rating"}
    assert props["tags"] == {"type": "array", "items": {"type": "string"}, "minItems": 2}  # no FieldInfo default
    assert props["short"] == {"type": "string", "maxLength": 3, "default": "abc"}
    assert props["ratio"]["exclusiveMinimum"] == 0 and props["ratio"]["exclusiveMaximum"] == 1
    assert props["colour"]["$ref"] == "#/$defs/Colour" and schema["$defs"]["Colour"]["enum"] == ["red", "blue"]
    assert props["mode"]["enum"] == ["fast", "slow"]
    assert {"$ref": "#/$defs/Point"} in props["where"]["anyOf"] and {"type": "null"} in props["where"]["anyOf"]
    assert schema["$defs"]["Point"]["properties"]["x"] == {"type": "integer", "minimum": 0, "description": "column",
                                                           "title": "X"}
    assert props["note"]["description"] == "a free note" and {"type": "null"} in props["note"]["anyOf"]
    assert props["explained"]["description"] == "said in Field"
    json.dumps(schema)  # JSON all through (a FieldInfo default used to be left in it)


GOOD = {"names": ["a", "b"], "ids": [1], "code": "ABC", "stars": 3, "tags": ["x", "y"]}


@pytest.mark.parametrize(("change", "where"), [
    ({"names": ["a"]}, "names"), ({"names": list("abcde")}, "names"), ({"ids": []}, "ids"),
    ({"code": "abc"}, "code"), ({"stars": 0}, "stars"), ({"stars": 6}, "stars"), ({"tags": ["x"]}, "tags"),
    ({"short": "abcd"}, "short"), ({"ratio": 1.0}, "ratio"), ({"colour": "green"}, "colour"),
    ({"mode": "medium"}, "mode"), ({"where": {"x": -1, "y": 0}}, "where.x"), ({"where": {"x": 1}}, "where.y"),
    ({"stars": None}, "stars"), ({"unknown": 1}, "unknown"),
])
async def test_a_call_breaking_a_constraint_is_a_tool_error_and_never_reaches_the_function(change, where) -> None:
    REACHED.clear()
    [out] = await run_tool_calls({"constrained": constrained}, [call("constrained", json.dumps({**GOOD, **change}))])
    assert not out.ok and out.text.startswith(f"error: bad arguments for constrained: {where}:")
    assert REACHED == []


async def test_a_call_within_the_constraints_reaches_the_function_with_validated_values() -> None:
    REACHED.clear()
    args = {**GOOD, "colour": "blue", "mode": "slow", "where": {"x": 1, "y": 2}, "note": "n"}
    [out] = await run_tool_calls({"constrained": constrained}, [call("constrained", json.dumps(args))])
    assert out.ok and out.text == "ok"
    [got] = REACHED
    assert got["colour"] is Colour.BLUE and got["where"] == Point(x=1, y=2) and got["short"] == "abc"
    assert got["ratio"] == 0.5 and got["explained"] == 0


def test_a_parameter_type_without_a_json_schema_is_refused_when_the_tool_is_made() -> None:
    def takes_a_callback(cb: Callable[[int], int]) -> int:
        return cb(1)

    with pytest.raises(UserError, match="takes_a_callback.*cannot be described"):
        Tool.from_function(takes_a_callback)

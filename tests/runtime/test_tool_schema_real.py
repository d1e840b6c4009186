"""A ``@tool`` whose parameters carry pydantic constraints, on the real engine with the default
model: the schema squad sends holds every constraint, llama-server turns it into the grammar of
the forced call (it accepts the ``$defs``, ``anyOf``, ``pattern`` and bounds), and the call the
model writes under that grammar validates and reaches the function. A 135M model writes what
the grammar allows; whether its values are *sensible* is not what is asserted."""

from __future__ import annotations

import json
from enum import Enum
from pathlib import Path
from typing import Annotated, Literal

import pytest
from pydantic import BaseModel, Field

from launch_support import THREADS
from squad.engine.session import EngineSpec
from squad.events import Event
from squad.runtime.agent import Agent
from squad.runtime.squad import Squad
from squad.runtime.tools import tool

pytestmark = [pytest.mark.engine, pytest.mark.anyio]

BOOKED: list[dict] = []


class Room(str, Enum):
    SINGLE = "single"
    DOUBLE = "double"


class Stay(BaseModel):
    nights: int = Field(ge=1, le=5, description="nights to stay")
    room: Room = Room.DOUBLE


@tool
def book(
    guests: Annotated[list[Annotated[str, Field(min_length=1, max_length=12)]], Field(min_length=2, max_length=3)],
    stay: Stay,
    code: str = Field(pattern=r"^[A-Z]{3}$"),
    meal: Literal["none", "breakfast"] = "none",
    note: Annotated[str | None, Field(max_length=20)] = None,
) -> str:
    """Book a hotel room.

    Args:
        guests: the guests' first names (two or three)
        stay: how long and which room
        code: the hotel's three-letter code
        meal: the meal plan
        note: a short note for the hotel
    """
    BOOKED.append({"guests": guests, "stay": stay, "code": code, "meal": meal, "note": note})
    return "booked"


@pytest.mark.timeout(900)  # two model calls on 2 shared cores
async def test_a_constrained_schema_becomes_the_engines_grammar_and_the_call_validates(
    llama_server_path: Path, default_model_path: Path
) -> None:
    BOOKED.clear()
    params = book.parameters()
    assert params["properties"]["guests"]["minItems"] == 2 and params["properties"]["guests"]["maxItems"] == 3
    assert params["$defs"]["Stay"]["properties"]["nights"]["maximum"] == 5
    assert params["properties"]["code"]["pattern"] == "^[A-Z]{3}$" and "code" in params["required"]
    agent = Agent(name="clerk", instructions="You book hotel rooms with the book tool.", budget=2048, max_tokens=160,
                  tools=["book"], tool_choice="book", parallel_tool_calls=False,
                  sampling={"temperature": 0.0, "seed": 1})
    events: list[Event] = []
    spec = EngineSpec(model=default_model_path, binary=llama_server_path, threads=THREADS)
    async with Squad([agent], engine=spec, tools=[book], on_event=events.append) as sq:
        result = await sq.run_agent("clerk", "Book the PAR hotel for Ann and Bob, two nights, with breakfast.")

    call = result.history[1]["tool_calls"][0]
    assert call["function"]["name"] == "book"
    sent = json.loads(call["function"]["arguments"])
    book.args_model.model_validate(sent)  # what the grammar let the model write holds every constraint
    assert result.history[2]["content"] == "booked"  # not "error: bad arguments ..."
    [got] = BOOKED
    assert 2 <= len(got["guests"]) <= 3 and isinstance(got["stay"], Stay) and 1 <= got["stay"].nights <= 5
    assert len(got["code"]) == 3 and got["code"].isupper() and got["meal"] in ("none", "breakfast")
    assert [(e.data["tool"], e.data["ok"]) for e in events if e.kind == "tool.called"][0] == ("book", True)

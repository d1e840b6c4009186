"""Structured output: answers as typed values, on the built-in model.

``output_type`` (a pydantic model here) is sent to llama-server as a JSON schema
(``response_format``), so the engine's grammar makes the model write JSON of that shape; squad
validates it into an instance (``result.output_value``) and asks once more, showing the error,
if it does not validate. The second agent uses a tool first: its schema goes only with the
answering round (llama-server lets a schema's grammar win over tools).

The shape is guaranteed; what a 135M model puts in it often is not right (it may call the tool
with the city instead of the country, or name the wrong city): a larger model does better.

    .venv/bin/python examples/structured.py
"""

from __future__ import annotations

import argparse
from typing import Annotated

import anyio
from pydantic import BaseModel, Field

from squad import Agent, Squad, tool


class City(BaseModel):
    city: str
    country: str


class Trip(BaseModel):
    # bounds go into the schema (maxLength, maxItems, ...), so the engine's grammar keeps a
    # small model from writing until max_tokens
    destination: str = Field(max_length=40)
    days: int = Field(ge=1, le=30)
    packing: list[Annotated[str, Field(max_length=30)]] = Field(max_length=3)


@tool
def capital(country: str) -> str:
    """The capital city of a country.

    Args:
        country: the country's name in English
    """
    return {"france": "Paris", "italy": "Rome", "japan": "Tokyo"}.get(country.strip().lower(), "unknown")


SAMPLING = {"temperature": 0.0, "seed": 1}
AGENTS = [
    Agent(name="geo", instructions="Answer with the city and its country.", output_type=City,
          max_tokens=64, sampling=SAMPLING),
    Agent(name="planner", instructions="Use the capital tool, then plan a short trip there.", tools=["capital"],
          tool_choice="required", output_type=Trip, max_tokens=128, sampling=SAMPLING),
]


async def main(model: str | None, threads: int) -> None:
    async with Squad(AGENTS, model=model, tools=[capital], threads=threads) as sq:
        found = await sq.run_agent("geo", "Which city is the Colosseum in?")
        trip = await sq.run_agent("planner", "Plan three days in the capital of Japan.")
    for result in (found, trip):
        print(f"\n{result.agent}: {type(result.output_value).__name__} -> {result.output_value!r}")
        for name, arguments, output in result.tool_calls:
            print(f"  tool {name}({arguments}) -> {output.strip()}")
        print(f"  JSON: {result.output}")
        print(f"  {result.summary()}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="model name or .gguf path (default: the default model)")
    parser.add_argument("--threads", type=int, default=2, help="llama-server threads (-t)")
    args = parser.parse_args()
    anyio.run(main, args.model, args.threads)

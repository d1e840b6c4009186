"""Tools: a Python function tool and a sub-agent exposed as a tool (``ask_<name>``).

The model decides whether to call them; tool errors go back to it as tool results. A
135M model is not a reliable tool caller, so this example prints what happened either
way: the tool calls made, their results, and the final answer.

    .venv/bin/python examples/tools.py
"""

from __future__ import annotations

import argparse
import datetime

import anyio

from squad.agent import Agent
from squad.runtime import Squad
from squad.tools import tool


@tool
def days_until(date: str) -> int:
    """Days from today until a date.

    Args:
        date: the date as YYYY-MM-DD
    """
    return (datetime.date.fromisoformat(date) - datetime.date.today()).days


AGENTS = [
    Agent(
        name="planner",
        description="plans trips",
        instructions="You plan trips. Use the tools when they help, then answer in one sentence.",
        budget=1536,
        max_tokens=64,
        tools=["days_until"],
        agents=["weather"],
        sampling={"temperature": 0.0, "seed": 1},
    ),
    Agent(
        name="weather",
        description="knows the usual weather of a city in a given month",
        instructions="You describe a city's usual weather in one short sentence.",
        budget=512,
        max_tokens=32,
        sampling={"temperature": 0.0, "seed": 1},
    ),
]


async def main(model: str | None) -> None:
    async with Squad(AGENTS, model=model, tools=[days_until], threads=2) as sq:
        result = await sq.run_agent("planner", "How many days until 2031-07-01, and what is Paris like in July?")
    for name, arguments, output in result.tool_calls:
        print(f"tool {name}({arguments}) -> {output}")
    for sub in result.subs:
        print(f"sub-agent {sub.summary()}")
    print(f"\nplanner: {result.output.strip()}")
    print(result.summary())


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="model name or .gguf path (default: the default model)")
    anyio.run(main, parser.parse_args().model)

"""Tools: a Python function tool and a sub-agent exposed as a tool (``ask_<name>``).

The built-in model's own chat template has no tools section, so squad starts llama-server
with its ChatML tool template (shown as ``squad:chatml-tools``): the engine renders the tool
definitions and parses the model's calls into its own ``tool_calls``. squad runs the calls
and sends the results back as ``tool`` messages.

A 135M model is not a reliable tool caller, so the planner is made to call first
(``tool_choice="days_until"``, for its first round only) and the weather agent is asked the
same way; the example prints every call, its arguments and result, and the final answers.

    .venv/bin/python examples/tools.py
"""

from __future__ import annotations

import argparse
import datetime

import anyio

from squad import Agent, Squad, tool


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
        tool_choice="days_until",
        parallel_tool_calls=False,
        sampling={"temperature": 0.0, "seed": 1},
    ),
    Agent(
        name="traveller",
        description="asks about the weather",
        instructions="You answer questions. Ask the weather sub-agent about the weather.",
        budget=2048,
        max_tokens=128,
        agents=["weather"],
        tool_choice="ask_weather",
        parallel_tool_calls=False,
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


async def main(model: str | None, threads: int) -> None:
    async with Squad(AGENTS, model=model, tools=[days_until], threads=threads) as sq:
        print(f"chat template: {sq.info.template_name}")
        results = [await sq.run_agent("planner", "How many days until 2031-07-01?"),
                   await sq.run_agent("traveller", "Weather in Paris?")]
    for result in results:
        print(f"\n{result.agent}:")
        ids = [call["id"] for message in result.history for call in message.get("tool_calls") or []]
        for call_id, (name, arguments, output) in zip(ids, result.tool_calls):  # as the engine returned them
            print(f"  engine tool_call {call_id[:8]}… {name}({arguments}) -> {output.strip()[:200]}")
        for sub in result.subs:
            print(f"  sub-agent {sub.summary()}")
        print(f"  answer: {result.output.strip()}")
        print(f"  {result.summary()}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="model name or .gguf path (default: the default model)")
    parser.add_argument("--threads", type=int, default=2, help="llama-server threads (-t)")
    args = parser.parse_args()
    anyio.run(main, args.model, args.threads)

"""Tool calls on the built-in model: how often they are right, with tool_choice required and auto.

Three fixed tasks, each offered the same three function tools (so "the right tool" means
something). Every task runs ``--runs`` times per mode with sampling seeds 1..N (temperature
0.7), all through squad on one engine started with squad's ChatML tool template. Per turn:

- called: the first model round made a tool call (the engine's own ``tool_calls``);
- right tool: the first call named the task's tool;
- right arguments: its arguments parsed as JSON and equal to the task's;
- answer uses result: the final answer contains the value the tool returned.

Each turn has at most two model rounds (``max_tool_rounds=1``): the round that may call (forced
with ``required``), then one that must answer; ``max_tokens`` 48. A grammar makes a call
well-formed; it does not make it right: these shares are what the 135M model does with the
calls it is made to write.

    .venv/bin/python bench/tools.py [--runs 20] [--slots 4]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import BINARY, MODEL, THREADS, engine_build, md_table
from squad.engine.session import EngineSpec
from squad.runtime.agent import Agent
from squad.runtime.squad import Squad
from squad.runtime.tools import tool


@tool
def get_weather(city: str) -> str:
    """The current weather of a city.

    Args:
        city: the city's name, e.g. Paris
    """
    return f"{city}: 21 C and sunny"


@tool
def add(a: int, b: int) -> int:
    """Add two whole numbers.

    Args:
        a: the first number
        b: the second number
    """
    return a + b


@tool
def to_celsius(fahrenheit: float) -> float:
    """Convert a temperature from Fahrenheit to Celsius.

    Args:
        fahrenheit: the temperature in degrees Fahrenheit
    """
    return round((fahrenheit - 32) * 5 / 9, 1)


@dataclass(frozen=True)
class Task:
    name: str
    prompt: str
    tool: str
    arguments: dict[str, Any]
    result: str  # what the final answer must contain to use the tool's result


TASKS = [
    Task("weather", "What is the weather in Paris right now?", "get_weather", {"city": "Paris"}, "21"),
    Task("add", "What is 1234 plus 4321?", "add", {"a": 1234, "b": 4321}, "5555"),
    Task("celsius", "How much is 212 degrees Fahrenheit in Celsius?", "to_celsius", {"fahrenheit": 212}, "100"),
]
MODES = ["required", "auto"]


def agent(mode: str, seed: int) -> Agent:
    return Agent(name=f"{mode}-{seed}", instructions="You answer questions. Use the tools when they help.",
                 budget=2048, max_tokens=48, tools=["get_weather", "add", "to_celsius"], tool_choice=mode,
                 parallel_tool_calls=False, sampling={"temperature": 0.7, "seed": seed})


def judge(task: Task, result: Any) -> dict[str, bool]:
    first = result.history[1] if len(result.history) > 1 else {}
    calls = first.get("tool_calls") or []
    call = calls[0]["function"] if calls else None
    try:
        args = json.loads(call["arguments"]) if call else None
    except ValueError:
        args = None
    used = bool(calls) and task.result in (result.output or "")
    return {"called": bool(calls), "right tool": bool(call and call["name"] == task.tool),
            "right arguments": bool(call and call["name"] == task.tool and args == task.arguments),
            "answer uses result": used}


async def main(runs: int, slots: int) -> None:
    agents = [agent(mode, seed) for mode in MODES for seed in range(1, runs + 1)]
    spec = EngineSpec(model=MODEL, binary=BINARY, threads=THREADS, slots=slots, ctx=2048 * slots)
    scores: dict[tuple[str, str], list[dict[str, bool]]] = {}
    started = time.monotonic()
    async with Squad(agents, engine=spec, tools=[get_weather, add, to_celsius], max_tool_rounds=1) as sq:
        template = sq.info.template_name
        limit = anyio.CapacityLimiter(slots)

        async def one(task: Task, mode: str, seed: int) -> None:
            async with limit:
                result = await sq.run_agent(f"{mode}-{seed}", task.prompt)
            scores.setdefault((task.name, mode), []).append(judge(task, result))

        async with anyio.create_task_group() as tg:
            for task in TASKS:
                for mode in MODES:
                    for seed in range(1, runs + 1):
                        tg.start_soon(one, task, mode, seed)
    took = time.monotonic() - started
    columns = ["called", "right tool", "right arguments", "answer uses result"]
    rows = []
    for mode in MODES:
        for task in [*TASKS, None]:
            turns = [s for (t, m), got in scores.items() if m == mode and (task is None or t == task.name) for s in got]
            label = task.name if task else "**all**"
            rows.append([mode, label, len(turns), *(f"{sum(s[c] for s in turns) / len(turns):.0%}" for c in columns)])
    print(f"### Tool calls on {MODEL.name}, {runs} runs per task and mode ({took:.0f} s)\n")
    print(f"Engine: {engine_build()}; chat template: {template}; {slots} slots, {THREADS} threads.\n")
    print(md_table(["tool_choice", "task", "turns", *columns], rows))
    print("\nTasks: " + "; ".join(f"{t.name}: \"{t.prompt}\" → {t.tool}({json.dumps(t.arguments)}), answer must "
                                   f"contain {t.result!r}" for t in TASKS) + ".")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20, help="runs per task and mode (seeds 1..N)")
    parser.add_argument("--slots", type=int, default=4, help="engine slots (turns run at once)")
    ns = parser.parse_args()
    anyio.run(main, ns.runs, ns.slots)

"""Tool results on the REAL llama-server with the default model: a result larger than the room
the agent has left is cut (a ``tool.truncated`` event) and the step completes, where it used
to end the run with ``AdmissionError ... shorten the prompt``; and an ecosystem MCP server
from PyPI (``mcp-server-time``, run unchanged) gets an auto-budgeted two-step recipe through
its second model round, which the first-round-only budget (768 tokens) could not hold.

A 135M model is not a reliable tool caller, so the first call is forced (``tool_choice``);
what is asserted is what squad and the engine do, not the answer's quality."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from launch_support import THREADS
from squad.engine.session import EngineSpec
from squad.events import CallFinished, Event, ToolTruncated
from squad.runtime.agent import Agent
from squad.runtime.squad import Squad
from squad.runtime.tools import tool

pytestmark = [pytest.mark.engine]
ROOT = Path(__file__).resolve().parents[2]
SAMPLING = {"temperature": 0.0, "seed": 1}


def page(chars: int) -> str:
    return " ".join(f"line {i} of the page says nothing much." for i in range(chars // 20 + 1))[:chars]


@tool
def read_page(name: str) -> str:
    """Read a web page.

    Args:
        name: the page's name
    """
    return page(50_000)


@tool
def read_note(name: str) -> str:
    """Read a note.

    Args:
        name: the note's name
    """
    return page(3_000)


@pytest.mark.anyio
@pytest.mark.timeout(900)
async def test_a_50k_and_a_3k_tool_result_at_budget_512_complete_with_a_truncation_event(
        llama_server_path: Path, default_model_path: Path) -> None:
    events: list[Event] = []
    agents = [
        Agent(name="reader", instructions="You read pages with your tool and sum them up in one line.",
              max_tokens=32, tools=["read_page"], tool_choice="required", parallel_tool_calls=False,
              max_tool_rounds=2, sampling=SAMPLING),  # budget auto: the plan's share
        Agent(name="noter", instructions="You read notes with your tool and sum them up in one line.", budget=512,
              max_tokens=32, tools=["read_note"], tool_choice="required", parallel_tool_calls=False,
              max_tool_rounds=2, sampling=SAMPLING),
    ]
    spec = EngineSpec(model=default_model_path, binary=llama_server_path, threads=THREADS, ctx=4096)
    async with Squad(agents, engine=spec, tools=[read_page, read_note], on_event=events.append) as sq:
        reader = await sq.run_agent("reader", "Read the page 'home'.")
        noter = await sq.run_agent("noter", "Read the note 'todo'.")
        reader_budget = sq.context_limit(sq.agents["reader"])
    for result, name, budget in ((reader, "read_page", reader_budget), (noter, "read_note", 512)):
        assert result.error is None and result.ok
        assert result.tool_calls and result.tool_calls[0][0] == name  # the engine's own call ran the tool
        cuts = [e for e in events if isinstance(e, ToolTruncated) and e.tool == name]
        assert cuts and cuts[0].budget == budget and cuts[0].kept_tokens <= cuts[0].room_tokens
        seen = result.tool_calls[0][2]
        assert f"[squad cut this result of tool '{name}'" in seen and len(seen) < cuts[0].result_chars
        # every round after the tool call reached the engine and came back
        done = [e for e in events if isinstance(e, CallFinished) and e.agent == result.agent]
        assert len(done) >= 2 and all(e.prompt_tokens + 32 <= budget for e in done)


@pytest.mark.timeout(1500)  # four model calls; on 2 shared, loaded cores this took 540 s
def test_mcp_server_time_from_pypi_runs_an_auto_budgeted_two_step_recipe(tmp_path: Path, llama_server_path: Path,
                                                                         default_model_path: Path) -> None:
    pytest.importorskip("mcp_server_time", reason="mcp-server-time is in the test extra: pip install -e '.[test]'")
    recipe = tmp_path / "clock.yaml"
    recipe.write_text(
        "name: clock\n"
        "mcp:\n  time:\n    command: python\n    args: [-m, mcp_server_time, --local-timezone, UTC]\n"
        "agents:\n  clock:\n    instructions: You tell the time. Use your tools.\n    max_tokens: 96\n"
        "    sampling: {temperature: 0.0, seed: 1}\n    tools: [time.*]\n    tool_choice: time.get_current_time\n"
        "main: clock\nflow:\n"
        "  - id: now\n    agent: clock\n    prompt: What time is it in UTC?\n"
        "  - id: say\n    agent: clock\n    prompt: 'Say this in one short sentence: {{ steps.now.output }}'\n")
    env = {**os.environ, "SQUAD_STATE_DIR": str(tmp_path / "state"), "PYTHONPATH": str(ROOT / "src")}
    trace = tmp_path / "trace.jsonl"
    proc = subprocess.run(
        [sys.executable, "-m", "squad", "run", str(recipe), "--llama-server", str(llama_server_path),
         "-t", str(THREADS), "--trace", str(trace), "--json"],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=1400)
    assert proc.returncode == 0, proc.stderr
    assert "AdmissionError" not in proc.stderr and "needs" not in proc.stderr
    events = [json.loads(line) for line in trace.read_text().splitlines()]
    planned = [e for e in events if e["kind"] == "engine.planned"]
    assert planned  # squad planned the budget itself (auto)
    tools = [e for e in events if e["kind"] == "tool.called"]
    assert tools and tools[0]["data"]["tool"] == "get_current_time" and tools[0]["data"]["ok"]
    first = tools[0]["conversation"]
    rounds = [e for e in events if e["kind"] == "call.finished" and e["conversation"] == first]
    assert len(rounds) >= 2  # the model round after the tool result ran and came back
    assert json.loads(proc.stdout)["steps"]["say"]["outcome"] in ("ok", "truncated", "empty")

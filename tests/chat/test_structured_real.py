"""Structured output on the REAL llama-server with the default model (kept small: 2 shared cores).

What each test proves:

- a pydantic ``output_type`` is sent as ``response_format`` (llama-server's grammar makes the
  answer JSON of the schema) and comes back as an instance (``output_value``);
- with a function tool as well: the call comes from the engine's ``tool_calls`` (forced in the
  first round), the schema is sent only in the answering round without tools (b11434 lets a
  schema's grammar win over tools), and the answer validates;
- field case F12 through ``squad run``: the recipe's ``output.schema`` is sent, the final
  output is JSON of it (exit 0); a schema the grammar cannot enforce (``multipleOf``) misses
  twice, and the run exits 1 with the raw text printed and written to ``--out``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from pydantic import BaseModel

from launch_support import THREADS
from squad.engine.session import EngineSpec
from squad.runtime.agent import Agent
from squad.runtime.squad import Squad
from squad.runtime.tools import tool

pytestmark = [pytest.mark.engine]
ROOT = Path(__file__).resolve().parents[2]
SMALL = dict(max_tokens=64, sampling={"temperature": 0.0, "seed": 1})


class City(BaseModel):
    city: str
    country: str


@tool
def capital(country: str) -> str:
    """The capital city of a country."""
    return {"france": "Paris", "italy": "Rome"}.get(country.strip().lower(), "unknown")


def _spec(llama_server_path: Path, default_model_path: Path) -> EngineSpec:
    return EngineSpec(model=default_model_path, binary=llama_server_path, threads=THREADS, slots=1, ctx=2048)


@pytest.mark.anyio
async def test_a_json_schema_answer_is_parsed_into_the_pydantic_model(llama_server_path, default_model_path):
    agent = Agent(name="geo", instructions="Answer with the city and its country.", output_type=City, **SMALL)
    async with Squad([agent], engine=_spec(llama_server_path, default_model_path)) as sq:
        result = await sq.run("Which city is the Eiffel Tower in?")
    assert isinstance(result.output_value, City)
    assert City.model_validate_json(result.output) == result.output_value
    assert result.main.usage.prompt_tokens > 0


@pytest.mark.anyio
async def test_a_tool_round_then_a_schema_answer_on_the_real_engine(llama_server_path, default_model_path):
    agent = Agent(name="geo", instructions="Use the capital tool, then answer with the city and its country.",
                  tools=["capital"], tool_choice="required", output_type=City, **SMALL)
    async with Squad([agent], engine=_spec(llama_server_path, default_model_path), tools=[capital]) as sq:
        assert sq.info.template_has_tools  # squad's ChatML tool template, read back from /props
        result = await sq.run("What is the capital of France?")
    assert result.main.tool_calls and result.main.tool_calls[0][0] == "capital"  # the engine's tool_calls
    assert isinstance(result.output_value, City)
    assert result.main.timings.calls >= 2


F12 = textwrap.dedent("""\
    name: f12
    main: geo
    agents:
      geo:
        instructions: Answer with the city and its country.
        max_tokens: 64
        sampling: {temperature: 0.0, seed: 1}
    flow:
      - id: ask
        prompt: Which city is the Eiffel Tower in?
    output:
      schema: {SCHEMA}
    """)
CITY = "{type: object, properties: {city: {type: string}, country: {type: string}}, required: [city, country]}"
UNREACHABLE = "{type: object, properties: {n: {type: integer, minimum: 1, multipleOf: 7919}}, required: [n]}"


def _run(tmp_path: Path, llama_server_path: Path, schema: str) -> tuple[subprocess.CompletedProcess, Path]:
    recipe = tmp_path / "f12.yaml"
    recipe.write_text(F12.replace("{SCHEMA}", schema))
    out = tmp_path / "out.txt"
    env = {**os.environ, "SQUAD_STATE_DIR": str(tmp_path / "state"), "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.run([sys.executable, "-m", "squad", "run", str(recipe), "--llama-server", str(llama_server_path),
                           "-t", str(THREADS), "-q", "--out", str(out), "--trace", str(tmp_path / "trace.jsonl")],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=900)
    return proc, out


def test_f12_the_recipe_schema_is_sent_and_the_output_is_its_json(tmp_path, llama_server_path, default_model_path):
    proc, out = _run(tmp_path, llama_server_path, CITY)
    assert proc.returncode == 0, proc.stderr
    value = json.loads(proc.stdout)
    assert set(value) >= {"city", "country"} and all(isinstance(v, str) for v in value.values())
    assert json.loads(out.read_text()) == value


@pytest.mark.timeout(900)
def test_f12_a_miss_exits_1_keeping_the_raw_text_on_stdout_and_in_out(tmp_path, llama_server_path,
                                                                      default_model_path):
    proc, out = _run(tmp_path, llama_server_path, UNREACHABLE)
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr and "does not match its output schema" in proc.stderr
    assert "multiple of 7919" in proc.stderr
    assert '"n"' in proc.stdout and '"n"' in out.read_text()  # the raw JSON the model gave, kept
    kinds = [json.loads(line)["kind"] for line in (tmp_path / "trace.jsonl").read_text().splitlines()]
    assert "output.retried" in kinds


@pytest.mark.timeout(900)  # ~5 s quiet; several tool rounds at 128 tokens when the cores are shared
def test_the_structured_example_runs_on_the_built_in_model(tmp_path, llama_server_path, default_model_path):
    env = {**os.environ, "SQUAD_STATE_DIR": str(tmp_path / "state"), "PYTHONPATH": str(ROOT / "src"),
           "SQUAD_LLAMA_SERVER": str(llama_server_path)}
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / "structured.py")], capture_output=True, text=True,
                          env=env, cwd=tmp_path, timeout=900)
    assert proc.returncode == 0, proc.stderr
    assert "geo: City -> City(" in proc.stdout and "planner: Trip -> Trip(" in proc.stdout
    assert "tool capital(" in proc.stdout

"""Field case F20 on the real engine: `squad engine start` runs squad serve in the background, so
two `squad run --url` processes share ONE admission. Each call holds ~1,000 prompt tokens + 32 on a
2,048-token pool with 2 slots: two at once would overflow it (each process admitting on its own
did, F20); through the shared admission both runs finish. Their calls are admitted one by one
(per call, not a lock around a run), and neither process reserves on its own side."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from launch_support import THREADS, wait_gone

pytestmark = pytest.mark.engine

RECIPE = """\
name: f20
agents:
  reader: {instructions: "You answer in one short sentence.", budget: 1536, max_tokens: 32}
main: reader
params:
  text: {type: string, required: true}
flow:
  - id: first
    agent: reader
    prompt: "What is this text about? {{ params.text }}"
  - id: second
    agent: reader
    prompt: "Name one word from this text: {{ params.text }}"
"""


def squad(*args: str, env: dict[str, str], **kwargs) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "squad", *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kwargs)


@pytest.mark.timeout(900)
def test_two_runs_on_one_started_engine_share_its_admission(tmp_path, llama_server_path, default_model_path):
    env = {**os.environ, "SQUAD_STATE_DIR": str(tmp_path / "state"),
           "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src")}
    env.pop("LLAMA_API_KEY", None)
    recipe = tmp_path / "f20.yaml"
    recipe.write_text(RECIPE)
    text = tmp_path / "text.txt"
    text.write_text("the cat sat on the mat and looked at the rain outside the window " * 70)
    started = squad("engine", "start", "-np", "2", "-c", "2048", "-t", str(THREADS),
                    "--llama-server", str(llama_server_path), "-m", str(default_model_path), env=env)
    out, err = started.communicate(timeout=300)
    assert started.returncode == 0, out + err
    record = json.loads((tmp_path / "state" / "engine.json").read_text())
    try:
        status = squad("engine", "status", "--json", env=env)
        assert json.loads(status.communicate(timeout=60)[0])["admits"] is True
        runs = [squad("run", str(recipe), "--url", record["url"], "-q", "-p", f"text=@{text}", "--trace",
                      str(tmp_path / f"run{i}.jsonl"), env=env) for i in range(2)]
        results = [run.communicate(timeout=600) for run in runs]
        for run, (out, err) in zip(runs, results):
            assert run.returncode == 0, err
            assert out.strip()
        served = httpx.get(record["url"] + "/squad/status", timeout=10,
                           headers={"Authorization": f"Bearer {record['api_key']}"}).json()
        assert served["clients"]["reader"]["completed"] == 4  # two calls per run, admitted per call
        assert served["clients"]["reader"]["failed"] == 0
        assert served["admission"]["pool"] == 2048 and served["peaks"]["requests"] >= 2
        for i in range(2):  # neither process queued or reserved on its own side
            kinds = [json.loads(line)["kind"] for line in (tmp_path / f"run{i}.jsonl").read_text().splitlines()]
            assert "call.finished" in kinds and "call.admitted" not in kinds
    finally:
        stopped = squad("engine", "stop", env=env)
        stopped.communicate(timeout=60)
        assert wait_gone(record["pid"])

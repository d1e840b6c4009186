"""Resumable runs on the REAL llama-server (issue 32, item 3).

The shipped review recipe (``recipes/review.yaml`` and its reviewers; chunks of 120 tokens, so the
test's code is 5 chunks per reviewer, and short answers) runs on the default model until reviewer
'security' has finished 2 of its 5 chunks, and is stopped there as Ctrl-C stops it. The resumed run
sends the engine only the calls its journal does not hold: counted from squad's trace
(``call.finished``) and checked against the engine's own ``/metrics`` (the tokens it generated in
the resumed run are exactly those squad's calls report)."""

from __future__ import annotations

import re
from pathlib import Path

import anyio
import httpx
import pytest

from launch_support import THREADS
from squad.engine.launcher import Launcher
from squad.engine.session import EngineSpec, plan_engine
from squad.events import AgentFinished, AgentResumed, CallFinished
from squad.recipes import load_recipe, run_recipe
from squad.recipes.resume import recipe_journal
from squad.runtime.journal import read_journal

pytestmark = [pytest.mark.engine, pytest.mark.anyio]

ROOT = Path(__file__).resolve().parents[2]
CODE = "\n".join(f"def f{i}(x):  # part {i}\n" + "    y = x + 1  # add one to the value\n" * 6 +
                 "    return y\n" for i in range(5))


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
async def engine(llama_server_path, default_model_path, tmp_path_factory):
    plan = plan_engine(EngineSpec(model=default_model_path, slots=3, ctx=4096), None)
    async with Launcher(plan, binary=llama_server_path, threads=THREADS,
                        log_dir=tmp_path_factory.mktemp("logs-resume")) as launched:
        assert launched.info is not None
        yield launched.info


def review(tmp_path: Path) -> Path:
    (tmp_path / "agents").mkdir()
    agents = (ROOT / "recipes/agents/reviewers.yaml").read_text().replace("max_tokens: 96", "max_tokens: 12")
    agents = agents.replace("temperature: 0.2}", "temperature: 0.0, seed: 1}")
    (tmp_path / "agents" / "reviewers.yaml").write_text(agents)
    text = (ROOT / "recipes/review.yaml").read_text().replace("chunk_tokens: 7000", "chunk_tokens: 120")
    path = tmp_path / "review.yaml"
    path.write_text(text.replace("max_tokens: 384", "max_tokens: 16"))
    return path


async def _predicted(info) -> float:
    """The engine's ``llamacpp:tokens_predicted_total``."""
    headers = {"Authorization": f"Bearer {info.api_key}"} if info.api_key else {}
    async with httpx.AsyncClient(base_url=info.base_url, headers=headers, timeout=60) as http:
        text = (await http.get("/metrics")).text
    return float(re.search(r"^llamacpp:tokens_predicted_total (\S+)$", text, re.M).group(1))


@pytest.mark.timeout(900)
async def test_a_review_stopped_after_2_of_5_chunks_resumes_with_only_the_rest(engine, tmp_path, monkeypatch):
    monkeypatch.setenv("SQUAD_STATE_DIR", str(tmp_path / "state"))
    path = review(tmp_path)
    recipe = load_recipe(path, {"code": CODE})
    assert len(recipe.items(recipe.flow[0].steps[0], {})) == 5
    total = 3 * 5 + 1  # three reviewers over 5 chunks, then the lead
    journal = recipe_journal(recipe)
    first: list = []
    with anyio.CancelScope() as scope:
        def stop(event) -> None:
            first.append(event)
            done = [e for e in first if isinstance(e, AgentFinished) and e.agent == "security"]
            if len(done) == 2 and isinstance(event, AgentFinished) and event.agent == "security":
                scope.cancel()  # as Ctrl-C: every call in flight is cancelled
        await run_recipe(recipe, engine=engine, on_event=stop, journal=journal)
    assert scope.cancelled_caught
    recorded = [line for held in read_journal(journal.path)[1].values() for line in held]
    assert {"security[0]", "security[1]"} <= {c["label"] for c in recorded} and len(recorded) < total

    before = await _predicted(engine)
    events: list = []
    run = await run_recipe(load_recipe(path, {"code": CODE}), engine=engine, on_event=events.append,
                           journal=recipe_journal(load_recipe(path, {"code": CODE}), "last"))
    after = await _predicted(engine)
    sent = [e for e in events if isinstance(e, CallFinished)]
    assert len(sent) == total - len(recorded)  # only the calls that had not finished went to the engine
    assert len([e for e in events if isinstance(e, AgentResumed)]) == len(recorded)
    # what the engine generated in the resumed run is exactly what squad's calls report
    assert after - before == sum(e.completion_tokens or 0 for e in sent)
    assert not run.errors and run.steps["merge"]["outcome"] in ("ok", "truncated")
    assert sorted(label for _, label in run.resumed) == sorted(c["label"] for c in recorded)

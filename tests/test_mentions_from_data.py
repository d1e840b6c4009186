"""F13: @mentions come only from the author's text. Values substituted into a recipe template
(step outputs, -p parameters, map items) are data: an @ in them never dispatches anyone and is
never an unknown-agent error; the model still sees the text unchanged."""

from __future__ import annotations

from pathlib import Path

import pytest

from squad.mention import DATA_CLOSE, DATA_OPEN
from squad.recipes import load_recipe, run_recipe
from squad.testing import ScriptedEngine

RECIPE = """\
name: f13
params:
  code: {{type: string, default: "x = 1"}}
agents:
  facts: {{instructions: You state facts., max_tokens: 32, budget: 1024}}
  checker: {{instructions: You check., max_tokens: 32, budget: 1024}}
  lead: {{instructions: You merge., max_tokens: 32, budget: 2048, agents: [checker], sub_agent_tools: false}}
main: lead
flow:
  - id: facts
    agent: facts
    prompt: "What is wrong here? {{{{ params.code }}}}"
  - id: merge
    agent: lead
    prompt: "{mention}Notes: {{{{ steps.facts.output }}}} Code: {{{{ params.code }}}}"
"""


def unmarked(text: str) -> bool:
    return DATA_OPEN not in text and DATA_CLOSE not in text


def recipe(tmp_path: Path, mention: str = "", **params: str):
    path = tmp_path / "f13.yaml"
    path.write_text(RECIPE.format(mention=mention))
    return load_recipe(path, params)


def replies(answer: str):
    sent: list[tuple[str, str]] = []

    def respond(req):
        text = req.messages[-1]["content"]
        sent.append((req.agent, text))
        return answer if req.agent == "facts" else f"ok from {req.agent}"

    return ScriptedEngine(responder=respond, slots=3), sent


@pytest.mark.anyio
@pytest.mark.parametrize("answer", [
    "The fix is in the login handler; for access ping @ops-team or mail help@example.org.",
    "@checker please look at this",
])
async def test_a_model_answer_never_dispatches_or_fails(tmp_path, answer):
    engine, sent = replies(answer)
    run = await run_recipe(recipe(tmp_path), engine=engine)
    assert run.output == "ok from lead" and not run.errors
    assert [agent for agent, _ in sent] == ["facts", "lead"]  # checker was never called
    lead_text = sent[-1][1]
    assert answer in lead_text and unmarked(lead_text)  # the model sees the text as it was


@pytest.mark.anyio
async def test_a_parameter_full_of_decorators_is_data(tmp_path):
    code = "@dataclass\nclass A:\n    x: int  # mail me@example.org\n@checker"
    engine, sent = replies("fine")
    run = await run_recipe(recipe(tmp_path, code=code), engine=engine)
    assert run.output == "ok from lead"
    assert [agent for agent, _ in sent] == ["facts", "lead"]
    assert all(unmarked(text) for _, text in sent) and code in sent[0][1]


@pytest.mark.anyio
async def test_the_authors_own_mention_still_dispatches(tmp_path):
    engine, sent = replies("@nobody said hi")
    run = await run_recipe(recipe(tmp_path, mention="@checker "), engine=engine)
    assert run.output == "ok from lead"
    assert [agent for agent, _ in sent] == ["facts", "checker", "lead"]
    assert all(unmarked(text) for _, text in sent)

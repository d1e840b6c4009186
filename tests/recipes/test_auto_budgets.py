"""Auto budgets planned from the real, counted work (squad.recipes.budgets.plan_budgets) and,
without a prompt, from the model's context shared by the agents at once (squad.sched.planner).

Recipe tests count with the default model's file (pulled if absent, see conftest); no test
here starts an engine except the one marked ``engine``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import anyio
import pytest

from squad.cli import main as squad_main
from squad.cli._app import collect_params
from squad.engine.llama import round_ctx
from squad.errors import RecipeError, UserError
from squad.recipes import load_recipe
from squad.recipes.budgets import headroom
from squad.sched.planner import plan
from squad.sched.workload import Call, Parallel, Sequence

ROOT = Path(__file__).resolve().parents[2]
REVIEW = ROOT / "recipes" / "review.yaml"
BIG = ROOT / "tests" / "data" / "review_runtime.py"  # a real ~600-line source file (a frozen copy of runtime.py: the
# live one changes with every edit, and its counts with it: a reviewer prompt then crossed a 256 boundary)
SIX_HUNDRED = ROOT / "tests" / "data" / "review_600.py"  # two of this repo's modules joined: ~620 real lines


def rows(recipe):
    return {(r.step, r.agent): r for r in recipe.budgets}


def test_headroom_is_ten_percent_at_least_64():
    assert (headroom(100), headroom(640), headroom(641), headroom(5000)) == (64, 64, 65, 500)


def test_auto_budgets_follow_the_input(default_model_path):
    small = load_recipe(REVIEW)
    big = load_recipe(REVIEW, {"code": BIG.read_text()})
    s, b = rows(small)[("security", "security")], rows(big)[("security", "security")]
    assert not s.estimated and not s.fixed and s.max_tokens == 96
    assert s.budget == round_ctx(s.prompt + 96 + headroom(s.prompt + 96))
    assert b.prompt > 4000 and b.budget == round_ctx(b.prompt + 96 + headroom(b.prompt + 96))
    assert small.agents["security"].budget == s.budget < big.agents["security"].budget == b.budget
    small_plan = plan(small.workload(), model=default_model_path, n_ctx_train=8192)
    big_plan = plan(big.workload(), model=default_model_path, n_ctx_train=8192)
    assert small_plan.n_ctx < big_plan.n_ctx == 3 * b.budget
    assert big_plan.budgets["security"] == b.budget


def test_a_step_on_earlier_outputs_is_an_estimate(default_model_path):
    recipe = load_recipe(REVIEW)
    merge = rows(recipe)[("merge", "lead")]
    assert merge.estimated and merge.max_tokens == 384
    assert merge.prompt > 3 * 96  # three reviewers' outputs stood in for at max_tokens each


def test_a_map_output_stands_in_for_all_its_items(default_model_path, tmp_path):
    path = tmp_path / "m.yaml"
    path.write_text(
        "name: m\nparams:\n  items: {type: list, default: [a, b, c, d, e]}\n"
        "agents:\n  s: {max_tokens: 100}\n  w: {max_tokens: 50}\nmain: w\n"
        "flow:\n  - {id: each, map: params.items, agent: s, prompt: 'Say {{ item }}'}\n"
        "  - {id: all, agent: w, prompt: 'Join: {{ steps.each.output }}'}\n")
    recipe = load_recipe(path)
    joined = rows(recipe)[("all", "w")]
    assert joined.estimated and 500 <= joined.prompt < 600  # 5 items x 100 tokens + the rest


def test_a_fixed_budget_stays_what_the_user_chose(default_model_path, tmp_path):
    path = tmp_path / "f.yaml"
    path.write_text("name: f\nagents:\n  a: {budget: 4096, max_tokens: 64}\nmain: a\nflow:\n  - {prompt: hi}\n")
    recipe = load_recipe(path)
    assert recipe.agents["a"].budget == 4096 and recipe.budgets[0].fixed and recipe.budgets[0].budget == 4096


ONE_PIECE = """\
name: one-piece
params:
  code: {type: string}
agents:
  reviewer: {instructions: You review code., max_tokens: 64}
main: reviewer
flow:
  - id: review
    agent: reviewer
    prompt: "Review this code:\\n{{ params.code }}"
"""


def one_piece(tmp_path):
    """A recipe that sends the whole input in one prompt (no split: chunks)."""
    path = tmp_path / "one.yaml"
    path.write_text(ONE_PIECE)
    return path


def test_a_prompt_the_model_cannot_hold_fails_at_load(default_model_path, tmp_path):
    code = tmp_path / "big.py"
    code.write_text(BIG.read_text() * 2)  # ~10,000 tokens, under 8 bytes per token of 8,192
    recipe = one_piece(tmp_path)
    with pytest.raises(RecipeError) as info:
        load_recipe(recipe, {"code": code.read_text()})
    err = info.value
    assert err.file == str(recipe) and err.line == 10 and err.field == "flow[0].prompt"
    assert err.problem.startswith("step 'review' (agent 'reviewer') cannot fit in the model even alone: "
                                  "its prompt is ")
    assert "above the model's training context of 8,192 tokens; use a model with a bigger context" in err.problem
    assert "split: chunks" in err.problem
    # the shipped review recipe reads the same input in pieces instead
    assert load_recipe(REVIEW, {"code": code.read_text()}).workload()


def test_a_prompt_far_too_large_is_refused_without_tokenizing(default_model_path, monkeypatch, tmp_path):
    from squad.engine.tokens import GGUFCounter

    monkeypatch.setattr(GGUFCounter, "count_chat", lambda *a, **k: pytest.fail("tokenized"))
    with pytest.raises(RecipeError, match=r"its prompt is [\d,]+ bytes, more than the 65,536 bytes"):
        load_recipe(one_piece(tmp_path), {"code": "x" * 70_000})


def test_at_file_reads_are_bounded(monkeypatch):
    """``-p code=@/dev/zero`` (an endless or huge file) is an error, not all of the memory."""
    import squad.cli._app as cli_app

    monkeypatch.setattr(cli_app, "AT_FILE_LIMIT", 1024)
    with pytest.raises(UserError, match=r"larger than 0 MiB"):
        collect_params(["code=@/dev/zero"])


def test_request_timeout_on_the_command_line(monkeypatch):
    """``--request-timeout`` reaches the engine spec ``run`` uses (the advice a CallTimeout gives)."""
    import squad.recipes

    seen = []

    async def fake_run(recipe, *, engine=None, **kwargs):
        seen.append(engine)
        raise RecipeError("stop here")

    monkeypatch.setattr(squad.recipes, "run_recipe", fake_run)
    with pytest.raises(SystemExit):
        squad_main(["run", str(REVIEW), "--request-timeout", "1800", "-q"])
    assert seen and seen[0].request_timeout == 1800


def test_at_file_params(tmp_path):
    f = tmp_path / "a.txt"
    f.write_text("text of a")
    assert collect_params([f"code=@{f}", "tag=@@home", "plain=x@y"]) == {
        "code": "text of a", "tag": "@home", "plain": "x@y"}
    with pytest.raises(UserError, match="cannot read the file"):
        collect_params([f"code=@{tmp_path / 'missing'}"])


def plan_cli(*args: str) -> None:
    with pytest.raises(SystemExit) as info:
        squad_main(["plan", *args])
    assert info.value.code == 0


def test_squad_plan_shows_counted_steps(default_model_path, capsys):
    plan_cli(str(REVIEW), "-p", f"code=@{BIG}")
    out = capsys.readouterr().out
    assert "budgets per step" in out and "~" in out and "(auto)" in out
    plan_cli(str(REVIEW), "-p", f"code=@{BIG}", "--json")
    data = json.loads(capsys.readouterr().out)
    steps = {s["step"]: s for s in data["steps"]}
    assert steps["merge"]["estimated"] and not steps["security"]["estimated"]
    assert steps["security"]["prompt_tokens"] > 4000 and steps["security"]["max_tokens"] == 96
    assert data["n_ctx"] == 3 * steps["security"]["budget"]


# --- no prompt known: the planner shares the context ---------------------------------------------


def test_auto_without_a_prompt_shares_the_training_context(tmp_path):
    model = tmp_path / "m.gguf"
    three = Parallel((Call("a", None), Call("b", None), Call("c", None)))
    p = plan(Sequence((three, Call("d", 1024))), model=model, n_ctx_train=8192)
    assert p.budgets == {"a": 2560, "b": 2560, "c": 2560, "d": 1024}  # 8192 / 3 down to 256
    assert p.n_ctx == 3 * 2560 and any(r.startswith("budget auto = 2,560 tokens") for r in p.reasons)


def test_a_pinned_context_is_shared_but_one_agent_never_exceeds_the_training_context(tmp_path):
    three = Parallel((Call("a", None), Call("b", None), Call("c", None)))
    big = plan(three, model=tmp_path / "m.gguf", n_ctx_train=8192, pin_ctx=3 * 8192)
    assert big.budgets == {"a": 8192, "b": 8192, "c": 8192} and big.n_ctx == 3 * 8192
    assert any("one request's cap; the pinned 24,576 is shared by 3" in r for r in big.reasons)
    mid = plan(three, model=tmp_path / "m.gguf", n_ctx_train=8192, pin_ctx=12288)
    assert mid.budgets["a"] == 4096 and any("the pinned context 12,288 / 3" in r for r in mid.reasons)


def test_auto_without_a_prompt_is_capped_by_memory(tmp_path):
    two = Parallel((Call("a", None), Call("b", None)))
    p = plan(two, model=tmp_path / "m.gguf", n_ctx_train=8192, kv_bytes_per_token=1000,
             memory_for_kv=2048 * 1000)
    assert p.budgets == {"a": 1024, "b": 1024} and p.n_ctx == 2048 and not p.warnings
    assert math.isclose(p.kv_bytes, 2048 * 1000)


@pytest.mark.engine
@pytest.mark.timeout(1800)  # three ~6,200-token prompts at once on a 2-core CPU: ~2 min quiet, far more when shared
def test_review_of_a_600_line_file_runs_in_one_piece(default_model_path, tmp_path):
    """The issue's bar: ``squad run recipes/review.yaml -p code=@<600-line file>`` succeeds in
    one piece per reviewer, planned from the counted prompts (not the recipe's defaults)."""
    from squad.recipes import run_recipe

    code = SIX_HUNDRED.read_text(encoding="utf-8")
    assert len(code.splitlines()) >= 600 and "@dataclass" in code and "@example.com" in code
    recipe = load_recipe(REVIEW, {"code": code})
    planned = rows(recipe)
    assert planned[("security", "security")].prompt > 5000  # counted from the file, not a default
    events: list = []
    spec = recipe.engine_spec().but(request_timeout=1500)  # a shared CI machine may be slow; a quiet one needs ~60 s
    run = anyio.run(lambda: run_recipe(recipe, engine=spec, on_event=events.append))
    for sid in ("security", "style", "tests", "merge"):
        assert run.steps[sid]["error"] is None, run.steps[sid]
        assert run.steps[sid]["output"].strip()
    assert run.output.strip()
    reviewer_calls = [e for e in events if e.kind == "call.finished" and e.agent in ("security", "style", "tests")]
    assert len(reviewer_calls) == 3  # one piece each: no chunks
    loaded = next(e for e in events if e.kind == "engine.loaded")
    assert loaded.pool >= 3 * planned[("security", "security")].budget  # three pieces at once in one pool


@pytest.mark.anyio
async def test_the_runtime_uses_the_planned_budget_for_auto(tmp_path):
    import dataclasses

    from squad import Agent, Squad
    from squad.testing import FakeEngine

    agents = [Agent(name="lead", agents=("a",)), Agent(name="a", budget=512, max_tokens=32)]
    async with FakeEngine(slots=2) as fe, Squad(agents, engine=fe.info) as sq:
        assert (sq.budget_of(agents[0]), sq.budget_of(agents[1])) == (None, 512)  # not planned: no limit
        assert sq.context_limit(agents[0]) == sq.info.n_ctx  # hand-back / chat history fallback
        sq.session.plan = dataclasses.replace(plan(sq.workload, model=tmp_path / "m.gguf", n_ctx_train=8192))
        assert sq.session.plan.budgets == {"lead": 4096, "a": 512}  # 8192 / 2 agents at once
        assert sq.budget_of(agents[0]) == 4096 and sq._resolved(agents[0]).budget == 4096


CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def test_a_model_override_recounts_the_budgets(default_model_path, tmp_path):
    """``--model`` replaces the recipe's model before counting: auto budgets and the
    cannot-fit check follow the model that will really run (here a 128-token one)."""
    from gguf_support import tiny_gguf

    tiny = tiny_gguf(tmp_path / "tiny.gguf", template=CHATML, n_ctx_train=128)
    code = "def add(a, b):\n    return a + b  # questions: dev@example.com\n" * 4
    default = load_recipe(one_piece(tmp_path), {"code": code})
    assert rows(default)[("review", "reviewer")].budget > 128
    with pytest.raises(RecipeError, match="training context of 128 tokens"):
        load_recipe(one_piece(tmp_path), {"code": code}, model=str(tiny))
    with pytest.raises(SystemExit) as exit_:
        squad_main(["plan", str(one_piece(tmp_path)), "-p", f"code={code}", "--model", str(tiny)])
    assert exit_.value.code == 2

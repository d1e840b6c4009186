"""Fixed prompts counted with the model's own tokenizer before anything runs (squad.recipes.budgets).

Tests on the default model need its file (pulled if absent, see conftest); tests on tiny
synthetic GGUF files always run. No test starts an engine.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import gguf_support
from squad.cli import main as squad_main
from squad.engine.llama import round_ctx
from squad.engine.tokens import counter_for_model
from squad.errors import RecipeError
from squad.recipes import load_recipe, validate_recipe

LONG = " ".join(["the quick brown fox jumps over the lazy dog"] * 223)  # 2,007 words
SYSTEM = "You summarize text."


def write_recipe(tmp_path: Path, *, model: str = "default", budget: int = 512, max_tokens: int = 128,
                 prompt: str = "Summarize: {{ params.text }}", param: str = f'default: "{LONG}"',
                 agents: str = "", flow: str = "") -> Path:
    path = tmp_path / "long.yaml"
    path.write_text(
        f"name: long\n"
        f"model: {model}\n"
        f"params:\n"
        f"  text: {{type: string, {param}}}\n"
        f"agents:\n"
        f"  writer: {{instructions: {SYSTEM}, budget: {budget}, max_tokens: {max_tokens}}}\n"
        f"{agents}"
        f"main: writer\n"
        f"flow:\n"
        f"{flow}"
        f"  - id: summarize\n"
        f"    prompt: \"{prompt}\"\n",
        encoding="utf-8")
    return path


def prompt_line(path: Path) -> tuple[int, int]:
    lines = path.read_text().splitlines()
    index = max(i for i, line in enumerate(lines) if line.strip().startswith("prompt:"))
    return index + 1, lines[index].index('"') + 1


def messages(user: str, system: str = SYSTEM) -> list[dict[str, str]]:
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def expected(counted: int, *, max_tokens: int = 128, budget: int = 512) -> str:
    need = counted + max_tokens
    return (f"step 'summarize' (agent 'writer') needs {need} tokens: its prompt is {counted} tokens (system + "
            f"user message, counted with the model's tokenizer) + max_tokens {max_tokens}, above the agent's "
            f"budget of {budget}; raise agents.writer.budget to {round_ctx(need)} or shorten the prompt")


# --- the default model ---------------------------------------------------------------------


def test_a_fixed_prompt_over_the_budget_fails_validate_at_the_prompt(default_model_path, tmp_path):
    path = write_recipe(tmp_path)
    counted = counter_for_model(default_model_path).count_chat(messages("Summarize: " + LONG))
    assert counted > 2000
    with pytest.raises(RecipeError) as info:
        validate_recipe(path)
    err = info.value
    assert (err.file, (err.line, err.column), err.field) == (str(path), prompt_line(path), "flow[0].prompt")
    assert err.problem == expected(counted)
    assert str(err).startswith(f"{path}:{err.line}:{err.column}: flow[0].prompt: step 'summarize'")


def test_run_and_plan_count_the_values_they_are_given(default_model_path, tmp_path):
    path = write_recipe(tmp_path)
    with pytest.raises(RecipeError, match="needs .* tokens"):
        load_recipe(path)  # squad run / squad plan: the default is the value
    assert load_recipe(path, {"text": "a short text"}).params["text"] == "a short text"


def test_a_prompt_that_fits_passes(default_model_path, tmp_path):
    assert validate_recipe(write_recipe(tmp_path, budget=8192)) == []


def test_a_required_parameter_is_counted_only_once_it_has_a_value(default_model_path, tmp_path):
    path = write_recipe(tmp_path, param="required: true")
    assert validate_recipe(path) == []
    with pytest.raises(RecipeError) as info:
        load_recipe(path, {"text": LONG})
    assert info.value.field == "flow[0].prompt"


@pytest.mark.parametrize(("prompt", "flow"), [
    ("{{ steps.first.output }} {{ params.text }}", "  - {id: first, prompt: hi}\n"),
    ("{{ item }}: {{ params.text }}", ""),
], ids=["steps", "item"])
def test_prompts_known_only_at_run_time_are_not_counted(default_model_path, tmp_path, prompt, flow):
    path = write_recipe(tmp_path, prompt=prompt, flow=flow)
    if "item" in prompt:  # make the last step a map
        path.write_text(path.read_text().replace("    prompt:", "    map: params.text\n    split: lines\n    prompt:"))
    assert validate_recipe(path) == []


def test_sub_agents_make_the_count_a_lower_bound(default_model_path, tmp_path):
    agents = ("  lead: {instructions: 'Helpers: {% for a in agents %}{{ a.name }} {% endfor %}', budget: 512, "
              "agents: [writer]}\n")
    path = write_recipe(tmp_path, agents=agents, prompt="@writer {{ params.text }}")
    path.write_text(path.read_text().replace("main: writer", "main: lead"))
    with pytest.raises(RecipeError) as info:
        validate_recipe(path)
    counted = counter_for_model(default_model_path).count_chat(
        messages("@writer " + LONG, system="Helpers: writer "))
    assert info.value.problem.startswith(f"step 'summarize' (agent 'lead') needs at least {counted + 256} tokens: "
                                         f"its prompt is at least {counted} tokens (system + user message, counted "
                                         "with the model's tokenizer; its tool definitions and the answers of the "
                                         "sub-agents it @mentions come on top)")


def test_cli_validate_exits_2_with_the_numbers(default_model_path, tmp_path, capsys):
    path = write_recipe(tmp_path)
    counted = counter_for_model(default_model_path).count_chat(messages("Summarize: " + LONG))
    with pytest.raises(SystemExit) as info:
        squad_main(["recipes", "validate", str(path)])
    assert info.value.code == 2
    err = " ".join(capsys.readouterr().err.split())  # rich wraps long lines
    line, column = prompt_line(path)
    assert f"error {path}:{line}:{column}: flow[0].prompt: {expected(counted)}" in err


SHIPPED = sorted((Path(__file__).resolve().parents[2] / "recipes").glob("*.yaml"))


@pytest.mark.parametrize("path", SHIPPED, ids=[p.name for p in SHIPPED])
def test_shipped_recipes_fit_their_budgets(default_model_path, path):
    assert validate_recipe(path) == []  # the model is on disk here, so fixed prompts are counted


def test_without_the_model_file_nothing_is_counted(tmp_path, monkeypatch):
    monkeypatch.setenv("SQUAD_CACHE_DIR", str(tmp_path / "empty-cache"))  # the default model is not there
    path = write_recipe(tmp_path, param=f'default: "{LONG[:3000]}"')  # ~600 tokens: too many, but not countable here
    assert validate_recipe(path) == []
    recipe = load_recipe(path)
    assert [w.problem for w in recipe.unchecked] == [
        "the default model 'smollm2-135m' is not on this machine, so budgets were not checked against its training "
        "context and prompts were not counted with its tokenizer; run `squad models pull smollm2-135m` and validate "
        "again"]


def test_without_the_model_file_a_prompt_no_tokenizer_can_fit_is_still_refused(tmp_path, monkeypatch):
    """The same verdict with or without the model file for a prompt far above the budget: more
    bytes than 8 per token of the budget (F19)."""
    monkeypatch.setenv("SQUAD_CACHE_DIR", str(tmp_path / "empty-cache"))
    with pytest.raises(RecipeError) as info:
        validate_recipe(write_recipe(tmp_path))
    assert info.value.line == prompt_line(tmp_path / "long.yaml")[0]
    assert info.value.problem == (
        "step 'summarize' (agent 'writer'): its prompt is 9,841 bytes (system + user message), more than a budget "
        "of 512 tokens can hold even at 8 bytes per token; raise agents.writer.budget or shorten the prompt")


# --- tiny synthetic models: always run -------------------------------------------------------

TEMPLATE = ("{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}[assistant]{% endif %}")


def tiny_gguf(path: Path, *, n_ctx_train: int, template: str = TEMPLATE) -> Path:
    return gguf_support.tiny_gguf(path, template=template, n_ctx_train=n_ctx_train)


@pytest.fixture
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SQUAD_CACHE_DIR", str(tmp_path / "cache"))


def test_counted_with_the_recipes_own_model(tmp_path, own_cache):
    model = tiny_gguf(tmp_path / "tiny.gguf", n_ctx_train=65536)
    path = write_recipe(tmp_path, model="tiny.gguf")
    counted = counter_for_model(model).count_chat(messages("Summarize: " + LONG))
    with pytest.raises(RecipeError) as info:
        validate_recipe(path)
    assert (info.value.line, info.value.column) == prompt_line(path)
    assert info.value.problem == expected(counted)


def test_a_budget_the_model_cannot_hold_asks_for_a_shorter_prompt(tmp_path, own_cache):
    tiny_gguf(tmp_path / "tiny.gguf", n_ctx_train=1024)  # byte tokens: 4,000 bytes fit 8 bytes/token
    with pytest.raises(RecipeError) as info:
        validate_recipe(write_recipe(tmp_path, model="tiny.gguf", param=f'default: "{LONG[:4000]}"'))
    assert info.value.problem.endswith(
        "above the agent's budget of 512; shorten the prompt (the model's training context is 1024 tokens, "
        "so the budget can be at most 1024)")


def test_a_request_the_counter_cannot_reproduce_is_not_counted(tmp_path, own_cache):
    tiny_gguf(tmp_path / "tiny.gguf", n_ctx_train=65536, template="{{ raise_exception('no') }}")
    assert validate_recipe(write_recipe(tmp_path, model="tiny.gguf", param=f'default: "{LONG[:3000]}"')) == []

